"""TauGrid as deployed, end to end: controller and agent processes on the dev cluster, faults
injected into an agent's fake NVML library from outside, outcomes read from the API server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pathlib
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client

from devcluster import cluster, fakenvml, processes, stack
from tests import controllerkit as kit
from tests import leaderservice, support

pytestmark = pytest.mark.cluster

TAINT = "taugrid.dev/gpu-unhealthy:NoSchedule"
FAST = {
    "TAUGRID_CONTROLLER_LEASE_DURATION_S": "3",
    "TAUGRID_CONTROLLER_RENEW_DEADLINE_S": "2",
    "TAUGRID_CONTROLLER_RETRY_PERIOD_S": "0.3",
    "TAUGRID_CONTROLLER_PASS_INTERVAL_S": "0.5",
    "TAUGRID_CONTROLLER_EVICT_GRACE_S": "0",
    "TAUGRID_CONTROLLER_RELEASE_AFTER_S": "1",
    "TAUGRID_CONTROLLER_STALE_QUARANTINE_AFTER_S": "30",
}


class Fleet:
    """Nodes, agents and controller replicas of one test, as host processes."""

    def __init__(self, dev: cluster.Cluster, bin_dir: pathlib.Path, ns: str, tmp: pathlib.Path):
        self.dev = dev
        self.bin_dir = bin_dir
        self.ns = ns
        self.tmp = tmp
        # Unix socket paths are limited to 108 bytes: keep the agents' sockets short.
        self.short = pathlib.Path(tempfile.mkdtemp(prefix="tge-"))
        self.table = processes.ProcessTable(tmp)
        self.nodes: list[str] = []
        self.controllers: dict[str, int] = {}
        self.lib_dir = fakenvml.build()

    def start_controller(self, name: str, extra: dict[str, str] | None = None) -> str:
        port = kit.free_port()
        env = stack.controller_env(
            self.dev,
            port=port,
            namespace=self.ns,
            identity=name,
            node_selector=f"taugrid.dev/test-fleet={self.ns}",
        )
        env = {**env, **FAST, **(extra or {})}
        self.table.start(name, [sys.executable, "-m", "controller"], env=env)
        self.controllers[name] = port
        url = f"http://127.0.0.1:{port}"
        stack.wait_http(self.dev_view(), name, f"{url}/healthz")
        return url

    def dev_view(self) -> cluster.Cluster:
        """A Cluster whose process table is this test's (for wait_http's log tails)."""
        view = cluster.Cluster(self.dev.state, self.dev.ports)
        view.table = self.table
        return view

    def start_agent(self, node: str, controller: str) -> None:
        port = kit.free_port()
        env = stack.agent_env(
            self.dev,
            node=node,
            port=port,
            controller=controller,
            token=stack.bound_token(self.dev, self.bin_dir, node, self.ns),
            state_dir=self.agent_dir(node),
            lib_dir=self.lib_dir,
        )
        env["TAUGRID_AGENT_HEARTBEAT_INTERVAL_S"] = "1"
        self.table.start(f"agent-{node}", [sys.executable, "-m", "agent"], env=env)
        stack.wait_http(self.dev_view(), f"agent-{node}", f"http://127.0.0.1:{port}/healthz")

    def agent_dir(self, node: str) -> pathlib.Path:
        return self.short / str(self.nodes.index(node))

    def control(self, node: str) -> fakenvml.SocketControl:
        return fakenvml.SocketControl(self.agent_dir(node) / "nvml.sock")

    def reboot(self, node: str, controller: str) -> None:
        """What a node reboot looks like to the agent: a new boot ID and a fresh driver."""
        self.table.stop(f"agent-{node}")
        (self.agent_dir(node) / "boot_id").write_text("rebooted-boot-id\n")
        self.start_agent(node, controller)

    def kill(self, name: str) -> None:
        rec = self.table.get(name)
        assert rec is not None
        with contextlib.suppress(ProcessLookupError):
            os.kill(rec.pid, signal.SIGKILL)


@pytest.fixture
def fleet_env(
    dev_cluster: cluster.Cluster, bin_dir: pathlib.Path, namespace: str, tmp_path: pathlib.Path
) -> Iterator[Fleet]:
    """Two fake GPU nodes with agent pods (KWOK runs them) for this test's processes."""
    f = Fleet(dev_cluster, bin_dir, namespace, tmp_path)
    prefix = f"e-{namespace}"[:50].rstrip("-") + "-"
    f.nodes = dev_cluster.ensure_nodes(
        bin_dir, 2, prefix=prefix, labels={"taugrid.dev/test-fleet": namespace}
    )
    dev_cluster.apply(
        bin_dir,
        [
            {"apiVersion": "v1", "kind": "ServiceAccount",
             "metadata": {"name": stack.AGENT_SA, "namespace": namespace}},
            *(stack.agent_pod(n, namespace) for n in f.nodes),
        ],
    )  # fmt: skip
    try:
        yield f
    finally:
        f.table.stop_all()
        shutil.rmtree(f.short, ignore_errors=True)
        for n in f.nodes:
            with contextlib.suppress(cluster.ClusterError):
                dev_cluster.kubectl(bin_dir, "delete", "node", n, "--wait=false")


def _history(node: dict[str, Any]) -> list[dict[str, Any]]:
    raw = node["metadata"].get("annotations", {}).get("taugrid.dev/history", "[]")
    return list(json.loads(raw))


async def test_an_xid_injected_into_an_agent_quarantines_its_node_and_a_reboot_releases_it(
    k8s: client.ApiClient, fleet_env: Fleet
) -> None:
    """Agent → heartbeat → controller → taint, cordon, condition; a reboot releases."""
    url = fleet_env.start_controller("ctl-a")
    for n in fleet_env.nodes:
        fleet_env.start_agent(n, url)
    bad = fleet_env.nodes[0]

    async def reported_healthy() -> None:
        for n in fleet_env.nodes:
            cond = kit.gpu_condition(await kit.read_node(k8s, n))
            assert cond is not None, f"{n}: no GPUHealthy yet"
            assert cond["status"] == "True", cond

    await support.eventually(reported_healthy, what="both nodes reported healthy")
    await asyncio.to_thread(fleet_env.control(bad).xid, 2, 79)

    async def quarantined() -> dict[str, Any]:
        node = await kit.read_node(k8s, bad)
        assert TAINT in kit.taints(node)
        assert node["spec"].get("unschedulable") is True
        cond = kit.gpu_condition(node)
        assert cond is not None
        assert cond["status"] == "False"
        return node

    node = await support.eventually(quarantined, what="the node to be quarantined")
    cond = kit.gpu_condition(node)
    assert cond is not None
    assert "GPU-" in cond["message"], cond
    other = await kit.read_node(k8s, fleet_env.nodes[1])
    assert TAINT not in kit.taints(other)

    await asyncio.to_thread(fleet_env.reboot, bad, url)

    async def released() -> None:
        node = await kit.read_node(k8s, bad)
        assert TAINT not in kit.taints(node)
        assert not node["spec"].get("unschedulable")

    await support.eventually(released, what="release after the reboot")


async def _replica(
    k8s: client.ApiClient, fleet_env: Fleet, proxy: leaderservice.ServiceProxy, name: str
) -> str:
    """Start a replica process standing in for a controller pod of its own (KWOK runs it):
    it labels that pod when it leads, and reaches the leader through the leader Service."""
    pod = await leaderservice.replica_pod(k8s, fleet_env.ns, name, fleet_env.nodes[0])
    token = fleet_env.tmp / f"{name}.peer-token"
    await leaderservice.peer_token(k8s, fleet_env.ns, pod, token)
    url = await asyncio.to_thread(fleet_env.start_controller, name, {
        "TAUGRID_CONTROLLER_POD_NAME": name,
        "TAUGRID_CONTROLLER_PEER_TOKEN_FILE": str(token),
        "TAUGRID_CONTROLLER_LEADER_URL": proxy.url,
        "TAUGRID_CONTROLLER_CONTROLLER_SERVICE_ACCOUNT": leaderservice.SERVICE_ACCOUNT,
    })  # fmt: skip
    proxy.backends[name] = ("127.0.0.1", fleet_env.controllers[name])
    return url


async def test_killing_the_leader_during_a_fault_lets_the_follower_finish_the_quarantine_once(
    k8s: client.ApiClient, fleet_env: Fleet
) -> None:
    """Failover: agents report to the follower, which sends their reports to the leader
    through the leader-only Service under its own peer token; after the leader is killed the
    follower takes over within the lease, quarantines once, and calls no node stale because
    of the failover (a new leader observes for one staleAfter first)."""
    await leaderservice.leader_service(k8s, fleet_env.ns)
    proxy = await leaderservice.ServiceProxy(k8s, fleet_env.ns).start()
    try:
        await _failover(k8s, fleet_env, proxy)
    finally:
        await proxy.close()


async def _failover(
    k8s: client.ApiClient, fleet_env: Fleet, proxy: leaderservice.ServiceProxy
) -> None:
    url_a = await _replica(k8s, fleet_env, proxy, "ctl-a")

    async def a_leads() -> None:
        async with aiohttp.ClientSession() as http, http.get(f"{url_a}/readyz") as resp:
            body = await resp.json()
            assert body["leader"] is True, body

    await support.eventually(a_leads, what="ctl-a to lead")
    url_b = await _replica(k8s, fleet_env, proxy, "ctl-b")
    for n in fleet_env.nodes:
        # Agents reach the follower, which forwards through the leader Service's stand-in;
        # that relay runs on this event loop, so the blocking start goes to a thread.
        await asyncio.to_thread(fleet_env.start_agent, n, url_b)

    async def reported() -> None:
        for n in fleet_env.nodes:
            cond = kit.gpu_condition(await kit.read_node(k8s, n))
            assert cond is not None
            assert cond["status"] == "True", cond

    await support.eventually(reported, what="heartbeats forwarded to the leader")
    fleet_env.kill("ctl-a")
    bad = fleet_env.nodes[1]
    await asyncio.to_thread(fleet_env.control(bad).xid, 0, 79)

    async def quarantined() -> dict[str, Any]:
        node = await kit.read_node(k8s, bad)
        assert TAINT in kit.taints(node)
        assert node["spec"].get("unschedulable") is True
        return node

    node = await support.eventually(quarantined, what="the follower to quarantine")
    quarantines = [e for e in _history(node) if e.get("action") == "Quarantine"]
    assert len(quarantines) == 1, _history(node)
    healthy = await kit.read_node(k8s, fleet_env.nodes[0])
    assert TAINT not in kit.taints(healthy), "the failover quarantined a node for staleness"
    cond = kit.gpu_condition(healthy)
    assert cond is not None
    assert cond["status"] == "True", cond
