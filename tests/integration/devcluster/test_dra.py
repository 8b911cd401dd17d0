"""DRA on the dev cluster is real: our publisher's ResourceSlices stand in for NVIDIA's kubelet
plugin, and everything else is upstream. kube-scheduler allocates each pod's claim from them,
Kueue counts the claims against quota, and kube-controller-manager's device-taint eviction
deletes a pod whose device gets a NoExecute taint it does not tolerate (after its toleration
when it has one). These tests drive Kueue and the scheduler directly: no TauGrid controller.
"""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from kubernetes_asyncio import client

from devcluster import cluster, drapublisher, fakenvml
from tests import dra, kueue, support

pytestmark = pytest.mark.cluster

FLEET_LABEL = "taugrid.dev/test-fleet"


@pytest_asyncio.fixture
async def fleet(
    k8s: client.ApiClient, dev_cluster: cluster.Cluster, bin_dir: pathlib.Path, namespace: str
) -> AsyncIterator[dict[str, list[str]]]:
    """Two DRA nodes and one device-plugin node of this test's own, and a queue of 3 GPUs
    over them; removed afterwards, with any DeviceTaintRule the test made."""
    prefix = f"n-{namespace}"[:40].rstrip("-")
    labels = {FLEET_LABEL: namespace}
    made = {
        "dra": await asyncio.to_thread(
            dev_cluster.ensure_nodes, bin_dir, 2, prefix=f"{prefix}-d", labels=labels,
            gpu_driver="dra",
        ),
        "device-plugin": await asyncio.to_thread(
            dev_cluster.ensure_nodes, bin_dir, 1, prefix=f"{prefix}-p", labels=labels,
        ),
    }  # fmt: skip
    await kueue.create_queues(k8s, namespace, gpus=3, node_labels=labels)
    try:
        async with dra.cleanup_rules(k8s, namespace):
            yield made
    finally:
        await kueue.delete_queues(k8s, namespace)
        core = client.CoreV1Api(k8s)
        for name in made["dra"] + made["device-plugin"]:
            await core.delete_node(name)


async def _slice(k8s: client.ApiClient, node: str) -> dict[str, Any]:
    custom = client.CustomObjectsApi(k8s)
    return dict(
        await custom.get_cluster_custom_object(
            *dra.RESOURCE, "resourceslices", drapublisher.slice_name(node)
        )
    )


async def test_each_dra_node_gets_one_slice_in_its_own_pool_with_the_uuids_its_agent_reports(
    k8s: client.ApiClient, fleet: dict[str, list[str]]
) -> None:
    """A DRA node's slice: driver gpu.nvidia.com, pool = node, gpu-0..7 with NVIDIA's
    attributes and the fake NVML's UUIDs for that node; a device-plugin node has none and
    advertises nvidia.com/gpu instead."""
    node = fleet["dra"][0]
    found = await _slice(k8s, node)
    spec = found["spec"]
    assert (drapublisher.DRIVER, node, node) == (spec["driver"], spec["pool"]["name"],
                                                 spec["nodeName"])  # fmt: skip
    expected = [(f"gpu-{i}", fakenvml.default_uuid(node, i), "gpu") for i in range(8)]
    actual = [(d["name"], d["attributes"]["uuid"]["string"], d["attributes"]["type"]["string"])
              for d in spec["devices"]]  # fmt: skip
    assert expected == actual
    core = client.CoreV1Api(k8s)
    dra_node = await core.read_node(node)
    plugin_node = await core.read_node(fleet["device-plugin"][0])
    assert "nvidia.com/gpu" not in dra_node.status.allocatable
    assert plugin_node.status.allocatable["nvidia.com/gpu"] == "8"
    with pytest.raises(client.ApiException) as err:
        await _slice(k8s, fleet["device-plugin"][0])
    assert err.value.status == 404


async def test_kueue_counts_claims_against_quota_and_the_scheduler_allocates_from_our_slices(
    k8s: client.ApiClient, namespace: str, fleet: dict[str, list[str]]
) -> None:
    """Four 1-GPU claim Jobs on a 3-GPU quota: three are admitted and their pods get a device
    of a DRA node's slice; the fourth waits, Kueue naming nvidia.com/gpu quota."""
    await dra.create(k8s, namespace, "resourceclaimtemplates", dra.claim_template("one"))
    batch = client.BatchV1Api(k8s)
    for job in ("a", "b", "c", "d"):
        await batch.create_namespaced_job(namespace, dra.dra_job(job, "q", "one"))

    allocated = await dra.allocated(k8s, namespace, 3)
    assert {pool for pool, _ in allocated.values()} <= set(fleet["dra"])
    assert len(set(allocated.values())) == 3

    async def quota_message() -> str:
        waiting = []
        for job in ("a", "b", "c", "d"):
            wl = await kueue.workload_of(k8s, namespace, job)
            cond = support.condition(wl, "QuotaReserved") or {}
            if cond.get("status") != "True":
                waiting.append(str(cond.get("message", "")))
        assert len(waiting) == 1, waiting
        return waiting[0]

    message = await support.eventually(quota_message, what="one Workload over quota")
    assert "insufficient unused quota for nvidia.com/gpu" in message


async def test_device_plugin_pods_land_on_device_plugin_nodes_and_claims_on_dra_nodes(
    k8s: client.ApiClient, namespace: str, fleet: dict[str, list[str]]
) -> None:
    """One queue over both kinds of node: a Job asking for nvidia.com/gpu runs on the
    device-plugin node, a Job with a claim on a DRA node."""
    await dra.create(k8s, namespace, "resourceclaimtemplates", dra.claim_template("one"))
    batch = client.BatchV1Api(k8s)
    await batch.create_namespaced_job(namespace, kueue.gpu_job("plugin", "q", 1, run_for="10m"))
    await batch.create_namespaced_job(namespace, dra.dra_job("claim", "q", "one"))
    core = client.CoreV1Api(k8s)

    async def placed() -> dict[str, str]:
        pods = await core.list_namespaced_pod(namespace)
        nodes = {p.metadata.labels["job-name"]: p.spec.node_name for p in pods.items}
        assert all(nodes.get(j) for j in ("plugin", "claim")), nodes
        return nodes

    nodes = await support.eventually(placed, what="both pods bound")
    assert nodes["plugin"] in fleet["device-plugin"]
    assert nodes["claim"] in fleet["dra"]


async def test_a_noexecute_rule_makes_kcm_delete_the_pod_holding_the_device_and_only_that_pod(
    k8s: client.ApiClient, namespace: str, fleet: dict[str, list[str]]
) -> None:
    """A NoExecute DeviceTaintRule on the device of one running pod: kube-controller-manager
    marks it DeletionByDeviceTaintManager and deletes it; the pod on the other device stays;
    a new claim is not allocated the tainted device."""
    await dra.create(k8s, namespace, "resourceclaimtemplates", dra.claim_template("one"))
    batch = client.BatchV1Api(k8s)
    for job in ("a", "b"):
        await batch.create_namespaced_job(namespace, dra.dra_job(job, "q", "one"))

    allocated = await dra.allocated(k8s, namespace, 2)
    victim, survivor = sorted(allocated)
    pool, device = allocated[victim]
    rule = dra.taint_rule(f"t-{namespace}", pool, device, key="taugrid.dev/test-failed",
                          effect="NoExecute", test=namespace)  # fmt: skip
    await dra.create(k8s, None, "devicetaintrules", rule)
    event = await dra.evicted_by_kcm(k8s, namespace, victim)
    assert event["source"]["component"] == "device-taint-eviction-controller"
    core = client.CoreV1Api(k8s)

    async def gone() -> None:
        pods = {p.metadata.name: p for p in (await core.list_namespaced_pod(namespace)).items}
        assert victim not in pods or pods[victim].metadata.deletion_timestamp, sorted(pods)
        assert pods[survivor].status.phase == "Running"

    await support.eventually(gone, what=f"{victim} deleted and {survivor} still running")
    await batch.create_namespaced_job(namespace, dra.dra_job("c", "q", "one"))

    async def third() -> tuple[str, str]:
        found = await dra.allocations(k8s, namespace)
        new = [where for pod, where in found.items() if pod.startswith("c-")]
        assert new, found
        return new[0]

    assert (pool, device) != await support.eventually(third, what="the new claim allocated")


async def test_a_tolerated_noexecute_taint_evicts_only_after_toleration_seconds(
    k8s: client.ApiClient, namespace: str, fleet: dict[str, list[str]]
) -> None:
    """A claim tolerating the taint for 5 s keeps its pod past the rule's creation; the
    pod is deleted once the toleration ran out, at timeAdded + 5 s or later."""
    template = dra.claim_template("grace", tolerate=("taugrid.dev/gpu-evict", 5))
    await dra.create(k8s, namespace, "resourceclaimtemplates", template)
    batch = client.BatchV1Api(k8s)
    await batch.create_namespaced_job(namespace, dra.dra_job("a", "q", "grace"))

    pod, (pool, device) = next(iter((await dra.allocated(k8s, namespace, 1)).items()))
    name = f"t-{namespace}"
    rule = dra.taint_rule(name, pool, device, key="taugrid.dev/gpu-evict", effect="NoExecute",
                          test=namespace)  # fmt: skip
    await dra.create(k8s, None, "devicetaintrules", rule)
    added = support.parse_time((await dra.rule(k8s, name))["spec"]["taint"]["timeAdded"])
    event = await dra.evicted_by_kcm(k8s, namespace, pod)
    marked = support.parse_time(event["firstTimestamp"])
    assert (marked - added).total_seconds() >= 5 - 1  # both have whole seconds


async def test_effect_none_evicts_nothing_and_reports_what_noexecute_would_evict(
    k8s: client.ApiClient, namespace: str, fleet: dict[str, list[str]]
) -> None:
    """A rule with effect None on a held device: the pod keeps running and the rule's
    EvictionInProgress condition says 1 pod would be evicted."""
    await dra.create(k8s, namespace, "resourceclaimtemplates", dra.claim_template("one"))
    batch = client.BatchV1Api(k8s)
    await batch.create_namespaced_job(namespace, dra.dra_job("a", "q", "one"))

    pod, (pool, device) = next(iter((await dra.allocated(k8s, namespace, 1)).items()))
    name = f"t-{namespace}"
    rule = dra.taint_rule(name, pool, device, key="taugrid.dev/gpu-evict", effect="None",
                          test=namespace)  # fmt: skip
    await dra.create(k8s, None, "devicetaintrules", rule)

    async def reported() -> str:
        cond = support.condition(await dra.rule(k8s, name), "EvictionInProgress")
        assert cond is not None, "no EvictionInProgress condition yet"
        return str(cond["message"])

    message = await support.eventually(reported, what="the dry run's report")
    assert "1 pod would be evicted in 1 namespace" in message
    pods = await client.CoreV1Api(k8s).list_namespaced_pod(namespace)
    assert [(pod, "Running", None)] == [
        (p.metadata.name, p.status.phase, p.metadata.deletion_timestamp) for p in pods.items
    ]
