"""Device quarantine on the real control plane: a fault on one GPU of a DRA node gives that
device two DeviceTaintRules; kube-scheduler keeps new claims off it and on the node's other
GPUs; kube-controller-manager evicts the pod holding it once its toleration ran out; dry run
only reports; recovery removes the rules; the device breaker stops at its limit; a
node-scoped fault still quarantines the node (DESIGN.md sections 2 and 6)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import pathlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from kubernetes_asyncio import client

from devcluster import cluster
from tests import controllerkit as kit
from tests import dra, support

pytestmark = pytest.mark.cluster

FAST = {"release_after_s": 1.0, "admission_pass_interval_s": 0.5}


@pytest_asyncio.fixture
async def fleet(
    k8s: client.ApiClient, dev_cluster: cluster.Cluster, bin_dir: pathlib.Path, namespace: str
) -> AsyncIterator[list[str]]:
    """Two DRA nodes only this test's controller manages; its rules go with it."""
    prefix = f"dq-{namespace}"[:48].rstrip("-") + "-"
    names = await asyncio.to_thread(
        dev_cluster.ensure_nodes, bin_dir, 2, prefix=prefix,
        labels={"taugrid.dev/test-fleet": namespace}, gpu_driver="dra",
    )  # fmt: skip
    try:
        yield names
    finally:
        await dra.delete_ours_on(k8s, names)
        core = client.CoreV1Api(k8s)
        for n in names:
            with contextlib.suppress(client.ApiException):
                await core.delete_node(n)
        await kit.delete_test_rbac(k8s, namespace)


async def _agents(k8s: client.ApiClient, namespace: str, nodes: list[str]) -> list[kit.Agent]:
    return [kit.Agent(n, await kit.agent_token(k8s, namespace, n), dra=True) for n in nodes]


def claim_pod(name: str, node: str, template: str) -> dict[str, Any]:
    """A pod the scheduler places on `node` with a claim from `template`."""
    return {
        "metadata": {"name": name, "annotations": {"kwok.taugrid.dev/run-for": "1h"}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "restartPolicy": "Never",
            "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": template}],
            "containers": [{"name": "main", "image": "train@sha256:" + "4" * 64,
                            "resources": {"claims": [{"name": "gpus"}]}}],
        },
    }  # fmt: skip


async def _wait_rules(k8s: client.ApiClient, node: str, names: set[str]) -> dict[str, Any]:
    async def present() -> dict[str, Any]:
        found = await dra.ours_on(k8s, [node])
        assert set(found) == names, sorted(found)
        return found

    return await support.eventually(present, what=f"rules {sorted(names)}")


async def _healthy(k8s: client.ApiClient, node: str) -> None:
    async def probe() -> None:
        cond = kit.gpu_condition(await kit.read_node(k8s, node))
        assert cond is not None, "no GPUHealthy condition yet"
        assert cond["status"] == "True", cond

    await support.eventually(probe, what=f"GPUHealthy=True on {node}")


async def _oncall(http: aiohttp.ClientSession, url: str, path: str, token: str) -> Any:
    async with http.get(f"{url}{path}", headers={"Authorization": f"Bearer {token}"}) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()


async def test_a_reset_class_fault_fences_one_gpu_and_new_pods_land_on_the_seven_others(
    k8s: client.ApiClient, dev_cluster: cluster.Cluster, namespace: str, fleet: list[str]
) -> None:
    """ResetGPU on GPU 3: two rules for exactly d0/gpu-3, the node neither tainted nor
    cordoned; eight 1-GPU pods for the node: seven get its other GPUs, the eighth waits; the
    node's history, an Event and GET /v1/nodes/{name} say which GPU is fenced and why."""
    agents = await _agents(k8s, namespace, fleet)
    bad = fleet[0]
    token = await kit.admin_token(k8s, namespace)
    async with kit.running(dev_cluster, namespace, agents, **FAST) as (ctl, http, _):
        await _healthy(k8s, bad)
        agents[0].fail(3, kit.ECC_RISING)
        rules = await _wait_rules(k8s, bad, {f"taugrid-{bad}-gpu-3-unhealthy",
                                              f"taugrid-{bad}-gpu-3-evict"})  # fmt: skip
        expected = {("taugrid.dev/gpu-unhealthy", "NoSchedule", "gpu-3"),
                    ("taugrid.dev/gpu-evict", "NoExecute", "gpu-3")}  # fmt: skip
        actual = {(r["spec"]["taint"]["key"], r["spec"]["taint"]["effect"],
                   r["spec"]["deviceSelector"]["device"]) for r in rules.values()}  # fmt: skip
        assert expected == actual
        node = await kit.read_node(k8s, bad)
        assert (kit.taints(node), node["spec"].get("unschedulable")) == ([], None)

        await dra.create(k8s, namespace, "resourceclaimtemplates", dra.claim_template("one"))
        core = client.CoreV1Api(k8s)
        for i in range(8):
            await core.create_namespaced_pod(namespace, claim_pod(f"p{i}", bad, "one"))
        allocated = await dra.allocated(k8s, namespace, 7)
        assert {(bad, f"gpu-{i}") for i in range(8) if i != 3} == set(allocated.values())

        async def eighth_waits() -> None:
            pods = (await core.list_namespaced_pod(namespace)).items
            waiting = [p for p in pods if not p.spec.node_name]
            assert len(waiting) == 1, [p.metadata.name for p in waiting]
            scheduled = [c for c in waiting[0].status.conditions or [] if c.type == "PodScheduled"]
            assert [(c.status, c.reason) for c in scheduled] == [("False", "Unschedulable")]

        await support.eventually(eighth_waits, what="the eighth pod left unscheduled")
        shown = await _oncall(http, ctl.url, f"/v1/nodes/{bad}", token)
        [fenced] = shown["devices"]
        expected_shown = ("gpu-3", agents[0].uuid(3), "EccUncorrectedRising", False, 2)
        actual_shown = (fenced["device"], fenced["gpuUuid"], fenced["reason"], fenced["dryRun"],
                        len(fenced["rules"]))  # fmt: skip
        assert expected_shown == actual_shown
        assert "GPU reset" in fenced["clears"]

        async def recorded() -> None:
            annotations = (await kit.read_node(k8s, bad))["metadata"]["annotations"]
            history = json.loads(annotations.get("taugrid.dev/history", "[]"))
            assert "DeviceQuarantine" in [e["action"] for e in history], history

        await support.eventually(recorded, what="the fence in the node's history")
        fleet_json = await _oncall(http, ctl.url, "/v1/fleet", token)
        assert (fleet_json["devices"]["quarantined"], fleet_json["devices"]["gpus"]) == (1, 16)


async def test_the_pod_holding_the_bad_gpu_is_evicted_only_after_its_toleration(
    k8s: client.ApiClient, dev_cluster: cluster.Cluster, namespace: str, fleet: list[str]
) -> None:
    """A pod whose claim tolerates taugrid.dev/gpu-evict for 6 s: kube-controller-manager
    deletes it (DeviceTaintManagerEviction) no sooner than 6 s after the rule's timeAdded."""
    agents = await _agents(k8s, namespace, fleet)
    node = fleet[0]
    template = dra.claim_template("grace", tolerate=("taugrid.dev/gpu-evict", 6))
    await dra.create(k8s, namespace, "resourceclaimtemplates", template)
    async with kit.running(dev_cluster, namespace, agents, **FAST):
        await _healthy(k8s, node)
        await client.CoreV1Api(k8s).create_namespaced_pod(namespace, claim_pod("p", node, "grace"))
        (_, device), *_ = (await dra.allocated(k8s, namespace, 1)).values()
        index = int(device.removeprefix("gpu-"))
        agents[0].fail(index, kit.ECC_RISING)
        rules = await _wait_rules(k8s, node, {f"taugrid-{node}-{device}-unhealthy",
                                               f"taugrid-{node}-{device}-evict"})  # fmt: skip
        added = support.parse_time(
            rules[f"taugrid-{node}-{device}-evict"]["spec"]["taint"]["timeAdded"]
        )
        event = await dra.evicted_by_kcm(k8s, namespace, "p")
        waited = (support.parse_time(event["firstTimestamp"]) - added).total_seconds()
        assert waited >= 6 - 1, waited  # both have whole seconds


async def test_dry_run_creates_one_effect_none_rule_and_kcm_reports_the_would_be_eviction(
    k8s: client.ApiClient, dev_cluster: cluster.Cluster, namespace: str, fleet: list[str]
) -> None:
    """Dry run: only `…-dry-run` with effect None; the pod holding the device keeps running,
    and the rule's EvictionInProgress condition says 1 pod would be evicted."""
    agents = await _agents(k8s, namespace, fleet)
    node = fleet[1]
    await dra.create(k8s, namespace, "resourceclaimtemplates", dra.claim_template("one"))
    async with kit.running(dev_cluster, namespace, agents, dry_run=True, **FAST) as (ctl, _, _):

        async def reporting() -> None:  # dry run writes no condition to wait for
            assert node in ctl.fleet.fleet, "no heartbeat yet"

        await support.eventually(reporting, what=f"heartbeats from {node}")
        await client.CoreV1Api(k8s).create_namespaced_pod(namespace, claim_pod("p", node, "one"))
        (_, device), *_ = (await dra.allocated(k8s, namespace, 1)).values()
        agents[1].fail(int(device.removeprefix("gpu-")), kit.ECC_RISING)
        name = f"taugrid-{node}-{device}-dry-run"
        rules = await _wait_rules(k8s, node, {name})
        assert rules[name]["spec"]["taint"]["effect"] == "None"

        async def reported() -> str:
            cond = support.condition(await dra.rule(k8s, name), "EvictionInProgress")
            assert cond is not None, "no EvictionInProgress condition yet"
            return str(cond["message"])

        message = await support.eventually(reported, what="kube-controller-manager's report")
        assert "1 pod would be evicted in 1 namespace" in message
        pod = await client.CoreV1Api(k8s).read_namespaced_pod("p", namespace)
        assert (pod.status.phase, pod.metadata.deletion_timestamp) == ("Running", None)


async def test_the_rules_go_after_recovery_and_the_gpu_is_allocated_again(
    k8s: client.ApiClient, dev_cluster: cluster.Cluster, namespace: str, fleet: list[str]
) -> None:
    """The GPU reports healthy again: after releaseAfter both rules are deleted (and only
    ours: a rule of someone else's on the same device stays), and claims get it again."""
    agents = await _agents(k8s, namespace, fleet)
    node = fleet[0]
    foreign = dra.taint_rule(f"other-{namespace}", node, "gpu-5", key="example.com/note",
                             effect="None", test=namespace)  # fmt: skip
    async with (
        dra.cleanup_rules(k8s, namespace),
        kit.running(dev_cluster, namespace, agents, **FAST),
    ):
        await dra.create(k8s, None, "devicetaintrules", foreign)
        await _healthy(k8s, node)
        agents[0].fail(5, kit.ECC_RISING)
        await _wait_rules(k8s, node, {f"taugrid-{node}-gpu-5-unhealthy",
                                      f"taugrid-{node}-gpu-5-evict"})  # fmt: skip
        agents[0].heal(5)
        await _wait_rules(k8s, node, set())
        assert (await dra.rule(k8s, f"other-{namespace}"))["spec"]["taint"]["key"] == (
            "example.com/note"
        )
        await dra.create(k8s, namespace, "resourceclaimtemplates", dra.claim_template("one"))
        core = client.CoreV1Api(k8s)
        for i in range(8):
            await core.create_namespaced_pod(namespace, claim_pod(f"p{i}", node, "one"))
        allocated = await dra.allocated(k8s, namespace, 8)
        assert (node, "gpu-5") in set(allocated.values())


async def test_the_device_breaker_stops_at_its_limit(
    k8s: client.ApiClient, dev_cluster: cluster.Cluster, namespace: str, fleet: list[str]
) -> None:
    """3 of 16 GPUs turning bad at once (over a 10 % limit): the device breaker opens, no
    rule is created, an Event on the Lease says so and GET /v1/fleet shows it open."""
    agents = await _agents(k8s, namespace, fleet)
    token = await kit.admin_token(k8s, namespace)
    settings = {"device_breaker_percent": 10.0, "device_breaker_min_devices": 2,
                "device_quarantine_max_per_node": 3, **FAST}  # fmt: skip
    async with kit.running(dev_cluster, namespace, agents, **settings) as (ctl, http, _):
        for n in fleet:
            await _healthy(k8s, n)
        for i in range(3):
            agents[0].fail(i, kit.ECC_RISING)

        async def opened() -> dict[str, Any]:
            found = await _oncall(http, ctl.url, "/v1/fleet", token)
            assert found["devices"]["breaker"]["open"], found["devices"]
            return dict(found)

        found = await support.eventually(opened, what="the device breaker open")
        assert "3 of 16 GPUs" in found["devices"]["breaker"]["message"]
        assert await dra.ours_on(k8s, [fleet[0]]) == {}
        events = client.EventsV1Api(k8s)

        async def evented() -> None:
            listed = await events.list_namespaced_event(namespace)
            assert "DeviceOpenBreaker" in {e.reason for e in listed.items}, "no Event yet"

        await support.eventually(evented, what="the DeviceOpenBreaker Event on the Lease")


async def test_a_reboot_class_fault_on_a_dra_node_quarantines_the_node_and_evicts_claim_pods(
    k8s: client.ApiClient, dev_cluster: cluster.Cluster, namespace: str, fleet: list[str]
) -> None:
    """Xid 79 is node-scoped: taint and cordon as on a device-plugin node, no device rule,
    and the pod holding a claim there is evicted through the Eviction API."""
    agents = await _agents(k8s, namespace, fleet)
    node = fleet[1]
    await dra.create(k8s, namespace, "resourceclaimtemplates", dra.claim_template("one"))
    core = client.CoreV1Api(k8s)
    async with kit.running(dev_cluster, namespace, agents, **FAST):
        await _healthy(k8s, node)
        await core.create_namespaced_pod(namespace, claim_pod("p", node, "one"))
        await dra.allocated(k8s, namespace, 1)
        agents[1].fail(0, kit.XID_79)

        async def quarantined() -> None:
            raw = await kit.read_node(k8s, node)
            assert "taugrid.dev/gpu-unhealthy:NoSchedule" in kit.taints(raw)
            assert raw["spec"].get("unschedulable") is True

        await support.eventually(quarantined, what="node quarantine")

        async def evicted() -> None:
            try:
                pod = await core.read_namespaced_pod("p", namespace)
            except client.ApiException as err:
                if err.status == 404:
                    return
                raise
            assert pod.metadata.deletion_timestamp is not None, "the claim pod is still there"

        await support.eventually(evicted, what="the claim pod evicted")
        assert await dra.ours_on(k8s, [node]) == {}
