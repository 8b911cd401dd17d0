"""When to set DCGM's health watches, when to read them, and when to try again (pure).

A host engine forgets its watches when it restarts (the GPU Operator's `nvidia-dcgm` pod
during an upgrade); `dcgmi health -c -j` then prints "Error: Health watches not enabled", not
JSON. And a DCGM that was down when the agent started is down only for a while. So the
supervisor re-arms (`dcgmi health -s a`) after every failed or unreadable check, and retries
an arm that failed with an exponential backoff, for as long as the agent runs. The
monitor passes `now` and the outcome of each `dcgmi` call; nothing here runs anything.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum


class Step(enum.StrEnum):
    """The next `dcgmi` call."""

    ARM = "Arm"
    """`dcgmi health -s a`: set every health watch."""
    CHECK = "Check"
    """`dcgmi health -c -j`: read them."""


@dataclasses.dataclass(frozen=True, slots=True)
class Timing:
    """The supervisor's settings."""

    check_interval_s: float = 60.0
    retry_initial_s: float = 5.0
    retry_max_s: float = 300.0


@dataclasses.dataclass(frozen=True, slots=True)
class WatchState:
    """Where the health watches stand."""

    armed: bool = False
    available: bool = False
    """The last call reached a host engine and succeeded."""
    failures: int = 0
    """Failed calls in a row since the last success."""
    next_at: dt.datetime | None = None
    """When the next call is due (None: at once)."""
    detail: str = "not started"
    rearmed: int = 0
    """How often the watches were set again after they had been set once."""
    armed_once: bool = False
    last_check_at: dt.datetime | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    """The next call and when it is due."""

    step: Step
    at: dt.datetime


def plan(state: WatchState, now: dt.datetime) -> Plan:
    """Return the next call: arm until the watches are set, then check them."""
    return Plan(Step.CHECK if state.armed else Step.ARM, state.next_at or now)


def backoff_s(failures: int, timing: Timing) -> float:
    """Seconds before retry number `failures` (1: the initial delay), capped."""
    if failures <= 0:
        return 0.0
    return float(min(timing.retry_initial_s * 2.0 ** (failures - 1), timing.retry_max_s))


def after_arm(
    state: WatchState, *, ok: bool, detail: str, now: dt.datetime, timing: Timing
) -> WatchState:
    """Fold the outcome of `dcgmi health -s a`."""
    if ok:
        # DCGM needs samples before a check means anything: the first read waits an interval.
        return dataclasses.replace(
            state,
            armed=True,
            available=True,
            failures=0,
            next_at=now + dt.timedelta(seconds=timing.check_interval_s),
            detail="health watches set",
            rearmed=state.rearmed + (1 if state.armed_once else 0),
            armed_once=True,
        )
    failures = state.failures + 1
    delay = backoff_s(failures, timing)
    return dataclasses.replace(
        state,
        armed=False,
        available=False,
        failures=failures,
        next_at=now + dt.timedelta(seconds=delay),
        detail=f"{detail} (attempt {failures}; retrying in {delay:g} s)",
    )


def after_check(
    state: WatchState, *, ok: bool, detail: str, now: dt.datetime, timing: Timing
) -> WatchState:
    """Fold the outcome of `dcgmi health -c -j`; any failure means arm again, at once."""
    if ok:
        return dataclasses.replace(
            state,
            available=True,
            failures=0,
            next_at=now + dt.timedelta(seconds=timing.check_interval_s),
            detail="health watches set",
            last_check_at=now,
        )
    # Not JSON, an error or no answer: the host engine restarted (and forgot its watches) or
    # is down. Re-arming at once covers the first; a failing arm then backs off.
    return dataclasses.replace(
        state,
        armed=False,
        available=False,
        failures=state.failures + 1,
        next_at=now,
        detail=f"health check failed, setting the watches again: {detail}",
        last_check_at=now,
    )
