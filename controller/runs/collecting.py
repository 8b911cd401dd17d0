"""Results reports, collected: accepted at once, written to the TauRun in few writes.

A training loop may report a metric every step from every worker, and each report would be
a status write (and a new resourceVersion every reconcile pass must catch up with). So a
report is validated and fenced when it arrives (a stale attempt's is refused with 409, as a
checkpoint's is), answered 202, and kept in a buffer per run; `flush_s` after the first
report of a burst, the buffer is folded into the status by `results.merge` and written
once, under the run's lock (the reconciler's writes of the same run wait for it).

What a failover loses: reports answered 202 whose flush had not happened yet, at most
`flush_s` worth, held in the old leader's memory. A shutdown flushes first (while this
replica still leads); a write that fails is retried a few times, then dropped with a
warning. Pods that must not lose a report (the final metrics) can report again: the same
step of a metric replaces its value, the same artifact URI its entry.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import datetime as dt
from collections.abc import Callable
from typing import Any, Protocol

import structlog

from controller import errors, leading
from controller.runs import checkpoints, records, results

log = structlog.get_logger()

FLUSH_RETRIES = 5
"""Writes of one batch tried before it is dropped (each `flush_s` apart)."""


class Writer(Protocol):
    """What the collector needs of the reconciler: the run's lock, the run, its status."""

    def lock(self, key: tuple[str, str]) -> asyncio.Lock:
        """The lock every write of one run takes."""
        ...

    async def managed_run(self, namespace: str, name: str) -> dict[str, Any]:
        """The run, read fresh; NotFound when it is gone or another manager's."""
        ...

    async def write_status(self, item: dict[str, Any], status: records.RunStatus) -> dict[str, Any]:
        """Patch what changed of the status."""
        ...


class Collector:
    """Accept results reports and write them in batches; see the module docstring."""

    def __init__(
        self,
        writer: Writer,
        *,
        flush_s: float,
        limits: results.Limits,
        pending_max: int,
        clock: Callable[[], dt.datetime],
    ) -> None:
        self.writer = writer
        self.flush_s = flush_s
        self.limits = limits
        self.pending_max = pending_max
        """Points, artifacts and summaries waiting per run; more is 429."""
        self._clock = clock
        self._pending: dict[tuple[str, str], list[results.ResultReport]] = {}
        self._tasks: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._closing = False
        self.writes = 0
        """Status writes made, for the log and the tests that count them."""

    def pending(self, namespace: str, name: str) -> int:
        """Reports of a run accepted and not written yet."""
        return len(self._pending.get((namespace, name), ()))

    async def accept(
        self, namespace: str, name: str, report: results.ResultReport
    ) -> dict[str, Any]:
        """Take a report from the run's current attempt (see the module docstring); raise
        NotFound, checkpoints.FencedError (409) for another attempt, errors.Invalid for one
        metric name too many, errors.TooManyRequests when the run's buffer is full."""
        key = (namespace, name)
        item = await self.writer.managed_run(namespace, name)
        try:
            status = records.read(item.get("status"))
        except ValueError as err:
            msg = f"run {name!r} has a status this controller cannot read ({err})"
            raise errors.Conflict(msg, code="UnreadableStatus") from err
        checkpoints.fence(report, status.current_attempt)
        queued = self._pending.setdefault(key, [])
        results.check_names(status.results, queued, report, self.limits)
        if sum(r.size for r in queued) + report.size > self.pending_max:
            msg = (
                f"run {name!r} reports faster than its results are written: at most"
                f" {self.pending_max} points, artifacts and summaries wait at once; slow down"
                " or report several points per call"
            )
            raise errors.TooManyRequests(msg, code="ResultsBacklog")
        queued.append(report)
        if key not in self._tasks:
            # A context of its own: the request's (its request id) must not tag later writes.
            self._tasks[key] = asyncio.create_task(
                self._flush_later(key), name=f"results-{name}", context=contextvars.Context()
            )
        return {
            "accepted": {"metrics": len(report.metrics), "artifacts": len(report.artifacts),
                         "summary": report.summary is not None},
            "pending": len(queued),
            "writtenWithinS": self.flush_s,
        }  # fmt: skip

    async def _flush_later(self, key: tuple[str, str]) -> None:
        try:
            for _ in range(FLUSH_RETRIES):
                await asyncio.sleep(self.flush_s)
                if await self.flush(key):
                    break
            else:
                dropped = self._pending.pop(key, [])
                log.warning("results dropped", run=f"{key[0]}/{key[1]}", reports=len(dropped),
                            reason="writes kept failing")  # fmt: skip
        finally:
            self._tasks.pop(key, None)
        if self._pending.get(key) and not self._closing:  # came while the last write ran
            self._tasks[key] = asyncio.create_task(
                self._flush_later(key), context=contextvars.Context()
            )

    async def flush(self, key: tuple[str, str]) -> bool:
        """Write a run's buffered reports now; False when the write failed (they stay)."""
        namespace, name = key
        async with self.writer.lock(key):
            batch = self._pending.pop(key, [])
            if not batch:
                return True
            try:
                item = await self.writer.managed_run(namespace, name)
                old = records.read(item.get("status"))
                merged = results.merge(old.results, batch, self._clock(), self.limits)
                await self.writer.write_status(item, old.model_copy(update={"results": merged}))
            except errors.NotFound:
                log.info("results dropped", run=f"{namespace}/{name}", reports=len(batch),
                         reason="the run is gone")  # fmt: skip
                return True
            except leading.NotLeaderError:
                log.warning("results dropped", run=f"{namespace}/{name}", reports=len(batch),
                            reason="no longer the leader")  # fmt: skip
                return True
            except asyncio.CancelledError:
                self._pending[key] = batch + self._pending.get(key, [])
                raise
            except Exception as err:  # noqa: BLE001  (an API error: keep them, retry later)
                self._pending[key] = batch + self._pending.get(key, [])
                log.warning("results write failed", run=f"{namespace}/{name}", error=repr(err))
                return False
        self.writes += 1
        log.info("results written", run=f"{namespace}/{name}", reports=len(batch))
        return True

    async def aclose(self) -> None:
        """Flush every run's buffer now (shutdown, while still leading), then stop."""
        self._closing = True
        for task in list(self._tasks.values()):
            task.cancel()
        for task in list(self._tasks.values()):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        for key in list(self._pending):
            with contextlib.suppress(Exception):
                await self.flush(key)
        self._pending.clear()
