"""Run controllers against the dev cluster and speak to them as agents and on-call engineers.

Agents authenticate exactly as in production: a ServiceAccount token requested through the
TokenRequest API, bound to a pod that KWOK runs on the agent's node, with audience `taugrid`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import pathlib
import socket
import ssl
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from aiohttp import web
from kubernetes_asyncio import client

from controller import app as controller_app
from controller import main as controller_main
from controller import serving
from controller.admission import admitting
from controller.fleet import api as fleet_api
from controller.settings import ControllerSettings
from devcluster import cluster, fakenvml
from shared import health, heartbeat
from tests import support

AGENT_SA = "taugrid-agent"


def free_port() -> int:
    """Return a free loopback TCP port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclasses.dataclass
class RunningController:
    """One in-process controller replica and its URL."""

    app: web.Application
    runner: web.AppRunner
    url: str
    settings: ControllerSettings

    @property
    def serving(self) -> serving.ServingState:
        return self.app[serving.SERVING]

    @property
    def fleet(self) -> fleet_api.FleetContext:
        return self.app[fleet_api.FLEET]

    @property
    def gate(self) -> admitting.Gate:
        return self.app[controller_app.GATE]

    async def stop(self) -> None:
        await self.runner.cleanup()


async def start_controller(
    kubeconfig: pathlib.Path,
    namespace: str,
    *,
    ssl_context: ssl.SSLContext | None = None,
    **overrides: Any,
) -> RunningController:
    """Start a controller replica on a free loopback port with test-sized limits (serving
    HTTPS with `ssl_context`, advertised as such)."""
    port = free_port()
    url = f"{'https' if ssl_context else 'http'}://127.0.0.1:{port}"
    values: dict[str, Any] = {
        "host": "127.0.0.1",
        "port": port,
        "advertise_url": url,
        "kubeconfig": str(kubeconfig),
        "namespace": namespace,
        "lease_duration_s": 3.0,
        "renew_deadline_s": 2.0,
        "retry_period_s": 0.3,
        "pass_interval_s": 0.5,
        "evict_grace_s": 0.0,
        "eviction_retry_s": 0.3,
        "release_after_s": 1.0,
        "stale_quarantine_after_s": 2.0,
        "auth_cache_ttl_s": 1.0,
        # The scripted agents report every 0.5 s (a production agent: 5 s).
        "heartbeat_min_interval_s": 0.1,
        # Only this test's nodes: a controller without a selector would manage the shared
        # dev fleet and fight the dev controller (and other tests) over it.
        "node_selector": f"taugrid.dev/test-fleet={namespace}",
        # An AdmissionCheck of its own: answering the dev cluster's `taugrid-gpu-health` would
        # fight the dev controller over it.
        "admission_check": f"gh-{namespace}"[:63],
    }
    values.update(overrides)
    settings = ControllerSettings(**values)
    app = controller_app.make_app(settings)
    runner = controller_main.make_runner(app, shutdown_timeout=2.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, ssl_context=ssl_context)
    await site.start()
    return RunningController(app, runner, url, settings)


async def wait_leader(*replicas: RunningController) -> RunningController:
    """Poll until one replica leads and its node cache is synced; return it."""

    async def probe() -> RunningController:
        leaders = [r for r in replicas if r.serving.elector.is_leader()]
        assert len(leaders) == 1, f"{len(leaders)} leaders"
        assert leaders[0].fleet.cache.synced.is_set(), "node cache not synced"
        return leaders[0]

    return await support.eventually(probe, what="a leader")


async def agent_token(
    api: client.ApiClient, namespace: str, node: str, *, audience: str | None = "taugrid"
) -> str:
    """Run an agent pod on `node` (KWOK runs it) and return a token bound to it, for
    `audience` (None: the API server's own, as a default `kubectl create token`)."""
    core = client.CoreV1Api(api)
    try:
        await core.create_namespaced_service_account(namespace, {"metadata": {"name": AGENT_SA}})
    except client.ApiException as err:
        if err.status != 409:
            raise
    pod_name = f"agent-{node}"[:63]
    try:
        pod = await core.read_namespaced_pod(pod_name, namespace)
    except client.ApiException as err:
        if err.status != 404:
            raise
        pod = await _agent_pod(core, namespace, node, pod_name)
    spec: dict[str, Any] = {
        "expirationSeconds": 3600,
        "boundObjectRef": {
            "apiVersion": "v1", "kind": "Pod", "name": pod_name, "uid": pod.metadata.uid,
        },
    }  # fmt: skip
    if audience is not None:
        spec["audiences"] = [audience]
    tr = await core.create_namespaced_service_account_token(AGENT_SA, namespace, {"spec": spec})
    return str(tr.status.token)


async def _agent_pod(core: client.CoreV1Api, namespace: str, node: str, pod_name: str) -> Any:
    return await core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": pod_name, "labels": {"app": "taugrid-agent"}},
            "spec": {
                "nodeName": node,
                "serviceAccountName": AGENT_SA,
                "tolerations": [{"operator": "Exists"}],
                "containers": [{"name": "agent", "image": "taugrid/agent@sha256:" + "3" * 64}],
            },
        },
    )


async def admin_token(api: client.ApiClient, namespace: str, name: str = "oncall") -> str:
    """A ServiceAccount token allowed to get and patch nodes (an on-call engineer)."""
    core = client.CoreV1Api(api)
    rbac = client.RbacAuthorizationV1Api(api)
    await core.create_namespaced_service_account(namespace, {"metadata": {"name": name}})
    role = f"{namespace}-{name}"
    await rbac.create_cluster_role(
        {
            "metadata": {"name": role, "labels": {"taugrid.dev/test": "true"}},
            "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}],
        }
    )
    await rbac.create_cluster_role_binding(
        {
            "metadata": {"name": role, "labels": {"taugrid.dev/test": "true"}},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": role,
            },
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        }
    )
    tr = await core.create_namespaced_service_account_token(
        name, namespace, {"spec": {"expirationSeconds": 3600}}
    )
    return str(tr.status.token)


@contextlib.asynccontextmanager
async def own_fleet(
    k8s: client.ApiClient,
    dev: cluster.Cluster,
    bin_dir: pathlib.Path,
    namespace: str,
    count: int,
    *,
    tag: str,
) -> AsyncIterator[list[str]]:
    """`count` fake GPU nodes that only this test's controller manages (labelled for its
    namespace, named `<tag>-<namespace>-N`); deleted, with the test's RBAC, at the end."""
    names = await asyncio.to_thread(
        dev.ensure_nodes,
        bin_dir,
        count,
        prefix=f"{tag}-{namespace}"[:50].rstrip("-") + "-",
        labels={"taugrid.dev/test-fleet": namespace},
    )
    try:
        yield names
    finally:
        core = client.CoreV1Api(k8s)
        for n in names:
            with contextlib.suppress(client.ApiException):
                await core.delete_node(n)
        await delete_test_rbac(k8s, namespace)


async def delete_test_rbac(api: client.ApiClient, namespace: str) -> None:
    """Remove cluster-scoped RBAC made by `admin_token`."""
    rbac = client.RbacAuthorizationV1Api(api)
    for kind in ("cluster_role_binding", "cluster_role"):
        try:
            await getattr(rbac, f"delete_{kind}")(f"{namespace}-oncall")
        except client.ApiException as err:
            if err.status != 404:
                raise


def gpu(
    index: int,
    node: str,
    verdict: health.Verdict = health.Verdict.HEALTHY,
    reasons: tuple[heartbeat.Reason, ...] = (),
    *,
    uuid: str = "",
) -> heartbeat.GpuReport:
    """One GPU of a fake node, with a UUID derived from the node name (or the one given)."""
    action = max(
        (r.action for r in reasons),
        key=health.ACTION_SEVERITY.__getitem__,
        default=health.Action.NONE,
    )
    return heartbeat.GpuReport(
        index=index,
        uuid=uuid or f"GPU-{node}-{index}",
        name="NVIDIA H100 80GB HBM3",
        verdict=verdict,
        action=action,
        reasons=list(reasons),
    )


XID_79 = heartbeat.Reason(
    code="XidFallenOffBus",
    verdict=health.Verdict.FAILED,
    action=health.Action.REBOOT_NODE,
    message="Xid 79: GPU has fallen off the bus",
    xid=79,
    latched=True,
    clears_when="a new boot ID",
)


ECC_RISING = heartbeat.Reason(
    code="EccUncorrectedRising",
    verdict=health.Verdict.DEGRADED,
    action=health.Action.RESET_GPU,
    message="uncorrected ECC errors rising",
    latched=True,
    clears_when="a GPU reset",
)
"""A reset-class fault scoped to one GPU (device quarantine on DRA nodes)."""
XID_95 = heartbeat.Reason(
    code="XidUncontainedEcc",
    verdict=health.Verdict.FAILED,
    action=health.Action.RESET_GPU,
    message="Xid 95: uncontained ECC error",
    xid=95,
    latched=True,
    clears_when="a GPU reset",
)


class Agent:
    """A scripted agent: posts heartbeats for one node with its pod-bound token.

    `dra=True` reports the UUIDs the dev cluster's fake NVML gives that node, which its DRA
    publisher lists in the node's ResourceSlice."""

    def __init__(
        self, node: str, token: str, boot_id: str = "boot-1", *, dra: bool = False
    ) -> None:
        self.node = node
        self.token = token
        self.boot_id = boot_id
        self.sequence = 0
        self.dra = dra
        self.gpus = [self._gpu(i) for i in range(8)]

    def uuid(self, index: int) -> str:
        """The UUID this agent reports for GPU `index`."""
        return fakenvml.default_uuid(self.node, index) if self.dra else f"GPU-{self.node}-{index}"

    def _gpu(self, index: int, reason: heartbeat.Reason | None = None) -> heartbeat.GpuReport:
        if reason is None:
            return gpu(index, self.node, uuid=self.uuid(index))
        return gpu(index, self.node, reason.verdict, (reason,), uuid=self.uuid(index))

    def fail(self, index: int, reason: heartbeat.Reason = XID_79) -> None:
        self.gpus[index] = self._gpu(index, reason)

    def heal(self, index: int | None = None) -> None:
        """All GPUs healthy again (or only GPU `index`)."""
        for i in range(8) if index is None else (index,):
            self.gpus[i] = self._gpu(i)

    def report(self, interval_s: float = 1.0) -> heartbeat.Heartbeat:
        self.sequence += 1
        return heartbeat.Heartbeat(
            schema_version=1,
            node_name=self.node,
            boot_id=self.boot_id,
            interval_s=interval_s,
            sequence=self.sequence,
            sent_at=dt.datetime.now(dt.UTC),
            gpus=self.gpus,
        )

    async def send(self, http: aiohttp.ClientSession, url: str, interval_s: float = 1.0) -> int:
        body = heartbeat.encode(self.report(interval_s))
        async with http.post(
            f"{url}/v1/heartbeats",
            data=body,
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        ) as resp:
            await resp.read()
            return resp.status


async def heartbeat_loop(
    agents: list[Agent], http: aiohttp.ClientSession, urls: list[str], interval_s: float = 0.5
) -> None:
    """Keep every agent reporting to the first URL that answers (like real agents do)."""
    while True:
        for a in agents:
            for url in urls:
                try:
                    if await a.send(http, url, interval_s) < 500:
                        break
                except aiohttp.ClientError:
                    continue
        await asyncio.sleep(interval_s)


async def read_node(api: client.ApiClient, name: str) -> dict[str, Any]:
    """The node as raw JSON."""
    resp = await client.CoreV1Api(api).read_node(name, _preload_content=False)
    return dict(await resp.json())


def taints(node: dict[str, Any]) -> list[str]:
    return [f"{t['key']}:{t['effect']}" for t in node["spec"].get("taints") or []]


def gpu_condition(node: dict[str, Any]) -> dict[str, Any] | None:
    return support.condition(node, "GPUHealthy")


@contextlib.asynccontextmanager
async def running(
    dev: cluster.Cluster, namespace: str, agents: list[Agent], **overrides: Any
) -> AsyncIterator[tuple[RunningController, aiohttp.ClientSession, dict[str, asyncio.Task[None]]]]:
    """A leading controller for the test's fleet and one heartbeat loop per agent.

    Cancel an agent's loop to silence that node; everything stops on exit.
    """
    ctl = await start_controller(dev.kubeconfig, namespace, **overrides)
    async with aiohttp.ClientSession() as http:
        loops = {
            a.node: asyncio.create_task(heartbeat_loop([a], http, [ctl.url], 0.5)) for a in agents
        }
        try:
            await wait_leader(ctl)
            yield ctl, http, loops
        finally:
            for t in loops.values():
                t.cancel()
            for t in loops.values():
                with contextlib.suppress(asyncio.CancelledError):
                    await t
            await ctl.stop()
