"""The web page shows device quarantine: on a DRA node with one GPU fenced, the node's row
names the fenced GPU, its DeviceTaintRules, since when and what clears them; the node is
not cordoned and the fleet summary counts the fenced GPUs."""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from kubernetes_asyncio import client

from devcluster import cluster
from tests import browser, dra, support
from tests import controllerkit as kit
from tests.e2e.test_web import _sign_in, page  # noqa: F401  (page: the browser tab fixture)

pytestmark = pytest.mark.cluster

SNAPSHOT = """(() => {
  const all = (root, sel) => [...root.querySelectorAll(sel)];
  const summary = Object.fromEntries(all(document, "#fleet-summary dt").map((dt) =>
    [dt.textContent, dt.nextElementSibling.textContent]));
  return {
    summary,
    nodes: Object.fromEntries(all(document, "#nodes-body tr[data-node]").map((r) => [
      r.dataset.node, {
        fencedGpus: r.dataset.fencedGpus, cordoned: r.dataset.cordoned,
        chips: all(r, "li[data-fenced]").map((g) => g.dataset.index),
        fenced: all(r, "li[data-fenced-device]").map((d) => ({
          device: d.dataset.fencedDevice, dryRun: d.dataset.dryRun, text: d.textContent })),
      }])),
  };
})()"""


@pytest_asyncio.fixture
async def fleet(
    k8s: client.ApiClient, dev_cluster: cluster.Cluster, bin_dir: pathlib.Path, namespace: str
) -> AsyncIterator[tuple[str, str, kit.Agent]]:
    """One DRA node with its agent heartbeating to a controller that manages only it."""
    [node] = await asyncio.to_thread(
        dev_cluster.ensure_nodes, bin_dir, 1, prefix=f"wd-{namespace}"[:48].rstrip("-") + "-",
        labels={"taugrid.dev/test-fleet": namespace}, gpu_driver="dra",
    )  # fmt: skip
    try:
        token = await kit.admin_token(k8s, namespace)
        agent = kit.Agent(node, await kit.agent_token(k8s, namespace, node), dra=True)
        async with kit.running(dev_cluster, namespace, [agent]) as (ctl, _, _):
            yield ctl.url, token, agent
    finally:
        await dra.delete_ours_on(k8s, [node])
        await kit.delete_test_rbac(k8s, namespace)
        with contextlib.suppress(client.ApiException):
            await client.CoreV1Api(k8s).delete_node(node)


async def test_the_page_names_the_fenced_gpu_its_rules_and_what_clears_it(
    page: browser.Page,  # noqa: F811  (the imported fixture)
    fleet: tuple[str, str, kit.Agent],
) -> None:
    """ResetGPU on GPU 4: the row lists gpu-4 fenced with both rules and a reset as what
    clears it, its chip is marked, the node is not cordoned, the summary counts 1 of 8."""
    url, token, agent = fleet
    await page.goto(url + "/")
    await _sign_in(page, token)
    agent.fail(4, kit.ECC_RISING)

    async def shown() -> dict[str, Any]:
        seen = dict(await page.evaluate(SNAPSHOT))
        node = seen["nodes"].get(agent.node)
        assert node is not None, seen["nodes"]
        assert node["fencedGpus"] == "1", node
        assert node["fenced"], node
        return seen

    seen = await support.eventually(shown, what="the fenced GPU on the page")
    node = seen["nodes"][agent.node]
    [fenced] = node["fenced"]
    expected = ("gpu-4", "false", ["4"], "false")
    assert expected == (fenced["device"], fenced["dryRun"], node["chips"], node["cordoned"])
    for text in (f"taugrid-{agent.node}-gpu-4-unhealthy (taugrid.dev/gpu-unhealthy:NoSchedule)",
                 f"taugrid-{agent.node}-gpu-4-evict (taugrid.dev/gpu-evict:NoExecute)",
                 "EccUncorrectedRising", "clears with a GPU reset", agent.uuid(4)):  # fmt: skip
        assert text in fenced["text"], fenced["text"]
    assert seen["summary"]["GPUs fenced (device quarantine)"].startswith("1 of at most 1"), seen
