"""The admission gate, computed: does a Workload fit, node by node, on healthy nodes?

Purely computational (DESIGN.md section 7, "Admission gate"): the `Gate` loop reads raw
Workloads, Nodes, Pods, ResourceFlavors, ClusterQueues and the AdmissionCheck, turns them into
the small views below with the `parse_*` functions, and asks `plan` (one pass over every
Workload) or `decide` (one Workload) what our check's state should be. `now` is always an
argument. No I/O, no clock, no logging.

What the gate holds a Workload to:
- **Ready** when every pod set fits on healthy, schedulable nodes of its assigned flavor,
  counted node by node: a pod of 8 GPUs needs one node with 8 free GPUs, however many GPUs
  the flavor has in total. Free means allocatable minus the requests of the pods bound to
  the node (and of admitted Workloads whose pods are not bound yet), for GPUs, CPU and memory.
  Pod sets are packed together, largest pods first, each on the tightest node that takes it.
- **Retry**, with `requeueAfterSeconds` set, when they do not fit: Kueue releases the quota
  and queues the Workload again after that delay (nil would make Kueue retry at once: a hot
  loop). The message says what is missing in words.
- **Pending** while pods of an earlier attempt of the same run still run (fencing): they
  end within their grace period, and two attempts of a run must never run at once.
- Nothing at all (None: no write) for a Workload that is Evicted, has no quota reserved, is
  finished or deactivated, is already admitted, whose check Kueue has not listed yet or is
  already Retry/Rejected, or whose check already says what we would write. A check once
  Ready is never taken back: a node failing after admission is the quarantine's business.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import math
from collections.abc import Iterable, Mapping, Sequence
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
    gpus = _quantity(items.get(marks.GPU_RESOURCE))
    cpu = _quantity(items.get("cpu"), 1000)
    memory = _quantity(items.get("memory"))
    return Resources(
        gpus if gpus is not None else missing,
        cpu if cpu is not None else missing,
        memory if memory is not None else missing,
    )


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
    total = Resources()
    for c in pod_spec.get("containers") or []:
        total = total + _container_requests(c)
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

    @property
    def free(self) -> Resources:
        """Allocatable minus used."""
        return self.allocatable - self.used

    @property
    def problem(self) -> str:
        """Why the node is not healthy, in one word or three ('' when it is)."""
        if self.gpu_status == "False":
            return self.gpu_reason or "GPUHealthy=False"
        if self.gpu_status == "Unknown":
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

    @property
    def terminal(self) -> bool:
        """Succeeded or Failed: it runs nothing and holds nothing."""
        return self.phase in TERMINAL_POD_PHASES

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


def with_usage(node_list: Iterable[NodeCapacity], pods: Iterable[PodUsage]) -> list[NodeCapacity]:
    """Add the requests of every non-terminal pod bound to each node to its `used`."""
    used: dict[str, Resources] = {}
    for p in pods:
        if p.node and not p.terminal:
            used[p.node] = used.get(p.node, Resources()) + p.requests
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


def cluster_queue_checks(raw: Mapping[str, Any]) -> frozenset[str]:
    """Names of the admission checks a raw ClusterQueue's `admissionChecksStrategy` lists."""
    strategy = (raw.get("spec") or {}).get("admissionChecksStrategy") or {}
    return frozenset(
        str(c.get("name", ""))
        for c in strategy.get("admissionChecks") or []
        if isinstance(c, Mapping) and c.get("name")
    )


def queues_with_check(raw_queues: Iterable[Mapping[str, Any]], check: str) -> frozenset[str]:
    """Names of the ClusterQueues whose strategy names `check`."""
    return frozenset(
        str((q.get("metadata") or {}).get("name", ""))
        for q in raw_queues
        if check in cluster_queue_checks(q)
    )


def owns_check(
    raw_check: Mapping[str, Any] | None, controller_name: str = marks.ADMISSION_CHECK_CONTROLLER
) -> bool:
    """Whether a raw AdmissionCheck exists and names our controller."""
    if raw_check is None:
        return False
    return (raw_check.get("spec") or {}).get("controllerName") == controller_name


def active_condition(
    raw_check: Mapping[str, Any], now: dt.datetime, message: str
) -> dict[str, Any] | None:
    """The `Active` condition to write on our AdmissionCheck, None when it already holds
    (True, our reason and message, for the current generation)."""
    meta = raw_check.get("metadata") or {}
    generation = int(meta.get("generation") or 0)
    current = next(
        (c for c in (raw_check.get("status") or {}).get("conditions") or []
         if isinstance(c, Mapping) and c.get("type") == marks.CHECK_ACTIVE_CONDITION),
        None,
    )  # fmt: skip
    if (
        current is not None
        and current.get("status") == "True"
        and current.get("reason") == marks.CHECK_ACTIVE_REASON
        and current.get("message") == message
        and int(current.get("observedGeneration") or 0) == generation
    ):
        return None
    since = now
    if current is not None and current.get("status") == "True":
        since = timestamps.parse(current.get("lastTransitionTime")) or now
    return {
        "type": marks.CHECK_ACTIVE_CONDITION,
        "status": "True",
        "reason": marks.CHECK_ACTIVE_REASON,
        "message": message,
        "observedGeneration": generation,
        "lastTransitionTime": timestamps.rfc3339(since),
    }


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


def _pod_sets(raw: Mapping[str, Any]) -> tuple[PodSet, ...]:
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
        out.append(
            PodSet(
                name=name,
                count=int(count if count is not None else ps.get("count") or 0),
                requests=pod_requests(pod_spec),
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
    raw: Mapping[str, Any], owner_labels: Mapping[str, str] | None = None
) -> Workload:
    """Read a raw Workload. The run and attempt come from its owner Job/RayJob's labels
    (`owner_labels`; Kueue copies none to the Workload unless configured to), else from the
    Workload's own labels, else from its first pod template (our pods carry them too)."""
    meta = raw.get("metadata") or {}
    spec = raw.get("spec") or {}
    admission = (raw.get("status") or {}).get("admission") or {}
    pod_sets = _pod_sets(raw)
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
    )


def owner_ref(raw: Mapping[str, Any]) -> tuple[str, str, str]:
    """(namespace, kind, name) of a raw Workload's first owner."""
    meta = raw.get("metadata") or {}
    owner = (meta.get("ownerReferences") or [{}])[0]
    return str(meta.get("namespace", "")), str(owner.get("kind", "")), str(owner.get("name", ""))


# ---------------------------------------------------------------- the decision


@dataclasses.dataclass(frozen=True)
class Decision:
    """What our check on one Workload should say."""

    state: CheckState
    message: str
    requeue_after_s: int | None = None
    """Set with Retry only: Kueue waits this long before queueing the Workload again."""
    since: dt.datetime | None = None
    """`lastTransitionTime` to write: now on a change of state, else the current one."""
    placement: tuple[tuple[str, Resources], ...] = ()
    """(node, requests) of every pod, for Ready: what the later Workloads of a pass must
    not count on."""


@dataclasses.dataclass(frozen=True)
class _Pod:
    pod_set: str
    requests: Resources
    nodes: frozenset[str]


def _eligible(node: NodeCapacity, ps: PodSet, flavors: Mapping[str, Flavor]) -> bool:
    """Whether the pod set may run on the node, health aside: the flavor's labels and the
    pod's node selector match, and every hard taint (health taints aside) is tolerated."""
    wanted = dict(ps.node_selector)
    tolerations = list(ps.tolerations)
    for name in ps.flavors:
        flavor = flavors.get(name)
        if flavor is None:
            continue
        wanted.update(flavor.node_labels)
        tolerations += flavor.tolerations
        # Kueue assigns a flavor only to Workloads that tolerate its nodeTaints.
        tolerations += [Toleration(t.key, "Equal", t.value, t.effect) for t in flavor.node_taints]
    if any(node.labels.get(k) != v for k, v in wanted.items()):
        return False
    health_keys = {marks.TAINT_KEY, UNSCHEDULABLE_TAINT, *NOT_READY_TAINTS}
    return all(
        any(tol.tolerates(t) for tol in tolerations)
        for t in node.taints
        if t.effect in HARD_EFFECTS and t.key not in health_keys
    )


def _pack(
    pods: Sequence[_Pod], free: dict[str, Resources]
) -> tuple[list[tuple[str, Resources]], str | None]:
    """Place pods largest first, each on the tightest node that takes it; update `free`.
    Return the placement and the pod set of the first pod that did not fit (None: all did)."""
    placed: list[tuple[str, Resources]] = []
    for pod in sorted(pods, key=lambda p: p.requests, reverse=True):
        fits = [n for n in pod.nodes if pod.requests.fits_in(free[n])]
        if not fits:
            return placed, pod.pod_set
        node = min(fits, key=lambda n: (free[n], n))
        free[node] = free[node] - pod.requests
        placed.append((node, pod.requests))
    return placed, None


def _slots(free: Resources, req: Resources, cap: int) -> int:
    """How many pods of `req` fit in `free` (at most `cap`)."""
    counts = [
        have // need
        for have, need in ((free.gpus, req.gpus), (free.cpu_milli, req.cpu_milli),
                           (free.memory, req.memory))
        if need > 0
    ]  # fmt: skip
    return max(0, min([cap, *counts]))


def _names(items: Sequence[str]) -> str:
    shown = ", ".join(items[:MAX_NAMES])
    return shown + (" …" if len(items) > MAX_NAMES else "")


def _plural(n: int, one: str, many: str) -> str:
    return one if n == 1 else many


def _size(req: Resources) -> str:
    parts = []
    if req.cpu_milli:
        cpu = req.cpu_milli / 1000
        parts.append(f"{cpu:g} CPU")
    if req.memory:
        parts.append(f"{req.memory / 2**30:g}Gi memory")
    return " and ".join(parts) or "nothing"


def _shortfall(
    ps: PodSet,
    candidates: Sequence[NodeCapacity],
    free: Mapping[str, Resources],
    *,
    several: bool,
) -> str:
    """Say in words why a pod set does not fit: what it needs, which healthy nodes have it,
    and which nodes of its flavor are unhealthy and why."""
    req, count = ps.requests, ps.count
    flavor = "/".join(ps.flavors)
    where = f"on healthy nodes of flavor {flavor}" if flavor else "on healthy nodes"
    whole_nodes = req.gpus > 0 and all(n.allocatable.gpus < 2 * req.gpus for n in candidates)
    if whole_nodes:
        need = f"needs {count} {_plural(count, 'node', 'nodes')} with {req.gpus} free GPUs"
    elif req.gpus > 0:
        need = f"needs room for {count} {_plural(count, 'pod', 'pods')} of {req.gpus} GPUs"
    else:
        need = f"needs room for {count} {_plural(count, 'pod', 'pods')} of {_size(req)}"
    head = f"pod set {ps.name} {need}" if several else need
    healthy = [n for n in candidates if n.healthy]
    roomy = sorted(n.name for n in healthy if _slots(free[n.name], req, count) > 0)
    slots = sum(_slots(free[n.name], req, count) for n in healthy)
    if not candidates:
        return f"{head} {where}; no node matches the flavor's labels and the pod's selector"
    if not roomy:
        have = f"; no healthy node has {'them' if whole_nodes else 'room'}"
    elif whole_nodes and slots < count:
        have = (f"; only {len(roomy)} healthy {_plural(len(roomy), 'node has', 'nodes have')}"
                f" them: {_names(roomy)}")  # fmt: skip
    elif slots < count:
        have = f"; healthy nodes have room for only {slots}: {_names(roomy)}"
    else:
        have = f"; with the other pod sets it does not fit on {_names(roomy)}"
    sick = sorted((n.name, n.problem) for n in candidates if not n.healthy)
    if sick:
        listed = _names([f"{name} {why}" for name, why in sick])
        have += f" ({len(sick)} unhealthy: {listed})"
    return f"{head} {where}{have}"


def _fit(
    workload: Workload,
    node_list: Sequence[NodeCapacity],
    flavors: Mapping[str, Flavor],
) -> tuple[bool, str, tuple[tuple[str, Resources], ...]]:
    """Pack every pod set of the Workload on healthy nodes; say where, or why not."""
    free = {n.name: n.free for n in node_list}
    before = dict(free)
    candidates = {ps.name: [n for n in node_list if _eligible(n, ps, flavors)]
                  for ps in workload.pod_sets}  # fmt: skip
    pods = [
        _Pod(ps.name, ps.requests, frozenset(n.name for n in candidates[ps.name] if n.healthy))
        for ps in workload.pod_sets
        for _ in range(ps.count)
    ]
    placed, failed = _pack(pods, free)
    if failed is not None:
        ps = next(p for p in workload.pod_sets if p.name == failed)
        several = len(workload.pod_sets) > 1
        return False, _shortfall(ps, candidates[ps.name], before, several=several), ()
    used = sorted({node for node, _ in placed})
    flavor_names = sorted({f for ps in workload.pod_sets for f in ps.flavors})
    of = f" of flavor {'/'.join(flavor_names)}" if flavor_names else ""
    message = f"fits on healthy nodes{of}: {_names(used)}" if used else "fits (no pods to place)"
    return True, message, tuple(placed)


def _fencing(workload: Workload, pods: Iterable[PodUsage]) -> str:
    """The Pending message while pods of an earlier attempt still run ('' when none do).
    Pods that ended (Succeeded/Failed) run nothing: an ended attempt kept for its logs must
    not hold back a resume."""
    if not workload.run or workload.attempt is None:
        return ""
    earlier = sorted(
        (p.attempt, p.name)
        for p in pods
        if p.namespace == workload.namespace
        and p.run == workload.run
        and p.attempt is not None
        and p.attempt < workload.attempt
        and not p.terminal
    )
    if not earlier:
        return ""
    last = max(a for a, _ in earlier)
    names = [name for a, name in earlier if a == last]
    return f"waiting for attempt {last}'s pods to end: {_names(names)}"


def decide(
    workload: Workload,
    nodes: Sequence[NodeCapacity],
    flavors: Mapping[str, Flavor],
    earlier_attempt_pods: Iterable[PodUsage],
    now: dt.datetime,
    *,
    check: str = marks.DEFAULT_ADMISSION_CHECK,
    retry_after_s: float = DEFAULT_RETRY_AFTER_S,
) -> Decision | None:
    """Decide our check's state for one Workload; None means write nothing.

    `nodes` carry their usage (`with_usage`); `earlier_attempt_pods` may hold any pods: only
    the non-terminal ones of earlier attempts of the Workload's run count (fencing).
    """
    ours = workload.check(check)
    if ours is None or ours.state in {CheckState.READY, CheckState.RETRY, CheckState.REJECTED}:
        return None
    if (
        not workload.quota_reserved
        or workload.evicted
        or workload.finished
        or workload.admitted
        or not workload.active
    ):
        return None
    fenced = _fencing(workload, earlier_attempt_pods)
    placement: tuple[tuple[str, Resources], ...] = ()
    after: int | None = None
    if fenced:
        state, message = CheckState.PENDING, fenced
    else:
        fits, message, placement = _fit(workload, nodes, flavors)
        state = CheckState.READY if fits else CheckState.RETRY
        after = None if fits else math.ceil(retry_after_s)
    if state == ours.state and message == ours.message:
        return None
    since = now if state != ours.state or ours.last_transition is None else ours.last_transition
    return Decision(state, message, after, since, placement)


def _claims(
    workload: Workload, pods: Sequence[PodUsage], node_list: Sequence[NodeCapacity],
    flavors: Mapping[str, Flavor], free: dict[str, Resources],
) -> None:  # fmt: skip
    """Reserve room for the pods of a passed Workload that are not bound yet (best effort:
    a pod that fits nowhere claims nothing). Pods are matched by the template's labels."""
    waiting: list[_Pod] = []
    for ps in workload.pod_sets:
        if not ps.labels:
            continue  # cannot tell its pods apart: assume they are bound and counted
        started = sum(
            1
            for p in pods
            if p.namespace == workload.namespace
            and (p.node or p.terminal)
            and all(p.labels.get(k) == v for k, v in ps.labels.items())
        )
        eligible = frozenset(n.name for n in node_list if n.healthy and _eligible(n, ps, flavors))
        waiting += [_Pod(ps.name, ps.requests, eligible)] * max(0, ps.count - started)
    for pod in waiting:
        _pack([pod], free)


def plan(
    workloads: Sequence[Workload],
    nodes: Sequence[NodeCapacity],
    flavors: Mapping[str, Flavor],
    pods: Sequence[PodUsage],
    now: dt.datetime,
    *,
    check: str = marks.DEFAULT_ADMISSION_CHECK,
    retry_after_s: float = DEFAULT_RETRY_AFTER_S,
    queues: frozenset[str] | None = None,
) -> dict[tuple[str, str], Decision]:
    """Decide every Workload of one pass, keyed by (namespace, name).

    `nodes` come without usage: the pods' requests are added here. Admitted (or already
    passed) Workloads whose pods are not bound yet claim their room first; then the
    Workloads waiting on our check are decided in Kueue's order (priority, then age), each
    Ready one claiming its nodes, so one pass never promises the same GPUs twice. `queues`
    limits the pass to Workloads admitted through those ClusterQueues (None: any).
    """
    base = with_usage(nodes, pods)
    free = {n.name: n.free for n in base}
    for w in workloads:
        if w.holds_capacity(check):
            _claims(w, pods, base, flavors, free)
    waiting = [
        w
        for w in workloads
        if w.check(check) is not None and (queues is None or w.cluster_queue in queues)
    ]
    waiting.sort(key=lambda w: (-w.priority, w.created or now, w.namespace, w.name))
    out: dict[tuple[str, str], Decision] = {}
    for w in waiting:
        current = [dataclasses.replace(n, used=n.allocatable - free[n.name]) for n in base]
        decision = decide(w, current, flavors, pods, now, check=check,
                          retry_after_s=retry_after_s)  # fmt: skip
        if decision is None:
            continue
        out[(w.namespace, w.name)] = decision
        for node, req in decision.placement:
            free[node] = free[node] - req
    return out


def check_state_body(check: str, decision: Decision) -> dict[str, Any]:
    """Our entry of `status.admissionChecks`, as server-side apply wants it (Kueue's v1beta2
    schema requires `message` and `lastTransitionTime`)."""
    body: dict[str, Any] = {
        "name": check,
        "state": str(decision.state),
        "message": decision.message[:32768],
        "lastTransitionTime": timestamps.rfc3339(decision.since) if decision.since else None,
    }
    if decision.requeue_after_s is not None:
        body["requeueAfterSeconds"] = decision.requeue_after_s
    return {k: v for k, v in body.items() if v is not None}
