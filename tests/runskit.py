"""What the run API's tests share (and the e2e tier and benches reuse): a researcher's
token and Role, a run pod's token, a tau.yaml for a GPU job, and `Env`, one test's world
around a controller."""

from __future__ import annotations

import dataclasses
import io
import json
from typing import Any

import aiohttp
from kubernetes_asyncio import client

from tests import controllerkit, support

IMAGE = "registry.example/train@sha256:" + "0" * 64
RESEARCHER_RULES = [
    {"apiGroups": ["taugrid.dev"], "resources": ["tauruns"],
     "verbs": ["create", "get", "list", "watch", "delete", "patch"]},
    {"apiGroups": [""], "resources": ["pods", "pods/log"], "verbs": ["get", "list"]},
]  # fmt: skip


async def make_token(
    api: client.ApiClient, namespace: str, name: str, rules: list[dict[str, Any]] | None
) -> str:
    """A ServiceAccount token; with `rules`, a Role and RoleBinding in the namespace."""
    core = client.CoreV1Api(api)
    rbac = client.RbacAuthorizationV1Api(api)
    await core.create_namespaced_service_account(namespace, {"metadata": {"name": name}})
    if rules is not None:
        await rbac.create_namespaced_role(namespace, {"metadata": {"name": name}, "rules": rules})
        await rbac.create_namespaced_role_binding(
            namespace,
            {
                "metadata": {"name": name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                            "name": name},
                "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
            },
        )  # fmt: skip
    tr = await core.create_namespaced_service_account_token(
        name, namespace, {"spec": {"expirationSeconds": 3600}}
    )
    return str(tr.status.token)


RUN_AUDIENCE = "taugrid-run"


async def run_token(
    api: client.ApiClient, namespace: str, run: str, *, attempt: int = 1,
    audience: str = RUN_AUDIENCE,
) -> str:  # fmt: skip
    """The token a pod of attempt `attempt` of `run` has at TAU_TOKEN_FILE: a TokenRequest
    for the namespace's default ServiceAccount, bound to that pod, of the run audience (what
    the kubelet mounts from the rendered projected volume; KWOK's pods have no kubelet)."""
    core = client.CoreV1Api(api)
    selector = f"taugrid.dev/run={run},taugrid.dev/attempt={attempt}"

    async def pod() -> tuple[str, str]:
        pods = await core.list_namespaced_pod(namespace, label_selector=selector)
        live = [p for p in pods.items if p.metadata.deletion_timestamp is None]
        assert live, f"no pod of {run} attempt {attempt} yet"
        return str(live[0].metadata.name), str(live[0].metadata.uid)

    name, uid = await support.eventually(pod, what=f"a pod of {run} attempt {attempt}")
    request = {"spec": {
        "audiences": [audience], "expirationSeconds": 3600,
        "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": name, "uid": uid},
    }}  # fmt: skip

    async def mint() -> str:
        tr = await core.create_namespaced_service_account_token("default", namespace, request)
        return str(tr.status.token)

    return await support.eventually(support.not_found_is_not_yet(mint), what="the run token")


@dataclasses.dataclass
class Env:
    """One test's world: controller, namespace, researcher token, HTTP session."""

    url: str
    namespace: str
    token: str
    http: aiohttp.ClientSession
    api: client.ApiClient
    controller: controllerkit.RunningController

    def headers(self, **extra: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}", **extra}

    async def submit(
        self, spec: dict[str, Any] | str | bytes, *, token: str | None = None, **headers: str
    ) -> tuple[int, dict[str, Any]]:
        if isinstance(spec, dict):
            body: bytes = json.dumps(spec).encode()
            headers.setdefault("Content-Type", "application/json")
        else:
            body = spec.encode() if isinstance(spec, str) else spec
            headers.setdefault("Content-Type", "application/yaml")
        hdrs = {**self.headers(**headers)}
        if token is not None:
            hdrs["Authorization"] = f"Bearer {token}"
        async with self.http.post(
            f"{self.url}/v1/runs",
            data=io.BytesIO(body),
            headers=hdrs,
            params={"namespace": self.namespace},
        ) as resp:
            return resp.status, await resp.json()

    async def get(self, path: str, **params: str) -> tuple[int, dict[str, Any]]:
        async with self.http.get(self.url + path, headers=self.headers(), params=params) as r:
            return r.status, await r.json()

    async def run(self, name: str) -> dict[str, Any]:
        status, body = await self.get(f"/v1/runs/{self.namespace}/{name}")
        assert status == 200, body
        return body

    async def wait_phase(self, name: str, *phases: str, timeout_s: float = 120) -> dict[str, Any]:
        async def probe() -> dict[str, Any]:
            run = await self.run(name)
            assert run["phase"] in phases, f"phase {run['phase']}: {run['message']}"
            return run

        return await support.eventually(probe, timeout_s=timeout_s, what=f"{name} in {phases}")


def job_spec(name: str, gpus: int = 1, **extra: Any) -> dict[str, Any]:
    """A tau.yaml (as a dict) for a GPU job in queue `q`."""
    return {"name": name, "image": IMAGE, "command": ["python", "train.py"],
            "resources": {"gpus": gpus, "cpu": "1", "memory": "1Gi"}, "queue": "q",
            **extra}  # fmt: skip
