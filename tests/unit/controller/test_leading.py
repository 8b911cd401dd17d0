"""Leader election: one leader, judged on our own clock, and writes fenced by the lease."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt

import pytest

from controller import leading

WALL = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def record(holder: str, version: str = "1", duration: float = 15.0) -> leading.LeaseRecord:
    return leading.LeaseRecord(holder, duration, WALL, WALL, 0, f"http://{holder}", version)


@pytest.mark.parametrize(
    ("obs", "now", "expected_holder"),
    [
        pytest.param(leading.Observation(None, 0), 0, "me", id="no lease: acquire it"),
        pytest.param(leading.Observation(record("me"), 0), 5, "me", id="our own lease: renew it"),
        pytest.param(
            leading.Observation(record("other"), 0), 10, None, id="another's live lease: wait"
        ),
        pytest.param(
            leading.Observation(record("other"), 0),
            16,
            "me",
            id="another's lease unrenewed: take over",
        ),
        pytest.param(
            leading.Observation(record(""), 0), 1, "me", id="a released lease: acquire at once"
        ),
    ],
)
def test_next_record_acquires_renews_or_waits(
    obs: leading.Observation, now: float, expected_holder: str | None
) -> None:
    """The decision depends only on what we observed and when it last changed."""
    rec = leading.next_record(
        obs, identity="me", url="http://me", duration_s=15, wall=WALL, now=now
    )
    assert (rec.holder if rec else None) == expected_holder


def test_taking_over_counts_a_transition_and_keeps_the_version_for_a_conditional_write() -> None:
    """A takeover bumps leaseTransitions and writes conditionally on the observed version."""
    obs = leading.Observation(record("other", version="42"), 0)
    rec = leading.next_record(obs, identity="me", url="http://me", duration_s=15, wall=WALL, now=20)
    assert rec is not None
    assert (rec.transitions, rec.version, rec.leader_url) == (1, "42", "http://me")


class MemoryStore:
    """An in-memory Lease with optimistic concurrency, like the API server's."""

    def __init__(self) -> None:
        self.rec: leading.LeaseRecord | None = None
        self.n = 0

    async def read(self) -> leading.LeaseRecord | None:
        return self.rec

    async def write(
        self, record: leading.LeaseRecord, *, create: bool
    ) -> leading.LeaseRecord | None:
        if create and self.rec is not None:
            return None
        if not create and (self.rec is None or self.rec.version != record.version):
            return None
        self.n += 1
        self.rec = dataclasses.replace(record, version=str(self.n))
        return self.rec


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


async def test_two_electors_never_lead_at_once_and_the_follower_takes_over_after_expiry() -> None:
    """Only one replica leads; when it stops renewing, the other leads after one lease."""
    store, clock = MemoryStore(), Clock()
    a = leading.Elector(store, "a", "http://a", lease_duration_s=15, renew_deadline_s=10,
                        retry_period_s=2, clock=clock)  # fmt: skip
    b = leading.Elector(store, "b", "http://b", lease_duration_s=15, renew_deadline_s=10,
                        retry_period_s=2, clock=clock)  # fmt: skip
    await a.step()
    await b.step()
    assert (a.is_leader(), b.is_leader()) == (True, False)
    assert b.leader_identity == "a"
    for _ in range(7):  # a stops renewing; b keeps observing
        clock.t += 2
        await b.step()
        assert not b.is_leader() or not a.is_leader()
    assert a.is_leader() is False, "a missed its renew deadline and must stop writing"
    with pytest.raises(leading.NotLeaderError):
        a.ensure_leader()
    clock.t += 2
    await b.step()
    assert b.is_leader() is True
    assert store.rec is not None
    assert store.rec.holder == "b"


async def test_releasing_on_shutdown_lets_the_follower_lead_at_once() -> None:
    """A leader that shuts down clears the holder; the follower does not wait a lease."""
    store, clock = MemoryStore(), Clock()
    a = leading.Elector(store, "a", "http://a", lease_duration_s=15, renew_deadline_s=10,
                        retry_period_s=2, clock=clock)  # fmt: skip
    b = leading.Elector(store, "b", "http://b", lease_duration_s=15, renew_deadline_s=10,
                        retry_period_s=2, clock=clock)  # fmt: skip
    await a.step()
    await a.release()
    clock.t += 0.1
    await b.step()
    assert b.is_leader() is True


async def test_the_pass_helper_counts_a_failed_pass_and_goes_on() -> None:
    """A pass that raises is counted under its loop's name and the next pass runs; losing
    the lease mid-pass is not a failure; a follower runs no pass at all."""
    store, clock = MemoryStore(), Clock()
    elector = leading.Elector(store, "a", "http://a", lease_duration_s=15, renew_deadline_s=10,
                              retry_period_s=2, clock=clock)  # fmt: skip
    outcomes: list[BaseException | None] = [RuntimeError("api down"), leading.NotLeaderError("x")]
    passes: list[int] = []
    failures: list[str] = []
    followed: list[int] = []
    wake = asyncio.Event()

    async def one_pass() -> float | None:
        passes.append(len(passes))
        outcome = outcomes.pop(0) if outcomes else None
        if outcome is not None:
            raise outcome
        return None

    loop = asyncio.create_task(
        leading.run_passes("demo", one_pass, wake=wake, interval_s=3600, elector=elector,
                           failures=failures.append, on_follower=lambda: followed.append(1))
    )  # fmt: skip
    try:
        while not followed:  # not the leader yet: the helper runs no pass
            await asyncio.sleep(0)
        await elector.step()
        for _ in range(3):
            wake.set()
            for _ in range(50):
                await asyncio.sleep(0)
    finally:
        loop.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loop
    assert (passes, failures) == ([0, 1, 2], ["demo"])


class RecordingLabel:
    """The leader label of one pod, as the writes left it; fails the next `fail` writes."""

    def __init__(self) -> None:
        self.writes: list[bool] = []
        self.fail = 0

    async def set_leader(self, leading: bool) -> None:
        if self.fail:
            self.fail -= 1
            msg = "the API server is away"
            raise ConnectionError(msg)
        self.writes.append(leading)


async def test_the_leader_label_follows_the_lease_and_is_written_only_on_a_change() -> None:
    """First sync writes (clearing a label left by a restarted container), then only changes
    are written: leading sets it, losing the lease removes it."""
    store, clock = MemoryStore(), Clock()
    elector = leading.Elector(store, "a", "http://a", lease_duration_s=15, renew_deadline_s=10,
                              retry_period_s=2, clock=clock)  # fmt: skip
    label = RecordingLabel()
    mark = leading.LeaderMark(label, elector, interval_s=1.0)
    await mark.sync()  # a follower: the label is removed once
    await elector.step()
    await mark.sync()
    await mark.sync()  # unchanged: nothing written
    clock.t += 11  # past the renew deadline without renewing: no longer the leader
    await mark.sync()
    expected = [False, True, False]
    assert expected == label.writes


async def test_a_failed_label_write_is_retried_until_it_lands() -> None:
    """A write that fails leaves the mark unwritten, so the next round writes again."""
    store, clock = MemoryStore(), Clock()
    elector = leading.Elector(store, "a", "http://a", lease_duration_s=15, renew_deadline_s=10,
                              retry_period_s=2, clock=clock)  # fmt: skip
    await elector.step()
    label = RecordingLabel()
    label.fail = 2
    mark = leading.LeaderMark(label, elector, interval_s=1.0)
    for _ in range(3):
        with contextlib.suppress(ConnectionError):
            await mark.sync()
    expected = ([True], True)
    assert expected == (label.writes, mark.written)


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        pytest.param(["start"], (1, 0, True), id="start runs the task"),
        pytest.param(["start", "start"], (1, 0, True),
                     id="a second start while it runs starts nothing"),
        pytest.param(["start", "stop"], (1, 1, False),
                     id="stop cancels the task and waits for its end"),
        pytest.param(["start", "stop", "start"], (2, 1, True),
                     id="leading again starts it again"),
        pytest.param(["stop"], (0, 0, False), id="stop without a task does nothing"),
        pytest.param(["stop", "stop", "start", "stop", "stop"], (1, 1, False),
                     id="stops repeat harmlessly (the elector's and the shutdown's)"),
    ],
)  # fmt: skip
async def test_a_task_runs_only_between_start_and_stop(
    steps: list[str], expected: tuple[int, int, bool]
) -> None:
    """`WhileLeading` runs at most one task, from `start` until `stop`, which waits for the
    task's own cleanup."""
    started: list[None] = []
    ended: list[None] = []

    async def run() -> None:
        started.append(None)
        try:
            await asyncio.Event().wait()
        finally:
            ended.append(None)

    task = leading.WhileLeading("test", run)
    for step in steps:
        if step == "start":
            task.start()
            await asyncio.sleep(0)  # let it begin
        else:
            await task.stop()
    assert expected == (len(started), len(ended), task.running)
    await task.stop()
