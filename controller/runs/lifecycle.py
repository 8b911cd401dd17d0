"""Runs, computed: phase, failure class, queue position, why a run waits, and its evidence.

Purely computational (DESIGN.md section 7): the reconciler reads raw objects from the API
server, turns them into the small views below with the `parse_*` functions, and asks these
functions what the run's state is; `now` is always an argument. No I/O, no clock, no logging.

Phase of one attempt, from Kueue's Workload first and the Job/RayJob and pods second
(anchors 2.2: read state from the Workload conditions, not from the Job alone):

| what is seen | phase |
|---|---|
| Job `Complete`, or RayJob `jobStatus: SUCCEEDED` | Succeeded |
| Job `Failed`/`FailureTarget`, RayJob `FAILED`/`Failed`, or a pod Failed while admitted | Failed |
| Workload `PodsReady`, or a pod Running | Running |
| Workload `Admitted` (quota reserved and every admission check Ready) | Admitted |
| anything else (no Workload yet, quota not reserved, evicted and requeued) | Queued |

A suspended object is never Running or Failed: Kueue preemption suspends the Job, deletes its
pods and later readmits the same Job, so pods ending under a suspension are not a failure.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import enum
import re
from collections.abc import Iterable, Mapping
from typing import Any

from controller import marks, timestamps
from shared import spec as specs


class Phase(enum.StrEnum):
    """Where a run is in its life (DESIGN.md section 7)."""

    PENDING = "Pending"
    QUEUED = "Queued"
    ADMITTED = "Admitted"
    RUNNING = "Running"
    RESUMING = "Resuming"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    CANCELLED = "Cancelled"


TERMINAL_PHASES = frozenset({Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED})
PHASE_ORDER = (Phase.QUEUED, Phase.ADMITTED, Phase.RUNNING, Phase.SUCCEEDED)
"""The happy path; a condition per phase reached is kept on the TauRun."""


class PositionSource(enum.StrEnum):
    """Where a queue position came from (the API response says which)."""

    VISIBILITY = "visibility"
    """Kueue's visibility API (`pendingworkloads`) answered."""
    COMPUTED = "computed"
    """Computed here from the pending Workloads, in Kueue's order."""


# ---------------------------------------------------------------- views of raw objects


@dataclasses.dataclass(frozen=True)
class Condition:
    """One status condition."""

    type: str
    status: str
    reason: str = ""
    message: str = ""
    time: dt.datetime | None = None

    @property
    def true(self) -> bool:
        """Whether the condition holds."""
        return self.status == "True"


def _conditions(raw: Mapping[str, Any]) -> tuple[Condition, ...]:
    return tuple(
        Condition(
            type=str(c["type"]),
            status=str(c.get("status", "")),
            reason=str(c.get("reason") or ""),
            message=str(c.get("message") or ""),
            time=timestamps.parse(c.get("lastTransitionTime")),
        )
        for c in (raw.get("status") or {}).get("conditions") or []
        if isinstance(c, dict) and c.get("type")
    )


def _find(conditions: Iterable[Condition], kind: str) -> Condition | None:
    return next((c for c in conditions if c.type == kind), None)


@dataclasses.dataclass(frozen=True)
class WorkloadView:
    """What we read of a Kueue Workload (`kueue.x-k8s.io/v1beta2`)."""

    name: str
    namespace: str
    owner_kind: str
    owner_name: str
    queue_name: str
    priority: int
    created: dt.datetime | None
    conditions: tuple[Condition, ...] = ()
    cluster_queue: str = ""
    flavors: tuple[tuple[str, str], ...] = ()
    """(resource, flavor) pairs of the admission, over every pod set."""
    pod_sets: tuple[tuple[str, int], ...] = ()
    """(name, count) of each pod set."""
    evictions: tuple[tuple[str, int], ...] = ()
    """(reason, count) from `schedulingStats.evictions`."""
    admission_checks: tuple[tuple[str, str, str], ...] = ()
    """(name, state, message) of each admission check."""
    active: bool = True
    uid: str = ""

    def condition(self, kind: str) -> Condition | None:
        """The condition of the given type, if present."""
        return _find(self.conditions, kind)

    def holds(self, kind: str) -> bool:
        """Whether the condition of the given type is True."""
        c = self.condition(kind)
        return c is not None and c.true

    @property
    def pending(self) -> bool:
        """Waiting for quota: active, not finished, no quota reserved."""
        return self.active and not self.holds("QuotaReserved") and not self.holds("Finished")

    @property
    def queue_order_time(self) -> dt.datetime | None:
        """Kueue's queue-order timestamp: the last eviction for a requeued Workload, else
        its creation (Kueue's default `requeuingStrategy.timestamp: Eviction`)."""
        evicted = self.condition("Evicted")
        if evicted is not None and evicted.true and evicted.time is not None:
            return evicted.time
        return self.created


def parse_workload(raw: Mapping[str, Any]) -> WorkloadView:
    """Read the fields we use from a raw Workload."""
    meta = raw.get("metadata") or {}
    spec = raw.get("spec") or {}
    status = raw.get("status") or {}
    owners = meta.get("ownerReferences") or [{}]
    admission = status.get("admission") or {}
    flavors: list[tuple[str, str]] = []
    for assignment in admission.get("podSetAssignments") or []:
        for resource, flavor in sorted((assignment.get("flavors") or {}).items()):
            if (resource, flavor) not in flavors:
                flavors.append((str(resource), str(flavor)))
    stats = status.get("schedulingStats") or {}
    return WorkloadView(
        name=str(meta.get("name", "")),
        namespace=str(meta.get("namespace", "")),
        uid=str(meta.get("uid", "")),
        owner_kind=str(owners[0].get("kind", "")),
        owner_name=str(owners[0].get("name", "")),
        queue_name=str(spec.get("queueName", "")),
        priority=int(spec.get("priority") or 0),
        created=timestamps.parse(meta.get("creationTimestamp")),
        conditions=_conditions(raw),
        cluster_queue=str(admission.get("clusterQueue", "")),
        flavors=tuple(flavors),
        pod_sets=tuple(
            (str(p.get("name", "")), int(p.get("count") or 0)) for p in spec.get("podSets") or []
        ),
        evictions=tuple(
            (str(e.get("reason", "")), int(e.get("count") or 0))
            for e in stats.get("evictions") or []
        ),
        admission_checks=tuple(
            (str(c.get("name", "")), str(c.get("state", "")), str(c.get("message") or ""))
            for c in status.get("admissionChecks") or []
        ),
        active=spec.get("active", True) is not False,
    )


@dataclasses.dataclass(frozen=True)
class PodView:
    """What we read of one pod of an attempt."""

    name: str
    node: str
    phase: str
    attempt: int | None = None
    index: int | None = None
    """Completion index (Indexed Jobs), else None."""
    exit_codes: tuple[int, ...] = ()
    terminated_reasons: tuple[str, ...] = ()
    disruption: str = ""
    """Reason of the `DisruptionTarget` condition (eviction, preemption, taint), or ''."""
    deleting: bool = False
    started: dt.datetime | None = None
    finished: dt.datetime | None = None
    image: str = ""
    image_id: str = ""
    created: dt.datetime | None = None
    containers: tuple[str, ...] = ()


def parse_pod(raw: Mapping[str, Any]) -> PodView:
    """Read the fields we use from a raw Pod."""
    meta = raw.get("metadata") or {}
    spec = raw.get("spec") or {}
    status = raw.get("status") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    exit_codes: list[int] = []
    reasons: list[str] = []
    finished: list[dt.datetime] = []
    image = image_id = ""
    for cs in status.get("containerStatuses") or []:
        image = image or str(cs.get("image") or "")
        image_id = image_id or str(cs.get("imageID") or "")
        terminated = (cs.get("state") or {}).get("terminated") or (cs.get("lastState") or {}).get(
            "terminated"
        )
        if terminated:
            exit_codes.append(int(terminated.get("exitCode") or 0))
            reasons.append(str(terminated.get("reason") or ""))
            end = timestamps.parse(terminated.get("finishedAt"))
            if end is not None:
                finished.append(end)
    disruption = _find(_conditions(raw), "DisruptionTarget")
    index = annotations.get(marks.JOB_COMPLETION_INDEX_ANNOTATION)
    attempt = labels.get(marks.ATTEMPT_LABEL)
    return PodView(
        name=str(meta.get("name", "")),
        node=str(spec.get("nodeName") or ""),
        phase=str(status.get("phase") or "Pending"),
        attempt=int(attempt) if isinstance(attempt, str) and attempt.isdigit() else None,
        index=int(index) if isinstance(index, str) and index.isdigit() else None,
        exit_codes=tuple(exit_codes),
        terminated_reasons=tuple(reasons),
        disruption=disruption.reason if disruption is not None and disruption.true else "",
        deleting=bool(meta.get("deletionTimestamp")),
        started=timestamps.parse(status.get("startTime")),
        finished=max(finished) if finished else None,
        image=image,
        image_id=image_id,
        created=timestamps.parse(meta.get("creationTimestamp")),
        containers=tuple(str(c.get("name", "")) for c in spec.get("containers") or []),
    )


@dataclasses.dataclass(frozen=True)
class AttemptObjectView:
    """The Job or RayJob of one attempt."""

    kind: str
    name: str
    suspended: bool
    conditions: tuple[Condition, ...] = ()
    created: dt.datetime | None = None
    start: dt.datetime | None = None
    completion: dt.datetime | None = None
    ray_job_status: str = ""
    ray_deployment_status: str = ""
    ray_reason: str = ""
    ray_message: str = ""
    uid: str = ""

    def holds(self, kind: str) -> bool:
        """Whether the condition of the given type is True."""
        c = _find(self.conditions, kind)
        return c is not None and c.true


def parse_attempt_object(raw: Mapping[str, Any]) -> AttemptObjectView:
    """Read a Job (`batch/v1`) or RayJob (`ray.io/v1`)."""
    meta = raw.get("metadata") or {}
    spec = raw.get("spec") or {}
    status = raw.get("status") or {}
    return AttemptObjectView(
        kind=str(raw.get("kind", "Job")),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        suspended=bool(spec.get("suspend")),
        conditions=_conditions(raw),
        created=timestamps.parse(meta.get("creationTimestamp")),
        start=timestamps.parse(status.get("startTime")),
        completion=timestamps.parse(status.get("completionTime") or status.get("endTime")),
        ray_job_status=str(status.get("jobStatus") or ""),
        ray_deployment_status=str(status.get("jobDeploymentStatus") or ""),
        ray_reason=str(status.get("reason") or ""),
        ray_message=str(status.get("message") or ""),
    )


@dataclasses.dataclass(frozen=True)
class NodeFacts:
    """What the classifier must know about nodes: which exist, which we quarantined, and
    on which of those a GPU failed (their pods are lost at once, not at eviction)."""

    existing: frozenset[str]
    quarantined: frozenset[str] = frozenset()
    failed: frozenset[str] = frozenset()
    """Quarantined because a GPU failed (a Failed verdict: Xid 79, a lost GPU...)."""


def node_facts(raw_nodes: Iterable[Mapping[str, Any]]) -> NodeFacts:
    """Build NodeFacts from raw Nodes (quarantined = carries our quarantined-by annotation;
    failed = its quarantine record says a GPU failed)."""
    existing: set[str] = set()
    quarantined: set[str] = set()
    failed: set[str] = set()
    for node in raw_nodes:
        meta = node.get("metadata") or {}
        name = str(meta.get("name", ""))
        existing.add(name)
        annotations = meta.get("annotations") or {}
        if marks.quarantined(annotations):
            quarantined.add(name)
            if marks.quarantine_failed(annotations):
                failed.add(name)
    return NodeFacts(frozenset(existing), frozenset(quarantined), frozenset(failed))


# ---------------------------------------------------------------- one attempt


@dataclasses.dataclass(frozen=True)
class AttemptOutcome:
    """The state of one attempt, as derived from what the API server holds."""

    phase: Phase
    failure_class: specs.FailureClass | None = None
    reason: str = ""
    """PascalCase reason (`Completed`, `OOMKilled`, `QuotaReserved`...)."""
    message: str = ""
    exit_codes: tuple[int, ...] = ()
    nodes: tuple[str, ...] = ()
    started: dt.datetime | None = None
    ended: dt.datetime | None = None


def classify_failure(
    pods: Iterable[PodView], nodes: NodeFacts, *, object_reason: str = ""
) -> tuple[specs.FailureClass, str]:
    """Return the failure class of a failed attempt and a sentence saying why.

    The most specific cause wins, infrastructure before the application: a pod lost with a
    node we quarantined (or a node that vanished) is a NodeFailure even though its container
    exited 143 on SIGTERM; an eviction is Evicted; then OOMKilled; then a non-zero exit code
    is AppError; a deadline is Timeout. Anything else is Unknown (never retried).
    """
    failed = [p for p in pods if p.phase == "Failed" or p.disruption or p.exit_codes]
    lost = [p for p in failed if p.node and (p.node in nodes.quarantined or p.node not in
                                             nodes.existing)]  # fmt: skip
    if lost:
        node = lost[0].node
        why = "was quarantined" if node in nodes.quarantined else "vanished"
        return specs.FailureClass.NODE_FAILURE, f"pod {lost[0].name} was lost: node {node} {why}"
    evicted = [p for p in failed if p.disruption]
    if evicted:
        p = evicted[0]
        return specs.FailureClass.EVICTED, f"pod {p.name} was evicted ({p.disruption})"
    oom = [p for p in failed if "OOMKilled" in p.terminated_reasons]
    if oom:
        return (
            specs.FailureClass.OOM_KILLED,
            f"pod {oom[0].name} ran out of memory (OOMKilled); ask for more resources.memory",
        )
    nonzero = [(p, c) for p in failed for c in p.exit_codes if c != 0]
    if nonzero:
        p, code = nonzero[0]
        return specs.FailureClass.APP_ERROR, f"pod {p.name} exited with code {code}"
    if object_reason in {"DeadlineExceeded", "ActiveDeadlineSecondsExceeded"}:
        return specs.FailureClass.TIMEOUT, "the attempt ran past its deadline"
    detail = f" ({object_reason})" if object_reason else ""
    return specs.FailureClass.UNKNOWN, f"the attempt failed for a reason we cannot tell{detail}"


def attempt_outcome(
    obj: AttemptObjectView | None,
    workload: WorkloadView | None,
    pods: Iterable[PodView],
    nodes: NodeFacts,
) -> AttemptOutcome:
    """Derive the phase of one attempt (the table in the module docstring)."""
    pods = tuple(pods)
    starts = [p.started for p in pods if p.started is not None]
    ends = [p.finished for p in pods if p.finished is not None]
    base = AttemptOutcome(
        Phase.QUEUED,
        reason="Pending",
        exit_codes=tuple(c for p in pods for c in p.exit_codes),
        nodes=tuple(sorted({p.node for p in pods if p.node})),
        started=min(starts) if starts else None,
    )
    if obj is None:
        return dataclasses.replace(base, reason="Creating")
    ended = obj.completion or (max(ends) if ends else None)
    if _succeeded(obj):
        return dataclasses.replace(
            base, phase=Phase.SUCCEEDED, reason="Completed",
            message="the run finished successfully", ended=ended,
        )  # fmt: skip
    failed_pods = [p for p in pods if p.phase == "Failed"]
    object_failed, object_reason = _object_failed(obj)
    admitted = workload is not None and workload.holds("Admitted")
    lost = [p for p in pods if p.node in nodes.failed and p.phase not in {"Succeeded", "Failed"}]
    if lost and not obj.suspended and not object_failed:
        # A GPU under this pod failed: the attempt cannot finish (a collective hangs on the
        # lost rank). End it now rather than after the eviction grace.
        return dataclasses.replace(
            base, phase=Phase.FAILED, failure_class=specs.FailureClass.NODE_FAILURE,
            reason=str(specs.FailureClass.NODE_FAILURE),
            message=f"pod {lost[0].name} was lost: a GPU on node {lost[0].node} failed and the"
            " node was quarantined", ended=ended,
        )  # fmt: skip
    if object_failed or (failed_pods and not obj.suspended and admitted):
        failure, why = classify_failure(pods, nodes, object_reason=object_reason)
        return dataclasses.replace(
            base, phase=Phase.FAILED, failure_class=failure, reason=str(failure), message=why,
            ended=ended,
        )  # fmt: skip
    if not obj.suspended and (
        (workload is not None and workload.holds("PodsReady"))
        or any(p.phase == "Running" and not p.deleting for p in pods)
    ):
        return dataclasses.replace(base, phase=Phase.RUNNING, reason="PodsReady")
    if admitted:
        return dataclasses.replace(base, phase=Phase.ADMITTED, reason="Admitted")
    return base


def _succeeded(obj: AttemptObjectView) -> bool:
    if obj.kind == "RayJob":
        return obj.ray_job_status == "SUCCEEDED" and obj.ray_deployment_status in {
            "Complete",
            "",
        }
    return obj.holds("Complete") or obj.holds("SuccessCriteriaMet")


def _object_failed(obj: AttemptObjectView) -> tuple[bool, str]:
    if obj.kind == "RayJob":
        failed = obj.ray_job_status == "FAILED" or obj.ray_deployment_status == "Failed"
        return failed, obj.ray_reason
    for kind in ("Failed", "FailureTarget"):
        c = _find(obj.conditions, kind)
        if c is not None and c.true:
            return True, c.reason
    return False, ""


# ---------------------------------------------------------------- queue position


@dataclasses.dataclass(frozen=True)
class QueuePosition:
    """Where a pending Workload stands; positions start at 0 (0 = next to be admitted)."""

    in_cluster_queue: int
    in_local_queue: int
    source: PositionSource
    ahead_gpus: int = 0


def kueue_order_key(w: WorkloadView) -> tuple[int, dt.datetime, str]:
    """Kueue's order of pending Workloads: higher priority first, then older queue-order
    timestamp first (`pkg/queue` `queueOrderingFunc`); the name breaks ties."""
    when = w.queue_order_time or dt.datetime.max.replace(tzinfo=dt.UTC)
    return (-w.priority, when, f"{w.namespace}/{w.name}")


def compute_positions(
    pending: Iterable[WorkloadView], local_to_cluster: Mapping[tuple[str, str], str]
) -> dict[tuple[str, str], QueuePosition]:
    """Compute the position of every pending Workload, keyed by (namespace, name).

    `local_to_cluster` maps (namespace, LocalQueue) to its ClusterQueue; Workloads whose
    LocalQueue is unknown have no position.
    """
    by_cq: dict[str, list[WorkloadView]] = {}
    for w in pending:
        if not w.pending:
            continue
        cq = local_to_cluster.get((w.namespace, w.queue_name))
        if cq is not None:
            by_cq.setdefault(cq, []).append(w)
    out: dict[tuple[str, str], QueuePosition] = {}
    for items in by_cq.values():
        items.sort(key=kueue_order_key)
        per_lq: dict[tuple[str, str], int] = {}
        for pos, w in enumerate(items):
            lq = (w.namespace, w.queue_name)
            out[(w.namespace, w.name)] = QueuePosition(
                in_cluster_queue=pos, in_local_queue=per_lq.get(lq, 0),
                source=PositionSource.COMPUTED,
            )  # fmt: skip
            per_lq[lq] = per_lq.get(lq, 0) + 1
    return out


def position_from_visibility(
    items: Iterable[Mapping[str, Any]], namespace: str, workload: str
) -> QueuePosition | None:
    """Find a Workload in a visibility API `pendingworkloads` answer."""
    for item in items:
        meta = item.get("metadata") or {}
        if meta.get("name") == workload and meta.get("namespace", namespace) == namespace:
            return QueuePosition(
                in_cluster_queue=int(item.get("positionInClusterQueue") or 0),
                in_local_queue=int(item.get("positionInLocalQueue") or 0),
                source=PositionSource.VISIBILITY,
            )
    return None


# ---------------------------------------------------------------- why it waits

_QUOTA_RE = re.compile(
    r"insufficient (?:unused )?quota for ([\w./-]+) in flavor ([\w.-]+), (?:request > maximum"
    r" capacity \((\S+) > (\S+)\)|([\d.]+\w*) more needed)"
)

_RESOURCE_WORDS = {marks.GPU_RESOURCE: "GPUs", "cpu": "CPU", "memory": "memory"}


@dataclasses.dataclass(frozen=True)
class WaitContext:
    """What a waiting message may mention."""

    queue: str
    namespace: str
    queue_exists: bool
    cluster_queue: str = ""
    gpus_per_worker: int = 0
    workers: int = 1
    position: QueuePosition | None = None


def waiting_message(ctx: WaitContext, workload: WorkloadView | None) -> str:
    """Say in plain words why a run is not running yet (empty when it is not waiting)."""
    if not ctx.queue_exists:
        return (
            f"queue {ctx.queue!r} does not exist in namespace {ctx.namespace}; set `queue:` to"
            " one that `tau queues` lists, or ask your platform team for one"
        )
    if workload is None:
        return f"submitted to queue {ctx.queue!r}; waiting for Kueue to pick it up"
    asked = ctx.gpus_per_worker * ctx.workers
    ahead = ""
    if ctx.position is not None:
        n = ctx.position.in_cluster_queue
        runs = "run is" if n == 1 else "runs are"
        ahead = f"; {n} {runs} ahead of it" if n else "; it is next in line"
    if not workload.active:
        return "the queue deactivated this run (an admission check rejected it)"
    checks = [(n, s, m) for n, s, m in workload.admission_checks if s != "Ready"]
    if workload.holds("QuotaReserved") and not workload.holds("Admitted"):
        if checks:
            detail = "; ".join(f"{n}: {m or s}" for n, s, m in checks)
            return f"quota reserved; waiting for admission checks ({detail})"
        return "quota reserved; waiting to be admitted"
    if workload.holds("Evicted") and not workload.holds("QuotaReserved"):
        evicted = workload.condition("Evicted")
        why = evicted.reason if evicted is not None else ""
        if why in {"Preempted", "InClusterQueue"}:
            return f"preempted by higher-priority work; waiting to be admitted again{ahead}"
    reserved = workload.condition("QuotaReserved")
    kueue_text = reserved.message if reserved is not None else ""
    match = _QUOTA_RE.search(kueue_text)
    if match is not None:
        resource, flavor = match.group(1), match.group(2)
        words = _RESOURCE_WORDS.get(resource, resource)
        if match.group(3) is not None:
            return (
                f"waiting forever unless the queue grows: it asks for {match.group(3)} {words}"
                f" but queue {ctx.queue!r} can never give more than {match.group(4)}"
                f" (flavor {flavor})"
            )
        need = match.group(5)
        what = f"{asked} GPUs" if resource == marks.GPU_RESOURCE and asked else words
        return (
            f"waiting for quota: queue {ctx.queue!r} has not enough free {words} for the"
            f" {what} this run asks for ({need} more needed in flavor {flavor}){ahead}"
        )
    if reserved is not None and reserved.reason == "Inadmissible":
        return f"queue {ctx.queue!r} cannot admit work right now: {kueue_text}"
    if kueue_text:
        return f"waiting in queue {ctx.queue!r}: {kueue_text}{ahead}"
    return f"waiting in queue {ctx.queue!r}{ahead}"


# ---------------------------------------------------------------- status and evidence


def set_phase_condition(
    conditions: list[dict[str, Any]], phase: Phase, reason: str, message: str, now: dt.datetime
) -> bool:
    """Record that the run reached `phase` (a True condition of that type); keep the first
    time it was reached. Return whether anything changed."""
    for c in conditions:
        if c.get("type") == str(phase):
            if c.get("status") == "True":
                return False
            c.update(
                status="True",
                reason=reason,
                message=message,
                lastTransitionTime=timestamps.rfc3339(now),
            )
            return True
    conditions.append(
        {
            "type": str(phase),
            "status": "True",
            "reason": reason or str(phase),
            "message": message,
            "lastTransitionTime": timestamps.rfc3339(now),
        }
    )
    return True


def attempt_record(
    number: int,
    *,
    object_kind: str,
    object_name: str,
    outcome: AttemptOutcome,
    workload: WorkloadView | None,
    previous: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The wire form of one attempt for `status.attempts[]`, merged over what was recorded
    before (nodes and exit codes survive the pods being garbage-collected)."""
    prev = dict(previous or {})
    record: dict[str, Any] = {
        **prev,
        "number": number,
        "objectKind": object_kind,
        "objectName": object_name,
        "phase": str(outcome.phase),
    }
    if outcome.nodes:
        record["nodes"] = list(outcome.nodes)
    if outcome.exit_codes:
        record["exitCodes"] = list(outcome.exit_codes)
    if outcome.started is not None and not prev.get("startTime"):
        record["startTime"] = timestamps.rfc3339(outcome.started)
    if outcome.ended is not None:
        record["endTime"] = timestamps.rfc3339(outcome.ended)
    if outcome.failure_class is not None:
        record["failureClass"] = str(outcome.failure_class)
        record["message"] = outcome.message
    if workload is not None:
        record["workload"] = workload.name
        if workload.cluster_queue:
            record["clusterQueue"] = workload.cluster_queue
            record["flavors"] = dict(workload.flavors)
        if workload.evictions:
            record["evictions"] = [{"reason": r, "count": n} for r, n in workload.evictions]
    return record


_EVIDENCE_ATTEMPT_KEYS = (
    "number",
    "objectName",
    "nodes",
    "exitCodes",
    "failureClass",
    "startTime",
    "endTime",
)


def evidence(
    spec: specs.TauSpec,
    namespace: str,
    *,
    attempts: Iterable[Mapping[str, Any]],
    pods: Iterable[PodView],
    workload: WorkloadView | None,
    previous: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The evidence record (DESIGN.md section 2): enough to reproduce the run and to see
    where it ran. Values once seen are kept when their source has gone (pods are deleted)."""
    prev = dict(previous or {})
    image_ids = sorted({p.image_id for p in pods if p.image_id})
    attempts = list(attempts)
    nodes = sorted({n for a in attempts for n in a.get("nodes") or []})
    kueue = dict(prev.get("kueue") or {})
    kueue["localQueue"] = spec.queue
    if spec.priority:
        kueue["priorityClass"] = spec.priority
    if workload is not None:
        kueue["workload"] = workload.name
        if workload.cluster_queue:
            kueue["clusterQueue"] = workload.cluster_queue
            kueue["flavors"] = dict(workload.flavors)
        if workload.evictions:
            kueue["evictions"] = [{"reason": r, "count": n} for r, n in workload.evictions]
    out: dict[str, Any] = {
        **prev,
        "specHash": specs.spec_hash(spec),
        "image": spec.image,
        "kind": str(spec.kind),
        "namespace": namespace,
        "kueue": kueue,
        "spec": specs.spec_to_wire(spec),
    }
    if image_ids:
        out["imageID"] = image_ids[0]
    if nodes:
        out["nodes"] = nodes
    if spec.experiment is not None:
        out["experiment"] = spec.experiment.model_dump(mode="json", by_alias=True,
                                                       exclude_none=True)  # fmt: skip
    out["attempts"] = [{k: a[k] for k in _EVIDENCE_ATTEMPT_KEYS if k in a} for a in attempts]
    return out


def resume_refusal(name: str, phase: str) -> str:
    """Why a run in `phase` cannot be resumed by hand ('' when it can: Failed or Cancelled)."""
    if phase in {Phase.FAILED, Phase.CANCELLED}:
        return ""
    hint = "" if phase in TERMINAL_PHASES else " (cancel it first to restart it)"
    return f"run {name!r} is {phase}; only a Failed or Cancelled run can be resumed{hint}"


def reopened(status: Mapping[str, Any], *, by: str, now: dt.datetime) -> dict[str, Any]:
    """A copy of an ended run's status, reopened for a manual resume: the end conditions
    turn False (reason Resumed, who and when), the end time and the TTL clean-up are
    forgotten, and `retry.maxAttempts` counts afresh from the current attempt."""
    out = copy.deepcopy(dict(status))
    out.setdefault("conditions", [])
    out.setdefault("attempts", [])
    ended = {str(p) for p in TERMINAL_PHASES}
    for c in out["conditions"]:
        if c.get("type") in ended:
            c.update(status="False", reason="Resumed", lastTransitionTime=timestamps.rfc3339(now),
                     message=f"resumed by {by}")  # fmt: skip
    out.update(attemptBudgetFrom=int(out.get("currentAttempt") or 0), endTime=None,
               objectsDeleted=None)  # fmt: skip
    return out


def should_retry(
    spec: specs.TauSpec, failure: specs.FailureClass, attempt: int, *, budget_from: int = 0
) -> bool:
    """Whether the controller starts another attempt after `attempt` failed with `failure`.

    `maxAttempts` counts the attempts since `budget_from` (the attempt a person resumed
    after: a manual resume grants a fresh budget). Unknown is never retried.
    """
    if failure == specs.FailureClass.UNKNOWN:
        return False
    return str(failure) in spec.retry.when and attempt - budget_from < spec.retry.max_attempts


MAX_BACKOFF_S = 3600.0
"""The longest wait between two attempts, however many have failed."""


def retry_backoff_s(spec: specs.TauSpec, retries_so_far: int) -> float:
    """The wait before the next attempt: `retry.backoff`, doubled for each retry already made
    (`backoff`, 2×, 4×...), capped at an hour. 0 stays 0: a node failure is not the run's
    fault and it resumes at once."""
    base = float(spec.retry.backoff_s)
    if base <= 0:
        return 0.0
    return min(base * 2.0 ** max(retries_so_far, 0), MAX_BACKOFF_S)


INFRASTRUCTURE_FAILURES = frozenset({specs.FailureClass.NODE_FAILURE, specs.FailureClass.EVICTED})
"""Failures that are not the run's fault: its next attempt keeps its place in line."""


def resume_priority_class(
    spec: specs.TauSpec, failure: str, resume_class: str | None
) -> str | None:
    """The WorkloadPriorityClass of the next attempt, or None for the run's own.

    A new attempt is a new Workload, which Kueue would queue behind everything submitted
    since the run first started. After an infrastructure failure (NodeFailure, Evicted) the
    next attempt of a run in the default band (no `priority`) gets `resume_class`, one step
    above that band, so it goes ahead of its peers. Runs with a priority class of their own
    keep it: they already stand ahead of the default band, and a bump could make them
    preempt work at their own level. Failures of the run's own making (AppError, OOMKilled,
    Timeout) queue normally.
    """
    if not resume_class or spec.priority is not None:
        return None
    if failure not in {str(f) for f in INFRASTRUCTURE_FAILURES}:
        return None
    return resume_class


def timed_out(spec: specs.TauSpec, first_start: dt.datetime | None, now: dt.datetime) -> bool:
    """Whether the run's wall-clock `timeout` (measured from its first pod start) has passed."""
    limit = spec.timeout_s
    if limit is None or first_start is None:
        return False
    return (now - first_start).total_seconds() > limit


def ttl_expired(ended: dt.datetime | None, ttl_s: float | None, now: dt.datetime) -> bool:
    """Whether a finished run's objects may be deleted (its TauRun and evidence stay)."""
    if ended is None or ttl_s is None:
        return False
    return (now - ended).total_seconds() >= ttl_s
