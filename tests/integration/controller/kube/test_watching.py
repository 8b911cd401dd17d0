"""Watch-fed caches on the real control plane: what the admission gate and the quarantine
loop read instead of listing per pass follows adds, updates and deletes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import pytest_asyncio
from kubernetes_asyncio import client

from controller.kube import admission, nodes
from tests import support

pytestmark = pytest.mark.cluster


@contextlib.asynccontextmanager
async def running(*runs: Callable[[], Any]) -> AsyncIterator[None]:
    tasks = [asyncio.create_task(run()) for run in runs]
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


@pytest_asyncio.fixture
async def node_name(k8s: client.ApiClient, namespace: str) -> AsyncIterator[str]:
    """A Node object of this test's own (deleted afterwards if the test did not)."""
    name = f"w-{namespace}"[:60]
    yield name
    with contextlib.suppress(client.ApiException):
        await client.CoreV1Api(k8s).delete_node(name)


async def test_the_gate_caches_follow_node_and_pod_adds_updates_and_deletes(
    k8s: client.ApiClient, namespace: str, node_name: str
) -> None:
    """Once synced, the gate reads nodes and pods from its caches: a created, relabelled and
    deleted Node and Pod show up, change and disappear there, trimmed to what it parses."""
    store = admission.AdmissionStore(k8s)
    core = client.CoreV1Api(k8s)
    async with running(store.run_caches):
        await asyncio.wait_for(store.nodes.synced.wait(), 30)
        await asyncio.wait_for(store.pods.synced.wait(), 30)
        await core.create_node({"metadata": {"name": node_name, "labels": {"a": "1"}}})
        pod = {
            "metadata": {"name": "p", "namespace": namespace, "labels": {"a": "1"}},
            "spec": {"nodeName": node_name, "containers": [{
                "name": "c", "image": "none",
                "resources": {"requests": {"cpu": "2"}}, "env": [{"name": "X", "value": "y"}],
            }]},
        }  # fmt: skip
        await core.create_namespaced_pod(namespace, pod)
        pod_key = f"{namespace}/p"

        async def added() -> None:
            assert node_name in store.nodes.items
            assert pod_key in store.pods.items
            assert {node_name} <= {n["metadata"]["name"] for n in await store.list_nodes()}

        await support.eventually(added, what="the new node and pod in the caches")
        assert {"containers": [{"resources": {"requests": {"cpu": "2"}}}],
                "nodeName": node_name} == store.pods.items[pod_key]["spec"]  # fmt: skip

        await core.patch_node(node_name, {"metadata": {"labels": {"a": "2"}}})
        await core.patch_namespaced_pod("p", namespace, {"metadata": {"labels": {"a": "2"}}})

        async def updated() -> None:
            assert store.nodes.items[node_name]["metadata"]["labels"]["a"] == "2"
            assert store.pods.items[pod_key]["metadata"]["labels"]["a"] == "2"

        await support.eventually(updated, what="the relabelled node and pod in the caches")

        await core.delete_namespaced_pod("p", namespace, grace_period_seconds=0)
        await core.delete_node(node_name)

        async def deleted() -> None:
            assert node_name not in store.nodes.items
            assert pod_key not in store.pods.items
            assert pod_key not in {
                f"{p['metadata']['namespace']}/{p['metadata']['name']}"
                for p in await store.list_pods()
            }

        await support.eventually(deleted, what="the deleted node and pod gone from the caches")


async def test_the_node_cache_names_the_nodes_that_changed(
    k8s: client.ApiClient, node_name: str
) -> None:
    """A subscriber of the quarantine's node cache starts with everything, then is told the
    name of each Node added, changed or deleted, and nothing else."""
    cache = nodes.NodeCache(k8s, on_change=lambda: None)
    changes = cache.subscribe()
    core = client.CoreV1Api(k8s)
    async with running(cache.run):
        await asyncio.wait_for(cache.synced.wait(), 30)
        everything, _ = changes.take()
        assert everything
        steps: list[Callable[[], Awaitable[Any]]] = [
            lambda: core.create_node({"metadata": {"name": node_name}}),
            lambda: core.patch_node(node_name, {"metadata": {"labels": {"a": "2"}}}),
            lambda: core.delete_node(node_name),
        ]
        for step in steps:
            await step()

            async def told() -> None:
                assert (False, {node_name}) == changes.take()

            await support.eventually(told, what=f"{node_name} named as changed")
