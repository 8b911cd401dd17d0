"""The gpu-health AdmissionCheck on the real control plane (real Kueue, KWOK nodes).

Each test brings its own AdmissionCheck (`gh-<namespace>`, the controller's default in
tests), ResourceFlavor (selecting only this test's nodes by a label of their own),
ClusterQueue that references the check, LocalQueue `q`, and two fake 8-GPU nodes. Node
health is set by hand, as the quarantine would set it (condition `GPUHealthy=False`, our
taint); the test controller's quarantine loop is pointed at no node so it cannot undo that.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import pathlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from kubernetes_asyncio import client

from controller import marks, timestamps
from controller.admission import admitting
from devcluster import cluster
from tests import controllerkit, kueue, support

pytestmark = pytest.mark.cluster

KUEUE = ("kueue.x-k8s.io", "v1beta2")
GATE_LABEL = "taugrid.dev/gate-test"
SMP = "application/strategic-merge-patch+json"
RETRY_AFTER_S = 5


@dataclasses.dataclass
class World:
    """One test's Kueue objects, nodes and controller."""

    api: client.ApiClient
    namespace: str
    check: str
    flavor: str
    cluster_queue: str
    nodes: list[str]
    controller: controllerkit.RunningController

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)


def kueue_objects(namespace: str, check: str, flavor: str, cq: str) -> list[dict[str, Any]]:
    """AdmissionCheck, ResourceFlavor (this test's nodes only), ClusterQueue with the check."""
    queue = kueue.cluster_queue(cq, namespace, gpus=32)
    queue["spec"]["resourceGroups"][0]["flavors"][0]["name"] = flavor
    queue["spec"]["admissionChecksStrategy"] = {"admissionChecks": [{"name": check}]}
    return [
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "AdmissionCheck",
         "metadata": {"name": check}, "spec": {"controllerName": marks.ADMISSION_CHECK_CONTROLLER}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
         "metadata": {"name": flavor}, "spec": {"nodeLabels": {GATE_LABEL: namespace}}},
        queue,
    ]  # fmt: skip


PLURALS = {"AdmissionCheck": "admissionchecks", "ResourceFlavor": "resourceflavors",
           "ClusterQueue": "clusterqueues"}  # fmt: skip


@pytest_asyncio.fixture
async def world(
    k8s: client.ApiClient, dev_cluster: cluster.Cluster, bin_dir: pathlib.Path, namespace: str
) -> AsyncIterator[World]:
    """Queues with our check, two healthy 8-GPU nodes of the flavor, a leading controller."""
    check, flavor, cq = (f"{p}-{namespace}"[:63] for p in ("gh", "fl", "cq"))
    custom = client.CustomObjectsApi(k8s)
    objects = kueue_objects(namespace, check, flavor, cq)
    nodes: list[str] = []
    ctl: controllerkit.RunningController | None = None
    try:
        for obj in objects:
            await custom.create_cluster_custom_object(*KUEUE, PLURALS[obj["kind"]], obj)
        await custom.create_namespaced_custom_object(
            *KUEUE, namespace, "localqueues", kueue.local_queue("q", namespace, cq)
        )
        prefix = f"g-{namespace}"[:50].rstrip("-") + "-"
        nodes = await asyncio.to_thread(
            dev_cluster.ensure_nodes, bin_dir, 2, prefix=prefix,
            labels={"taugrid.dev/test-fleet": namespace, GATE_LABEL: namespace},
        )  # fmt: skip
        ctl = await controllerkit.start_controller(
            dev_cluster.kubeconfig, namespace,
            admission_retry_after_s=RETRY_AFTER_S,
            # The gate is under test, not the quarantine: it must not rewrite by hand-set health.
            node_selector="taugrid.dev/quarantine-in-test=none",
        )  # fmt: skip
        assert ctl.settings.admission_check == check
        await controllerkit.wait_leader(ctl)
        yield World(k8s, namespace, check, flavor, cq, nodes, ctl)
    finally:
        if ctl is not None:
            await ctl.stop()
        core = client.CoreV1Api(k8s)
        for n in nodes:
            with contextlib.suppress(client.ApiException):
                await core.delete_node(n)
        for obj in reversed(objects):
            with contextlib.suppress(client.ApiException):
                await custom.delete_cluster_custom_object(
                    *KUEUE, PLURALS[obj["kind"]], obj["metadata"]["name"]
                )


# ---------------------------------------------------------------- helpers


async def make_unhealthy(api: client.ApiClient, node: str) -> None:
    """Mark a node as the quarantine does for Xid 79: condition False and our taint."""
    core = client.CoreV1Api(api)
    cond = {"type": "GPUHealthy", "status": "False", "reason": "XidFallenOffBus",
            "message": f"GPU-{node}-3: Xid 79",
            "lastTransitionTime": timestamps.rfc3339(dt.datetime.now(dt.UTC))}  # fmt: skip
    await core.patch_node_status(node, {"status": {"conditions": [cond]}}, _content_type=SMP)
    await core.patch_node(
        node,
        {"spec": {"taints": [{"key": "taugrid.dev/gpu-unhealthy", "effect": "NoSchedule"}]}},
        _content_type="application/merge-patch+json",
    )


async def make_healthy(api: client.ApiClient, node: str) -> None:
    """Release a node as the quarantine does: condition True, taint removed."""
    core = client.CoreV1Api(api)
    cond = {"type": "GPUHealthy", "status": "True", "reason": "Healthy", "message": "released"}
    await core.patch_node_status(node, {"status": {"conditions": [cond]}}, _content_type=SMP)
    await core.patch_node(node, {"spec": {"taints": None}},
                          _content_type="application/merge-patch+json")  # fmt: skip


async def submit(w: World, name: str) -> None:
    """A suspended 2-pod × 8-GPU Job in the test's queue."""
    job = kueue.gpu_job(name, "q", 8, run_for="1s", parallelism=2)
    await client.BatchV1Api(w.api).create_namespaced_job(w.namespace, job)


def our_check(wl: dict[str, Any], check: str) -> dict[str, Any]:
    """Our entry of the Workload's `status.admissionChecks` (AssertionError: not there yet)."""
    for c in (wl.get("status") or {}).get("admissionChecks") or []:
        if c.get("name") == check:
            return dict(c)
    msg = f"no {check} entry on {wl['metadata']['name']} yet"
    raise AssertionError(msg)


def holds(wl: dict[str, Any], kind: str) -> bool:
    cond = support.condition(wl, kind)
    return cond is not None and cond.get("status") == "True"


async def admitted(w: World, job: str) -> dict[str, Any]:
    """Wait until the Job's Workload is Admitted with our check Ready; return it."""

    async def probe() -> dict[str, Any]:
        wl = await kueue.workload_of(w.api, w.namespace, job)
        check = our_check(wl, w.check)
        assert check["state"] == "Ready", check
        assert holds(wl, "Admitted"), wl["status"].get("conditions")
        return wl

    return await support.eventually(probe, what=f"{job} admitted through {w.check}")


async def retry_events(w: World, workload: str) -> list[dict[str, Any]]:
    """Our Retry Events on a Workload."""
    events = await client.EventsV1Api(w.api).list_namespaced_event(
        w.namespace, _preload_content=False
    )
    items = (await events.json()).get("items") or []
    return [
        e
        for e in items
        if e.get("reason") == admitting.RETRY_EVENT_REASON
        and (e.get("regarding") or {}).get("name") == workload
    ]


def retry_decisions(w: World) -> float:
    """How many Retry states the controller has written (its metric)."""
    registry = w.controller.serving.metrics.registry
    value = registry.get_sample_value("taugrid_admission_decisions_total", {"state": "Retry"})
    return value or 0.0


# ---------------------------------------------------------------- the test


async def test_the_gate_admits_on_healthy_nodes_and_retries_without_a_hot_loop(
    world: World,
) -> None:
    """Active check; 2 × 8 GPUs admitted on two healthy nodes; with one node unhealthy the
    next 2 × 8 Job is retried (requeueAfterSeconds set, a message naming the sick node, one
    Event, a bounded number of retries) and stays unadmitted; released, it is admitted."""
    w = world
    gate = w.controller.gate

    async def active() -> None:
        ac = await w.custom.get_cluster_custom_object(*KUEUE, "admissionchecks", w.check)
        cond = support.condition(ac, "Active")
        assert cond is not None, "no Active condition yet"
        assert (cond["status"], cond["reason"]) == ("True", marks.CHECK_ACTIVE_REASON)
        registry = w.controller.serving.metrics.registry
        assert registry.get_sample_value("taugrid_admission_check_active") == 1

    await support.eventually(active, what=f"{w.check} Active")

    await submit(w, "first")
    first = await admitted(w, "first")
    assert our_check(first, w.check)["message"].startswith("fits on healthy nodes")

    async def finished() -> None:
        wl = await kueue.workload_of(w.api, w.namespace, "first")
        assert holds(wl, "Finished"), "first is still running"

    await support.eventually(finished, what="the first Job to finish and free its nodes")

    healthy, sick = w.nodes
    await make_unhealthy(w.api, sick)
    await submit(w, "second")

    async def retried() -> dict[str, Any]:
        wl = await kueue.workload_of(w.api, w.namespace, "second")
        check = our_check(wl, w.check)
        assert int(check.get("retryCount") or 0) >= 1, check
        return wl

    wl = await support.eventually(retried, what="second to be retried by the gate")
    name = wl["metadata"]["name"]
    check = our_check(wl, w.check)
    assert check["requeueAfterSeconds"] == RETRY_AFTER_S
    assert not holds(wl, "Admitted")
    message = gate.message_for(w.namespace, name)
    assert message is not None
    assert "needs 2 nodes with 8 free GPUs" in message
    assert f"only 1 healthy node has them: {healthy}" in message
    assert f"{sick} XidFallenOffBus" in message

    # No hot loop: Kueue waits the requeueAfterSeconds each Retry carries (a nil delay would
    # retry at once), so two more retries take at least one whole delay between them; and
    # the gate writes one Retry per Kueue cycle, no more.
    retries_before = int(check.get("retryCount") or 0)
    decided_before = retry_decisions(w)
    started = time.monotonic()

    async def two_more() -> dict[str, Any]:
        wl = await kueue.workload_of(w.api, w.namespace, "second")
        retries = int(our_check(wl, w.check).get("retryCount") or 0) - retries_before
        assert retries >= 2, f"{retries} more retries so far"
        return wl

    wl = await support.eventually(two_more, timeout_s=120, what="two more retries")
    elapsed = time.monotonic() - started
    assert elapsed >= RETRY_AFTER_S - 1, f"two retries in {elapsed:.1f}s: a hot loop"
    retries = int(our_check(wl, w.check).get("retryCount") or 0) - retries_before
    assert retry_decisions(w) - decided_before <= retries + 1
    assert not holds(wl, "Admitted")
    assert len(await retry_events(w, name)) == 1, "one Event per distinct message"

    await make_healthy(w.api, sick)
    second = await admitted(w, "second")
    assert our_check(second, w.check)["message"].startswith("fits on healthy nodes")
    assert gate.message_for(w.namespace, name) is None, "a Ready check holds nothing back"


async def test_a_passed_jobs_pods_carry_the_gates_marks(world: World) -> None:
    """The gate's Ready entry holds one update for the Job's one pod set; Kueue takes it into
    the Job's pod template when it starts the Job, so every pod carries the label and says
    which check passed it and when (the check's own transition time)."""
    w = world
    await submit(w, "marked")
    wl = await admitted(w, "marked")
    ours = our_check(wl, w.check)
    pod_set = wl["spec"]["podSets"][0]["name"]
    passed_at = ours["lastTransitionTime"]
    mark = {marks.GATE_PASSED_LABEL: "true"}
    notes = {marks.GATE_CHECK_ANNOTATION: w.check, marks.GATE_PASSED_AT_ANNOTATION: passed_at}
    assert ours["podSetUpdates"] == [{"name": pod_set, "labels": mark, "annotations": notes}]

    batch = client.BatchV1Api(w.api)

    async def started() -> dict[str, Any]:
        job = await batch.read_namespaced_job("marked", w.namespace, _preload_content=False)
        raw = dict(await job.json())
        assert raw["spec"].get("suspend") is False, "not started yet"
        return raw

    job = await support.eventually(started, what="Kueue to start the Job")
    template = job["spec"]["template"]["metadata"]
    assert template["labels"][marks.GATE_PASSED_LABEL] == "true"
    assert {k: template["annotations"][k] for k in notes} == notes

    async def pods() -> list[dict[str, Any]]:
        listed = await client.CoreV1Api(w.api).list_namespaced_pod(
            w.namespace, label_selector=f"job-name=marked,{marks.GATE_PASSED_LABEL}=true",
            _preload_content=False,
        )  # fmt: skip
        items = list((await listed.json()).get("items") or [])
        assert len(items) == 2, f"{len(items)} marked pods so far"
        return items

    for pod in await support.eventually(pods, what="the Job's two pods, marked"):
        assert pod["metadata"]["annotations"][marks.GATE_PASSED_AT_ANNOTATION] == passed_at
