"""What the run API's integration tests share: `env`, one test's world around a controller."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
import pytest_asyncio
from kubernetes_asyncio import client

from devcluster import cluster
from tests import controllerkit, kueue
from tests.runskit import RESEARCHER_RULES, Env, make_token


@pytest_asyncio.fixture
async def env(
    dev_cluster: cluster.Cluster,
    k8s: client.ApiClient,
    namespace: str,
    request: pytest.FixtureRequest,
) -> AsyncIterator[Env]:
    """A controller, 8 GPUs of private quota and a researcher token in a fresh namespace
    (`@pytest.mark.controller(setting=value)` changes the controller's settings)."""
    marker = request.node.get_closest_marker("controller")
    overrides = dict(marker.kwargs) if marker is not None else {}
    await kueue.create_queues(k8s, namespace, gpus=8)
    token = await make_token(k8s, namespace, "researcher", RESEARCHER_RULES)
    settings = {
        "run_pass_interval_s": 0.5,
        "run_pod_annotations": {"kwok.taugrid.dev/run-for": "600s"},
        "run_manager": f"test/{namespace}",
        **overrides,
    }
    ctl = await controllerkit.start_controller(dev_cluster.kubeconfig, namespace, **settings)
    await controllerkit.wait_leader(ctl)
    http = aiohttp.ClientSession()
    try:
        yield Env(ctl.url, namespace, token, http, k8s, ctl)
    finally:
        await http.close()
        await ctl.stop()
        await kueue.delete_queues(k8s, namespace)
