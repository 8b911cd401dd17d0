"""Results reports, collected: buffered per run, written in batches, kept across a failed
write, flushed at shutdown (against a writer of our own in memory: what is checked is the
collector's bookkeeping; the cluster tier checks the writes land on a real TauRun)."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import pytest

from controller import errors
from controller.runs import collecting, records, results
from tests import support

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


class MemoryRun:
    """One TauRun's status in memory; `fail` makes the next writes raise."""

    def __init__(self) -> None:
        self.status: dict[str, Any] = {"currentAttempt": 1}
        self.writes = 0
        self.fail = 0
        self.locks: dict[tuple[str, str], asyncio.Lock] = {}

    def lock(self, key: tuple[str, str]) -> asyncio.Lock:
        return self.locks.setdefault(key, asyncio.Lock())

    async def managed_run(self, namespace: str, name: str) -> dict[str, Any]:
        return {"metadata": {"namespace": namespace, "name": name}, "status": self.status}

    async def write_status(self, item: dict[str, Any], status: records.RunStatus) -> dict[str, Any]:
        if self.fail:
            self.fail -= 1
            msg = "the API server said 500"
            raise RuntimeError(msg)
        self.writes += 1
        self.status = records.wire(status)
        return item

    def points(self) -> int:
        kept = records.read(self.status).results
        return sum(len(s.points) for s in kept.metrics) if kept else 0


def collector(
    run: MemoryRun, flush_s: float = 0.01, pending_max: int = 100
) -> collecting.Collector:
    return collecting.Collector(run, flush_s=flush_s, limits=results.Limits(),
                                pending_max=pending_max, clock=lambda: T0)  # fmt: skip


async def written(run: MemoryRun, points: int) -> None:
    """Wait until the run's status holds `points` points."""

    async def probe() -> None:
        assert run.points() == points, run.points()

    await support.eventually(probe, what=f"{points} points written", interval_s=0.01)


def loss(step: int, attempt: int = 1) -> results.ResultReport:
    return results.parse_report(
        {"attempt": attempt, "metrics": [{"name": "loss", "value": 1.0, "step": step}]}
    )


async def test_a_burst_is_written_once_and_later_reports_in_a_later_write() -> None:
    """Reports of one burst share one write; a report after it gets a write of its own."""
    run = MemoryRun()
    c = collector(run)
    for step in range(10):
        await c.accept("ns", "r", loss(step))
    await written(run, 10)
    await c.accept("ns", "r", loss(10))
    await written(run, 11)
    assert run.writes == 2


async def test_a_failed_write_keeps_the_reports_for_the_next_try() -> None:
    """An API error loses nothing: the batch waits and the next try writes it."""
    run = MemoryRun()
    run.fail = 2
    c = collector(run)
    await c.accept("ns", "r", loss(1))
    await written(run, 1)
    assert (run.writes, run.fail, c.pending("ns", "r")) == (1, 0, 0)


async def test_shutdown_flushes_what_waits() -> None:
    """`aclose` writes the buffers at once instead of waiting for their timers."""
    run = MemoryRun()
    c = collector(run, flush_s=3600)
    await c.accept("ns", "r", loss(1))
    await c.aclose()
    assert (run.points(), run.writes) == (1, 1)


async def test_a_full_buffer_and_a_stale_attempt_are_refused() -> None:
    """Past `pending_max` a report is 429 (TooManyRequests); another attempt's is 409."""
    run = MemoryRun()
    run.status = {"currentAttempt": 2}
    c = collector(run, flush_s=3600, pending_max=2)
    await c.accept("ns", "r", loss(1, attempt=2))
    await c.accept("ns", "r", loss(2, attempt=2))
    with pytest.raises(errors.TooManyRequests):
        await c.accept("ns", "r", loss(3, attempt=2))
    with pytest.raises(errors.Conflict) as err:
        await c.accept("ns", "r", loss(3, attempt=1))
    assert err.value.code == "StaleAttempt"
    await c.aclose()
