"""The agent's API through the controller, on the real control plane with a real agent app.

The agent runs in process on the fake NVML library, with its real TokenReview and
SubjectAccessReview authenticator against the dev cluster's API server; the controller calls
it with its own agent token (audience `taugrid-agent`, a ServiceAccount allowed to patch
nodes, as the chart's controller is). The agent pods are KWOK's; their IPs are set to
loopback addresses, where the in-process agent listens (127.0.0.1) or nothing does
(127.0.0.2).
"""

from __future__ import annotations

import contextlib
import pathlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import test_utils
from kubernetes_asyncio import client

from agent import app as agent_app
from agent import k8sauth, settings
from devcluster import cluster, fakenvml
from tests import controllerkit as kit
from tests import support

pytestmark = pytest.mark.cluster

AGENT_AUDIENCE = "taugrid-agent"


@pytest.fixture(scope="module")
def fake() -> Iterator[fakenvml.InProcessControl]:
    """The fake NVML library, loaded once for the module."""
    control = fakenvml.InProcessControl(fakenvml.build())
    yield control
    control.reset_all()


@pytest_asyncio.fixture
async def fleet(
    k8s: client.ApiClient, dev_cluster: cluster.Cluster, bin_dir: pathlib.Path, namespace: str
) -> AsyncIterator[list[str]]:
    """Three fake GPU nodes that only this test's controller manages."""
    async with kit.own_fleet(k8s, dev_cluster, bin_dir, namespace, 3, tag="ap") as names:
        yield names


async def _account(
    k8s: client.ApiClient, namespace: str, name: str, verbs: list[str], audience: str | None
) -> str:
    """A ServiceAccount allowed `verbs` on nodes (none: no binding), and a token of it."""
    core = client.CoreV1Api(k8s)
    rbac = client.RbacAuthorizationV1Api(k8s)
    await core.create_namespaced_service_account(namespace, {"metadata": {"name": name}})
    if verbs:
        role = f"{namespace}-{name}"
        meta = {"name": role, "labels": {"taugrid.dev/test": "true"}}
        rules = [{"apiGroups": [""], "resources": ["nodes"], "verbs": verbs}]
        await rbac.create_cluster_role({"metadata": meta, "rules": rules})
        await rbac.create_cluster_role_binding({
            "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        })  # fmt: skip
    spec: dict[str, Any] = {"expirationSeconds": 3600}
    if audience:
        spec["audiences"] = [audience]
    tr = await core.create_namespaced_service_account_token(name, namespace, {"spec": spec})
    return str(tr.status.token)


async def _drop_roles(k8s: client.ApiClient, namespace: str, names: list[str]) -> None:
    rbac = client.RbacAuthorizationV1Api(k8s)
    for name in names:
        for kind in ("cluster_role_binding", "cluster_role"):
            with contextlib.suppress(client.ApiException):
                await getattr(rbac, f"delete_{kind}")(f"{namespace}-{name}")


async def _set_pod_ip(k8s: client.ApiClient, namespace: str, node: str, ip: str) -> None:
    """Give the KWOK agent pod of `node` the address `ip` (KWOK leaves it so)."""
    body = {"status": {"podIP": ip, "podIPs": [{"ip": ip}]}}
    await client.CoreV1Api(k8s).patch_namespaced_pod_status(
        f"agent-{node}"[:63], namespace, body, _content_type="application/merge-patch+json"
    )


async def test_on_call_reaches_the_agent_through_the_controller_and_no_one_else_does(  # noqa: PLR0917 - fixtures
    k8s: client.ApiClient,
    dev_cluster: cluster.Cluster,
    namespace: str,
    fleet: list[str],
    fake: fakenvml.InProcessControl,
    tmp_path: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On-call's token gets the agent's GPU view, starts nothing it may not, releases through
    the controller; a researcher's token is 403 before any agent is called; an unknown node
    is 404, a node whose agent does not listen or never reported 502, never a 500."""
    fake.reset_all()
    live, dead, silent = fleet
    agents = [kit.Agent(n, await kit.agent_token(k8s, namespace, n)) for n in (live, dead)]
    on_call = {"Authorization": f"Bearer {await kit.admin_token(k8s, namespace)}"}
    roles = ["ctl", "reader"]
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(_drop_roles, k8s, namespace, roles)
        agent_token = await _account(k8s, namespace, "ctl", ["patch"], AGENT_AUDIENCE)
        reader = {"Authorization": "Bearer "
                  + await _account(k8s, namespace, "reader", ["get"], None)}  # fmt: skip
        researcher = {"Authorization": "Bearer "
                      + await _account(k8s, namespace, "researcher", [], None)}  # fmt: skip
        token_file = tmp_path / "agent-token"
        token_file.write_text(agent_token)
        for node, ip in ((live, "127.0.0.1"), (dead, "127.0.0.2")):
            await _set_pod_ip(k8s, namespace, node, ip)

        boot = tmp_path / "boot"
        boot.write_text("b\n")
        cfg = settings.Settings(
            node_name=live, boot_id_path=boot, state_path=tmp_path / "state.json",
            kmsg_path=None, dcgm_enabled=False, gauge_interval_s=0.05, listen_host="127.0.0.1",
            pci_devices_path=None,
        )  # fmt: skip
        # The agent's reviews go to the API server on a client of their own (admin here; the
        # chart's agent is bound to system:auth-delegator).
        monkeypatch.setenv("KUBECONFIG", str(dev_cluster.kubeconfig))
        authn = await k8sauth.KubernetesAuthenticator.in_cluster(controller_audience=AGENT_AUDIENCE)
        stack.push_async_callback(authn.close)
        server = test_utils.TestServer(
            agent_app.make_app(cfg, authenticator=authn), host="127.0.0.1"
        )
        async with test_utils.TestClient(server):
            port = server.port
            assert port is not None
            async with kit.running(
                dev_cluster, namespace, agents, agent_port=port,
                agent_token_file=str(token_file),
            ) as (ctl, http, _loops):  # fmt: skip
                base = f"{ctl.url}/v1/nodes"

                async def gpus_of_live() -> dict[str, Any]:
                    async with http.get(f"{base}/{live}/gpus", headers=on_call) as resp:
                        body: dict[str, Any] = await resp.json()
                        assert resp.status == 200, body
                        assert body["gpus"], body
                        return body

                doc = await support.eventually(gpus_of_live, what="the agent's GPU view")
                # The controller's token passed the agent's own review: pod names are shown.
                assert (doc["node"], doc["podAttribution"]["podsShown"]) == (live, True)

                async with http.get(f"{base}/{live}/gpus", headers=reader) as resp:
                    body = await resp.json()
                    # May read nodes, not patch them: the agent is asked as anyone is.
                    assert (resp.status, body["podAttribution"]["podsShown"]) == (200, False)

                answers = {}
                for label, method, path, headers in (
                    ("researcher gpus", "GET", f"{base}/{live}/gpus", researcher),
                    ("researcher diag", "POST", f"{base}/{live}/diag", researcher),
                    ("researcher release", "POST", f"{base}/{live}/agent/release", researcher),
                    ("reader release", "POST", f"{base}/{live}/agent/release", reader),
                    ("unknown node", "GET", f"{base}/no-such-node-{namespace}/gpus", on_call),
                    ("bad name", "GET", f"{base}/Bad_Name/gpus", on_call),
                    ("bad level", "POST", f"{base}/{live}/diag?level=9", on_call),
                    ("bad gpu", "POST", f"{base}/{live}/agent/release?gpu=..%2Fx", on_call),
                    ("agent not listening", "GET", f"{base}/{dead}/gpus", on_call),
                    ("no agent reported", "GET", f"{base}/{silent}/gpus", on_call),
                    ("nothing latched", "POST", f"{base}/{live}/agent/release", on_call),
                    ("no DCGM", "POST", f"{base}/{live}/diag", on_call),
                ):
                    async with http.request(method, path, headers=headers) as resp:
                        body = await resp.json()
                        answers[label] = (resp.status, body["error"]["code"])
                expected = {
                    "researcher gpus": (403, "Forbidden"),
                    "researcher diag": (403, "Forbidden"),
                    "researcher release": (403, "Forbidden"),
                    "reader release": (403, "Forbidden"),
                    "unknown node": (404, "NotFound"),
                    "bad name": (400, "Invalid"),
                    "bad level": (400, "Invalid"),
                    "bad gpu": (400, "Invalid"),
                    "agent not listening": (502, "AgentUnreachable"),
                    "no agent reported": (502, "AgentUnreachable"),
                    # The agent's own verdicts, made for the controller's token: relayed.
                    "nothing latched": (404, "NothingReleased"),
                    "no DCGM": (503, "DcgmUnavailable"),
                }
                assert expected == answers

                # Without its agent token the controller is refused by the agent: a 502 that
                # says so, never the caller's 401.
                token_file.write_text("")
                async with http.post(f"{base}/{live}/agent/release", headers=on_call) as resp:
                    body = await resp.json()
                    assert (resp.status, body["error"]["code"]) == (
                        502, "AgentRefusedController"), body  # fmt: skip
