"""Experiments read a whole namespace's runs: they hold the per-identity slots that a run list
holds (security review 3, finding 7: /v1/experiments and compare answered 48 of 48 concurrent
calls from one researcher, each a full TauRun LIST).

The controller talks to the API server through the counting proxy, held on TauRun LISTs
until the test lets them go, so what is in flight is what the slots allow: counts, not clocks.
"""

from __future__ import annotations

import asyncio
import pathlib

import aiohttp
import pytest
from kubernetes_asyncio import client

from devcluster import cluster
from tests import apiproxy, runskit, support
from tests import controllerkit as kit

pytestmark = pytest.mark.cluster

SLOTS = 2
CALLS = 6


@pytest.mark.parametrize(
    "call_to",
    [
        pytest.param(("/v1/experiments", {}), id="listing experiments holds a slot"),
        pytest.param(("/v1/experiments/compare", {"name": "e"}), id="comparing runs holds a slot"),
    ],
)
async def test_one_researchers_concurrent_experiment_reads_are_capped(
    dev_cluster: cluster.Cluster,
    k8s: client.ApiClient,
    namespace: str,
    tmp_path: pathlib.Path,
    call_to: tuple[str, dict[str, str]],
) -> None:
    """Six calls at once from one researcher, with two expensive-read slots per identity:
    two reach the API server and answer 200 once released, four are 429 naming the limit
    at once, and the API server saw two TauRun LISTs."""
    path, params = call_to
    token = await runskit.make_token(k8s, namespace, "researcher", runskit.RESEARCHER_RULES)
    proxy = apiproxy.HoldingProxy(
        dev_cluster, tmp_path, lambda method, path: method == "GET" and path.endswith("/tauruns")
    )
    await proxy.start()
    ctl = await kit.start_controller(
        proxy.kubeconfig, namespace, run_manager=f"test/{namespace}",
        expensive_reads_per_identity=SLOTS,
    )  # fmt: skip
    lists = f"/apis/taugrid.dev/v1alpha1/namespaces/{namespace}/tauruns"
    try:
        await kit.wait_leader(ctl)
        async with aiohttp.ClientSession() as http:

            async def call() -> tuple[int, str]:
                async with http.get(
                    f"{ctl.url}{path}", params={"namespace": namespace, **params},
                    headers={"Authorization": f"Bearer {token}"},
                ) as resp:  # fmt: skip
                    body = await resp.json()
                    return resp.status, (body.get("error") or {}).get("code", "")

            before = proxy.count("GET", lists)
            proxy.released.clear()
            calls = [asyncio.create_task(call()) for _ in range(CALLS)]

            async def held() -> None:
                assert sum(t.done() for t in calls) == CALLS - SLOTS

            await support.eventually(held, what="the calls over the slots answered")
            proxy.released.set()
            answers = sorted(await asyncio.gather(*calls))
            reached = proxy.count("GET", lists) - before
    finally:
        proxy.released.set()
        await ctl.stop()
        await proxy.close()
    expected = (sorted([(200, "")] * SLOTS + [(429, "TooMany")] * (CALLS - SLOTS)), SLOTS)
    assert expected == (answers, reached)
