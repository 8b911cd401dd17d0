"""A pass or a submission cancelled as it starts its reads leaves no read behind unawaited.

`asyncio.gather` wraps each read in a task; a task cancelled before its first step never runs
its coroutine's body, so a read handed to a helper as a coroutine object (rather than started
inside it) would be dropped never awaited: Python then warns "coroutine ... was never
awaited" (a test with unraisable warnings as errors fails; a daemon logs noise). The pass and
the pre-flight start their reads inside the helpers; these tests cancel each right after it
has scheduled its reads and fail on any such warning.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import typing
import warnings
from collections.abc import Callable, Coroutine
from typing import Any

from controller.runs import preflight
from tests.unit.controller.runs.test_preflight import VOLUMES, spec
from tests.unit.controller.runs.test_reconciling import FakeStore, _reconciler


async def _never_awaited(start: Callable[[], Coroutine[Any, Any, Any]]) -> list[str]:
    """Start `start()`, let it schedule its reads, cancel it before any read runs; return the
    "never awaited" warnings that follow."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        task = asyncio.ensure_future(start())
        await asyncio.sleep(0)  # its first step: gather schedules the reads
        task.cancel()  # before any of them has run a step
        with contextlib.suppress(asyncio.CancelledError):
            await task
        gc.collect()
    return [str(w.message) for w in seen if "never awaited" in str(w.message)]


async def test_a_pass_cancelled_as_it_starts_its_reads_leaves_none_unawaited() -> None:
    rec = _reconciler(FakeStore())
    assert await _never_awaited(rec.snapshot) == []
    assert await _never_awaited(lambda: rec.snapshot_of_run("team", "demo")) == []


class _Store:
    """Pre-flight's reads, each answering at once."""

    async def list_kueue(self, plural: str, namespace: str | None = None) -> list[dict[str, Any]]:
        return []

    async def get_cluster_queue(self, name: str) -> dict[str, Any] | None:
        return None

    async def get_priority_class(self, name: str) -> dict[str, Any] | None:
        return {}

    async def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None


async def test_a_preflight_cancelled_as_it_starts_its_reads_leaves_none_unawaited() -> None:
    store = typing.cast("preflight.PreflightStore", _Store())
    submitted = spec(priority="high", **VOLUMES)
    assert await _never_awaited(lambda: preflight.gather(store, submitted, "team")) == []
