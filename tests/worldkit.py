"""One world of hostile-input tests: a controller on the dev cluster, two researchers in two
namespaces, a stranger with no RBAC, an on-call engineer, an agent bound to a node of the
world's own fleet, and one real run (with its run-scoped token).

The hostile corpus (tests/integration/controller/test_hostile.py) and the OpenAPI fuzzer
(tests/e2e/test_fuzz.py) share it: every credential an operation needs is here.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import pathlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import yarl
from kubernetes_asyncio import client

from devcluster import cluster
from tests import controllerkit, kueue, runskit, support
from tests.runskit import RESEARCHER_RULES, job_spec, make_token

STATUS_RULES = [
    *RESEARCHER_RULES,
    {"apiGroups": ["taugrid.dev"], "resources": ["tauruns/status"], "verbs": ["update"]},
]
"""A researcher's rights, and `update tauruns/status` for the checkpoint calls."""


@dataclasses.dataclass
class World:
    """Everything a hostile test speaks to, and with."""

    controller: controllerkit.RunningController
    http: aiohttp.ClientSession
    api: client.ApiClient
    ns_a: str
    ns_b: str
    researcher_a: str
    researcher_b: str
    stranger: str
    """A ServiceAccount of namespace A with no RBAC at all."""
    oncall: str
    agent: str
    """A projected token (audience `taugrid`) bound to a pod on `node`."""
    peer: str
    """A replica's peer token: the controller ServiceAccount's, audience `taugrid-peer`."""
    node: str
    run: str
    """A run of researcher A in namespace A, really created."""
    run_token: str
    """That run's own token (`TAU_TOKEN`)."""

    @property
    def url(self) -> str:
        return self.controller.url

    def bearer(self, token: str | None) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"} if token else {}

    async def call(
        self,
        method: str,
        path: str,
        *,
        token: str | None,
        body: bytes | None = None,
        content_type: str = "application/json",
        params: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        """Send one request (the path as given, already encoded); the status and the JSON
        body (or the text, for a body that is not JSON)."""
        headers = self.bearer(token)
        if body is not None:
            headers["Content-Type"] = content_type
        url = yarl.URL(self.url + path, encoded=True)
        data = io.BytesIO(body) if body is not None else None  # aiohttp warns on big bytes
        async with self.http.request(method, url, data=data, headers=headers,
                                     params=params) as resp:  # fmt: skip
            text = await resp.text()
            try:
                return resp.status, await resp.json(content_type=None)
            except ValueError:
                return resp.status, text

    async def healthy(self) -> bool:
        async with self.http.get(f"{self.url}/healthz") as resp:
            return resp.status == 200


async def _namespace(api: client.ApiClient, name: str) -> None:
    core = client.CoreV1Api(api)
    await core.create_namespace(
        {"metadata": {"name": name, "labels": {"taugrid.dev/test": "true"}}}
    )

    async def default_sa() -> Any:
        return await core.read_namespaced_service_account("default", name)

    await support.eventually(support.not_found_is_not_yet(default_sa), what=f"default SA in {name}")


async def _peer_token(api: client.ApiClient, namespace: str, node: str) -> str:
    """A token of the replicas' ServiceAccount (`taugrid-controller`) for the peer audience,
    bound to a replica pod of its own on `node` (KWOK runs it), as a replica's projected
    volume holds it."""
    core = client.CoreV1Api(api)
    sa = "taugrid-controller"
    await core.create_namespaced_service_account(namespace, {"metadata": {"name": sa}})
    pod = await core.create_namespaced_pod(namespace, {
        "metadata": {"name": "replica"},
        "spec": {"nodeName": node, "serviceAccountName": sa,
                 "tolerations": [{"operator": "Exists"}],
                 "containers": [{"name": "controller",
                                 "image": "taugrid/controller@sha256:" + "4" * 64}]},
    })  # fmt: skip
    spec = {
        "audiences": ["taugrid-peer"], "expirationSeconds": 3600,
        "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": "replica",
                           "uid": pod.metadata.uid},
    }  # fmt: skip
    tr = await core.create_namespaced_service_account_token(sa, namespace, {"spec": spec})
    return str(tr.status.token)


@contextlib.asynccontextmanager
async def world(
    api: client.ApiClient,
    dev_cluster: cluster.Cluster,
    bin_dir: pathlib.Path,
    prefix: str,
    **overrides: Any,
) -> AsyncIterator[World]:
    """Build the world (namespaces `<prefix>-a-…` and `<prefix>-b-…`), yield it, tear it down."""
    ns_a = support.unique_name(f"{prefix}-a", max_len=40)
    ns_b = support.unique_name(f"{prefix}-b", max_len=40)
    await _namespace(api, ns_a)
    await _namespace(api, ns_b)
    names: list[str] = []
    ctl: controllerkit.RunningController | None = None
    http = aiohttp.ClientSession()
    try:
        await kueue.create_queues(api, ns_a, gpus=8)
        await kueue.create_queues(api, ns_b, gpus=8)
        researcher_a = await make_token(api, ns_a, "researcher", STATUS_RULES)
        researcher_b = await make_token(api, ns_b, "researcher", STATUS_RULES)
        stranger = await make_token(api, ns_a, "stranger", None)
        oncall = await controllerkit.admin_token(api, ns_a)
        names = await asyncio.to_thread(
            dev_cluster.ensure_nodes, bin_dir, 1, prefix=f"h-{ns_a}"[:50] + "-",
            labels={"taugrid.dev/test-fleet": ns_a},
        )  # fmt: skip
        agent = await controllerkit.agent_token(api, ns_a, names[0])
        peer = await _peer_token(api, ns_a, names[0])
        values: dict[str, Any] = {
            "run_pass_interval_s": 0.5,
            "run_manager": f"test/{ns_a}",
            "run_pod_annotations": {"kwok.taugrid.dev/run-for": "600s"},
            "logs_wait_s": 0.5,
            **overrides,
        }
        ctl = await controllerkit.start_controller(dev_cluster.kubeconfig, ns_a, **values)
        await controllerkit.wait_leader(ctl)
        run = "owned"
        async with http.post(
            f"{ctl.url}/v1/runs", json=job_spec(run), params={"namespace": ns_a},
            headers={"Authorization": f"Bearer {researcher_a}"},
        ) as resp:  # fmt: skip
            assert resp.status == 201, await resp.text()
        yield World(
            controller=ctl, http=http, api=api, ns_a=ns_a, ns_b=ns_b,
            researcher_a=researcher_a, researcher_b=researcher_b, stranger=stranger,
            oncall=oncall, agent=agent, peer=peer, node=names[0], run=run,
            run_token=await runskit.run_token(api, ns_a, run),
        )  # fmt: skip
    finally:
        await http.close()
        if ctl is not None:
            await ctl.stop()
        core = client.CoreV1Api(api)
        for node in names:
            with contextlib.suppress(client.ApiException):
                await core.delete_node(node)
        await kueue.delete_queues(api, ns_a)
        await kueue.delete_queues(api, ns_b)
        await controllerkit.delete_test_rbac(api, ns_a)
        for ns in (ns_a, ns_b):
            with contextlib.suppress(client.ApiException):
                await core.delete_namespace(ns, propagation_policy="Background")
