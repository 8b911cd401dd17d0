"""An eviction a PodDisruptionBudget refuses (429) is tried again, on the real control plane:
the quarantine pass judges only the nodes its queue hands out, so a node whose eviction was
blocked must come back to the queue, not wait for the next resync; and it is tried again
after `eviction_retry_s`, not on every pass (`controller.fleet.evictions`)."""

from __future__ import annotations

import contextlib
import pathlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from kubernetes_asyncio import client

from devcluster import cluster
from tests import controllerkit as kit
from tests import support

pytestmark = pytest.mark.cluster


@pytest_asyncio.fixture
async def fleet(
    k8s: client.ApiClient, dev_cluster: cluster.Cluster, bin_dir: pathlib.Path, namespace: str
) -> AsyncIterator[list[str]]:
    """Two fake GPU nodes that only this test's controller manages."""
    async with kit.own_fleet(k8s, dev_cluster, bin_dir, namespace, 2, tag="e") as names:
        yield names


async def _guarded_trainer(k8s: client.ApiClient, namespace: str, node: str) -> None:
    """A GPU pod on `node` that a PodDisruptionBudget keeps (counted by the budget)."""
    core, policy = client.CoreV1Api(k8s), client.PolicyV1Api(k8s)
    await core.create_namespaced_pod(namespace, {
        "metadata": {"name": "trainer", "labels": {"app": "trainer"},
                     "annotations": {"kwok.taugrid.dev/run-for": "1h"}},
        "spec": {"nodeName": node, "restartPolicy": "Never",
                 "containers": [{"name": "main", "image": "train@sha256:" + "4" * 64,
                                 "resources": {"limits": {"nvidia.com/gpu": "8"}}}]},
    })  # fmt: skip
    await policy.create_namespaced_pod_disruption_budget(namespace, {
        "metadata": {"name": "keep-trainer"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "trainer"}}},
    })  # fmt: skip

    async def protected() -> None:
        pdb = await policy.read_namespaced_pod_disruption_budget("keep-trainer", namespace)
        assert pdb.status is not None
        assert (pdb.status.expected_pods, pdb.status.current_healthy) == (1, 1)

    await support.eventually(protected, what="the budget to count the trainer")


async def _healthy(k8s: client.ApiClient, node: str) -> None:
    async def healthy() -> None:
        cond = kit.gpu_condition(await kit.read_node(k8s, node))
        assert cond is not None
        assert cond["status"] == "True"

    await support.eventually(healthy, what="GPUHealthy=True from heartbeats")


def _sample(ctl: kit.RunningController, name: str, labels: dict[str, str] | None = None) -> float:
    return ctl.serving.metrics.registry.get_sample_value(name, labels or {}) or 0.0


@contextlib.asynccontextmanager
async def _guarded_node_fails(
    k8s: client.ApiClient,
    dev_cluster: cluster.Cluster,
    namespace: str,
    fleet: list[str],
    **overrides: Any,
) -> AsyncIterator[kit.RunningController]:
    """A controller for `fleet` whose first node, holding a GPU pod a PodDisruptionBudget
    protects, reports healthy and then Xid 79; yields the controller."""
    agents = [kit.Agent(n, await kit.agent_token(k8s, namespace, n)) for n in fleet]
    async with kit.running(dev_cluster, namespace, agents, **overrides) as (ctl, _http, _loops):
        await _guarded_trainer(k8s, namespace, fleet[0])
        await _healthy(k8s, fleet[0])
        agents[0].fail(3)
        yield ctl


async def test_an_eviction_a_disruption_budget_blocked_is_tried_again_once_it_allows(
    k8s: client.ApiClient,
    dev_cluster: cluster.Cluster,
    namespace: str,
    fleet: list[str],
) -> None:
    """Xid 79 on a node whose GPU pod a PodDisruptionBudget protects: the node is quarantined
    and the eviction refused; once the budget is deleted the pod is evicted within a few
    retries (`eviction_retry_s`, 0.3 s here), long before the resync (10 minutes here) would
    have judged the node again."""
    core = client.CoreV1Api(k8s)
    policy = client.PolicyV1Api(k8s)
    overrides = {"full_pass_interval_s": 600.0}
    async with _guarded_node_fails(k8s, dev_cluster, namespace, fleet, **overrides) as ctl:

        async def refused() -> None:
            blocked = _sample(ctl, "taugrid_evictions_total", {"outcome": "blocked"})
            assert blocked >= 2, "the eviction was not refused and retried"

        await support.eventually(refused, what="the eviction refused by the budget, twice")
        assert (await core.read_namespaced_pod("trainer", namespace)).metadata.name == "trainer"
        await policy.delete_namespaced_pod_disruption_budget("keep-trainer", namespace)

        async def evicted() -> None:
            try:
                await core.read_namespaced_pod("trainer", namespace)
            except client.ApiException as err:
                if err.status == 404:
                    return
                raise
            raise AssertionError("the GPU pod is still on the quarantined node")

        await support.eventually(evicted, what="the GPU pod evicted once the budget is gone")


async def test_a_refused_eviction_is_not_tried_again_on_every_pass(
    k8s: client.ApiClient,
    dev_cluster: cluster.Cluster,
    namespace: str,
    fleet: list[str],
) -> None:
    """The rounds are paced (`controller.fleet.evictions`): with `eviction_retry_s` an hour,
    a round the budget refused is not run again on the passes that follow, though the node is
    judged on each of them (before, every pass listed the node's pods and asked again)."""
    overrides = {"full_pass_interval_s": 600.0, "eviction_retry_s": 3600.0}
    async with _guarded_node_fails(k8s, dev_cluster, namespace, fleet, **overrides) as ctl:

        async def refused() -> float:
            blocked = _sample(ctl, "taugrid_evictions_total", {"outcome": "blocked"})
            assert blocked == 1, "the eviction was not refused yet"
            return _sample(ctl, "taugrid_quarantine_pass_seconds_count")

        passes = await support.eventually(refused, what="the eviction refused by the budget")

        async def passed() -> None:
            done = _sample(ctl, "taugrid_quarantine_pass_seconds_count") - passes
            assert done >= 6, f"{done:.0f} passes since the refusal"

        await support.eventually(passed, what="six more quarantine passes")
        assert _sample(ctl, "taugrid_evictions_total", {"outcome": "blocked"}) == 1
