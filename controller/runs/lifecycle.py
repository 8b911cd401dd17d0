"""Runs, computed: phases, an attempt's outcome and failure class, retries, and evidence.

Purely computational (DESIGN.md section 7): the reconciler reads raw objects from the API
server, turns them into small views (`controller.runs.views`), and asks these functions what
the run's state is; `now` is always an argument. No I/O, no clock, no logging.

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
PHASE_ORDER = (Phase.QUEUED, Phase.ADMITTED, Phase.RUNNING, Phase.SUCCEEDED)
"""The happy path; a condition per phase reached is kept on the TauRun."""


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
    if not failed:
        gone = sorted(
            n for n in set(recorded_nodes) if n in nodes.quarantined or n not in nodes.existing
        )
        if gone:
            why = "was quarantined" if gone[0] in nodes.quarantined else "vanished"
            return (
                specs.FailureClass.NODE_FAILURE,
                f"the attempt's pods are gone and its node {gone[0]} {why}",
            )
    lost = [p for p in failed if p.node and (p.node in nodes.quarantined or p.node not in
                                             nodes.existing)]  # fmt: skip
    if lost:
        node = lost[0].node
        why = "was quarantined" if node in nodes.quarantined else "vanished"
        return specs.FailureClass.NODE_FAILURE, f"pod {lost[0].name} was lost: node {node} {why}"
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


# ---------------------------------------------------------------- status and evidence


def set_phase_condition(
    conditions: tuple[records.Condition, ...],
    phase: Phase,
    reason: str,
    message: str,
    now: dt.datetime,
) -> tuple[tuple[records.Condition, ...], bool]:
    """Record that the run reached `phase` (a True condition of that type), keeping the
    first time it was reached. Return the conditions and whether anything changed."""
    for i, c in enumerate(conditions):
        if c.type == str(phase):
            if c.status == "True":
                return conditions, False
            changed = c.model_copy(
                update={"status": "True", "reason": reason, "message": message,
                        "last_transition_time": now}
            )  # fmt: skip
            return (*conditions[:i], changed, *conditions[i + 1 :]), True
    added = records.Condition(
        type=str(phase), status="True", reason=reason or str(phase), message=message,
        last_transition_time=now,
    )  # fmt: skip
    return (*conditions, added), True


def with_phase_condition(
    status: records.RunStatus, phase: Phase, reason: str, message: str, now: dt.datetime
) -> records.RunStatus:
    """The status with `set_phase_condition` applied."""
    conditions, _ = set_phase_condition(status.conditions, phase, reason, message, now)
    return status.model_copy(update={"conditions": conditions})


def _evictions(workload: views.WorkloadView) -> tuple[records.Eviction, ...]:
    return tuple(records.Eviction(reason=r, count=n) for r, n in workload.evictions)


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
        update["workload"] = workload.name
        if workload.cluster_queue:
            update["cluster_queue"] = workload.cluster_queue
            update["flavors"] = dict(workload.flavors)
        if workload.evictions:
            update["evictions"] = _evictions(workload)
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
        kueue["workload"] = workload.name
        if workload.cluster_queue:
            kueue["cluster_queue"] = workload.cluster_queue
            kueue["flavors"] = dict(workload.flavors)
        if workload.evictions:
            kueue["evictions"] = _evictions(workload)
    update: dict[str, Any] = {
        "spec_hash": specs.spec_hash(spec),
        "image": spec.image,
        "kind": str(spec.kind),
        "namespace": namespace,
        "kueue": prev.kueue.model_copy(update=kueue),
        "spec": specs.spec_to_wire(spec),
        "attempts": tuple(
            records.EvidenceAttempt(
                number=a.number, object_name=a.object_name, nodes=a.nodes,
                exit_codes=a.exit_codes, failure_class=a.failure_class,
                start_time=a.start_time, end_time=a.end_time,
            )
            for a in attempts
        ),
    }  # fmt: skip
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


def resume_refusal(name: str, phase: str) -> str:
    """Why a run in `phase` cannot be resumed by hand ('' when it can: Failed or Cancelled)."""
    if phase in {Phase.FAILED, Phase.CANCELLED}:
        return ""
    hint = "" if phase in TERMINAL_PHASES else " (cancel it first to restart it)"
    return f"run {name!r} is {phase}; only a Failed or Cancelled run can be resumed{hint}"


def reopened(status: records.RunStatus, *, by: str, now: dt.datetime) -> records.RunStatus:
    """An ended run's status, reopened for a manual resume: the end conditions turn False
    (reason Resumed, who and when), the end time and the TTL clean-up are forgotten, and
    `retry.maxAttempts` counts afresh from the current attempt."""
    ended = {str(p) for p in TERMINAL_PHASES}
    conditions = tuple(
        c.model_copy(update={"status": "False", "reason": "Resumed", "last_transition_time": now,
                             "message": f"resumed by {by}"})
        if c.type in ended else c
        for c in status.conditions
    )  # fmt: skip
    return status.model_copy(
        update={"conditions": conditions, "attempt_budget_from": status.current_attempt,
                "end_time": None, "objects_deleted": None}
    )  # fmt: skip


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


def final_message(
    spec: specs.TauSpec, failure: specs.FailureClass, attempt: int, budget_from: int, why: str
) -> str:
    """Say why a failed attempt ends the run: which policy decided it, in words."""
    if failure == specs.FailureClass.UNKNOWN:
        tail = "an Unknown failure is never retried"
    elif str(failure) not in spec.retry.when:
        tail = f"{failure} is not in retry.when ({', '.join(spec.retry.when)})"
    else:
        tail = f"all {attempt - budget_from} of retry.maxAttempts={spec.retry.max_attempts} used"
    return f"attempt {attempt} failed ({why}); not retried: {tail}"


def end(
    status: records.RunStatus,
    phase: Phase,
    reason: str,
    message: str,
    *,
    now: dt.datetime,
    ended: dt.datetime | None = None,
) -> records.RunStatus:
    """End the run: phase, reason and message, its end time, no place in line, and the
    condition of its final phase."""
    closed = status.model_copy(
        update={"phase": phase, "reason": reason, "message": message,
                "end_time": status.end_time or ended or now, "queue_position": None,
                "queue_position_in_local_queue": None, "queue_position_source": None}
    )  # fmt: skip
    return with_phase_condition(closed, phase, reason, message, ended or now)


def phase_conditions(
    status: records.RunStatus,
    outcome: AttemptOutcome,
    workload: views.WorkloadView | None,
    now: dt.datetime,
) -> tuple[records.RunStatus, float | None]:
    """Keep one condition per phase reached, at the time Kueue or the pods say so; also
    return the seconds the run waited in line when it was admitted just now (else None)."""
    waited = None
    conds = status.conditions
    if workload is not None and workload.holds("Admitted"):
        admitted = workload.condition("Admitted")
        at = admitted.time if admitted is not None and admitted.time else now
        message = f"admitted by cluster queue {workload.cluster_queue}"
        conds, changed = set_phase_condition(conds, Phase.ADMITTED, "Admitted", message, at)
        if changed:
            queued = next((c.last_transition_time for c in conds if c.type == "Queued"), None)
            if queued is not None:
                waited = max((at - queued).total_seconds(), 0)
    if outcome.phase in {Phase.RUNNING, Phase.SUCCEEDED}:
        ready = workload.condition("PodsReady") if workload is not None else None
        running_at = ready.time if ready is not None and ready.true else None
        conds, _ = set_phase_condition(
            conds, Phase.RUNNING, "PodsReady", "", running_at or outcome.started or now
        )
    return status.model_copy(update={"conditions": conds}), waited
