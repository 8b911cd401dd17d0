"""What happened to an attempt: its phase, outcome and failure class, its record and evidence.

Purely computational (DESIGN.md section 7): the reconciler reads raw objects from the API
server, turns them into small views (`controller.runs.views`), and asks these functions what
happened to the current attempt; what to do about it is `controller.runs.policy`'s. `now` is
always an argument. No I/O, no clock, no logging.

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

import dataclasses
import datetime as dt
from collections.abc import Iterable
from typing import Any

from controller import marks
from controller.runs import records, views
from shared import spec as specs

Phase = records.Phase

TERMINAL_PHASES = frozenset({Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED})


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
    pods: Iterable[views.PodView],
    nodes: views.NodeFacts,
    *,
    object_reason: str = "",
    recorded_nodes: Iterable[str] = (),
) -> tuple[specs.FailureClass, str]:
    """Return the failure class of a failed attempt and a sentence saying why.

    The most specific cause wins, infrastructure before the application: a pod lost with a
    node we quarantined (or a node that vanished) is a NodeFailure even though its container
    exited 143 on SIGTERM, and so is a pod kube-controller-manager deleted because a GPU it
    held got a NoExecute device taint (`DeletionByDeviceTaintManager`: device quarantine is
    node failure at the scale of one GPU); an eviction is Evicted; then OOMKilled; then a
    non-zero exit code is AppError; a deadline is Timeout. Anything else is Unknown (never
    retried).

    A real kubelet removes an evicted pod within a second of its exit, often before a pass
    sees it Failed: with no failed pod left to read, the nodes the attempt was recorded on
    decide (`recorded_nodes`, kept in `status.attempts[]`): one we quarantined, or one gone,
    makes it a NodeFailure, as its pod would have.
    """
    pods = tuple(pods)
    failed = [p for p in pods if p.phase == "Failed" or p.disruption or p.exit_codes]
    gone = sorted(n for n in set(recorded_nodes) if nodes.lost(n)) if not failed else []
    if gone:
        why = f"the attempt's pods are gone and its node {gone[0]} {nodes.lost(gone[0])}"
        return specs.FailureClass.NODE_FAILURE, why
    lost = [p for p in failed if p.node and nodes.lost(p.node)]
    if lost:
        pod = lost[0]
        why = f"pod {pod.name} was lost: node {pod.node} {nodes.lost(pod.node)}"
        return specs.FailureClass.NODE_FAILURE, why
    fenced = [p for p in failed if p.disruption == marks.DEVICE_TAINT_DELETION_REASON]
    if fenced:
        p = fenced[0]
        where = f" on node {p.node}" if p.node else ""
        why = (
            f"pod {p.name} was lost: a GPU it held{where} was fenced with a NoExecute device "
            f"taint ({marks.DEVICE_TAINT_DELETION_REASON})"
        )
        return specs.FailureClass.NODE_FAILURE, why
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
    obj: views.AttemptObjectView | None,
    workload: views.WorkloadView | None,
    pods: Iterable[views.PodView],
    nodes: views.NodeFacts,
    *,
    recorded_nodes: Iterable[str] = (),
) -> AttemptOutcome:
    """Derive the phase of one attempt (the table in the module docstring); `recorded_nodes`
    are the nodes its pods were seen on before (they may be gone now)."""
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
        failure, why = classify_failure(
            pods, nodes, object_reason=object_reason, recorded_nodes=recorded_nodes
        )
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


def _succeeded(obj: views.AttemptObjectView) -> bool:
    if obj.kind == "RayJob":
        return obj.ray_job_status == "SUCCEEDED" and obj.ray_deployment_status in {
            "Complete",
            "",
        }
    return obj.holds("Complete") or obj.holds("SuccessCriteriaMet")


def _object_failed(obj: views.AttemptObjectView) -> tuple[bool, str]:
    if obj.kind == "RayJob":
        failed = obj.ray_job_status == "FAILED" or obj.ray_deployment_status == "Failed"
        return failed, obj.ray_reason
    for kind in ("Failed", "FailureTarget"):
        c = views.find_condition(obj.conditions, kind)
        if c is not None and c.true:
            return True, c.reason
    return False, ""


# ---------------------------------------------------------------- record and evidence


def _workload_fields(workload: views.WorkloadView) -> dict[str, Any]:
    """What an attempt record and the evidence keep of a Workload: its name, and its cluster
    queue and flavors once admitted, and its evictions when it had any."""
    out: dict[str, Any] = {"workload": workload.name}
    if workload.cluster_queue:
        out["cluster_queue"] = workload.cluster_queue
        out["flavors"] = dict(workload.flavors)
    if workload.evictions:
        out["evictions"] = tuple(records.Eviction(reason=r, count=n) for r, n in workload.evictions)
    return out


def attempt_record(
    number: int,
    *,
    object_kind: str,
    object_name: str,
    outcome: AttemptOutcome,
    workload: views.WorkloadView | None,
    previous: records.AttemptRecord | None = None,
) -> records.AttemptRecord:
    """One attempt for `status.attempts[]`, merged over what was recorded before (nodes and
    exit codes survive the pods being garbage-collected)."""
    prev = previous or records.AttemptRecord(number=number)
    update: dict[str, Any] = {
        "number": number,
        "object_kind": object_kind,
        "object_name": object_name,
        "phase": outcome.phase,
    }
    if outcome.nodes:
        update["nodes"] = outcome.nodes
    if outcome.exit_codes:
        update["exit_codes"] = outcome.exit_codes
    if outcome.started is not None and prev.start_time is None:
        update["start_time"] = outcome.started
    if outcome.ended is not None:
        update["end_time"] = outcome.ended
    if outcome.failure_class is not None:
        update["failure_class"] = str(outcome.failure_class)
        update["message"] = outcome.message
    if workload is not None:
        update.update(_workload_fields(workload))
    return prev.model_copy(update=update)


def evidence(
    spec: specs.TauSpec,
    namespace: str,
    *,
    attempts: Iterable[records.AttemptRecord],
    pods: Iterable[views.PodView],
    workload: views.WorkloadView | None,
    previous: records.Evidence | None = None,
    rerun_of: records.RerunSource | None = None,
) -> records.Evidence:
    """The evidence record (DESIGN.md section 2): enough to reproduce the run and to see
    where it ran. Values once seen are kept when their source has gone (pods are deleted)."""
    prev = previous or records.Evidence()
    image_ids = sorted({p.image_id for p in pods if p.image_id})
    attempts = tuple(attempts)
    nodes = tuple(sorted({n for a in attempts for n in a.nodes}))
    kueue: dict[str, Any] = {"local_queue": spec.queue}
    if spec.priority:
        kueue["priority_class"] = spec.priority
    if workload is not None:
        kueue.update(_workload_fields(workload))
    update: dict[str, Any] = {
        "spec_hash": specs.spec_hash(spec),
        "image": spec.image,
        "kind": str(spec.kind),
        "namespace": namespace,
        "kueue": prev.kueue.model_copy(update=kueue),
        "spec": specs.spec_to_wire(spec),
        "attempts": tuple(
            records.EvidenceAttempt.model_validate(a, from_attributes=True) for a in attempts
        ),
    }
    if image_ids:
        update["image_id"] = image_ids[0]
    if nodes:
        update["nodes"] = nodes
    if spec.experiment is not None:
        update["experiment"] = spec.experiment.model_dump(
            mode="json", by_alias=True, exclude_none=True
        )
    if rerun_of is not None:
        update["rerun_of"] = rerun_of
    return prev.model_copy(update=update)
