"""Builders of raw Kueue and batch objects for tests that drive Kueue directly.

Raw-Kueue tests get their own ClusterQueue that references no AdmissionCheck (Kueue
deactivates a ClusterQueue whose check is not Active, and ours needs the controller).
"""

from __future__ import annotations

from typing import Any

from kubernetes_asyncio import client

from devcluster import cluster

KUEUE = ("kueue.x-k8s.io", "v1beta2")


def cluster_queue(
    name: str,
    namespace: str,
    gpus: int,
    cpu: int = 64,
    *,
    flavor: str = cluster.FLAVOR,
    checks: tuple[str, ...] = (),
) -> dict[str, Any]:
    """A ClusterQueue serving only `namespace`, with `gpus` GPUs of `flavor` (the dev
    flavor by default), waiting on the admission checks named in `checks`."""
    cq: dict[str, Any] = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {
            "namespaceSelector": {
                "matchLabels": {"kubernetes.io/metadata.name": namespace},
            },
            "resourceGroups": [
                {
                    "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                    "flavors": [
                        {
                            "name": flavor,
                            "resources": [
                                {"name": "cpu", "nominalQuota": str(cpu)},
                                {"name": "memory", "nominalQuota": "512Gi"},
                                {"name": "nvidia.com/gpu", "nominalQuota": str(gpus)},
                            ],
                        }
                    ],
                }
            ],
        },
    }
    if checks:
        cq["spec"]["admissionChecksStrategy"] = {"admissionChecks": [{"name": c} for c in checks]}
    return cq


def resource_flavor(name: str, node_labels: dict[str, str]) -> dict[str, Any]:
    """A ResourceFlavor pinning admitted pods to nodes with `node_labels`."""
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ResourceFlavor",
        "metadata": {"name": name},
        "spec": {"nodeLabels": node_labels},
    }


def local_queue(name: str, namespace: str, cluster_queue: str) -> dict[str, Any]:
    """A LocalQueue pointing at `cluster_queue`."""
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterQueue": cluster_queue},
    }


def gpu_job(
    name: str, queue: str, gpus: int, *, run_for: str = "2s", parallelism: int = 1
) -> dict[str, Any]:
    """A suspended Job for Kueue to admit; KWOK runs each pod for `run_for`."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {"kueue.x-k8s.io/queue-name": queue}},
        "spec": {
            "suspend": True,
            "parallelism": parallelism,
            "completions": parallelism,
            "backoffLimit": 0,
            "template": {
                "metadata": {"annotations": {"kwok.taugrid.dev/run-for": run_for}},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "main",
                            "image": "registry.example/train@sha256:" + "0" * 64,
                            "resources": {
                                "requests": {"cpu": "1", "memory": "1Gi"},
                                "limits": {"nvidia.com/gpu": str(gpus)},
                            },
                        }
                    ],
                },
            },
        },
    }


def flavor_name(namespace: str) -> str:
    """The private ResourceFlavor `create_queues` makes for `namespace` (given node labels)."""
    return f"rf-{namespace}"[:63]


async def create_queues(
    api: client.ApiClient,
    namespace: str,
    gpus: int,
    *,
    cpu: int = 64,
    node_labels: dict[str, str] | None = None,
    checks: tuple[str, ...] = (),
) -> str:
    """Create a private ClusterQueue and a LocalQueue `q` in `namespace`; return `q`.

    With `node_labels`, the queue gets a ResourceFlavor of its own that pins admitted pods to
    the nodes carrying them (`flavor_name`); `checks` are AdmissionChecks it waits on.
    """
    custom = client.CustomObjectsApi(api)
    cq = f"cq-{namespace}"[:63]
    flavor = cluster.FLAVOR
    if node_labels is not None:
        flavor = flavor_name(namespace)
        await custom.create_cluster_custom_object(
            *KUEUE, "resourceflavors", resource_flavor(flavor, node_labels)
        )
    await custom.create_cluster_custom_object(
        *KUEUE, "clusterqueues",
        cluster_queue(cq, namespace, gpus, cpu, flavor=flavor, checks=checks),
    )  # fmt: skip
    await custom.create_namespaced_custom_object(
        *KUEUE, namespace, "localqueues", local_queue("q", namespace, cq)
    )
    return "q"


async def delete_queues(api: client.ApiClient, namespace: str) -> None:
    """Delete the private ClusterQueue and ResourceFlavor made by `create_queues` (the
    namespace takes the rest); those never made are not an error."""
    custom = client.CustomObjectsApi(api)
    for plural, name in (("clusterqueues", f"cq-{namespace}"[:63]),
                         ("resourceflavors", flavor_name(namespace))):  # fmt: skip
        try:
            await custom.delete_cluster_custom_object(*KUEUE, plural, name)
        except client.ApiException as err:
            if err.status != 404:
                raise


async def workload_of(api: client.ApiClient, namespace: str, job: str) -> dict[str, Any]:
    """Return the Workload Kueue made for a Job (owner reference), or raise "not yet"."""
    custom = client.CustomObjectsApi(api)
    wls = await custom.list_namespaced_custom_object(*KUEUE, namespace, "workloads")
    for wl in wls["items"]:
        owners = wl["metadata"].get("ownerReferences") or []
        if any(o.get("name") == job for o in owners):
            return dict(wl)
    msg = f"no Workload for {namespace}/{job} yet"
    raise AssertionError(msg)
