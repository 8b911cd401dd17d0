"""What the run reconciler reads, as small frozen views: Workloads, pods, attempt objects.

The `parse_*` functions turn the raw objects the run store lists into the values the pure
run core (`controller.runs.outcomes`, `controller.runs.positions`) decides over; each reads
only the fields it needs, and a missing field is an absence, never an error.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any

from controller import marks, timestamps

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


def find_condition(conditions: Iterable[Condition], kind: str) -> Condition | None:
    """The condition of type `kind`, None when there is none."""
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
    evictions: tuple[tuple[str, int], ...] = ()
    """(reason, count) from `schedulingStats.evictions`."""
    admission_checks: tuple[tuple[str, str, str], ...] = ()
    """(name, state, message) of each admission check."""
    active: bool = True
    requeue_at: dt.datetime | None = None
    """`status.requeueState.requeueAt`: when Kueue queues it again after a backoff."""
    requeue_count: int = 0
    """`status.requeueState.count`: how often Kueue evicted and requeued it (waitForPodsReady)."""
    uid: str = ""
    """`metadata.uid`: Kueue's last tie-break between Workloads of one priority and second."""

    def condition(self, kind: str) -> Condition | None:
        """The condition of the given type, if present."""
        return find_condition(self.conditions, kind)

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
    flavors = dict.fromkeys(
        (str(resource), str(flavor))
        for assignment in admission.get("podSetAssignments") or []
        for resource, flavor in sorted((assignment.get("flavors") or {}).items())
    )
    stats = status.get("schedulingStats") or {}
    requeue = status.get("requeueState") or {}
    return WorkloadView(
        uid=str(meta.get("uid", "")),
        name=str(meta.get("name", "")),
        namespace=str(meta.get("namespace", "")),
        owner_kind=str(owners[0].get("kind", "")),
        owner_name=str(owners[0].get("name", "")),
        queue_name=str(spec.get("queueName", "")),
        priority=int(spec.get("priority") or 0),
        created=timestamps.parse(meta.get("creationTimestamp")),
        conditions=_conditions(raw),
        cluster_queue=str(admission.get("clusterQueue", "")),
        flavors=tuple(flavors),
        evictions=tuple(
            (str(e.get("reason", "")), int(e.get("count") or 0))
            for e in stats.get("evictions") or []
        ),
        admission_checks=tuple(
            (str(c.get("name", "")), str(c.get("state", "")), str(c.get("message") or ""))
            for c in status.get("admissionChecks") or []
        ),
        active=spec.get("active", True) is not False,
        requeue_at=timestamps.parse(requeue.get("requeueAt")),
        requeue_count=int(requeue.get("count") or 0),
    )


@dataclasses.dataclass(frozen=True)
class PodView:
    """What we read of one pod of an attempt."""

    name: str
    node: str
    phase: str
    index: int | None = None
    """Completion index (Indexed Jobs), else None."""
    exit_codes: tuple[int, ...] = ()
    terminated_reasons: tuple[str, ...] = ()
    disruption: str = ""
    """Reason of the `DisruptionTarget` condition (eviction, preemption, taint), or ''."""
    deleting: bool = False
    started: dt.datetime | None = None
    finished: dt.datetime | None = None
    image_id: str = ""
    created: dt.datetime | None = None
    containers: tuple[str, ...] = ()
    unschedulable: str = ""
    """The scheduler's word when it cannot place the pod (`PodScheduled` False), e.g.
    `0/4 nodes are available: persistentvolumeclaim "datasets" not found.`; '' otherwise."""
    waiting: tuple[tuple[str, str, str], ...] = ()
    """(container, reason, message) of each container (init containers first) that waits
    to start: `ErrImagePull`, `ImagePullBackOff`, `CreateContainerConfigError`..."""


def parse_pod(raw: Mapping[str, Any]) -> PodView:
    """Read the fields we use from a raw Pod."""
    meta = raw.get("metadata") or {}
    spec = raw.get("spec") or {}
    status = raw.get("status") or {}
    annotations = meta.get("annotations") or {}
    statuses = status.get("containerStatuses") or []
    terminated = [
        t
        for cs in statuses
        if (t := (cs.get("state") or {}).get("terminated"))
        or (t := (cs.get("lastState") or {}).get("terminated"))
    ]
    finished = [e for t in terminated if (e := timestamps.parse(t.get("finishedAt"))) is not None]
    conditions = _conditions(raw)
    disruption = find_condition(conditions, "DisruptionTarget")
    scheduled = find_condition(conditions, "PodScheduled")
    unschedulable = ""
    if scheduled is not None and scheduled.status == "False":
        unschedulable = scheduled.message or scheduled.reason or "not scheduled yet"
    waiting = tuple(
        (str(cs.get("name") or ""), str(w.get("reason") or ""), str(w.get("message") or ""))
        for cs in [*(status.get("initContainerStatuses") or []),
                   *(status.get("containerStatuses") or [])]
        if isinstance(cs, dict) and (w := (cs.get("state") or {}).get("waiting")) is not None
    )  # fmt: skip
    index = annotations.get(marks.JOB_COMPLETION_INDEX_ANNOTATION)
    return PodView(
        name=str(meta.get("name", "")),
        node=str(spec.get("nodeName") or ""),
        phase=str(status.get("phase") or "Pending"),
        index=int(index) if isinstance(index, str) and index.isdigit() else None,
        exit_codes=tuple(int(t.get("exitCode") or 0) for t in terminated),
        terminated_reasons=tuple(str(t.get("reason") or "") for t in terminated),
        disruption=disruption.reason if disruption is not None and disruption.true else "",
        deleting=bool(meta.get("deletionTimestamp")),
        started=timestamps.parse(status.get("startTime")),
        finished=max(finished) if finished else None,
        image_id=next((str(cs["imageID"]) for cs in statuses if cs.get("imageID")), ""),
        created=timestamps.parse(meta.get("creationTimestamp")),
        containers=tuple(str(c.get("name", "")) for c in spec.get("containers") or []),
        unschedulable=unschedulable,
        waiting=waiting,
    )


@dataclasses.dataclass(frozen=True)
class AttemptObjectView:
    """The Job or RayJob of one attempt."""

    kind: str
    name: str
    suspended: bool
    conditions: tuple[Condition, ...] = ()
    completion: dt.datetime | None = None
    ray_job_status: str = ""
    ray_deployment_status: str = ""
    ray_reason: str = ""

    def holds(self, kind: str) -> bool:
        """Whether the condition of the given type is True."""
        c = find_condition(self.conditions, kind)
        return c is not None and c.true


def parse_attempt_object(raw: Mapping[str, Any]) -> AttemptObjectView:
    """Read a Job (`batch/v1`) or RayJob (`ray.io/v1`)."""
    meta = raw.get("metadata") or {}
    spec = raw.get("spec") or {}
    status = raw.get("status") or {}
    return AttemptObjectView(
        kind=str(raw.get("kind", "Job")),
        name=str(meta.get("name", "")),
        suspended=bool(spec.get("suspend")),
        conditions=_conditions(raw),
        completion=timestamps.parse(status.get("completionTime") or status.get("endTime")),
        ray_job_status=str(status.get("jobStatus") or ""),
        ray_deployment_status=str(status.get("jobDeploymentStatus") or ""),
        ray_reason=str(status.get("reason") or ""),
    )


@dataclasses.dataclass(frozen=True)
class NodeFacts:
    """What the classifier must know about nodes: which exist, which we quarantined, and
    on which of those a GPU failed (their pods are lost at once, not at eviction)."""

    existing: frozenset[str]
    quarantined: frozenset[str] = frozenset()
    failed: frozenset[str] = frozenset()
    """Quarantined because a GPU failed (a Failed verdict: Xid 79, a lost GPU...)."""

    def lost(self, node: str) -> str:
        """How a run lost `node`: 'was quarantined' or 'vanished' ('' when it did not)."""
        if node in self.quarantined:
            return "was quarantined"
        return "" if node in self.existing else "vanished"


def node_facts(raw_nodes: Iterable[Mapping[str, Any]]) -> NodeFacts:
    """Build NodeFacts from raw Nodes (quarantined = carries our quarantined-by annotation;
    failed = its quarantine record says a GPU failed)."""
    metas = [node.get("metadata") or {} for node in raw_nodes]
    notes = {str(m.get("name", "")): m.get("annotations") or {} for m in metas}
    quarantined = frozenset(n for n, a in notes.items() if marks.quarantined(a))
    failed = frozenset(n for n in quarantined if marks.quarantine_failed(notes[n]))
    return NodeFacts(frozenset(notes), quarantined, failed)
