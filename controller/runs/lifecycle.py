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

import copy
import dataclasses
import datetime as dt
import enum
from collections.abc import Iterable, Mapping
from typing import Any

from controller import timestamps
from controller.runs import views
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
    pods: Iterable[views.PodView], nodes: views.NodeFacts, *, object_reason: str = ""
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
    obj: views.AttemptObjectView | None,
    workload: views.WorkloadView | None,
    pods: Iterable[views.PodView],
    nodes: views.NodeFacts,
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
    workload: views.WorkloadView | None,
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
    pods: Iterable[views.PodView],
    workload: views.WorkloadView | None,
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
    status: dict[str, Any],
    phase: Phase,
    reason: str,
    message: str,
    *,
    now: dt.datetime,
    ended: dt.datetime | None = None,
) -> None:
    """End the run: phase, reason and message, its end time, no place in line, and the
    condition of its final phase."""
    status.update(phase=phase, reason=reason, message=message,
                  endTime=status.get("endTime") or timestamps.rfc3339(ended or now),
                  queuePosition=None, queuePositionInLocalQueue=None,
                  queuePositionSource=None)  # fmt: skip
    set_phase_condition(status["conditions"], phase, reason, message, ended or now)


def phase_conditions(
    status: dict[str, Any],
    outcome: AttemptOutcome,
    workload: views.WorkloadView | None,
    now: dt.datetime,
) -> float | None:
    """Keep one condition per phase reached, at the time Kueue or the pods say so; return
    the seconds the run waited in line when it was admitted just now (None otherwise)."""
    waited = None
    conds = status["conditions"]
    if workload is not None and workload.holds("Admitted"):
        admitted = workload.condition("Admitted")
        at = admitted.time if admitted is not None and admitted.time else now
        message = f"admitted by cluster queue {workload.cluster_queue}"
        if set_phase_condition(conds, Phase.ADMITTED, "Admitted", message, at):
            queued = timestamps.parse(
                next((c.get("lastTransitionTime") for c in conds if c["type"] == "Queued"), None)
            )
            if queued is not None:
                waited = max((at - queued).total_seconds(), 0)
    if outcome.phase in {Phase.RUNNING, Phase.SUCCEEDED}:
        ready = workload.condition("PodsReady") if workload is not None else None
        running_at = ready.time if ready is not None and ready.true else None
        set_phase_condition(
            conds, Phase.RUNNING, "PodsReady", "", running_at or outcome.started or now
        )
    return waited
