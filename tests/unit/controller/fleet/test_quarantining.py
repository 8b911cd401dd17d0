"""The quarantine loop's scheduling of its writes: fences never wait behind other writes.

The actuator's writer is a stand-in here (it applies each patch as the API server would,
`fakes.apply`), because what is tested is the order and overlap of our own writes, which a
real API server answering in milliseconds cannot hold still; the writes themselves are
tested on the real control plane (tests/integration/controller/fleet).
"""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any, cast

from kubernetes_asyncio import client

from controller import leading, metrics
from controller.fleet import conditions, quarantining, state
from controller.kube import nodes as kube_nodes
from tests.unit.controller.fleet import fakes
from tests.unit.controller.fleet.fakes import at
from tests.unit.controller.fleet.test_policy import SETTINGS


class _Leader:
    def is_leader(self) -> bool:
        return True

    def ensure_leader(self) -> None:
        pass


class _Writer:
    """Applies patches to the cache's nodes; a condition write of a node in `held` waits
    until `release` is set."""

    def __init__(self, cache: kube_nodes.NodeCache) -> None:
        self.cache = cache
        self.held: set[str] = set()
        self.release = asyncio.Event()
        self.log: list[tuple[str, str]] = []

    async def patch(self, name: str, patch: conditions.NodePatch) -> dict[str, Any] | None:
        what = "condition" if patch.subresource == "status" else "fence"
        if what == "condition" and name in self.held:
            await self.release.wait()
        self.log.append((name, what))
        return fakes.apply(self.cache.nodes[name], patch)

    async def event(self, node: dict[str, Any], reason: str, note: str, *, warning: bool) -> None:
        pass


def _quarantiner(
    api: client.ApiClient,
) -> tuple[quarantining.Quarantiner, _Writer, state.FleetState]:
    fleet = state.FleetState(leader_since=at(-3600), stale_multiplier=3.0)
    cache = kube_nodes.NodeCache(api, on_change=lambda: None)  # never runs: no API calls
    cache.nodes = {n: kube_nodes.trim_node(fakes.raw_node(n)) for n in ("a", "b")}
    writer = _Writer(cache)
    q = quarantining.Quarantiner(
        fleet, cache=cache, writer=cast("kube_nodes.NodeWriter", writer),
        settings=SETTINGS.model_copy(
            update={"max_quarantined_fraction": 1.0, "breaker_percent": 100}
        ),
        elector=cast("leading.Elector", _Leader()), metrics=metrics.make_metrics(),
        clock=lambda: at(0),
    )  # fmt: skip
    return q, writer, fleet


def _fail(fleet: state.FleetState, node: str, now: dt.datetime) -> None:
    fleet.ingest(fakes.hb(node, faults={0: [fakes.xid79(now)]}, sent_at=now), now)


async def test_a_pass_fences_while_the_last_ones_conditions_are_still_being_written() -> None:
    """Node a fails: its pass taints it, and its condition write hangs. Node b fails: the
    next pass taints b at once, leaving a (still being written) alone; once a's write is
    through, a pass finds a done and writes nothing twice."""
    async with client.ApiClient() as api:
        await _two_faults(*_quarantiner(api))


async def _two_faults(
    q: quarantining.Quarantiner, writer: _Writer, fleet: state.FleetState
) -> None:
    _fail(fleet, "a", at(0))
    writer.held.add("a")
    await q.run_pass()
    _fail(fleet, "b", at(0))
    async with asyncio.timeout(5):  # generous: a pass waiting for a's write never returns
        await q.run_pass()
        while ("b", "condition") not in writer.log:  # b's goes on beside a's, held
            await asyncio.sleep(0)
    before_release = list(writer.log)
    writer.release.set()
    await q.settle()
    await q.run_pass()
    await q.settle()
    expected = (
        [("a", "fence"), ("b", "fence"), ("b", "condition")],
        [("a", "fence"), ("b", "fence"), ("b", "condition"), ("a", "condition")],
    )
    assert expected == (before_release, writer.log)


async def test_only_writes_a_pass_had_to_leave_alone_ask_for_another_pass() -> None:
    """When a node's background writes end, a pass is asked for only if a pass skipped the
    node meanwhile: asking after every round would retry, say, an eviction a
    PodDisruptionBudget refused in a tight loop."""
    async with client.ApiClient() as api:
        q, writer, fleet = _quarantiner(api)
        _fail(fleet, "a", at(0))
        await q.run_pass()
        q.wake.clear()
        await q.settle()
        alone = q.wake.is_set()
        writer.held.add("b")
        _fail(fleet, "b", at(0))
        await q.run_pass()
        await q.run_pass()  # b is busy: left alone
        q.wake.clear()
        writer.release.set()
        await q.settle()
        assert (alone, q.wake.is_set()) == (False, True)
