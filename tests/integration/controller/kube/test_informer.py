"""Watch-fed caches on the real control plane: what the admission gate, the quarantine loop
and the run reconciler read instead of listing per pass follows adds, updates and deletes."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import pytest_asyncio
from kubernetes_asyncio import client

from controller import marks, workqueue
from controller.kube import admission, informer, nodes, runs
from tests import kueue, support

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
    """A work queue fed by the quarantine's node cache (as the quarantiner's is) starts with
    everything, then is handed the name of each Node added, changed or deleted, and nothing
    else. The cache selects this
    test's node by a label, as the chart's `nodeSelector` does: the cluster's other nodes
    (KWOK's, the real node) change all the time and would be named too."""
    selector = {"taugrid.dev/test": node_name}
    cache = nodes.NodeCache(
        k8s, on_change=lambda: None, label_selector=f"taugrid.dev/test={node_name}"
    )
    queue: workqueue.WorkQueue[str] = workqueue.WorkQueue(resync_s=1e9)
    cache.subscribe(lambda change: queue.add(change.key))

    class Changes:
        @staticmethod
        def take() -> tuple[bool, set[str]]:
            batch = queue.take(0.0)
            return batch.everything, set(batch.keys)

    changes = Changes()
    core = client.CoreV1Api(k8s)
    async with running(cache.run):
        await asyncio.wait_for(cache.synced.wait(), 30)
        everything, _ = changes.take()
        assert everything
        steps: list[Callable[[], Awaitable[Any]]] = [
            lambda: core.create_node({"metadata": {"name": node_name, "labels": selector}}),
            lambda: core.patch_node(node_name, {"metadata": {"labels": {"a": "2"}}}),
            lambda: core.delete_node(node_name),
        ]
        told: set[str] = set()

        async def named() -> None:
            relisted, names = changes.take()
            told.update(names)
            assert (False, {node_name}) == (relisted, told)

        for step in steps:
            told.clear()
            await step()
            await support.eventually(named, what=f"{node_name} named as changed")


async def test_a_label_selected_cache_holds_only_the_objects_carrying_the_label(
    k8s: client.ApiClient, namespace: str
) -> None:
    """A cache bound to a label selector follows a labelled ConfigMap's create, update and
    delete; one without the label is never held, and one whose label is removed leaves."""
    core = client.CoreV1Api(k8s)
    cache: informer.Informer[informer.Raw] = informer.Informer(
        functools.partial(core.list_namespaced_config_map, namespace, label_selector="sel"),
        informer.trim_object, kind="configmaps",
    )  # fmt: skip

    def body(name: str, labels: dict[str, str]) -> dict[str, Any]:
        return {"metadata": {"name": name, "labels": labels}, "data": {"k": "1"}}

    async with running(cache.run):
        await asyncio.wait_for(cache.synced.wait(), 30)
        await core.create_namespaced_config_map(namespace, body("plain", {}))
        await core.create_namespaced_config_map(namespace, body("chosen", {"sel": "a"}))
        chosen, plain = f"{namespace}/chosen", f"{namespace}/plain"

        async def added() -> None:
            assert {chosen} == set(cache.items)
            assert [chosen] == [informer.key_of(o) for o in cache.select("sel=a")]
            assert not cache.select("sel=b")

        await support.eventually(added, what="only the labelled ConfigMap in the cache")
        await core.patch_namespaced_config_map("chosen", namespace, {"data": {"k": "2"}})

        async def updated() -> None:
            expected = {"k": "2"}
            assert expected == cache.items[chosen]["data"]

        await support.eventually(updated, what="the updated ConfigMap in the cache")
        await core.patch_namespaced_config_map("chosen", namespace,
                                               {"metadata": {"labels": {"sel": None}}})  # fmt: skip

        async def unlabelled() -> None:
            assert chosen not in cache.items

        await support.eventually(unlabelled, what="the unlabelled ConfigMap gone")
        await core.patch_namespaced_config_map("plain", namespace,
                                               {"metadata": {"labels": {"sel": "c"}}})  # fmt: skip

        async def labelled() -> None:
            assert {plain} == set(cache.items)

        await support.eventually(labelled, what="the newly labelled ConfigMap in the cache")
        await core.delete_namespaced_config_map("plain", namespace)

        async def deleted() -> None:
            assert not cache.items

        await support.eventually(deleted, what="the deleted ConfigMap gone from the cache")


async def test_a_custom_object_cache_follows_kueue_local_queues(
    k8s: client.ApiClient, namespace: str
) -> None:
    """The run store's LocalQueue cache (a custom object) follows a LocalQueue's create,
    update and delete, and `list_kueue` answers from it, by namespace."""
    store = runs.RunStore(k8s)
    custom = client.CustomObjectsApi(k8s)
    cache = store.kueue["localqueues"]
    key = f"{namespace}/lq"
    async with running(cache.run):
        await asyncio.wait_for(cache.synced.wait(), 30)
        await custom.create_namespaced_custom_object(
            *kueue.KUEUE, namespace, "localqueues", kueue.local_queue("lq", namespace, "cq-a")
        )

        async def added() -> None:
            listed = await store.list_kueue("localqueues", namespace)
            assert [key] == [informer.key_of(o) for o in listed]
            assert "managedFields" not in listed[0]["metadata"]

        await support.eventually(added, what="the LocalQueue in the cache")
        await custom.patch_namespaced_custom_object(
            *kueue.KUEUE, namespace, "localqueues", "lq", {"metadata": {"labels": {"a": "2"}}},
            _content_type="application/merge-patch+json",
        )  # fmt: skip

        async def updated() -> None:
            expected = {"a": "2"}
            assert expected == cache.items[key]["metadata"].get("labels")

        await support.eventually(updated, what="the relabelled LocalQueue")
        await custom.delete_namespaced_custom_object(*kueue.KUEUE, namespace, "localqueues", "lq")

        async def deleted() -> None:
            assert not await store.list_kueue("localqueues", namespace)

        await support.eventually(deleted, what="the deleted LocalQueue gone from the cache")


async def test_a_kind_the_api_server_does_not_serve_is_cached_as_none(
    k8s: client.ApiClient,
) -> None:
    """An optional cache of a custom resource whose CRD is not installed (404) is synced and
    empty, says so, and keeps running (it asks again later) rather than ending in an error."""
    custom = client.CustomObjectsApi(k8s)
    asked: list[bool] = []

    async def list_absent(**kwargs: Any) -> Any:
        asked.append(bool(kwargs.get("watch")))
        return await custom.list_cluster_custom_object(
            "absent.taugrid.dev", "v1", "nones", **kwargs
        )

    cache: informer.Informer[informer.Raw] = informer.Informer(
        list_absent, informer.trim_object, kind="nones", optional=True, absent_retry_s=0.05
    )
    task = asyncio.create_task(cache.run())
    try:

        async def asked_again() -> None:
            expected = [False, False, False]  # listed again, never watched
            assert expected == asked[:3]

        await support.eventually(asked_again, what="three lists of the absent kind")
        expected = (True, True, False)
        assert expected == (cache.absent, cache.synced.is_set(), task.done())
        assert not cache.items
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_job_the_store_created_is_listed_at_once(
    k8s: client.ApiClient, namespace: str
) -> None:
    """Read-your-writes: a run's Job the store created is in its answer to the reconciler's
    list when `create` returns (before the watch need have brought it), and a Job without
    the run label is not; deleting it takes it out once the watch says so."""
    store = runs.RunStore(k8s)
    cache = store.labelled["Job"]

    def job(name: str, labels: dict[str, str]) -> dict[str, Any]:
        return {
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {"suspend": True, "template": {"spec": {
                "restartPolicy": "Never", "containers": [{"name": "c", "image": "none"}],
            }}},
        }  # fmt: skip

    async with running(cache.run):
        await asyncio.wait_for(cache.synced.wait(), 30)
        assert await store.create(job("mine", {marks.RUN_LABEL: "demo"}))
        listed = await store.list_labelled("Job", f"{marks.RUN_LABEL}=demo")
        assert [(namespace, "Job", "mine")] == [
            (o["metadata"]["namespace"], o["kind"], o["metadata"]["name"]) for o in listed
        ]
        await client.BatchV1Api(k8s).create_namespaced_job(namespace, job("other", {}))
        await client.BatchV1Api(k8s).delete_namespaced_job(
            "mine", namespace, propagation_policy="Background"
        )

        async def deleted() -> None:
            listed = await store.list_labelled("Job", marks.RUN_LABEL)
            assert not [o for o in listed if o["metadata"]["namespace"] == namespace]

        await support.eventually(deleted, what="the deleted Job gone, the unlabelled never in")


async def test_the_node_metadata_cache_keeps_names_and_quarantine_annotations(
    k8s: client.ApiClient, node_name: str
) -> None:
    """The run store's node cache (a metadata-only watch) holds each node's name and its
    quarantine annotations only, and follows an annotation's change and the node's delete."""
    store = runs.RunStore(k8s)
    core = client.CoreV1Api(k8s)
    async with running(store.nodes.run):
        await asyncio.wait_for(store.nodes.synced.wait(), 30)
        await core.create_node({"metadata": {"name": node_name, "labels": {"a": "1"},
                                             "annotations": {"other": "x"}}})  # fmt: skip

        async def added() -> None:
            assert {"metadata": {"name": node_name, "annotations": {}}} in await store.list_nodes()

        await support.eventually(added, what="the new node, trimmed, in the cache")
        by = {marks.QUARANTINED_BY_ANNOTATION: "test"}
        await core.patch_node(node_name, {"metadata": {"annotations": by}})

        async def annotated() -> None:
            assert by == store.nodes.items[node_name]["metadata"]["annotations"]

        await support.eventually(annotated, what="the quarantine annotation in the cache")
        await core.delete_node(node_name)

        async def deleted() -> None:
            assert node_name not in store.nodes.items

        await support.eventually(deleted, what="the deleted node gone from the cache")


async def test_the_gate_reads_kueue_objects_from_caches(
    k8s: client.ApiClient, namespace: str
) -> None:
    """Once synced, the gate's ClusterQueues come from its cache: a created ClusterQueue is
    listed, and its delete takes it out."""
    store = admission.AdmissionStore(k8s)
    custom = client.CustomObjectsApi(k8s)
    name = f"cq-{namespace}"[:63]
    async with running(store.run_caches):
        for cache in store.kueue.values():
            await asyncio.wait_for(cache.synced.wait(), 30)
        await custom.create_cluster_custom_object(
            *kueue.KUEUE, "clusterqueues", kueue.cluster_queue(name, namespace, gpus=1)
        )
        try:

            async def added() -> None:
                listed = await store.list_kueue("clusterqueues")
                assert name in {o["metadata"]["name"] for o in listed}

            await support.eventually(added, what="the ClusterQueue listed from the cache")
        finally:
            await custom.delete_cluster_custom_object(*kueue.KUEUE, "clusterqueues", name)

        async def deleted() -> None:
            assert name not in store.kueue["clusterqueues"].items

        await support.eventually(deleted, what="the deleted ClusterQueue gone from the cache")
