"""The on-call verbs of `tau` against a controller on the real control plane."""

from __future__ import annotations

import asyncio
import os
import pathlib
import sys
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from kubernetes_asyncio import client

from devcluster import cluster
from tests import controllerkit as kit
from tests import support

pytestmark = pytest.mark.cluster

TAINT = "taugrid.dev/gpu-unhealthy:NoSchedule"
TAU = pathlib.Path(__file__).resolve().parents[4] / "controller" / "assets" / "tau.py"


@pytest_asyncio.fixture
async def fleet(
    k8s: client.ApiClient, dev_cluster: cluster.Cluster, bin_dir: pathlib.Path, namespace: str
) -> AsyncIterator[list[str]]:
    """Two fake GPU nodes that only this test's controller manages."""
    async with kit.own_fleet(k8s, dev_cluster, bin_dir, namespace, 2, tag="t") as names:
        yield names


async def test_on_call_runs_the_fleet_from_tau(
    k8s: client.ApiClient, dev_cluster: cluster.Cluster, namespace: str, fleet: list[str],
    tmp_path: pathlib.Path,
) -> None:  # fmt: skip
    """tau nodes, node, quarantine, release, fleet, dry-run and breaker-reset do what the
    fleet API does: the taint comes and goes, the mode switches, the node shows its record."""
    agents = [kit.Agent(n, await kit.agent_token(k8s, namespace, n)) for n in fleet]
    token = await kit.admin_token(k8s, namespace)
    async with kit.running(dev_cluster, namespace, agents, max_quarantined=2) as (ctl, _, _):

        async def tau(*argv: str) -> tuple[int, str]:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, str(TAU), *argv,
                env={"TAU_URL": ctl.url, "TAU_TOKEN": token, "PATH": os.environ["PATH"],
                     "XDG_CONFIG_HOME": str(tmp_path)},
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            )  # fmt: skip
            out, _ = await asyncio.wait_for(proc.communicate(), 60)
            return int(proc.returncode or 0), out.decode()

        async def listed() -> str:
            code, out = await tau("nodes")
            assert code == 0, out
            assert all(n in out for n in fleet), out
            return out

        await support.eventually(listed, what="tau nodes to list the fleet")
        code, out = await tau("quarantine", fleet[0], "--reason", "fan noise, ticket 7")
        assert (code, "quarantined" in out) == (0, True), out

        async def tainted() -> None:
            assert TAINT in kit.taints(await kit.read_node(k8s, fleet[0]))

        await support.eventually(tainted, what="the manual quarantine's taint")
        code, out = await tau("node", fleet[0])
        assert (code, "fan noise, ticket 7" in out) == (0, True), out

        code, out = await tau("release", fleet[0], "--reason", "fan replaced")
        assert (code, "not quarantined" in out) == (0, True), out

        async def released() -> None:
            assert TAINT not in kit.taints(await kit.read_node(k8s, fleet[0]))

        await support.eventually(released, what="the manual release")
        code, out = await tau("dry-run", "on")
        assert (code, "Dry run:     on" in out) == (0, True), out
        code, out = await tau("fleet", "--json")
        assert (code, '"dryRun": true' in out) == (0, True), out
        code, out = await tau("dry-run", "off")
        assert (code, "Dry run:     off" in out) == (0, True), out
        code, out = await tau("breaker-reset", "--reason", "checked the switch: ticket 7")
        assert (code, "Breaker:     closed" in out) == (0, True), out

        async def reset_recorded_with_its_reason() -> None:
            events = await client.EventsV1Api(k8s).list_namespaced_event(namespace)
            notes = [e.note for e in events.items if e.reason == "CloseBreaker"]
            assert any("checked the switch: ticket 7" in (n or "") for n in notes), notes

        await support.eventually(reset_recorded_with_its_reason, what="the reset's Event")
