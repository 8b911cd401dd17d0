"""What the admission gate reads, as small frozen views: Workloads, Nodes, pods, flavors.

The `parse_*` functions turn the raw objects the gate's adapter lists into the values the
pure plan (`controller.admission.policy`) decides over, and read the AdmissionCheck itself
(`owns_check`, `active_condition`). Purely computational: no I/O, no clock, no logging.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import enum
import math
from collections.abc import Iterable, Mapping
from typing import Any

from controller import marks, timestamps
from shared import spec as specs

DEFAULT_RETRY_AFTER_S = 15.0

UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
NOT_READY_TAINTS = frozenset({"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"})
HARD_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
TERMINAL_POD_PHASES = frozenset({"Succeeded", "Failed"})
UNLIMITED = 1 << 62
"""Stands for a resource a node does not report (never the limiting one)."""
MAX_NAMES = 5
"""Node names listed in one message before `…`."""


class CheckState(enum.StrEnum):
    """States of a Workload's admission check (`AdmissionCheckState.state`)."""

    PENDING = "Pending"
    READY = "Ready"
    RETRY = "Retry"
    REJECTED = "Rejected"


# ---------------------------------------------------------------- resources


@dataclasses.dataclass(frozen=True, order=True)
class Resources:
    """An amount of the resources the gate counts; `order` sorts GPUs first."""

    gpus: int = 0
    cpu_milli: int = 0
    memory: int = 0
    """Bytes."""

    def __add__(self, other: Resources) -> Resources:
        return Resources(
            self.gpus + other.gpus, self.cpu_milli + other.cpu_milli, self.memory + other.memory
        )

    def __sub__(self, other: Resources) -> Resources:
        return Resources(
            self.gpus - other.gpus, self.cpu_milli - other.cpu_milli, self.memory - other.memory
        )

    def fits_in(self, free: Resources) -> bool:
        """Whether this request fits in `free`."""
        return (
            self.gpus <= free.gpus
            and self.cpu_milli <= free.cpu_milli
            and self.memory <= free.memory
        )

    def times(self, n: int) -> Resources:
        """This amount `n` times."""
        return Resources(self.gpus * n, self.cpu_milli * n, self.memory * n)


def _quantity(value: object, scale: float = 1.0) -> int | None:
    """Parse a quantity (rounded up after `scale`); None when absent or unreadable."""
    if value is None:
        return None
    try:
        return math.ceil(specs.parse_quantity(str(value)) * scale - 1e-9)
    except ValueError:
        return None


def resource_list(raw: object, *, missing: int = 0) -> Resources:
    """Read a Kubernetes resource list (`{"nvidia.com/gpu": "8", "cpu": "500m"}`)."""
    items = raw if isinstance(raw, Mapping) else {}
    scales = ((marks.GPU_RESOURCE, 1.0), ("cpu", 1000), ("memory", 1.0))
    amounts = (_quantity(items.get(key), scale) for key, scale in scales)
    return Resources(*(missing if amount is None else amount for amount in amounts))


def _container_requests(container: Mapping[str, Any]) -> Resources:
    """Requests of one container; a limit stands in for a missing request (API defaulting)."""
    res = container.get("resources") or {}
    limits = resource_list(res.get("limits"))
    requests = resource_list(res.get("requests"))
    raw_requests = res.get("requests") or {}
    return Resources(
        requests.gpus if marks.GPU_RESOURCE in raw_requests else limits.gpus,
        requests.cpu_milli if "cpu" in raw_requests else limits.cpu_milli,
        requests.memory if "memory" in raw_requests else limits.memory,
    )


def pod_requests(pod_spec: Mapping[str, Any]) -> Resources:
    """Effective requests of a pod: the larger of its containers' sum and its biggest init
    container, per resource, plus the pod overhead (the scheduler's rule)."""
    total = sum(map(_container_requests, pod_spec.get("containers") or []), Resources())
    for c in pod_spec.get("initContainers") or []:
        init = _container_requests(c)
        total = Resources(
            max(total.gpus, init.gpus),
            max(total.cpu_milli, init.cpu_milli),
            max(total.memory, init.memory),
        )
    return total + resource_list(pod_spec.get("overhead"))


# ---------------------------------------------------------------- taints and tolerations


@dataclasses.dataclass(frozen=True)
class Taint:
    """A node taint."""

    key: str
    value: str = ""
    effect: str = "NoSchedule"


@dataclasses.dataclass(frozen=True)
class Toleration:
    """A pod toleration (Kubernetes matching rules)."""

    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Taint) -> bool:
        """Whether this toleration lets a pod onto a node with `taint`."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.operator == "Exists":
            return not self.key or self.key == taint.key
        return self.key == taint.key and self.value == taint.value


def _taints(raw: object) -> tuple[Taint, ...]:
    items = raw if isinstance(raw, list) else []
    return tuple(
        Taint(str(t.get("key", "")), str(t.get("value") or ""), str(t.get("effect") or ""))
        for t in items
        if isinstance(t, Mapping)
    )


def _tolerations(raw: object) -> tuple[Toleration, ...]:
    items = raw if isinstance(raw, list) else []
    return tuple(
        Toleration(
            key=str(t.get("key") or ""),
            operator=str(t.get("operator") or "Equal"),
            value=str(t.get("value") or ""),
            effect=str(t.get("effect") or ""),
        )
        for t in items
        if isinstance(t, Mapping)
    )


def _strings(raw: object) -> dict[str, str]:
    return {str(k): str(v) for k, v in raw.items()} if isinstance(raw, Mapping) else {}


# ---------------------------------------------------------------- nodes


@dataclasses.dataclass(frozen=True)
class NodeCapacity:
    """One node as the gate sees it: what it offers, what is used, whether it is healthy."""

    name: str
    allocatable: Resources
    used: Resources = Resources()
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    ready: bool = True
    gpu_status: str = ""
    """Status of the `GPUHealthy` condition ('' when the node has none)."""
    gpu_reason: str = ""
    unschedulable: bool = False
    dra: bool = False
    """Its GPUs are DRA devices: `allocatable.gpus` counts the usable ones (healthy and
    untainted), `used.gpus` those of them allocated to claims (`WithDevices`)."""
    fresh: bool = True
    """Its GPU health data is fresh (DRA nodes: a recent heartbeat; a leader that has none
    yet fails closed)."""
    fenced: tuple[tuple[str, str], ...] = ()
    """DRA nodes: (device, why) of the devices not usable (`tainted`, `faulty`)."""

    @property
    def free(self) -> Resources:
        """Allocatable minus used."""
        return self.allocatable - self.used

    @property
    def problem(self) -> str:
        """Why the node is not healthy, in one word or three ('' when it is).

        A DRA node is judged device by device, so its `GPUHealthy` condition (False when
        any one GPU is bad) does not count; stale health data does.
        """
        if self.dra:
            if not self.fresh:
                return "GPU health data stale"
        elif self.gpu_status == "False":
            return self.gpu_reason or "GPUHealthy=False"
        if self.gpu_status == "Unknown" and not self.dra:
            detail = f" ({self.gpu_reason})" if self.gpu_reason else ""
            return f"GPU health unknown{detail}"
        if any(t.key == marks.TAINT_KEY for t in self.taints):
            return f"tainted {marks.TAINT_KEY}"
        if not self.ready or any(t.key in NOT_READY_TAINTS for t in self.taints):
            return "NotReady"
        if self.unschedulable or any(t.key == UNSCHEDULABLE_TAINT for t in self.taints):
            return "cordoned"
        return ""

    @property
    def healthy(self) -> bool:
        """GPUHealthy not False/Unknown, not tainted by us, Ready, not cordoned."""
        return not self.problem


def parse_node(raw: Mapping[str, Any]) -> NodeCapacity:
    """Read what the gate needs from a raw Node (nothing is used yet)."""
    meta = raw.get("metadata") or {}
    spec = raw.get("spec") or {}
    status = raw.get("status") or {}
    conds = {str(c.get("type")): c for c in status.get("conditions") or [] if isinstance(c, dict)}
    ready = conds.get("Ready")
    gpu = conds.get(marks.NODE_CONDITION) or {}
    alloc = resource_list(status.get("allocatable"), missing=UNLIMITED)
    if marks.GPU_RESOURCE not in (status.get("allocatable") or {}):
        alloc = dataclasses.replace(alloc, gpus=0)
    return NodeCapacity(
        name=str(meta.get("name", "")),
        allocatable=alloc,
        labels=_strings(meta.get("labels")),
        taints=_taints(spec.get("taints")),
        ready=ready is not None and ready.get("status") == "True",
        gpu_status=str(gpu.get("status") or ""),
        gpu_reason=str(gpu.get("reason") or ""),
        unschedulable=spec.get("unschedulable") is True,
    )


# ---------------------------------------------------------------- pods


@dataclasses.dataclass(frozen=True)
class PodUsage:
    """One pod: where it is bound, what it requests, which run attempt it belongs to."""

    namespace: str
    name: str
    node: str
    requests: Resources
    phase: str = "Pending"
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    claimed: bool = False
    """A ResourceClaim allocated and reserved for it (`Claims.pods`, `MarkClaimed`): the
    scheduler has placed it and is binding it; its devices already count as held."""

    @property
    def terminal(self) -> bool:
        """Succeeded or Failed: it runs nothing and holds nothing."""
        return self.phase in TERMINAL_POD_PHASES

    @property
    def placed(self) -> bool:
        """Bound to a node, or on its way there (its claims are allocated)."""
        return bool(self.node) or self.claimed

    @property
    def run(self) -> str:
        """The TauRun it belongs to ('' for other pods)."""
        return self.labels.get(marks.RUN_LABEL, "")

    @property
    def attempt(self) -> int | None:
        """Its run attempt, when labelled."""
        value = self.labels.get(marks.ATTEMPT_LABEL, "")
        return int(value) if value.isdigit() else None


def parse_pod(raw: Mapping[str, Any]) -> PodUsage:
    """Read what the gate needs from a raw Pod."""
    meta = raw.get("metadata") or {}
    spec = raw.get("spec") or {}
    return PodUsage(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        node=str(spec.get("nodeName") or ""),
        requests=pod_requests(spec),
        phase=str((raw.get("status") or {}).get("phase") or "Pending"),
        labels=_strings(meta.get("labels")),
    )


def usage(pods: Iterable[PodUsage]) -> dict[str, Resources]:
    """The requests of the non-terminal pods bound to each node, summed by node."""
    used: dict[str, Resources] = {}
    for p in pods:
        if p.node and not p.terminal:
            used[p.node] = used.get(p.node, Resources()) + p.requests
    return used


def with_usage(node_list: Iterable[NodeCapacity], pods: Iterable[PodUsage]) -> list[NodeCapacity]:
    """Add the requests of every non-terminal pod bound to each node to its `used`."""
    used = usage(pods)
    return [dataclasses.replace(n, used=n.used + used.get(n.name, Resources())) for n in node_list]


# ---------------------------------------------------------------- flavors and queues


@dataclasses.dataclass(frozen=True)
class Flavor:
    """A ResourceFlavor: the node labels it selects, the taints its nodes carry, and the
    tolerations Kueue injects into admitted pods."""

    name: str
    node_labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    node_taints: tuple[Taint, ...] = ()
    tolerations: tuple[Toleration, ...] = ()


def parse_flavor(raw: Mapping[str, Any]) -> Flavor:
    """Read a raw ResourceFlavor."""
    spec = raw.get("spec") or {}
    return Flavor(
        name=str((raw.get("metadata") or {}).get("name", "")),
        node_labels=_strings(spec.get("nodeLabels")),
        node_taints=_taints(spec.get("nodeTaints")),
        tolerations=_tolerations(spec.get("tolerations")),
    )


# ---------------------------------------------------------------- workloads


@dataclasses.dataclass(frozen=True)
class PodSet:
    """One pod set of a Workload, with the flavors its admission assigned."""

    name: str
    count: int
    requests: Resources
    """Per pod."""
    node_selector: Mapping[str, str] = dataclasses.field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """The pod template's labels (its pods carry them)."""
    flavors: tuple[str, ...] = ()
    dra: bool = False
    """Its pods get GPUs through DRA claims (templates): `requests.gpus` is read from
    Kueue's quota usage of the pod set, and they fit only on DRA nodes."""


@dataclasses.dataclass(frozen=True)
class CheckStatus:
    """One entry of `status.admissionChecks`."""

    name: str
    state: str
    message: str = ""
    last_transition: dt.datetime | None = None
    requeue_after_s: int | None = None
    retry_count: int = 0


@dataclasses.dataclass(frozen=True)
class Workload:
    """What the gate reads of a Kueue Workload (`kueue.x-k8s.io/v1beta2`)."""

    namespace: str
    name: str
    pod_sets: tuple[PodSet, ...]
    checks: tuple[CheckStatus, ...] = ()
    cluster_queue: str = ""
    resource_version: str = ""
    uid: str = ""
    priority: int = 0
    created: dt.datetime | None = None
    quota_reserved: bool = False
    admitted: bool = False
    evicted: bool = False
    finished: bool = False
    active: bool = True
    run: str = ""
    """The TauRun of its owner Job/RayJob ('' for anything else)."""
    attempt: int | None = None
    pods_ready: bool = False
    """Kueue's PodsReady condition: its pods run (or ran)."""
    owner: tuple[str, str] = ("", "")
    """(kind, name) of its first owner: the Job or RayJob whose labels name its run."""

    @property
    def uses_dra(self) -> bool:
        """Whether any pod set gets GPUs through DRA claims."""
        return any(ps.dra for ps in self.pod_sets)

    def check(self, name: str) -> CheckStatus | None:
        """Our entry in `status.admissionChecks`, if Kueue listed it."""
        return next((c for c in self.checks if c.name == name), None)

    def holds_capacity(self, check: str) -> bool:
        """Admitted, or passed by our check: its pods will land on nodes soon if not yet."""
        ours = self.check(check)
        passed = self.admitted or (ours is not None and ours.state == CheckState.READY)
        return passed and self.quota_reserved and not self.finished and not self.evicted


def _true(raw: Mapping[str, Any], kind: str) -> bool:
    return any(
        isinstance(c, Mapping) and c.get("type") == kind and c.get("status") == "True"
        for c in (raw.get("status") or {}).get("conditions") or []
    )


def _pod_sets(raw: Mapping[str, Any], dra_resource: str) -> tuple[PodSet, ...]:
    status = raw.get("status") or {}
    assigned = {
        str(a.get("name", "")): a
        for a in (status.get("admission") or {}).get("podSetAssignments") or []
        if isinstance(a, Mapping)
    }
    out = []
    for ps in (raw.get("spec") or {}).get("podSets") or []:
        name = str(ps.get("name", ""))
        template = ps.get("template") or {}
        pod_spec = template.get("spec") or {}
        assignment = assigned.get(name) or {}
        count = assignment.get("count")
        pods = int(count if count is not None else ps.get("count") or 0)
        requests = pod_requests(pod_spec)
        dra = bool(pod_spec.get("resourceClaims"))
        if dra:
            # Kueue's usage under the mapped name counts the claims' devices (and, when the
            # name is nvidia.com/gpu itself, the extended resource too).
            usage = _quantity((assignment.get("resourceUsage") or {}).get(dra_resource)) or 0
            per_pod = math.ceil(usage / pods) if pods else 0
            own = 0 if dra_resource == marks.GPU_RESOURCE else requests.gpus
            requests = dataclasses.replace(requests, gpus=own + per_pod)
        out.append(
            PodSet(
                name=name,
                count=pods,
                requests=requests,
                dra=dra,
                node_selector=_strings(pod_spec.get("nodeSelector")),
                tolerations=_tolerations(pod_spec.get("tolerations")),
                labels=_strings((template.get("metadata") or {}).get("labels")),
                flavors=tuple(sorted({str(f) for f in (assignment.get("flavors") or {}).values()})),
            )
        )
    return tuple(out)


def _checks(raw: Mapping[str, Any]) -> tuple[CheckStatus, ...]:
    out = []
    for c in (raw.get("status") or {}).get("admissionChecks") or []:
        if not isinstance(c, Mapping):
            continue
        after = c.get("requeueAfterSeconds")
        out.append(
            CheckStatus(
                name=str(c.get("name", "")),
                state=str(c.get("state", "")),
                message=str(c.get("message") or ""),
                last_transition=timestamps.parse(c.get("lastTransitionTime")),
                requeue_after_s=int(after) if after is not None else None,
                retry_count=int(c.get("retryCount") or 0),
            )
        )
    return tuple(out)


def parse_workload(
    raw: Mapping[str, Any],
    owner_labels: Mapping[str, str] | None = None,
    *,
    dra_resource: str = marks.GPU_RESOURCE,
) -> Workload:
    """Read a raw Workload. The run and attempt come from its owner Job/RayJob's labels
    (`owner_labels`; Kueue copies none to the Workload unless configured to), else from the
    Workload's own labels, else from its first pod template (our pods carry them too)."""
    meta = raw.get("metadata") or {}
    spec = raw.get("spec") or {}
    admission = (raw.get("status") or {}).get("admission") or {}
    pod_sets = _pod_sets(raw, dra_resource)
    sources = [dict(owner_labels or {}), _strings(meta.get("labels"))]
    sources += [dict(ps.labels) for ps in pod_sets[:1]]
    labels = next((s for s in sources if s.get(marks.RUN_LABEL)), {})
    attempt = labels.get(marks.ATTEMPT_LABEL, "")
    return Workload(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        resource_version=str(meta.get("resourceVersion", "")),
        pod_sets=pod_sets,
        checks=_checks(raw),
        cluster_queue=str(admission.get("clusterQueue", "")),
        priority=int(spec.get("priority") or 0),
        created=timestamps.parse(meta.get("creationTimestamp")),
        quota_reserved=_true(raw, "QuotaReserved"),
        admitted=_true(raw, "Admitted"),
        evicted=_true(raw, "Evicted"),
        finished=_true(raw, "Finished"),
        active=spec.get("active", True) is not False,
        run=labels.get(marks.RUN_LABEL, ""),
        attempt=int(attempt) if attempt.isdigit() else None,
        pods_ready=_true(raw, "PodsReady"),
        owner=owner_ref(raw)[1:],
    )


def with_owner(w: Workload, owner_labels: Mapping[str, str] | None) -> Workload:
    """`w` (parsed once, by the workloads cache) joined with its owner Job/RayJob's labels:
    they name the run and attempt first (`parse_workload`'s order); `w` itself when they
    name no run or the same."""
    labels = owner_labels or {}
    run = labels.get(marks.RUN_LABEL)
    if not run:
        return w
    raw_attempt = labels.get(marks.ATTEMPT_LABEL, "")
    attempt = int(raw_attempt) if raw_attempt.isdigit() else None
    if (run, attempt) == (w.run, w.attempt):
        return w
    joined = copy.copy(w)  # a fraction of `dataclasses.replace`'s cost, every pass
    object.__setattr__(joined, "run", run)
    object.__setattr__(joined, "attempt", attempt)
    return joined


def waits(w: Workload, check: str, queues: frozenset[str] | None = None) -> bool:
    """Whether a Workload may need a decision of the gate: its quota is reserved (through one
    of `queues`; None: any), it is neither evicted nor finished, and our check is Pending
    and it is not admitted yet, or Ready on DRA devices before its pods run (those are
    checked again until they do)."""
    ours = w.check(check)
    if ours is None or not w.quota_reserved or w.evicted or w.finished:
        return False
    if queues is not None and w.cluster_queue not in queues:
        return False
    if ours.state == CheckState.READY:
        return w.uses_dra and not w.pods_ready
    return ours.state in {CheckState.PENDING, ""} and not w.admitted


def owner_ref(raw: Mapping[str, Any]) -> tuple[str, str, str]:
    """(namespace, kind, name) of a raw Workload's first owner."""
    meta = raw.get("metadata") or {}
    owner = (meta.get("ownerReferences") or [{}])[0]
    return str(meta.get("namespace", "")), str(owner.get("kind", "")), str(owner.get("name", ""))
