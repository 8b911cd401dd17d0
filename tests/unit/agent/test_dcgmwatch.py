"""The health-watch supervisor: arm, check, re-arm after any failure, back off while away."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from agent import dcgmwatch

T0 = dt.datetime(2026, 5, 1, 12, 0, tzinfo=dt.UTC)
TIMING = dcgmwatch.Timing(check_interval_s=60, retry_initial_s=5, retry_max_s=40)
ARM, CHECK = dcgmwatch.Step.ARM, dcgmwatch.Step.CHECK


@dataclasses.dataclass(frozen=True)
class Call:
    """One dcgmi call's outcome, and the (step, seconds until due) the supervisor plans next."""

    ok: bool
    then: tuple[dcgmwatch.Step, float]
    available: bool


def fold(calls: list[Call]) -> list[tuple[tuple[dcgmwatch.Step, float], bool]]:
    """Make each planned call with the given outcome at the time it is due."""
    state, now, out = dcgmwatch.WatchState(), T0, []
    for call in calls:
        plan = dcgmwatch.plan(state, now)
        now = plan.at
        fn = dcgmwatch.after_arm if plan.step is ARM else dcgmwatch.after_check
        state = fn(state, ok=call.ok, detail="dcgmi said no", now=now, timing=TIMING)
        nxt = dcgmwatch.plan(state, now)
        out.append(((nxt.step, (nxt.at - now).total_seconds()), state.available))
    return out


@pytest.mark.parametrize(
    "calls",
    [
        pytest.param([Call(True, (CHECK, 60), True), Call(True, (CHECK, 60), True)],
                     id="watches are set, then read every interval"),
        pytest.param([Call(True, (CHECK, 60), True), Call(False, (ARM, 0), False),
                      Call(True, (CHECK, 60), True)],
                     id="a failed or non-JSON check re-arms at once (a host-engine restart)"),
        pytest.param([Call(False, (ARM, 5), False), Call(False, (ARM, 10), False),
                      Call(False, (ARM, 20), False), Call(False, (ARM, 40), False),
                      Call(False, (ARM, 40), False), Call(True, (CHECK, 60), True)],
                     id="a DCGM down at start is retried with a capped backoff until it answers"),
        pytest.param([Call(True, (CHECK, 60), True), Call(False, (ARM, 0), False),
                      Call(False, (ARM, 10), False), Call(True, (CHECK, 60), True)],
                     id="a host engine that stays down after a failed check backs off too"),
    ],
)  # fmt: skip
def test_the_supervisor_plans_the_next_call(calls: list[Call]) -> None:
    """Each outcome leads to the next call and its delay, and to DCGM's availability."""
    assert [(c.then, c.available) for c in calls] == fold(calls)


def test_setting_the_watches_again_is_counted_and_said() -> None:
    """/v1/gpus shows how often the watches were set again and why DCGM is unavailable."""
    state = dcgmwatch.after_arm(dcgmwatch.WatchState(), ok=True, detail="", now=T0, timing=TIMING)
    state = dcgmwatch.after_check(state, ok=False, detail="not enabled", now=T0, timing=TIMING)
    assert "setting the watches again: not enabled" in state.detail
    state = dcgmwatch.after_arm(state, ok=False, detail="no host", now=T0, timing=TIMING)
    assert state.detail == "no host (attempt 2; retrying in 10 s)"
    state = dcgmwatch.after_arm(state, ok=True, detail="", now=T0, timing=TIMING)
    assert (state.rearmed, state.failures, state.available) == (1, 0, True)


@pytest.mark.parametrize(
    ("failures", "delay"),
    [(0, 0.0), (1, 5.0), (2, 10.0), (3, 20.0), (4, 40.0), (9, 40.0)],
    ids=lambda v: f"{v}",
)
def test_backoff_doubles_up_to_its_cap(failures: int, delay: float) -> None:
    """5 s, 10 s, 20 s, ... at most retry_max_s."""
    assert delay == dcgmwatch.backoff_s(failures, TIMING)
