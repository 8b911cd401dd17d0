"""The API write budget on the real control plane: a storm bigger than the budget queues, loses
nothing, and the lease keeps being renewed first."""

from __future__ import annotations

import pathlib
import re
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from kubernetes_asyncio import client

from devcluster import cluster
from tests import controllerkit as kit
from tests import support

pytestmark = pytest.mark.cluster

TAINT_KEY = "taugrid.dev/gpu-unhealthy"


@pytest_asyncio.fixture
async def fleet(
    k8s: client.ApiClient, dev_cluster: cluster.Cluster, bin_dir: pathlib.Path, namespace: str
) -> AsyncIterator[list[str]]:
    """Six fake GPU nodes that only this test's controller manages."""
    async with kit.own_fleet(k8s, dev_cluster, bin_dir, namespace, 6, tag="wb") as names:
        yield names


def _sample(text: str, family: str, cls: str) -> float:
    """One labelled sample of the controller's /metrics, 0 when absent."""
    pattern = rf'^{re.escape(family)}\{{class="{cls}"\}} (\S+)$'
    found = re.search(pattern, text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


async def test_a_storm_past_the_budget_queues_loses_nothing_and_the_lease_goes_first(
    k8s: client.ApiClient, dev_cluster: cluster.Cluster, namespace: str, fleet: list[str]
) -> None:
    """Six nodes fail at once under a budget of 4 writes/s (burst 2): every one is tainted
    and cordoned in the end, node writes waited for the budget, and the replica still leads
    (its lease renewals went first)."""
    agents = [kit.Agent(n, await kit.agent_token(k8s, namespace, n)) for n in fleet]
    async with kit.running(
        dev_cluster, namespace, agents,
        max_quarantined=100, breaker_percent=100,
        api_writes_per_s=4.0, api_write_burst=2, api_write_aging_s=30.0,
    ) as (ctl, http, _loops):  # fmt: skip

        async def all_healthy() -> None:
            for n in fleet:
                cond = kit.gpu_condition(await kit.read_node(k8s, n))
                assert cond is not None, n
                assert cond["status"] == "True", (n, cond)

        await support.eventually(all_healthy, what="every node healthy", timeout_s=120)
        for agent in agents:
            agent.fail(0)

        async def all_quarantined() -> None:
            for n in fleet:
                node = await kit.read_node(k8s, n)
                taints = {t["key"] for t in node["spec"].get("taints") or []}
                assert TAINT_KEY in taints, (n, taints)
                assert node["spec"].get("unschedulable") is True, n

        await support.eventually(all_quarantined, what="every node quarantined", timeout_s=120)
        async with http.get(f"{ctl.url}/metrics") as resp:
            text = await resp.text()
        assert ctl.serving.elector.is_leader()
        assert _sample(text, "taugrid_api_writes_total", "lease") >= 1
        assert _sample(text, "taugrid_api_writes_total", "node") >= 2 * len(fleet)
        # Six quarantines are at least 12 node writes at 4/s: some waited for the budget.
        assert _sample(text, "taugrid_api_write_wait_seconds_sum", "node") > 0
