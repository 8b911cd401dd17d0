"""The install namespace's pods on the real control plane: what each replica reads for an
agent's URL, and the deletions that retire the tokens bound to those pods (review L7)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from kubernetes_asyncio import client

from controller.kube import nodes
from tests import support

pytestmark = pytest.mark.cluster


async def test_a_pods_ip_shows_and_its_deletion_is_told_by_uid(
    k8s: client.ApiClient, namespace: str
) -> None:
    """A pod created in the watched namespace is alive; once the kubelet (here the test, on
    the status subresource) gives it an IP, that is the IP of its UID; deleting it reports
    that UID gone, and it is no longer alive."""
    gone: list[str] = []
    pods = nodes.AgentPods(k8s, namespace, on_gone=gone.append)
    core = client.CoreV1Api(k8s)
    watch = asyncio.create_task(pods.run())
    try:
        await asyncio.wait_for(pods.pods.synced.wait(), 30)
        created = await core.create_namespaced_pod(namespace, {
            "metadata": {"name": "agent-x"},
            # Bound to a node nothing runs (no scheduler, no KWOK): only the test sets its IP.
            "spec": {"nodeName": f"none-{namespace}"[:63],
                     "containers": [{"name": "c", "image": "none"}]},
        })  # fmt: skip
        uid = created.metadata.uid
        await core.patch_namespaced_pod_status(
            "agent-x", namespace, {"status": {"podIP": "10.9.8.7", "podIPs": [{"ip": "10.9.8.7"}]}}
        )

        async def addressed() -> None:
            assert (pods.alive(uid), pods.ip_of(uid)) == (True, "10.9.8.7")

        await support.eventually(addressed, what="the pod alive with its IP")
        await core.delete_namespaced_pod("agent-x", namespace, grace_period_seconds=0)

        async def deleted() -> None:
            assert (gone, pods.alive(uid), pods.ip_of(uid)) == ([uid], False, None)

        await support.eventually(deleted, what="the pod's UID told gone")
    finally:
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch
