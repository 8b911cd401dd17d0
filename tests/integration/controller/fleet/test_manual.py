"""An on-call order against a node that changed meanwhile, on the real API server: the
quarantine's patch carries the node's resourceVersion, so the API server refuses it when
someone wrote the node in between (a pass writing its condition at that moment, as in
the e2e run where a manual quarantine answered 200 and was never written)."""

from __future__ import annotations

import datetime as dt
import pathlib
import typing
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from kubernetes_asyncio import client

from controller import errors, leading, metrics
from controller.fleet import nodes, policy, quarantining, state
from controller.kube import nodes as kube_nodes
from controller.settings import ControllerSettings
from devcluster import cluster
from tests import controllerkit as kit
from tests import support

pytestmark = pytest.mark.cluster

LABEL = "example.com/touched"


@pytest_asyncio.fixture
async def node(
    k8s: client.ApiClient, dev_cluster: cluster.Cluster, bin_dir: pathlib.Path, namespace: str
) -> AsyncIterator[str]:
    async with kit.own_fleet(k8s, dev_cluster, bin_dir, namespace, 1, tag="m") as names:
        yield names[0]


async def _stale_quarantiner(k8s: client.ApiClient, namespace: str, name: str) -> tuple[
    quarantining.Quarantiner, nodes.NodeView
]:  # fmt: skip
    """A Quarantiner whose node cache holds `name` as it was before someone labelled it."""
    writer = kube_nodes.NodeWriter(k8s, namespace, component="test-manual")
    cache = kube_nodes.NodeCache(k8s, on_change=lambda: None)
    before = await writer.read(name)
    assert before is not None
    cache.put(before)
    await client.CoreV1Api(k8s).patch_node(name, {"metadata": {"labels": {LABEL: "yes"}}})
    q = quarantining.Quarantiner(
        state.FleetState(leader_since=dt.datetime.now(dt.UTC)), cache=cache,
        settings=policy.settings_from(ControllerSettings()),
        elector=typing.cast("leading.Elector", support.AlwaysLeading("test-manual")), writer=writer,
        metrics=metrics.make_metrics(),
    )  # fmt: skip
    return q, nodes.parse(cache.nodes[name])


async def test_a_manual_quarantine_refused_by_a_newer_node_is_decided_again_and_written(
    k8s: client.ApiClient, namespace: str, node: str
) -> None:
    """The first patch is refused (409: the cached node is older than the API server's);
    the order is decided again on the node read afresh and written, the other writer's
    label kept."""
    q, view = await _stale_quarantiner(k8s, namespace, node)
    await q.manual(view, release=False, by="alice", reason="maintenance",
                   now=dt.datetime.now(dt.UTC))  # fmt: skip

    raw = await kit.read_node(k8s, node)
    parsed = nodes.parse(kube_nodes.trim_node(raw))
    expected = (True, True, "alice", "yes")
    actual = (parsed.tainted, parsed.unschedulable,
              parsed.quarantine.by if parsed.quarantine else None,
              (raw["metadata"].get("labels") or {}).get(LABEL))  # fmt: skip
    assert expected == actual


async def test_an_order_that_never_gets_through_is_a_409_not_a_200(
    k8s: client.ApiClient, namespace: str, node: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With one attempt allowed, the refused patch ends in Conflict naming the node, and the
    node is left as it was: no order is answered as done without being written."""
    monkeypatch.setattr(quarantining, "MANUAL_ATTEMPTS", 1)
    q, view = await _stale_quarantiner(k8s, namespace, node)
    with pytest.raises(errors.Conflict) as refused:
        await q.manual(view, release=False, by="alice", reason="maintenance",
                       now=dt.datetime.now(dt.UTC))  # fmt: skip

    parsed = nodes.parse(kube_nodes.trim_node(await kit.read_node(k8s, node)))
    expected = ("name", True, False, None)
    actual = (refused.value.field, node in refused.value.message, parsed.tainted,
              parsed.quarantine)  # fmt: skip
    assert expected == actual
