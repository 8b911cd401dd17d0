"""A run on DRA end to end: submitted through the API, admitted by Kueue behind our check on
DRA nodes, its claims allocated by kube-scheduler; a fault on the GPU it holds fences that
device, kube-controller-manager deletes the pod once the run's checkpoint grace ran out, the
attempt is a NodeFailure, and attempt 2 resumes from the newest checkpoint on healthy
devices and completes."""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from kubernetes_asyncio import client

from controller import marks
from devcluster import cluster
from tests import controllerkit as kit
from tests import dra, kueue, runskit, support
from tests.e2e import test_resilience as base
from tests.runskit import IMAGE, RESEARCHER_RULES, make_token

pytestmark = pytest.mark.cluster

GRACE_S = 3


@pytest_asyncio.fixture
async def world(
    k8s: client.ApiClient, dev_cluster: cluster.Cluster, bin_dir: pathlib.Path, namespace: str
) -> AsyncIterator[base.World]:
    """Two DRA nodes of a private flavor behind a private, health-gated queue `q`, and a
    controller that renders claims (`gpuMode: dra`)."""
    prefix = f"e-{namespace}"[:48].rstrip("-") + "-"
    nodes = await asyncio.to_thread(
        dev_cluster.ensure_nodes, bin_dir, 2, prefix=prefix, gpu_driver="dra",
        labels={base.FLEET_LABEL: namespace},
    )  # fmt: skip
    custom = client.CustomObjectsApi(k8s)
    check = f"gh-{namespace}"[:63]
    await custom.create_cluster_custom_object(*kueue.KUEUE, "admissionchecks", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "AdmissionCheck",
        "metadata": {"name": check}, "spec": {"controllerName": "taugrid.dev/gpu-health"},
    })  # fmt: skip
    await kueue.create_queues(k8s, namespace, gpus=16, node_labels={base.FLEET_LABEL: namespace},
                              checks=(check,))  # fmt: skip
    token = await make_token(k8s, namespace, "researcher", RESEARCHER_RULES)
    oncall = await kit.admin_token(k8s, namespace)
    agents = {n: kit.Agent(n, await kit.agent_token(k8s, namespace, n), dra=True) for n in nodes}
    try:
        async with kit.running(
            dev_cluster, namespace, list(agents.values()),
            admission_check=check, admission_retry_after_s=3.0, gpu_mode="dra",
            run_manager=f"test/{namespace}", run_pass_interval_s=0.5, release_after_s=1.0,
            run_pod_annotations={"kwok.taugrid.dev/run-for": "1h",
                                 "kwok.taugrid.dev/terminate-after": "4s"},
            resume_priority_class="",
        ) as (ctl, http, _):  # fmt: skip
            yield base.World(namespace, nodes, agents, k8s, http, ctl.url, token, oncall)
    finally:
        await dra.delete_ours_on(k8s, nodes)
        await kueue.delete_queues(k8s, namespace)
        with contextlib.suppress(client.ApiException):
            await custom.delete_cluster_custom_object(*kueue.KUEUE, "admissionchecks", check)
        core = client.CoreV1Api(k8s)
        for n in nodes:
            with contextlib.suppress(client.ApiException):
                await core.delete_node(n)
        await kit.delete_test_rbac(k8s, namespace)


def dra_run(name: str) -> dict[str, Any]:
    """One worker of 2 GPUs, checkpointing, with a checkpoint grace of 3 s."""
    return {"name": name, "image": IMAGE, "command": ["python", "train.py"],
            "resources": {"gpus": 2, "cpu": "2", "memory": "4Gi"}, "queue": "q",
            "checkpoint": {"dir": "/ckpt", "grace": f"{GRACE_S}s"}}  # fmt: skip


async def test_a_run_on_dra_resumes_on_healthy_devices_after_one_of_its_gpus_is_fenced(
    world: base.World,
) -> None:
    """Attempt 1 runs on two DRA devices and checkpoints at step 100; one of its GPUs
    fails (ResetGPU class): the device is fenced, the pod is deleted by the device-taint
    manager after the grace, attempt 1 is a NodeFailure, attempt 2 resumes from step 100
    with claims that avoid the fenced device, and the run succeeds."""
    status, body = await world.call("POST", f"/v1/runs?namespace={world.namespace}",
                                    json=dra_run("dr"))  # fmt: skip
    assert status == 201, body
    template = await client.CustomObjectsApi(world.api).get_namespaced_custom_object(
        *dra.RESOURCE, world.namespace, "resourceclaimtemplates", "dr-a1-gpus"
    )
    request = template["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert request["tolerations"][0]["tolerationSeconds"] == GRACE_S

    async def attempt_running(n: int) -> dict[str, Any]:
        run = await world.run("dr")
        assert (run["attempt"], run["phase"]) == (n, "Running"), (run["phase"], run["message"])
        pods = [p for p in await world.pods("dr")
                if p["metadata"]["labels"][marks.ATTEMPT_LABEL] == str(n)
                and p["status"].get("phase") == "Running"]  # fmt: skip
        assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
        return pods[0]

    first = await support.eventually(lambda: attempt_running(1), timeout_s=120, what="attempt 1")
    held = (await dra.devices_of(world.api, world.namespace))[first["metadata"]["name"]]
    assert len(held) == 2, held
    pool, device = min(held)
    assert pool == first["spec"]["nodeName"]
    run_token = await runskit.run_token(world.api, world.namespace, "dr")
    code, out = await world.tau("checkpoint", "--step", "100", "--path", "/ckpt/step-100",
                                token=run_token, TAU_RUN="dr", TAU_ATTEMPT="1")  # fmt: skip
    assert code == 0, out

    bad = int(device.removeprefix("gpu-"))
    world.agents[pool].fail(bad, kit.ECC_RISING)
    second = await support.eventually(lambda: attempt_running(2), timeout_s=180,
                                      what="attempt 2 running")  # fmt: skip
    run = await world.run("dr")
    failure = (run["attempts"][0]["failureClass"], run["attempts"][0]["message"])
    assert failure[0] == "NodeFailure", failure
    assert marks.DEVICE_TAINT_DELETION_REASON in failure[1], failure
    env = {e["name"]: e.get("value") for e in second["spec"]["containers"][0]["env"]}
    assert (env["TAU_RESUME_FROM"], env["TAU_ATTEMPT"], env["TAU_FAILURE_REASON"]) == (
        "/ckpt/step-100", "2", "NodeFailure",
    )  # fmt: skip
    now_held = (await dra.devices_of(world.api, world.namespace))[second["metadata"]["name"]]
    assert len(now_held) == 2, now_held
    assert (pool, device) not in now_held, now_held

    await base.finish(world.api, second)

    async def succeeded() -> None:
        run = await world.run("dr")
        assert run["phase"] == "Succeeded", (run["phase"], run["message"])

    await support.eventually(succeeded, timeout_s=120, what="the run succeeded")
