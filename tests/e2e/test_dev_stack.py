"""The dev cluster as `taugrid dev up` leaves it: TauGrid installed by its Helm chart, the
host processes standing in for the chart's pods with tokens bound to them, renewed in place.

These tests read the shared dev cluster and touch only what they create (a run in `default`).
The test command starts the dev cluster with `taugrid dev up` before pytest.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import subprocess
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client

from devcluster import chart, cluster, stack, tokens
from devcluster import node as real_node
from tests import support

pytestmark = pytest.mark.cluster

NODES = ["gpu-node-0", "gpu-node-1", "gpu-node-2", "gpu-node-3"]


def _dev_nodes(dev: cluster.Cluster) -> list[str]:
    nodes = [n for n in NODES if (tokens.agent_dir(dev, n) / "token").exists()]
    assert nodes, "no dev agents: start the dev cluster with `taugrid dev up` (scripts/test does)"
    return nodes


async def _review(api: client.ApiClient, token: str, audience: str | None) -> Any:
    spec: dict[str, Any] = {"token": token}
    if audience:
        spec["audiences"] = [audience]
    review = await client.AuthenticationV1Api(api).create_token_review({"spec": spec})
    assert review.status.authenticated, review.status.error
    return review.status


async def test_the_chart_installed_taugrid_and_kwok_runs_its_pods(
    dev_cluster: cluster.Cluster, bin_dir: pathlib.Path, k8s: client.ApiClient
) -> None:
    """One Helm release holds TauGrid: a controller Deployment, an agent pod on every dev
    node, the AdmissionCheck (Active: the dev controller answers it) and the dev queue waiting
    on it."""
    nodes = _dev_nodes(dev_cluster)
    listing = await asyncio.to_thread(
        subprocess.run,
        [str(chart.helm_binary(bin_dir)), "list", "-n", stack.NAMESPACE, "-o", "json",
         "--kubeconfig", str(dev_cluster.kubeconfig)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    out = listing.stdout
    releases = {r["name"]: r["status"] for r in json.loads(out)}
    assert releases.get(stack.RELEASE) == "deployed", releases
    agents, _ = await asyncio.to_thread(
        tokens.wait_for_pods, dev_cluster, bin_dir, stack.NAMESPACE, stack.RELEASE, nodes
    )
    real = [real_node.NODE_NAME] if real_node.running(dev_cluster) else []
    assert sorted(nodes + real) == sorted(agents)
    deploy = await client.AppsV1Api(k8s).read_namespaced_deployment(
        f"{stack.RELEASE}-controller", stack.NAMESPACE
    )
    # With the real node the controller is the chart's one real pod there; else two replicas
    # that KWOK "runs", with a host process standing in for the leader.
    assert (1 if real_node.running(dev_cluster) else 2) == deploy.spec.replicas
    custom = client.CustomObjectsApi(k8s)
    check = await custom.get_cluster_custom_object(
        "kueue.x-k8s.io", "v1beta2", "admissionchecks", cluster.ADMISSION_CHECK
    )
    active = support.condition(check, "Active")
    assert active is not None, check.get("status")
    assert active["status"] == "True", active
    cq = await custom.get_cluster_custom_object(
        "kueue.x-k8s.io", "v1beta2", "clusterqueues", cluster.CLUSTER_QUEUE
    )
    assert cq["spec"]["admissionChecksStrategy"]["admissionChecks"] == [
        {"name": cluster.ADMISSION_CHECK}
    ]
    assert cq["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"


async def test_host_processes_use_tokens_bound_to_the_charts_pods_and_renewed(
    dev_cluster: cluster.Cluster, bin_dir: pathlib.Path, k8s: client.ApiClient
) -> None:
    """The controller acts as its ServiceAccount (the chart's RBAC, not the admin's); each
    agent's heartbeat token is bound to the DaemonSet pod on its node. A renewal (what the
    renewer process does every 20 minutes) replaces them, and the agents keep reporting."""
    nodes = _dev_nodes(dev_cluster)
    controller_token = (tokens.controller_dir(dev_cluster) / "token").read_text().strip()
    status = await _review(k8s, controller_token, None)
    assert status.user.username == (
        f"system:serviceaccount:{stack.NAMESPACE}:{stack.RELEASE}-controller"
    )
    assert status.user.extra["authentication.kubernetes.io/pod-name"][0].startswith(
        f"{stack.RELEASE}-controller-"
    )
    before = {}
    for node in nodes:
        token = (tokens.agent_dir(dev_cluster, node) / "token").read_text().strip()
        before[node] = token
        status = await _review(k8s, token, "taugrid")
        assert status.user.username == f"system:serviceaccount:{stack.NAMESPACE}:taugrid-agent"
        assert status.user.extra["authentication.kubernetes.io/node-name"] == [node]

    await asyncio.to_thread(
        tokens.issue, dev_cluster, bin_dir, stack.NAMESPACE, stack.RELEASE, nodes
    )
    after = {n: (tokens.agent_dir(dev_cluster, n) / "token").read_text().strip() for n in nodes}
    assert all(after[n] != before[n] for n in nodes)
    for node in nodes:
        status = await _review(k8s, after[node], "taugrid")
        assert status.user.extra["authentication.kubernetes.io/node-name"] == [node]

    oncall = dev_cluster.kubectl(
        bin_dir, "-n", stack.NAMESPACE, "create", "token", stack.ONCALL_SA
    ).strip()
    seen: dict[str, str] = {}

    async def reporting_again() -> None:
        async with aiohttp.ClientSession() as http:
            for node in nodes:
                async with http.get(
                    f"{stack.controller_url()}/v1/nodes/{node}",
                    headers={"Authorization": f"Bearer {oncall}"},
                ) as resp:
                    body = await resp.json()
                    assert resp.status == 200, body
                    last = str(body["lastHeartbeat"])
                    seen.setdefault(node, last)
                    assert last != seen[node], f"no heartbeat from {node} since the renewal"

    await support.eventually(reporting_again, timeout_s=60, what="heartbeats after renewal")


async def test_a_first_run_passes_the_health_gate_of_the_dev_queue(
    dev_cluster: cluster.Cluster, bin_dir: pathlib.Path, k8s: client.ApiClient
) -> None:
    """What the welcome text tells a researcher to do: a run submitted to the dev controller
    goes through the gated dev queue (our check Ready on its Workload) and succeeds."""
    _dev_nodes(dev_cluster)
    token = stack.researcher_token(dev_cluster, bin_dir)
    name = support.unique_name("first", max_len=30)
    spec = {
        "name": name,
        "image": "registry.example/hello@sha256:" + "1" * 64,
        "command": ["echo", "hi"],
        "resources": {"gpus": 1, "cpu": "1", "memory": "1Gi"},
    }
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{stack.controller_url()}/v1/runs?namespace=default", json=spec,
                             headers=headers) as resp:  # fmt: skip
            assert resp.status == 201, await resp.text()

        async def succeeded() -> dict[str, Any]:
            async with http.get(f"{stack.controller_url()}/v1/runs/default/{name}",
                                headers=headers) as resp:  # fmt: skip
                run = await resp.json()
            assert run["phase"] == "Succeeded", (run["phase"], run["message"])
            return dict(run)

        run = await support.eventually(succeeded, timeout_s=120, what=f"run {name} succeeded")
    workload = run["attempts"][0]["workload"]
    wl = await client.CustomObjectsApi(k8s).get_namespaced_custom_object(
        "kueue.x-k8s.io", "v1beta2", "default", "workloads", workload
    )
    checks = {c["name"]: c["state"] for c in wl["status"].get("admissionChecks") or []}
    assert checks == {cluster.ADMISSION_CHECK: "Ready"}
