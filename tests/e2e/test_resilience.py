"""Resilience end to end: checkpoints, a node failure, the next attempt from the newest
checkpoint on healthy nodes only, and the health gate holding a run that cannot fit.

Each test gets three fake GPU nodes of its own flavor, scripted agents heartbeating for them,
our AdmissionCheck (answered by this test's controller) on a private ClusterQueue, and a
researcher token. KWOK keeps run pods running; the test finishes them as a kubelet would.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import os
import pathlib
import sys
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from kubernetes_asyncio import client

from controller import marks, timestamps
from devcluster import cluster
from shared import health, heartbeat
from tests import controllerkit as kit
from tests import kueue, runskit, support
from tests.runskit import IMAGE, RESEARCHER_RULES, make_token

pytestmark = pytest.mark.cluster

TAU = pathlib.Path(__file__).parents[2] / "controller/assets/tau.py"
FLEET_LABEL = "taugrid.dev/test-fleet"


@dataclasses.dataclass
class World:
    """One test's fleet, queue, controller and tokens."""

    namespace: str
    nodes: list[str]
    agents: dict[str, kit.Agent]
    api: client.ApiClient
    http: aiohttp.ClientSession
    url: str
    token: str
    oncall: str

    def headers(self, token: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {token or self.token}"}

    async def call(
        self, method: str, path: str, *, token: str | None = None, json: Any = None
    ) -> tuple[int, Any]:
        async with self.http.request(method, self.url + path, json=json,
                                     headers=self.headers(token)) as resp:  # fmt: skip
            return resp.status, await resp.json()

    async def run(self, name: str) -> dict[str, Any]:
        status, body = await self.call("GET", f"/v1/runs/{self.namespace}/{name}")
        assert status == 200, body
        return dict(body)

    async def pods(self, run: str) -> list[dict[str, Any]]:
        resp = await client.CoreV1Api(self.api).list_namespaced_pod(
            self.namespace, label_selector=f"{marks.RUN_LABEL}={run}", _preload_content=False
        )
        return list((await resp.json())["items"])

    async def tau(self, *argv: str, token: str | None = None, **env: str) -> tuple[int, str]:
        """The `tau` client, as a researcher or (with TAU_RUN/TAU_ATTEMPT) as a run's pod."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(TAU), *argv,
            env={"TAU_URL": self.url, "TAU_TOKEN": token or self.token,
                 "TAU_NAMESPACE": self.namespace, "PATH": os.environ["PATH"], **env},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        out, _ = await proc.communicate()
        return int(proc.returncode or 0), out.decode()


@pytest_asyncio.fixture
async def world(
    k8s: client.ApiClient, dev_cluster: cluster.Cluster, bin_dir: pathlib.Path, namespace: str
) -> AsyncIterator[World]:
    """Three nodes of a private flavor behind a private, health-gated queue `q`."""
    prefix = f"r-{namespace}"[:50].rstrip("-") + "-"
    nodes = await asyncio.to_thread(
        dev_cluster.ensure_nodes, bin_dir, 3, prefix=prefix, labels={FLEET_LABEL: namespace}
    )
    custom = client.CustomObjectsApi(k8s)
    check = f"gh-{namespace}"[:63]
    await custom.create_cluster_custom_object(*kueue.KUEUE, "admissionchecks", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "AdmissionCheck",
        "metadata": {"name": check}, "spec": {"controllerName": "taugrid.dev/gpu-health"},
    })  # fmt: skip
    await kueue.create_queues(k8s, namespace, gpus=24, node_labels={FLEET_LABEL: namespace},
                              checks=(check,))  # fmt: skip
    token = await make_token(k8s, namespace, "researcher", RESEARCHER_RULES)
    oncall = await kit.admin_token(k8s, namespace)
    agents = {n: kit.Agent(n, await kit.agent_token(k8s, namespace, n)) for n in nodes}
    try:
        async with kit.running(
            dev_cluster, namespace, list(agents.values()),
            admission_check=check,
            admission_retry_after_s=10.0,
            run_manager=f"test/{namespace}",
            run_pass_interval_s=0.5,
            run_pod_annotations={"kwok.taugrid.dev/run-for": "1h",
                                 "kwok.taugrid.dev/terminate-after": "8s"},
            run_termination_grace_s=45,
            degraded_drain_after_s=3.0,
            resume_priority_class="",
        ) as (ctl, http, _):  # fmt: skip
            yield World(namespace, nodes, agents, k8s, http, ctl.url, token, oncall)
    finally:
        await kueue.delete_queues(k8s, namespace)
        with contextlib.suppress(client.ApiException):
            await custom.delete_cluster_custom_object(*kueue.KUEUE, "admissionchecks", check)
        core = client.CoreV1Api(k8s)
        for n in nodes:
            with contextlib.suppress(client.ApiException):
                await core.delete_node(n)
        await kit.delete_test_rbac(k8s, namespace)


def pytorch_run(name: str) -> dict[str, Any]:
    """Two workers of 8 GPUs each, retried after a node failure (the default)."""
    return {"name": name, "kind": "pytorch", "image": IMAGE, "command": ["torchrun", "train.py"],
            "workers": 2, "resources": {"gpus": 8, "cpu": "4", "memory": "8Gi"}, "queue": "q",
            "checkpoint": {"dir": "/ckpt"}}  # fmt: skip


async def finish(api: client.ApiClient, pod: dict[str, Any]) -> None:
    """End a running pod with exit code 0, the way a kubelet reports it."""
    meta = pod["metadata"]
    now = timestamps.rfc3339(dt.datetime.now(dt.UTC))
    status = {
        "phase": "Succeeded",
        "containerStatuses": [{
            "name": c["name"], "image": c["image"], "imageID": "", "ready": False,
            "restartCount": 0,
            "state": {"terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": now,
                                     "startedAt": now}},
        } for c in pod["spec"]["containers"]],
    }  # fmt: skip
    await client.CoreV1Api(api).patch_namespaced_pod_status(
        meta["name"], meta["namespace"], {"status": status}
    )


async def test_a_node_failure_resumes_the_run_from_its_newest_checkpoint(world: World) -> None:
    """Checkpoints at 100 and 200, then Xid 79 on one of the run's nodes: the node is
    quarantined, attempt 1 is a NodeFailure, its pods are gone before attempt 2's start,
    attempt 2 resumes from step 200 on healthy nodes only and completes; the evidence shows
    both attempts."""
    status, _ = await world.call("POST", f"/v1/runs?namespace={world.namespace}",
                                 json=pytorch_run("llm"))  # fmt: skip
    assert status == 201

    async def attempt_running(n: int) -> list[dict[str, Any]]:
        run = await world.run("llm")
        assert (run["attempt"], run["phase"]) == (n, "Running"), (run["phase"], run["message"])
        pods = [p for p in await world.pods("llm")
                if p["metadata"]["labels"][marks.ATTEMPT_LABEL] == str(n)]  # fmt: skip
        assert len(pods) == 2, [p["metadata"]["name"] for p in pods]
        assert all(p["status"].get("phase") == "Running" for p in pods)
        return pods

    first = await support.eventually(lambda: attempt_running(1), timeout_s=120, what="attempt 1")
    used = sorted(p["spec"]["nodeName"] for p in first)
    run_token = await runskit.run_token(world.api, world.namespace, "llm")
    for step in (100, 200):
        code, out = await world.tau(
            "checkpoint", "--step", str(step), "--path", f"/ckpt/step-{step}",
            token=run_token, TAU_RUN="llm", TAU_ATTEMPT="1",
        )  # fmt: skip
        assert code == 0, out

    bad = used[0]
    world.agents[bad].fail(3)

    async def overlap_free_until_attempt_2_runs() -> list[dict[str, Any]]:
        pods = await world.pods("llm")
        by_attempt: dict[str, list[dict[str, Any]]] = {}
        for p in pods:
            by_attempt.setdefault(p["metadata"]["labels"][marks.ATTEMPT_LABEL], []).append(p)
        started = [p for p in by_attempt.get("2", []) if p["spec"].get("nodeName")]
        alive = [p for p in by_attempt.get("1", [])
                 if p["status"].get("phase") not in {"Succeeded", "Failed"}]  # fmt: skip
        if started and alive:  # not an AssertionError: `eventually` must stop at once
            pytest.fail("an attempt-2 pod was placed while attempt 1's pods still ran")
        return await attempt_running(2)

    second = await support.eventually(overlap_free_until_attempt_2_runs, timeout_s=180,
                                      interval_s=0.2, what="attempt 2 running")  # fmt: skip
    node = await kit.read_node(world.api, bad)
    assert "taugrid.dev/gpu-unhealthy:NoSchedule" in kit.taints(node)
    assert bad not in {p["spec"]["nodeName"] for p in second}
    env = {e["name"]: e.get("value") for e in second[0]["spec"]["containers"][0]["env"]}
    assert (env["TAU_RESUME_FROM"], env["TAU_ATTEMPT"], env["TAU_FAILURE_REASON"]) == (
        "/ckpt/step-200", "2", "NodeFailure",
    )  # fmt: skip
    run = await world.run("llm")
    assert run["attempts"][0]["failureClass"] == "NodeFailure", run["attempts"][0]
    code, out = await world.tau("status", "llm")  # what the researcher sees in the morning
    assert code == 0, out
    assert "/ckpt/step-200" in out, out
    assert "attempt 1: pod llm-a1-" in out, out
    assert bad in out, out

    for pod in second:
        await finish(world.api, pod)

    async def succeeded() -> dict[str, Any]:
        run = await world.run("llm")
        assert run["phase"] == "Succeeded", (run["phase"], run["message"])
        return run

    await support.eventually(succeeded, timeout_s=120, what="the run succeeded")
    status, evidence = await world.call("GET", f"/v1/runs/{world.namespace}/llm/evidence")
    assert status == 200
    assert [(a["number"], a.get("failureClass")) for a in evidence["attempts"]] == [
        (1, "NodeFailure"), (2, None),
    ]  # fmt: skip
    assert bad in evidence["attempts"][0]["nodes"]


async def test_the_health_gate_holds_a_run_that_cannot_fit_on_healthy_nodes(
    world: World,
) -> None:
    """With one healthy node of three, a two-node run waits and `tau status` says why; it is
    admitted once a node is released, and its Workload was never requeued in a hot loop."""
    for n in world.nodes[:2]:
        status, body = await world.call("POST", f"/v1/nodes/{n}/quarantine", token=world.oncall,
                                        json={"reason": "maintenance"})  # fmt: skip
        assert status in (200, 201), body
    status, _ = await world.call("POST", f"/v1/runs?namespace={world.namespace}",
                                 json=pytorch_run("wide"))  # fmt: skip
    assert status == 201

    async def says_why() -> str:
        code, out = await world.tau("status", "wide")
        assert code == 0, out
        assert "Queued" in out, out
        assert "healthy" in out.lower(), out
        return out

    await support.eventually(says_why, timeout_s=120, what="tau status explaining the wait")
    status, body = await world.call("DELETE", f"/v1/nodes/{world.nodes[0]}/quarantine",
                                    token=world.oncall, json={"reason": "repaired"})  # fmt: skip
    assert status == 200, body

    async def running() -> dict[str, Any]:
        run = await world.run("wide")
        assert run["phase"] == "Running", (run["phase"], run["message"])
        return run

    await support.eventually(running, timeout_s=180, what="the run admitted after the release")
    workloads = await client.CustomObjectsApi(world.api).list_namespaced_custom_object(
        *kueue.KUEUE, world.namespace, "workloads"
    )
    (workload,) = workloads["items"]
    status_ = workload.get("status") or {}
    evictions = sum(int(e.get("count") or 0) for e in
                    (status_.get("schedulingStats") or {}).get("evictions") or []
                    if e.get("reason") == "AdmissionCheck")  # fmt: skip
    requeues = max(int((status_.get("requeueState") or {}).get("count") or 0), evictions)
    assert requeues < 20, f"requeued {requeues} times with a 10 s retry delay: a hot loop"


ECC_RISING = heartbeat.Reason(
    code="EccUncorrectedRising",
    verdict=health.Verdict.DEGRADED,
    action=health.Action.RESET_GPU,
    message="uncorrected ECC errors rising",
    latched=True,
    clears_when="a GPU reset and a passing diagnostic",
)


async def test_a_drained_degraded_node_gives_the_run_its_sigterm_checkpoint(
    world: World,
) -> None:
    """A Degraded node is drained after degradedDrainAfter: the run's pod gets SIGTERM with
    the configured grace (45 s here), the checkpoint it saves meanwhile is accepted (its
    attempt is still current), and the next attempt resumes from exactly that one."""
    job = {"name": "drain", "image": IMAGE, "command": ["python", "train.py"], "queue": "q",
           "resources": {"gpus": 8, "cpu": "1", "memory": "1Gi"},
           "checkpoint": {"dir": "/ckpt"}}  # fmt: skip
    status, _ = await world.call("POST", f"/v1/runs?namespace={world.namespace}", json=job)
    assert status == 201

    async def running_pod() -> dict[str, Any]:
        pods = await world.pods("drain")
        assert [p["status"].get("phase") for p in pods] == ["Running"]
        return pods[0]

    pod = await support.eventually(running_pod, timeout_s=120, what="the run's pod running")
    run_token = await runskit.run_token(world.api, world.namespace, "drain")  # as mounted
    world.agents[pod["spec"]["nodeName"]].fail(2, ECC_RISING)

    async def sigtermed() -> dict[str, Any]:
        pods = await world.pods("drain")
        assert len(pods) == 1, "not evicted yet"
        assert pods[0]["metadata"].get("deletionTimestamp"), "not evicted yet"
        return pods[0]

    evicted = await support.eventually(sigtermed, timeout_s=120, what="the drain's eviction")
    assert evicted["metadata"]["deletionGracePeriodSeconds"] == 45
    code, out = await world.tau(
        "checkpoint", "--step", "300", "--path", "/ckpt/on-sigterm",
        token=run_token, TAU_RUN="drain", TAU_ATTEMPT="1",
    )  # fmt: skip
    assert code == 0, out

    async def resumed() -> dict[str, Any]:
        run = await world.run("drain")
        assert run["attempt"] == 2, (run["phase"], run["message"])
        return run

    run = await support.eventually(resumed, timeout_s=120, what="attempt 2")
    assert run["attempts"][0]["failureClass"] == "NodeFailure"
    job2 = await client.BatchV1Api(world.api).read_namespaced_job("drain-a2", world.namespace)
    env = {e.name: e.value for e in job2.spec.template.spec.containers[0].env}
    assert env["TAU_RESUME_FROM"] == "/ckpt/on-sigterm"
