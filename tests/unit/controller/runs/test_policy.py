"""The run decision step, table by table: every phase transition and failure class of
DESIGN.md section 7, decided from values alone (no store, no clock, no cluster)."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from controller import errors, marks, timestamps
from controller.runs import objects, plans, policy, positions, records, rendering, views
from shared import spec as specs
from tests.unit.controller.runs.builders import (
    ADMITTED,
    NODES,
    SPEC,
    T0,
    a_job,
    a_pod,
    a_rayjob,
    a_workload,
    cond,
    ts,
)

REF = objects.RunRef(name="demo", namespace="team", uid="u1")
SETTINGS = plans.RunSettings(
    render=rendering.RenderSettings(controller_url="http://taugrid:8080"),
    ttl_after_finished_s=60.0,
    pod_annotations={"kwok.taugrid.dev/run-for": "5s"},
    resume_priority_class=marks.RESUME_PRIORITY_CLASS,
)
NOW = T0 + dt.timedelta(seconds=30)
QUEUED_1: dict[str, Any] = {
    "phase": "Queued", "reason": "Submitted", "currentAttempt": 1,
    "startTime": ts(0),
    "attempts": [{"number": 1, "objectKind": "Job", "objectName": "demo-a1", "phase": "Queued",
                  "createdTime": ts(0), "resumeFrom": ""}],
    "conditions": [cond("Queued", reason="Submitted")],
}  # fmt: skip
"""The status right after attempt 1 was submitted."""


def spec_with(**fields: Any) -> dict[str, Any]:
    """The wire spec of SPEC with some fields changed."""
    return {**specs.spec_to_wire(SPEC), **fields}


def status_with(base: dict[str, Any] = QUEUED_1, **fields: Any) -> records.RunStatus:
    """A status read from its wire form, as the reconciler reads it."""
    return records.read({**base, **fields})


def run(status: records.RunStatus | None = None, **fields: Any) -> plans.RunInput:
    """One run's input: the spec SPEC, attempt 1 queued, unless told otherwise."""
    values: dict[str, Any] = {
        "ref": REF, "spec": specs.spec_to_wire(SPEC),
        "status": status if status is not None else status_with(),
        "attempt_object": a_job(suspended=True), "nodes": NODES, "cluster_queue": "cq",
        "priority_classes": frozenset({marks.RESUME_PRIORITY_CLASS}),
    }  # fmt: skip
    values.update(fields)
    return plans.RunInput(**values)


def failed_once(
    failure_class: str, *, when: list[str] | None = None, **spec: Any
) -> dict[str, Any]:
    """A run whose attempt 1 has just failed with `failure_class` (as its pods show it)."""
    pods = {
        "NodeFailure": [a_pod(phase="Failed", node="bad", exit_code=143)],
        "Evicted": [a_pod(phase="Failed", exit_code=143, disruption="EvictionByEvictionAPI")],
        "OOMKilled": [a_pod(phase="Failed", exit_code=137, reason="OOMKilled")],
        "AppError": [a_pod(phase="Failed", exit_code=3)],
    }[failure_class]
    wire = spec_with(**spec)
    if when is not None:
        wire["retry"] = {**wire.get("retry", {}), "when": when}
    return {"spec": wire, "attempt_object": a_job(), "workload": a_workload(*ADMITTED, cq="cq"),
            "pods": tuple(pods)}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Case:
    """One decision: the input and what the plan must say."""

    input: plans.RunInput
    phase: str
    reason: str = ""
    creates: tuple[tuple[str, str], ...] = ()
    deletes: tuple[tuple[str, str], ...] = ()
    started: tuple[int, ...] = ()
    ended: str | None = None
    resumed: str | None = None


def summary(plan: plans.RunPlan) -> dict[str, Any]:
    """What a plan says, in the terms of a Case."""
    return {
        "phase": str(plan.status.phase),
        "reason": plan.status.reason,
        "creates": tuple((o["kind"], o["metadata"]["name"]) for o in plan.creates),
        "deletes": tuple((d.kind, d.name) for d in plan.deletes),
        "started": plan.started,
        "ended": plan.ended,
        "resumed": plan.resumed,
    }


ATTEMPT_2 = (("Job", "demo-a2"),)
CASES = [
    pytest.param(
        Case(
            run(status=records.RunStatus(), attempt_object=None),
            "Queued",
            "Submitted",
            creates=(("ConfigMap", "demo-checkpoint"), ("Job", "demo-a1")),
            started=(1,),
        ),
        id="a new run gets its checkpoint map and attempt 1 (no token Secret), and is Queued",
    ),
    pytest.param(
        Case(
            run(status=records.read({"tokenSHA256": "d" * 64}), attempt_object=None),
            "Queued",
            "Submitted",
            creates=(("ConfigMap", "demo-checkpoint"), ("Job", "demo-a1")),
            started=(1,),
        ),
        id="a status an older controller wrote with a token digest makes no Secret either",
    ),
    pytest.param(
        Case(run(observed=False), "Queued", "Submitted"),
        id="the fast path after a submission decides nothing it has not read",
    ),
    pytest.param(
        Case(
            run(workload=a_workload(cond("QuotaReserved", "False", "Pending"))), "Queued", "Pending"
        ),
        id="a Workload without quota keeps the run Queued",
    ),
    pytest.param(
        Case(run(workload=a_workload(*ADMITTED, cq="cq")), "Admitted", "Admitted"),
        id="an admitted Workload makes the run Admitted",
    ),
    pytest.param(
        Case(
            run(attempt_object=a_job(), workload=a_workload(*ADMITTED, cq="cq"), pods=(a_pod(),)),
            "Running",
            "PodsReady",
        ),
        id="a running pod makes the run Running",
    ),
    pytest.param(
        Case(
            run(
                attempt_object=a_job(cond("Complete")),
                workload=a_workload(*ADMITTED, cq="cq"),
                pods=(a_pod(phase="Succeeded", exit_code=0),),
            ),
            "Succeeded",
            "Completed",
            ended="Succeeded",
        ),
        id="a complete Job ends the run Succeeded",
    ),
    pytest.param(
        Case(
            run(
                attempt_object=a_rayjob("SUCCEEDED", "Complete"),
                spec=spec_with(kind="ray"),
                workload=a_workload(*ADMITTED, cq="cq"),
            ),
            "Succeeded",
            "Completed",
            ended="Succeeded",
        ),
        id="a succeeded RayJob ends a ray run Succeeded",
    ),
    pytest.param(
        Case(run(attempt_object=None), "Queued", "Creating", creates=(("Job", "demo-a1"),)),
        id="an attempt whose Job is gone gets it back",
    ),
    pytest.param(
        Case(
            run(
                attempt_object=a_job(suspended=True),
                workload=a_workload(*ADMITTED, cq="cq"),
                pods=(a_pod(phase="Failed", node="bad", exit_code=143),),
            ),
            "Admitted",
            "Admitted",
        ),
        id="pods ending under a suspended (preempted) Job are no failure",
    ),
    pytest.param(
        Case(
            run(**failed_once("NodeFailure")),
            "Queued",
            "Submitted",
            deletes=(("Job", "demo-a1"),),
            creates=ATTEMPT_2,
            started=(2,),
            ended="NodeFailure",
            resumed="NodeFailure",
        ),
        id="a node failure ends attempt 1 and starts attempt 2 at once",
    ),
    pytest.param(
        Case(run(**failed_once("Evicted")), "Failed", "Evicted", ended="Evicted"),
        id="an eviction is final unless retry.when names Evicted",
    ),
    pytest.param(
        Case(
            run(**failed_once("Evicted", when=["Evicted"])),
            "Queued",
            "Submitted",
            deletes=(("Job", "demo-a1"),),
            creates=ATTEMPT_2,
            started=(2,),
            ended="Evicted",
            resumed="Evicted",
        ),
        id="an eviction is retried when retry.when names it",
    ),
    pytest.param(
        Case(run(**failed_once("OOMKilled")), "Failed", "OOMKilled", ended="OOMKilled"),
        id="OOMKilled is final by default",
    ),
    pytest.param(
        Case(run(**failed_once("AppError")), "Failed", "AppError", ended="AppError"),
        id="an application error is final by default",
    ),
    pytest.param(
        Case(
            run(**failed_once("AppError", when=["AppError"])),
            "Queued",
            "Submitted",
            deletes=(("Job", "demo-a1"),),
            creates=ATTEMPT_2,
            started=(2,),
            ended="AppError",
            resumed="AppError",
        ),
        id="an application error is retried when retry.when names it",
    ),
    pytest.param(
        Case(
            run(
                attempt_object=a_job(cond("Failed", reason="BackoffLimitExceeded")),
                workload=a_workload(*ADMITTED, cq="cq"),
            ),
            "Failed",
            "Unknown",
            ended="Unknown",
        ),
        id="a failure we cannot tell is Unknown and never retried",
    ),
    pytest.param(
        Case(
            run(**{**failed_once("NodeFailure"), "spec": spec_with(kind="pytorch", workers=2)}),
            "Queued",
            "Submitted",
            deletes=(("Job", "demo-a1"), ("Service", "demo-a1")),
            creates=(("NetworkPolicy", "demo-a2"), ("Service", "demo-a2"), ("Job", "demo-a2")),
            started=(2,),
            ended="NodeFailure",
            resumed="NodeFailure",
        ),
        id="a pytorch attempt goes with its headless Service; its NetworkPolicy stays",
    ),
    pytest.param(
        Case(run(cancel_requested=True), "Cancelled", "Cancelled", deletes=(("Job", "demo-a1"),)),
        id="a cancel deletes the attempt and keeps the run, Cancelled",
    ),
    pytest.param(
        Case(run(spec={"name": "demo"}), "Failed", "InvalidSpec"),
        id="a spec that is not valid fails the run",
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_each_transition_decides_its_writes(case: Case) -> None:
    """From a run's input alone, the plan says its phase, what to create and delete, and what
    ended or started."""
    plan = policy.decide_run(case.input, SETTINGS, NOW)
    expected = {k: v for k, v in dataclasses.asdict(case).items() if k != "input"}
    assert expected == summary(plan)


def test_timeout_ends_the_run_at_its_wall_clock_limit() -> None:
    """`timeout` counts from the first pod start; past it the attempt is deleted, Failed."""
    started = status_with(attempts=[{**QUEUED_1["attempts"][0], "startTime": ts(1)}])
    live = run(status=started, spec=spec_with(timeout="20s"), attempt_object=a_job(),
               workload=a_workload(*ADMITTED, cq="cq"), pods=(a_pod(),))  # fmt: skip
    before = policy.decide_run(live, SETTINGS, T0 + dt.timedelta(seconds=10))
    after = policy.decide_run(live, SETTINGS, T0 + dt.timedelta(seconds=30))
    expected = (
        ("Running", None, T0 + dt.timedelta(seconds=21)),
        ("Failed", "Timeout", (("Job", "demo-a1"),), "Timeout"),
    )
    actual = (
        (str(before.status.phase), before.ended, before.requeue_at),
        (str(after.status.phase), after.status.reason,
         tuple((d.kind, d.name) for d in after.deletes), after.ended),
    )  # fmt: skip
    assert expected == actual


def test_a_retry_waits_for_its_backoff_and_says_when() -> None:
    """With `retry.backoff` the run stays Resuming until the backoff has passed since the
    attempt ended (its pod finished at 9 s), naming the time."""
    failing = run(
        **failed_once("AppError", when=["AppError"], retry={"when": ["AppError"], "backoff": "60s"})
    )
    waiting = policy.decide_run(failing, SETTINGS, NOW)
    resumed_status = waiting.status
    later = run(status=resumed_status, spec=failing.spec)
    due = policy.decide_run(later, SETTINGS, T0 + dt.timedelta(seconds=100))
    expected = (
        ("Resuming", (("Job", "demo-a1"),), (), T0 + dt.timedelta(seconds=69)),
        ("Queued", (("Job", "demo-a2"),), (2,)),
    )
    actual = (
        (str(waiting.status.phase), tuple((d.kind, d.name) for d in waiting.deletes),
         waiting.started, waiting.requeue_at),
        (str(due.status.phase), tuple((o["kind"], o["metadata"]["name"]) for o in due.creates),
         due.started),
    )  # fmt: skip
    assert expected == actual
    assert "attempt 2 starts at 2026-01-01T00:01:09Z" in waiting.status.message


@pytest.mark.parametrize(
    ("spec", "classes", "expected"),
    [
        pytest.param({}, frozenset({marks.RESUME_PRIORITY_CLASS}), marks.RESUME_PRIORITY_CLASS,
                     id="after a node failure the next attempt keeps its place in line"),
        pytest.param({}, frozenset(), None,
                     id="a missing resume class leaves the priority alone"),
        pytest.param({"priority": "high"}, frozenset({marks.RESUME_PRIORITY_CLASS}), "high",
                     id="a run with a class of its own keeps it"),
    ],
)  # fmt: skip
def test_the_next_attempt_after_an_infrastructure_failure_is_boosted(
    spec: dict[str, Any], classes: frozenset[str], expected: str | None
) -> None:
    """The resume class goes on attempt 2's Job only when it exists and the run has none."""
    failing = run(**{**failed_once("NodeFailure", **spec), "priority_classes": classes})
    plan = policy.decide_run(failing, SETTINGS, NOW)
    job = next(o for o in plan.creates if o["kind"] == "Job")
    assert expected == job["metadata"]["labels"].get(marks.PRIORITY_CLASS_LABEL)


def test_max_attempts_is_honoured() -> None:
    """Attempt 3 of maxAttempts 3 failing ends the run, saying which rule decided."""
    third = status_with(currentAttempt=3, attempts=[
        {"number": n, "objectKind": "Job", "objectName": f"demo-a{n}", "phase": "Queued"}
        for n in (1, 2, 3)
    ])  # fmt: skip
    plan = policy.decide_run(run(status=third, **failed_once("NodeFailure")), SETTINGS, NOW)
    assert (str(plan.status.phase), plan.started) == ("Failed", ())
    assert "all 3 of retry.maxAttempts=3 used" in plan.status.message


@pytest.mark.parametrize(
    ("ended_s", "deleted", "expected"),
    [
        pytest.param(0, False, ((), False, T0 + dt.timedelta(seconds=90)),
                     id="a finished run keeps its objects until the TTL"),
        pytest.param(-60, False, ((("Job", "demo-a1"),), True, None),
                     id="after the TTL its objects go and the TauRun stays"),
        pytest.param(-60, True, ((), True, None), id="objects deleted once are not deleted again"),
    ],
)  # fmt: skip
def test_a_finished_runs_objects_go_after_the_ttl(
    ended_s: float, deleted: bool, expected: tuple[Any, ...]
) -> None:
    """The TTL counts from the end of the run (ttlAfterFinished: 60 s here)."""
    ended = T0 + dt.timedelta(seconds=30 + ended_s)
    done = status_with(phase="Succeeded", endTime=ended.strftime("%Y-%m-%dT%H:%M:%SZ"),
                       objectsDeleted=deleted or None)  # fmt: skip
    plan = policy.decide_run(run(status=done), SETTINGS, NOW)
    actual = (tuple((d.kind, d.name) for d in plan.deletes), bool(plan.status.objects_deleted),
              plan.requeue_at)  # fmt: skip
    assert expected == actual


def test_after_the_ttl_every_attempts_network_policy_goes_too() -> None:
    """An attempt that ends keeps its NetworkPolicy (its pods may still be terminating); the
    TTL's deletes take every attempt's objects, the policies included."""
    ended = T0 - dt.timedelta(seconds=30)
    done = status_with(phase="Failed", endTime=ended.strftime("%Y-%m-%dT%H:%M:%SZ"),
                       currentAttempt=2, attempts=[
        {"number": n, "objectKind": "Job", "objectName": f"demo-a{n}", "phase": "Failed"}
        for n in (1, 2)
    ])  # fmt: skip
    spec = spec_with(kind="pytorch", workers=2)
    plan = policy.decide_run(run(status=done, spec=spec), SETTINGS, NOW)
    expected = tuple(
        (kind, f"demo-a{n}") for n in (1, 2) for kind in ("Job", "Service", "NetworkPolicy")
    )
    assert expected == tuple((d.kind, d.name) for d in plan.deletes)


def test_a_queued_run_says_where_it_stands_and_why() -> None:
    """A queued run carries its place in line and, when our gate holds it, the gate's word."""
    position = positions.QueuePosition(3, 1, positions.PositionSource.COMPUTED)
    pending = a_workload(cond("QuotaReserved", "False", "Pending"))
    plan = policy.decide_run(
        run(workload=pending, position=position, held="no healthy node"), SETTINGS, NOW
    )
    expected = (3, 1, "computed", "waiting for healthy GPU capacity: no healthy node")
    st = plan.status
    assert expected == (st.queue_position, st.queue_position_in_local_queue,
                        st.queue_position_source, st.message)  # fmt: skip


def test_a_manual_resume_starts_the_next_attempt_from_the_named_checkpoint() -> None:
    """A Failed run resumes by hand: a fresh attempt budget, the checkpoint it names."""
    failed = status_with(
        phase="Failed", endTime=ts(9), objectsDeleted=True,
        conditions=[cond("Queued"), cond("Failed", reason="AppError")],
    )  # fmt: skip
    resumable = run(status=failed, spec=spec_with(checkpoint={"dir": "/ckpt"}))
    plan = policy.decide_resume(resumable, SETTINGS, NOW, checkpoint="/ckpt/7", by="ada")
    st = plan.status
    expected = ("Queued", (2,), "/ckpt/7", 1, None, (("ConfigMap", "demo-checkpoint"),
                                                       ("Job", "demo-a2")))  # fmt: skip
    assert expected == (
        str(st.phase), plan.started, st.attempts[-1].resume_from, st.attempt_budget_from,
        st.end_time, tuple((o["kind"], o["metadata"]["name"]) for o in plan.creates),
    )  # fmt: skip
    assert "resumed by ada from /ckpt/7" in st.message


@pytest.mark.parametrize(
    ("checkpoint", "directory"),
    [
        pytest.param("/etc/passwd", "/ckpt", id="a path outside the checkpoint dir"),
        pytest.param("/ckpt/../etc/shadow", "/ckpt", id="a path climbing out with .."),
        pytest.param("/ckptx/7", "/ckpt", id="a sibling directory sharing the prefix"),
        pytest.param("ckpt/7", "/ckpt", id="a relative path"),
        pytest.param("/ckpt/7", None, id="a run that declares no checkpoint directory"),
    ],
)  # fmt: skip
def test_a_resume_may_name_only_a_checkpoint_in_the_runs_own_directory(
    checkpoint: str, directory: str | None
) -> None:
    """DESIGN.md section 10: what the next attempt loads lies under `checkpoint.dir`; else a
    422 naming `checkpoint`, and nothing is planned."""
    failed = status_with(phase="Failed", endTime=ts(9), objectsDeleted=True)
    wire = spec_with(checkpoint={"dir": directory}) if directory else spec_with()
    with pytest.raises(errors.Invalid) as caught:
        policy.decide_resume(run(status=failed, spec=wire), SETTINGS, NOW,
                             checkpoint=checkpoint, by="ada")  # fmt: skip
    assert caught.value.field == "checkpoint"


@pytest.mark.parametrize(
    ("paths", "expected"),
    [
        pytest.param(["/ckpt/1", "/etc/shadow"], "/ckpt/1",
                     id="a forged newest path outside the dir gives way to the last good one"),
        pytest.param(["/ckpt/../etc/passwd"], "", id="a path climbing out with .. starts fresh"),
        pytest.param(["/ckpt/1", "/ckpt/2"], "/ckpt/2", id="the newest path under the dir is used"),
    ],
)  # fmt: skip
def test_the_next_attempt_loads_only_a_checkpoint_under_the_runs_directory(
    paths: list[str], expected: str
) -> None:
    """Security review 3, finding 6: a checkpoint path read back from status (which a writer
    of `tauruns/status` could have set) is checked at use, on a retry and on a resume."""
    saved = [{"attempt": 1, "step": i, "path": p, "time": ts(i)} for i, p in enumerate(paths)]
    retried = policy.decide_run(
        run(status=status_with(checkpoints=saved),
            **failed_once("NodeFailure", checkpoint={"dir": "/ckpt"})), SETTINGS, NOW,
    )  # fmt: skip
    failed = status_with(phase="Failed", endTime=ts(9), objectsDeleted=True, checkpoints=saved)
    resumed = policy.decide_resume(
        run(status=failed, spec=spec_with(checkpoint={"dir": "/ckpt"})), SETTINGS, NOW,
        checkpoint=None, by="ada",
    )  # fmt: skip
    actual = [
        _env(next(o for o in plan.creates if o["kind"] == "Job"))["TAU_RESUME_FROM"]
        for plan in (retried, resumed)
    ]
    assert [expected, expected] == actual


@pytest.mark.parametrize(
    ("priority", "allowed", "reason"),
    [
        pytest.param("urgent", ("normal",), "PriorityNotAllowed",
                     id="a class outside the platform's allowlist fails the run"),
        pytest.param(marks.RESUME_PRIORITY_CLASS, (), "InvalidSpec",
                     id="the resume class fails the run as an invalid spec"),
        pytest.param("team-resume", (), "PriorityNotAllowed",
                     id="the resume class under the chart's own name fails the run"),
        pytest.param("normal", ("normal",), "Submitted", id="an allowed class is submitted"),
    ],
)  # fmt: skip
def test_a_kubectl_made_run_is_held_to_the_priority_allowlist(
    priority: str, allowed: tuple[str, ...], reason: str
) -> None:
    """Security review 3, finding 5: the allowlist is enforced where every run passes, not
    only on the HTTP API; a refused run fails with the reason in its status and renders
    nothing."""
    settings = dataclasses.replace(
        SETTINGS, allowed_priority_classes=allowed, resume_priority_class="team-resume"
    )
    fresh = run(status=records.RunStatus(), spec=spec_with(priority=priority),
                attempt_object=None)  # fmt: skip
    plan = policy.decide_run(fresh, settings, NOW)
    refused = reason != "Submitted"
    expected = (reason, refused, refused)
    actual = (plan.status.reason, not plan.creates, priority in plan.status.message)
    assert expected == actual


def test_a_retry_of_a_run_whose_priority_is_no_longer_allowed_ends_it() -> None:
    """A spec patched to a disallowed class after attempt 1 (or an allowlist changed since)
    starts no further attempt: the run ends Failed `PriorityNotAllowed`, rendering nothing."""
    settings = dataclasses.replace(SETTINGS, allowed_priority_classes=("normal",))
    plan = policy.decide_run(run(**failed_once("NodeFailure", priority="urgent")), settings, NOW)
    st = plan.status
    expected = ("Failed", "PriorityNotAllowed", (), (), 1, [1])
    actual = (str(st.phase), st.reason, plan.creates, plan.started, st.current_attempt,
              [a.number for a in st.attempts])  # fmt: skip
    assert expected == actual


def test_resuming_a_run_whose_priority_is_no_longer_allowed_is_refused() -> None:
    """A hand resume renders a new attempt, so it is held to the allowlist too."""
    settings = dataclasses.replace(SETTINGS, allowed_priority_classes=("normal",))
    failed = status_with(phase="Failed", endTime=ts(9), objectsDeleted=True)
    with pytest.raises(errors.Conflict) as caught:
        policy.decide_resume(run(status=failed, spec=spec_with(priority="urgent")), settings,
                             NOW, checkpoint=None, by="ada")  # fmt: skip
    assert caught.value.field == "priority"


def test_resuming_a_cancelled_run_clears_its_cancel() -> None:
    """The cancel annotation would cancel the resumed attempt again: the plan removes it."""
    cancelled = status_with(phase="Cancelled", endTime=ts(9))
    plan = policy.decide_resume(run(status=cancelled, cancel_requested=True), SETTINGS, NOW,
                                checkpoint=None, by="ada")  # fmt: skip
    assert dict(plan.annotations) == {marks.CANCEL_ANNOTATION: None}


@pytest.mark.parametrize("phase", ["Running", "Queued", "Succeeded"])
def test_only_failed_or_cancelled_runs_resume(phase: str) -> None:
    """Anything else is a conflict naming what to do."""
    with pytest.raises(errors.Conflict, match="only a Failed or Cancelled run"):
        policy.decide_resume(run(status=status_with(phase=phase)), SETTINGS, NOW,
                             checkpoint=None, by="ada")  # fmt: skip


def test_the_same_input_decides_the_same_plan() -> None:
    """The decision is a function of its input: deciding twice gives one plan."""
    live = run(**failed_once("NodeFailure"))
    assert policy.decide_run(live, SETTINGS, NOW) == policy.decide_run(live, SETTINGS, NOW)


def _env(obj: dict[str, Any]) -> dict[str, str]:
    container = obj["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", "") for e in container["env"] if "value" in e}


def test_the_next_attempt_carries_the_failure_and_the_latest_checkpoint() -> None:
    """Attempt 2 starts from the newest checkpoint with the failure named in its env, and
    attempt 1's record keeps its class and exit code."""
    saved = status_with(checkpoints=[{"attempt": 1, "step": 200, "path": "/c/2", "time": ts(5)}])
    plan = policy.decide_run(
        run(status=saved, **failed_once("NodeFailure", checkpoint={"dir": "/c"})), SETTINGS, NOW
    )
    job = next(o for o in plan.creates if o["kind"] == "Job")
    env = _env(job)
    first = plan.status.attempts[0]
    expected = (("/c/2", "2", "NodeFailure"), ("NodeFailure", (143,)), 2)
    assert expected == (
        (env["TAU_RESUME_FROM"], env["TAU_ATTEMPT"], env["TAU_FAILURE_REASON"]),
        (first.failure_class, first.exit_codes), plan.status.current_attempt,
    )  # fmt: skip


def test_an_application_error_records_its_exit_code() -> None:
    """A final AppError keeps the exit code on the attempt and says it was not retried."""
    plan = policy.decide_run(run(**failed_once("AppError")), SETTINGS, NOW)
    assert (
        plan.status.attempts[0].exit_codes, "not retried" in plan.status.message
    ) == ((3,), True)  # fmt: skip


def test_a_pod_on_a_vanished_node_is_a_node_failure() -> None:
    """A node that no longer exists took the pod: NodeFailure, which a retry.when without
    NodeFailure does not retry."""
    gone = (a_pod(phase="Failed", node="gone", exit_code=143),)
    failing = run(**{**failed_once("AppError", when=["AppError"]), "pods": gone})
    plan = policy.decide_run(failing, SETTINGS, NOW)
    expected = ("Failed", "NodeFailure", True)
    assert expected == (
        str(plan.status.phase), plan.status.reason, "NodeFailure is not in retry.when"
        in plan.status.message,
    )  # fmt: skip


OBSERVATIONS = st.fixed_dictionaries({
    "attempt_object": st.sampled_from([None, a_job(), a_job(suspended=True),
                                       a_job(cond("Complete"))]),
    "workload": st.sampled_from([None, a_workload(*ADMITTED, cq="cq"), a_workload()]),
    "pods": st.sampled_from([(), (a_pod(),), (a_pod(phase="Failed", node="bad", exit_code=143),)]),
    "nodes": st.sampled_from([NODES, views.NodeFacts(frozenset(), frozenset())]),
    "held": st.sampled_from([None, "the gate holds it"]),
    "cluster_queue": st.sampled_from(["cq", None]),
    "priority_classes": st.sampled_from([None, frozenset({marks.RESUME_PRIORITY_CLASS})]),
    "observed": st.booleans(),
})  # fmt: skip
FINISHED = st.fixed_dictionaries({
    "phase": st.sampled_from(["Succeeded", "Failed", "Cancelled", "Queued", "Running"]),
    "endTime": st.sampled_from([None, *(ts(s) for s in (-120, -30, 0, 29, 30))]),
    "objectsDeleted": st.sampled_from([None, True]),
})  # fmt: skip


@given(
    status=FINISHED,
    ttl_s=st.sampled_from([None, 0.0, 60.0]),
    cancel=st.booleans(),
    spec=st.sampled_from([spec_with(), spec_with(workers=0)]),
    first=OBSERVATIONS,
    second=OBSERVATIONS,
    later_s=st.floats(0, 200),
)
@hsettings(max_examples=300, deadline=None)
def test_a_settled_run_decides_the_same_until_its_requeue_whatever_else_is_seen(
    *,
    status: dict[str, Any],
    ttl_s: float | None,
    cancel: bool,
    spec: dict[str, Any],
    first: dict[str, Any],
    second: dict[str, Any],
    later_s: float,
) -> None:
    """`policy.settled`, which lets a pass skip a finished run while its TauRun stays as it
    was: when the first decision settles the run, any later one before its `requeue_at`, from
    the same TauRun and whatever else is observed then, is the same plan."""
    settings = dataclasses.replace(SETTINGS, ttl_after_finished_s=ttl_s)
    fields = {k: v for k, v in status.items() if v is not None}
    tau: dict[str, Any] = {
        "status": status_with(**fields), "spec": spec, "cancel_requested": cancel,
    }  # fmt: skip
    plan = policy.decide_run(run(**tau, **first), settings, NOW)
    if not policy.settled(run(**tau, **first), plan):
        return
    later = NOW + dt.timedelta(seconds=later_s)
    if plan.requeue_at is not None and later >= plan.requeue_at:
        return
    assert plan == policy.decide_run(run(**tau, **second), settings, later)


@pytest.mark.parametrize(
    ("status", "ttl_s", "expected"),
    [
        pytest.param({"phase": "Succeeded", "endTime": ts(0)}, 60.0, (True, ts(60)),
                     id="finished within its TTL: settled until the TTL"),
        pytest.param({"phase": "Failed", "endTime": ts(0), "objectsDeleted": True}, 60.0,
                     (True, None), id="finished, objects gone: settled for good"),
        pytest.param({"phase": "Succeeded", "endTime": ts(-60)}, 60.0, (False, None),
                     id="past its TTL: its objects go, which is a write"),
        pytest.param({"phase": "Running"}, 60.0, (False, None), id="a live run never is"),
    ],
)  # fmt: skip
def test_a_finished_run_is_settled_while_nothing_is_left_to_write(
    status: dict[str, Any], ttl_s: float, expected: tuple[bool, str | None]
) -> None:
    """Settled: ended when decided, and nothing to write; and until when (`requeue_at`)."""
    settings = dataclasses.replace(SETTINGS, ttl_after_finished_s=ttl_s)
    observed = run(status=status_with(**status), attempt_object=a_job(cond("Complete")))
    plan = policy.decide_run(observed, settings, T0 + dt.timedelta(seconds=1))
    settled = policy.settled(observed, plan)
    until = timestamps.rfc3339(plan.requeue_at) if settled and plan.requeue_at else None
    assert expected == (settled, until)


def _pending_pod(**status: Any) -> views.PodView:
    """An attempt-1 pod that does not run: unscheduled, or waiting for its image."""
    return views.parse_pod(
        {"metadata": {"name": "demo-a1-abc", "labels": {marks.ATTEMPT_LABEL: "1"}},
         "spec": {"nodeName": "n0", "containers": [{"name": "main"}]},
         "status": {"phase": "Pending", **status}}
    )  # fmt: skip


def _evicted(requeue_s: float) -> views.WorkloadView:
    """A Workload Kueue took the quota from (waitForPodsReady), queued again at a time."""
    view = a_workload(cond("Evicted", reason="PodsReadyTimeout", message="re-queued", at=10))
    return dataclasses.replace(view, requeue_at=T0 + dt.timedelta(seconds=requeue_s),
                               requeue_count=2)  # fmt: skip


LIVE_OBSERVATIONS = st.fixed_dictionaries({
    "attempt_object": st.sampled_from([a_job(), a_job(suspended=True)]),
    "workload": st.sampled_from([
        None, a_workload(), a_workload(*ADMITTED, cq="cq"),
        a_workload(cond("QuotaReserved", at=20), cond("Admitted", at=20), cq="cq"),
        _evicted(60), _evicted(200),
    ]),
    "pods": st.sampled_from([
        (), (a_pod(),), (a_pod(phase="Failed", node="bad", exit_code=143),),
        (a_pod(phase="Failed", exit_code=3),),
        (_pending_pod(conditions=[cond("PodScheduled", "False", "Unschedulable", "0/4 fit")]),),
        (_pending_pod(containerStatuses=[{"name": "main", "state": {"waiting": {
            "reason": "ImagePullBackOff", "message": "no such image"}}}]),),
    ]),
    "nodes": st.sampled_from([NODES, views.NodeFacts(frozenset({"n0"}), frozenset())]),
    "held": st.sampled_from([None, "the gate holds it"]),
    "cluster_queue": st.sampled_from(["cq", None]),
    "position": st.sampled_from([None, positions.QueuePosition(2, 1, positions.PositionSource.
                                                                COMPUTED)]),
    "priority_classes": st.sampled_from([None, frozenset({marks.RESUME_PRIORITY_CLASS})]),
})  # fmt: skip
LIVE_SPECS = st.sampled_from([
    spec_with(), spec_with(timeout="2m"),
    spec_with(retry={"maxAttempts": 3, "backoff": "30s", "when": ["AppError", "NodeFailure"]}),
])  # fmt: skip


@given(
    observation=LIVE_OBSERVATIONS,
    spec=LIVE_SPECS,
    ready_s=st.sampled_from([None, 30.0, 120.0]),
    steps=st.lists(st.floats(0, 60), min_size=4, max_size=4),
    later_s=st.floats(0, 400),
)
@hsettings(max_examples=600, deadline=None)
def test_a_steady_live_run_decides_the_same_until_its_requeue(
    *,
    observation: dict[str, Any],
    spec: dict[str, Any],
    ready_s: float | None,
    steps: list[float],
    later_s: float,
) -> None:
    """`policy.steady`, which lets a pass skip a live run while all it reads stays the same:
    a run that keeps being observed the same settles (each decision's status read back as
    the next one's); once a decision writes nothing, any later one from the same input
    before its `requeue_at` is the same plan. This is what makes a queue's waiting message
    (Kueue's waitForPodsReady deadline, its requeue backoff), a retry's backoff and a
    timeout come on time while the pass skips the run."""
    settings = dataclasses.replace(SETTINGS, pods_ready_timeout_s=ready_s)
    status, now = status_with(), NOW
    for step in steps:
        observed = run(status, spec=spec, **observation)
        plan = policy.decide_run(observed, settings, now)
        if policy.steady(observed, plan):
            break
        status, now = plan.status, now + dt.timedelta(seconds=step)
    else:
        return
    later = now + dt.timedelta(seconds=later_s)
    if plan.requeue_at is not None and later >= plan.requeue_at:
        return
    assert plan == policy.decide_run(observed, settings, later)
