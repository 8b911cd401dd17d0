"""The run decision step: from what the reconciler read to what it must write (pure).

`decide_run(run, settings, now) -> plans.RunPlan` is the runs domain's `decide`, like the
quarantine policy's and the admission gate's: the reconciler reads everything one run needs
into a `RunInput` (the TauRun, its current attempt's object, Workload and pods, the nodes
they are on, its place in line, what the gate says), asks this function, and carries out the
plan in order: annotations, then deletes, then creates, then the status. Nothing here awaits,
logs or reads a clock, and the same input always gives the same plan, however the reconciler
was woken (level-triggered: an event and a timer tick decide alike).

The phases and failure classes are DESIGN.md section 7's: `outcomes` says what happened to an
attempt, and every transition of the run is here. An attempt that failed is ended by the
controller (its object deleted) before the next one is created, so two attempts never run at
once.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from controller import errors, marks, timestamps
from controller.runs import (
    checkpoints,
    networks,
    objects,
    outcomes,
    plans,
    positions,
    records,
    rendering,
    retries,
    views,
)
from shared import spec as specs

Phase = records.Phase


# ---------------------------------------------------------------- transitions


def resume_refusal(name: str, phase: str) -> str:
    """Why a run in `phase` cannot be resumed by hand ('' when it can: Failed or Cancelled)."""
    if phase in {Phase.FAILED, Phase.CANCELLED}:
        return ""
    hint = "" if phase in outcomes.TERMINAL_PHASES else " (cancel it first to restart it)"
    return f"run {name!r} is {phase}; only a Failed or Cancelled run can be resumed{hint}"


def reopened(status: records.RunStatus, *, by: str, now: dt.datetime) -> records.RunStatus:
    """An ended run's status, reopened for a manual resume: the end conditions turn False
    (reason Resumed, who and when), the end time and the TTL clean-up are forgotten, and
    `retry.maxAttempts` counts afresh from the current attempt."""
    ended = {str(p) for p in outcomes.TERMINAL_PHASES}
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


def timed_out(spec: specs.TauSpec, first_start: dt.datetime | None, now: dt.datetime) -> bool:
    """Whether the run's wall-clock `timeout` (measured from its first pod start) has passed."""
    at = _timeout_at(spec, first_start)
    return at is not None and now > at


def ttl_expired(ended: dt.datetime | None, ttl_s: float | None, now: dt.datetime) -> bool:
    """Whether a finished run's objects may be deleted (its TauRun and evidence stay)."""
    if ended is None or ttl_s is None:
        return False
    return (now - ended).total_seconds() >= ttl_s


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
    return records.with_phase_condition(closed, phase, reason, message, ended or now)


def phase_conditions(
    status: records.RunStatus,
    outcome: outcomes.AttemptOutcome,
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
        conds, changed = records.set_phase_condition(conds, Phase.ADMITTED, "Admitted", message, at)
        if changed:
            queued = next((c.last_transition_time for c in conds if c.type == "Queued"), None)
            if queued is not None:
                waited = max((at - queued).total_seconds(), 0)
    if outcome.phase in {Phase.RUNNING, Phase.SUCCEEDED}:
        ready = workload.condition("PodsReady") if workload is not None else None
        running_at = ready.time if ready is not None and ready.true else None
        conds, _ = records.set_phase_condition(
            conds, Phase.RUNNING, "PodsReady", "", running_at or outcome.started or now
        )
    return status.model_copy(update={"conditions": conds}), waited


# ---------------------------------------------------------------- the decision


def attempt_kind(spec: specs.TauSpec) -> str:
    """The kind of an attempt's object."""
    return "RayJob" if spec.kind == specs.RunKind.RAY else "Job"


def decide_run(run: plans.RunInput, settings: plans.RunSettings, now: dt.datetime) -> plans.RunPlan:
    """Decide one step of one run (see the module docstring)."""
    return _keeping_logs(
        _held_to_priority(run, _decide(run, settings, now), settings, now), run.ref
    )


def _held_to_priority(
    run: plans.RunInput, plan: plans.RunPlan, settings: plans.RunSettings, now: dt.datetime
) -> plans.RunPlan:
    """The plan, unless it starts a later attempt of a spec whose priority class is not
    allowed (changed since attempt 1, or the allowlist was): then the run ends Failed
    `PriorityNotAllowed` and nothing is rendered. A running attempt is left to finish."""
    if not plan.started or min(plan.started) <= 1:
        return plan  # attempt 1 was checked before it was planned (`_decide`)
    spec = specs.validate_spec(dict(run.spec)).spec
    refusal = priority_refusal(spec, settings)
    if not refusal:
        return plan
    before = plan.status.model_copy(
        update={"attempts": tuple(a for a in plan.status.attempts if a.number not in plan.started),
                "current_attempt": min(plan.started) - 1}
    )  # fmt: skip
    status = refused(before, "PriorityNotAllowed", refusal, now)
    return dataclasses.replace(plan, status=status, creates=(), started=())


def steady(run: plans.RunInput, plan: plans.RunPlan) -> bool:
    """Whether the plan writes nothing and counts nothing (`queue_wait_s` comes only with the
    Admitted condition it writes). Then until `plan.requeue_at` (None: never) the same input
    decides the same plan again: `requeue_at` is the earliest time any part of the decision
    reads the clock differently (a timeout, a retry's backoff, a TTL, Kueue's
    waitForPodsReady deadline or requeue time in a message), so a pass need not decide a run
    nothing it reads changed for until then (the reconciler's queue)."""
    return (
        not (plan.annotations or plan.deletes or plan.creates or plan.keep_logs)
        and not (plan.started or plan.ended or plan.resumed)
        and records.stored_alike(plan.status, run.status)
    )


def settled(run: plans.RunInput, plan: plans.RunPlan) -> bool:
    """Whether the run had ended when it was decided and its plan writes nothing. Then until
    `plan.requeue_at` (a finished run's TTL; None: never) the same TauRun decides the same
    again whatever else is observed, since a finished run's step reads only its own spec and
    status (`_finished`): a change of anything but its TauRun need not queue it."""
    return run.status.phase in outcomes.TERMINAL_PHASES and steady(run, plan)


def refused(
    status: records.RunStatus, reason: str, message: str, now: dt.datetime
) -> records.RunStatus:
    """The run ended Failed with `reason`: the executor met a refusal that asking again
    cannot change (a name somebody else holds, the cluster's admission saying no)."""
    if status.phase in outcomes.TERMINAL_PHASES:
        return status
    ended = end(status, Phase.FAILED, reason, message, now=now)
    last = ended.last_attempt
    if last is not None and last.end_time is None:
        last = last.model_copy(update={"end_time": now, "phase": Phase.FAILED})
        ended = ended.with_last_attempt(last)
    return ended


def _keeping_logs(plan: plans.RunPlan, ref: objects.RunRef) -> plans.RunPlan:
    """The plan, with the attempts whose logs it must keep first (see `RunPlan.keep_logs`)."""
    attempts = {
        n for d in plan.deletes if (n := objects.attempt_number(ref.name, d.name)) is not None
    }
    if plan.ended is not None and not plan.started:
        attempts.add(plan.status.current_attempt)
    return dataclasses.replace(plan, keep_logs=tuple(sorted(attempts)))


def priority_refusal(spec: specs.TauSpec, settings: plans.RunSettings) -> str:
    """Why the spec's priority class is not one the platform allows ('' when it is): the
    controller's resume class (whatever the chart named it), or one outside the allowlist."""
    if spec.priority is None:
        return ""
    if settings.resume_priority_class and spec.priority == settings.resume_priority_class:
        return (
            f"priority {spec.priority!r} is the controller's own priority class (resumed attempts)"
        )
    allowed = settings.allowed_priority_classes
    if allowed and spec.priority not in allowed:
        return f"priority {spec.priority!r} is not allowed here; allowed: {', '.join(allowed)}"
    return ""


def _decide(run: plans.RunInput, settings: plans.RunSettings, now: dt.datetime) -> plans.RunPlan:
    st = run.status
    try:
        spec = specs.validate_spec(dict(run.spec)).spec
    except specs.SpecError as err:
        if st.phase not in outcomes.TERMINAL_PHASES:
            st = _failed_at_once(st, "InvalidSpec", f"the spec is not valid: {err}", str(err), now)
        return plans.RunPlan(st)
    refusal = priority_refusal(spec, settings)
    if refusal and st.phase not in outcomes.TERMINAL_PHASES and st.current_attempt == 0:
        # Before anything is rendered: a run that already started under an older allowlist
        # is not killed by a platform's change of it (its next attempts keep their class).
        return plans.RunPlan(_failed_at_once(st, "PriorityNotAllowed", refusal, refusal, now))
    if st.phase in outcomes.TERMINAL_PHASES:
        return _finished(spec, run.ref, st, settings, now)
    if run.cancel_requested:
        st = end(
            st, Phase.CANCELLED, "Cancelled", "cancelled on request; its quota is freed", now=now
        )
        last = st.last_attempt
        if last is not None:
            last = last.model_copy(
                update={"end_time": last.end_time or now, "phase": Phase.CANCELLED}
            )
            st = st.with_last_attempt(last)
        return plans.RunPlan(
            st, deletes=_attempt_objects(spec, run.ref, st.current_attempt, settings)
        )
    if st.current_attempt == 0:
        first = _run_objects(run.ref, settings)
        st, attempt = _start(spec, run.ref, st, 1, now=now, settings=settings)
        return plans.RunPlan(st, creates=first + attempt, started=(1,))
    if not run.observed:
        return plans.RunPlan(st)
    if st.phase == Phase.RESUMING:
        return _resume_if_due(spec, run, st, settings, now, plan=plans.RunPlan(st))
    return _observe(spec, run, st, settings, now)


def _failed_at_once(
    st: records.RunStatus, reason: str, message: str, condition: str, now: dt.datetime
) -> records.RunStatus:
    """The run ended Failed by `reason` before any attempt was rendered for it."""
    st = st.model_copy(
        update={"phase": Phase.FAILED, "reason": reason, "end_time": now, "message": message}
    )
    return records.with_phase_condition(st, Phase.FAILED, reason, condition, now)


def _observe(
    spec: specs.TauSpec, run: plans.RunInput, st: records.RunStatus, settings: plans.RunSettings,
    now: dt.datetime,
) -> plans.RunPlan:  # fmt: skip
    """The current attempt is live: follow it, end the run, or retry."""
    current = st.current_attempt
    kind = attempt_kind(spec)
    name = objects.attempt_name(run.ref.name, current)
    # Gone while the attempt lives (listed before it was created, or deleted by hand):
    # create it again; a 409 means it was there all along.
    creates = (
        () if run.attempt_object is not None else _render(spec, run.ref, current, st, settings)
    )
    outcome = outcomes.attempt_outcome(
        run.attempt_object, run.workload, run.pods, run.nodes,
        recorded_nodes=st.last_attempt.nodes if st.last_attempt else (),
    )  # fmt: skip
    record = outcomes.attempt_record(
        current, object_kind=kind, object_name=name, outcome=outcome, workload=run.workload,
        previous=st.last_attempt or records.AttemptRecord(number=current),
    )  # fmt: skip
    attempts = (*st.attempts[:-1], record) if st.attempts else (record,)
    st = st.model_copy(
        update={"attempts": attempts,
                "evidence": outcomes.evidence(spec, run.ref.namespace, attempts=attempts,
                                               pods=run.pods, workload=run.workload,
                                               previous=st.evidence, rerun_of=run.rerun_of)}
    )  # fmt: skip
    first_start = st.attempts[0].start_time
    if timed_out(spec, first_start, now) and outcome.phase not in outcomes.TERMINAL_PHASES:
        record = record.model_copy(
            update={"phase": Phase.FAILED, "failure_class": str(specs.FailureClass.TIMEOUT),
                    "end_time": now}
        )  # fmt: skip
        st = st.with_last_attempt(record)
        st = end(
            st, Phase.FAILED, "Timeout", f"the run exceeded its timeout of {spec.timeout}", now=now
        )
        return plans.RunPlan(
            st, deletes=_attempt_objects(spec, run.ref, current, settings), creates=creates,
            ended=str(specs.FailureClass.TIMEOUT),
        )  # fmt: skip
    st, waited = phase_conditions(st, outcome, run.workload, now)
    st = positions.place(
        st, spec=spec, phase=outcome.phase, workload=run.workload, namespace=run.ref.namespace,
        position=run.position, cluster_queue=run.cluster_queue, held=run.held, pods=run.pods,
        pods_ready_timeout_s=settings.pods_ready_timeout_s, now=now, reason_ahead=run.reason_ahead,
    )  # fmt: skip
    due = [_timeout_at(spec, first_start),
           positions.changes_at(run.workload, settings.pods_ready_timeout_s, now)]  # fmt: skip
    plan = plans.RunPlan(
        st, creates=creates, queue_wait_s=waited,
        requeue_at=min((t for t in due if t is not None), default=None),
    )  # fmt: skip
    if outcome.phase == Phase.SUCCEEDED:
        st = end(st, Phase.SUCCEEDED, "Completed", outcome.message, now=now, ended=outcome.ended)
        return dataclasses.replace(
            plan, status=st, ended="Succeeded", requeue_at=_ttl_at(st, settings)
        )
    if outcome.phase == Phase.FAILED:
        failure = outcome.failure_class or specs.FailureClass.UNKNOWN
        budget_from = st.attempt_budget_from
        if retries.should_retry(spec, failure, current, budget_from=budget_from):
            record = st.attempts[-1]
            if record.end_time is None:  # the backoff counts from here
                record = record.model_copy(update={"end_time": now})
                st = st.with_last_attempt(record)
            message = (
                f"attempt {current} failed ({outcome.message}); starting attempt {current + 1}"
            )
            st = st.model_copy(
                update={"phase": Phase.RESUMING, "reason": str(failure), "message": message}
            )
            st = records.with_phase_condition(
                st, Phase.RESUMING, str(failure), outcome.message, now
            )
            plan = dataclasses.replace(
                plan, status=st, deletes=_attempt_objects(spec, run.ref, current, settings),
                ended=str(failure), resumed=str(failure),
            )  # fmt: skip
            return _resume_if_due(spec, run, st, settings, now, plan=plan)
        # Kueue frees the quota of a finished Job; the object stays for logs (TTL).
        message = retries.final_message(spec, failure, current, budget_from, outcome.message)
        st = end(st, Phase.FAILED, str(failure), message, now=now, ended=outcome.ended)
        return dataclasses.replace(
            plan, status=st, ended=str(failure), requeue_at=_ttl_at(st, settings)
        )
    st = st.model_copy(update={"phase": outcome.phase, "reason": outcome.reason})
    return dataclasses.replace(plan, status=st)


def _resume_if_due(
    spec: specs.TauSpec, run: plans.RunInput, st: records.RunStatus, settings: plans.RunSettings,
    now: dt.datetime, *, plan: plans.RunPlan,
) -> plans.RunPlan:  # fmt: skip
    """Start the next attempt once `retry.backoff` has passed (at once without a backoff)."""
    record = st.last_attempt or records.AttemptRecord(number=st.current_attempt)
    ended = record.end_time or now
    current = st.current_attempt or 1
    retried = current - 1 - st.attempt_budget_from
    wait = retries.retry_backoff_s(spec, retried)
    if wait and (now - ended).total_seconds() < wait:
        due = ended + dt.timedelta(seconds=wait)
        message = (
            f"attempt {current} failed ({record.failure_class}: {record.message}); attempt"
            f" {current + 1} starts at {timestamps.rfc3339(due)} (retry.backoff,"
            " doubled per retry)"
        )
        return dataclasses.replace(
            plan, status=st.model_copy(update={"message": message}), requeue_at=due
        )
    priority = retries.resume_priority_class(
        spec, record.failure_class or "", settings.resume_priority_class
    )
    if priority is not None and priority not in (run.priority_classes or frozenset()):
        priority = None  # a missing class would leave the attempt without a Workload
    st, created = _start(
        spec, run.ref, st, current + 1, now=now, settings=settings, priority_class=priority
    )
    return dataclasses.replace(
        plan, status=st, creates=plan.creates + created, started=(*plan.started, current + 1)
    )


def _finished(
    spec: specs.TauSpec, ref: objects.RunRef, st: records.RunStatus, settings: plans.RunSettings,
    now: dt.datetime,
) -> plans.RunPlan:  # fmt: skip
    """A finished run keeps its TauRun; its objects go once the TTL has passed."""
    if st.objects_deleted:
        return plans.RunPlan(st)
    if not ttl_expired(st.end_time, settings.ttl_after_finished_s, now):
        return plans.RunPlan(st, requeue_at=_ttl_at(st, settings))
    deletes = tuple(
        d for a in st.attempts for d in _attempt_objects(spec, ref, a.number, settings, fence=True)
    )
    return plans.RunPlan(st.model_copy(update={"objects_deleted": True}), deletes=deletes)


def decide_resume(
    run: plans.RunInput,
    settings: plans.RunSettings,
    now: dt.datetime,
    *,
    checkpoint: str | None,
    by: str,
) -> plans.RunPlan:
    """Start the next attempt of a Failed or Cancelled run by hand, from `checkpoint` (else
    the latest reported one), with a fresh `retry.maxAttempts` budget. Raises errors.Conflict
    (code NotResumable) when the run has not ended badly or its spec is not valid."""
    refusal = resume_refusal(run.ref.name, run.status.phase)
    if refusal:
        raise errors.Conflict(refusal, field="name", code="NotResumable")
    try:
        spec = specs.validate_spec(dict(run.spec)).spec
    except specs.SpecError as err:
        msg = f"run {run.ref.name!r} cannot be resumed: its spec is not valid ({err})"
        raise errors.Conflict(msg, field="name", code="NotResumable") from err
    refusal = priority_refusal(spec, settings)
    if refusal:
        msg = f"run {run.ref.name!r} cannot be resumed: {refusal}"
        raise errors.Conflict(msg, field="priority", code="PriorityNotAllowed")
    st = reopened(run.status, by=by, now=now)
    directory = _dir(spec)
    if checkpoint is not None:  # what the next attempt loads lies in the run's own storage
        checkpoint = checkpoints.confine(checkpoint, directory, field="checkpoint")
    start_from = checkpoint if checkpoint is not None else checkpoints.latest_under(st, directory)
    first = _run_objects(run.ref, settings)
    nxt = st.current_attempt + 1
    st, created = _start(spec, run.ref, st, nxt, now=now, settings=settings, resume_from=start_from)
    message = (
        f"resumed by {by} from {start_from or 'the start (no checkpoint)'}; attempt {nxt}"
        f" submitted to queue {spec.queue!r}"
    )
    annotations: dict[str, str | None] = {}
    if run.cancel_requested:
        annotations[marks.CANCEL_ANNOTATION] = None
    return plans.RunPlan(
        st.model_copy(update={"message": message}), annotations=annotations,
        creates=first + created, started=(nxt,),
    )  # fmt: skip


# ---------------------------------------------------------------- pieces


def _run_objects(ref: objects.RunRef, settings: plans.RunSettings) -> tuple[dict[str, Any], ...]:
    """The run's checkpoint ConfigMap (with the CA the pods trust for the controller, when it
    has one). The run needs no credential object: its pods get projected tokens."""
    name = objects.checkpoint_configmap_name(ref.name)
    return (objects.render_checkpoint_configmap(ref, name, "", ca_pem=settings.render.ca_pem),)


def _start(
    spec: specs.TauSpec,
    ref: objects.RunRef,
    st: records.RunStatus,
    attempt: int,
    *,
    now: dt.datetime,
    settings: plans.RunSettings,
    priority_class: str | None = None,
    resume_from: str | None = None,
) -> tuple[records.RunStatus, tuple[dict[str, Any], ...]]:
    """Attempt `attempt`, recorded and rendered; it resumes from `resume_from`, else from
    the latest checkpoint (attempts after the first)."""
    if resume_from is None:
        resume_from = checkpoints.latest_under(st, _dir(spec)) if attempt > 1 else ""
    entry = records.AttemptRecord(
        number=attempt, object_kind=attempt_kind(spec), phase=Phase.QUEUED,
        object_name=objects.attempt_name(ref.name, attempt), created_time=now,
        resume_from=resume_from, priority_class=priority_class or None,
    )  # fmt: skip
    st = st.model_copy(
        update={"attempts": (*st.attempts, entry), "current_attempt": attempt,
                "phase": Phase.QUEUED, "reason": "Submitted",
                "message": f"submitted to queue {spec.queue!r}; waiting for Kueue",
                "start_time": st.start_time or now}
    )  # fmt: skip
    st = records.with_phase_condition(
        st, Phase.QUEUED, "Submitted", f"attempt {attempt} created", now
    )
    return st, _render(spec, ref, attempt, st, settings)


def _dir(spec: specs.TauSpec) -> str | None:
    """The run's checkpoint directory, the only place a resumed attempt may load from."""
    return spec.checkpoint.dir if spec.checkpoint is not None else None


def _render(
    spec: specs.TauSpec, ref: objects.RunRef, attempt: int, st: records.RunStatus,
    settings: plans.RunSettings,
) -> tuple[dict[str, Any], ...]:  # fmt: skip
    """Render attempt `attempt`; what differs between attempts is read back from its record,
    so re-creating a lost object renders it the same."""
    record = st.attempt(attempt)
    if record is not None and record.resume_from is not None:
        resume_from = checkpoints.trusted(record.resume_from, _dir(spec))
    else:
        resume_from = checkpoints.latest_under(st, _dir(spec)) if attempt > 1 else ""
    previous = st.attempt(attempt - 1)
    failure = (previous.failure_class or str(previous.phase)) if previous else ""
    ctx = rendering.AttemptContext(
        run=ref, attempt=attempt,
        checkpoint_configmap=objects.checkpoint_configmap_name(ref.name),
        resume_from=resume_from,
        failure_reason=failure if attempt > 1 else "",
        priority_class=record.priority_class if record else None,
    )  # fmt: skip
    rendered = rendering.render_attempt(spec, ctx, settings.render)
    if settings.pod_annotations:
        for obj in rendered:
            for template in rendering.pod_templates(obj):
                meta = template.setdefault("metadata", {})
                meta["annotations"] = {**settings.pod_annotations, **meta.get("annotations", {})}
    return tuple(rendered)


def _attempt_objects(
    spec: specs.TauSpec,
    ref: objects.RunRef,
    attempt: int,
    settings: plans.RunSettings,
    *,
    fence: bool = False,
) -> tuple[plans.ObjectRef, ...]:
    """The objects of attempt `attempt` (none before the first); with `fence`, its
    NetworkPolicy too. An attempt that ends keeps its policy until the run's objects go
    after their TTL: the Job's pods are deleted in the background and may still run their
    grace period, fenced."""
    if attempt < 1:
        return ()
    name = objects.attempt_name(ref.name, attempt)
    out = [plans.ObjectRef(attempt_kind(spec), ref.namespace, name)]
    if spec.kind == specs.RunKind.PYTORCH:
        out.append(plans.ObjectRef("Service", ref.namespace, name))
    if fence and networks.fenced(spec):
        out.append(plans.ObjectRef(networks.KIND, ref.namespace, name))
    if spec.resources.gpus > 0 and settings.render.dra:
        # A template left by an attempt rendered before the mode changed is owned by the
        # TauRun, so it goes with the run.
        template = objects.claim_template_name(ref.name, attempt)
        out.append(plans.ObjectRef("ResourceClaimTemplate", ref.namespace, template))
    return tuple(out)


def _ttl_at(st: records.RunStatus, settings: plans.RunSettings) -> dt.datetime | None:
    if st.end_time is None or settings.ttl_after_finished_s is None or st.objects_deleted:
        return None
    return st.end_time + dt.timedelta(seconds=settings.ttl_after_finished_s)


def _timeout_at(spec: specs.TauSpec, first_start: dt.datetime | None) -> dt.datetime | None:
    if spec.timeout_s is None or first_start is None:
        return None
    return first_start + dt.timedelta(seconds=spec.timeout_s)
