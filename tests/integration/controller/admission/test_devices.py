"""The gpu-health AdmissionCheck on a DRA fleet (real Kueue, kube-scheduler, KWOK DRA nodes):
it counts healthy, untainted devices, holds a Workload that does not fit and admits it once
the devices clear, and releases the quota of a passed Workload whose devices went bad before
its pods started. Device health comes from heartbeats and the device quarantine of the same
controller, as in production."""

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
from tests import controllerkit as kit
from tests import dra, kueue, support
from tests.integration.controller.admission import test_admission as base

pytestmark = pytest.mark.cluster

RETRY_AFTER_S = 3


@pytest_asyncio.fixture
async def world(
    k8s: client.ApiClient, dev_cluster: cluster.Cluster, bin_dir: pathlib.Path, namespace: str
) -> AsyncIterator[tuple[kit.RunningController, list[kit.Agent]]]:
    """Queues with our check over two DRA nodes of 8 GPUs, their agents reporting, and a
    controller that manages them (device quarantine and the gate); 16 GPUs of quota."""
    check, flavor, cq = (f"{p}-{namespace}"[:63] for p in ("gh", "fl", "cq"))
    custom = client.CustomObjectsApi(k8s)
    objects = base.kueue_objects(namespace, check, flavor, cq)
    objects[2]["spec"]["resourceGroups"][0]["flavors"][0]["resources"][2]["nominalQuota"] = "16"
    prefix = f"ga-{namespace}"[:48].rstrip("-") + "-"
    nodes: list[str] = []
    try:
        for obj in objects:
            await custom.create_cluster_custom_object(*base.KUEUE, base.PLURALS[obj["kind"]], obj)
        await custom.create_namespaced_custom_object(
            *base.KUEUE, namespace, "localqueues", kueue.local_queue("q", namespace, cq)
        )
        nodes = await asyncio.to_thread(
            dev_cluster.ensure_nodes, bin_dir, 2, prefix=prefix, gpu_driver="dra",
            labels={"taugrid.dev/test-fleet": namespace, base.GATE_LABEL: namespace},
        )  # fmt: skip
        agents = [kit.Agent(n, await kit.agent_token(k8s, namespace, n), dra=True) for n in nodes]
        async with kit.running(dev_cluster, namespace, agents, release_after_s=1.0,
                               admission_retry_after_s=RETRY_AFTER_S,
                               admission_pass_interval_s=0.5) as (ctl, _, _):  # fmt: skip
            assert ctl.settings.admission_check == check
            yield ctl, agents
    finally:
        await dra.delete_ours_on(k8s, nodes)
        core = client.CoreV1Api(k8s)
        for n in nodes:
            with contextlib.suppress(client.ApiException):
                await core.delete_node(n)
        for obj in reversed(objects):
            with contextlib.suppress(client.ApiException):
                await custom.delete_cluster_custom_object(
                    *base.KUEUE, base.PLURALS[obj["kind"]], obj["metadata"]["name"]
                )


async def _healthy(k8s: client.ApiClient, nodes: list[str]) -> None:
    for node in nodes:

        async def probe(node: str = node) -> None:
            cond = kit.gpu_condition(await kit.read_node(k8s, node))
            assert cond is not None, "no GPUHealthy condition yet"
            assert cond["status"] == "True", cond

        await support.eventually(probe, what=f"GPUHealthy=True on {node}")


async def _check_of(k8s: client.ApiClient, namespace: str, job: str, check: str) -> Any:
    wl = await kueue.workload_of(k8s, namespace, job)
    return wl, base.our_check(wl, check)


async def test_the_gate_holds_what_does_not_fit_on_healthy_devices_and_admits_it_once_clear(
    k8s: client.ApiClient,
    namespace: str,
    world: tuple[kit.RunningController, list[kit.Agent]],
) -> None:
    """One GPU fenced on each node: 2 × 8 GPUs do not fit (15 of 16 usable, none of the two
    nodes whole), so Retry names the fenced GPUs and the run's message keeps it; both GPUs
    recover, the rules go, and on the next requeue the Workload is admitted and its claims
    allocated."""
    ctl, agents = world
    nodes = [a.node for a in agents]
    await _healthy(k8s, nodes)
    for agent in agents:
        agent.fail(2, kit.ECC_RISING)

    async def fenced() -> None:
        mine = await dra.ours_on(k8s, nodes)
        assert len(mine) == 4, sorted(mine)

    await support.eventually(fenced, what="two GPUs fenced")
    await dra.create(k8s, namespace, "resourceclaimtemplates", dra.claim_template("eight", 8))
    await client.BatchV1Api(k8s).create_namespaced_job(
        namespace, dra.dra_job("big", "q", "eight", run_for="1h", parallelism=2)
    )

    async def held() -> str:
        _, check = await _check_of(k8s, namespace, "big", ctl.settings.admission_check)
        message = ctl.gate.message_for(namespace, (await kueue.workload_of(
            k8s, namespace, "big"))["metadata"]["name"])  # fmt: skip
        assert message, f"no Retry yet: {check}"
        return message

    message = await support.eventually(held, what="the gate to hold the Workload")
    assert "needs 2 nodes with 8 free GPUs" in message, message
    assert "2 GPUs not usable" in message, message
    for node in nodes:
        assert f"{node} gpu-2 tainted" in message, message

    for agent in agents:
        agent.heal(2)

    async def allocated() -> None:
        found = await dra.allocations(k8s, namespace)
        assert len(found) == 2, found

    await support.eventually(allocated, what="both claims allocated after the GPUs cleared")
    wl, check = await _check_of(k8s, namespace, "big", ctl.settings.admission_check)
    assert (check["state"], base.holds(wl, "Admitted")) == ("Ready", True)


async def test_a_passed_workload_whose_devices_went_bad_before_its_pods_started_loses_its_quota(
    k8s: client.ApiClient,
    namespace: str,
    world: tuple[kit.RunningController, list[kit.Agent]],
) -> None:
    """Admitted with 8 GPUs, its pod still gated (not scheduled): a GPU on each node goes
    bad, so it fits nowhere any more; the gate turns its check to Retry and Kueue evicts it
    (quota released) instead of holding the quota for pods that cannot run."""
    ctl, agents = world
    await _healthy(k8s, [a.node for a in agents])
    await dra.create(k8s, namespace, "resourceclaimtemplates", dra.claim_template("eight", 8))
    job = dra.dra_job("gated", "q", "eight", run_for="1h")
    job["spec"]["template"]["spec"]["schedulingGates"] = [{"name": "example.com/hold"}]
    await client.BatchV1Api(k8s).create_namespaced_job(namespace, job)

    async def admitted() -> None:
        wl, check = await _check_of(k8s, namespace, "gated", ctl.settings.admission_check)
        assert (check["state"], base.holds(wl, "Admitted")) == ("Ready", True), check

    await support.eventually(admitted, what="the gated Workload admitted")
    for agent in agents:
        agent.fail(6, kit.ECC_RISING)

    async def evicted() -> dict[str, Any]:
        wl = await kueue.workload_of(k8s, namespace, "gated")
        cond = support.condition(wl, "Evicted") or {}
        assert cond.get("status") == "True", wl["status"].get("conditions")
        return cond

    cond = await support.eventually(evicted, what="Kueue evicting the Workload")
    assert cond["reason"] == "AdmissionCheck", cond
    message = ctl.gate.message_for(namespace, (await kueue.workload_of(
        k8s, namespace, "gated"))["metadata"]["name"])  # fmt: skip
    assert message is not None
    assert message.startswith("quota released before its pods started: "), message
