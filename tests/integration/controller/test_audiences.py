"""Token audiences on the real control plane (DESIGN.md section 10, review finding M9).

The dev cluster's API server lists only its own audience in `--api-audiences`, as a real
cluster does, so a token minted for the API server (a default `kubectl create token`) carries
no `taugrid` audience and is refused for heartbeats; which audiences a person's token must
carry is the `user_audiences` setting.
"""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import AsyncIterator

import aiohttp
import pytest
import pytest_asyncio
from kubernetes_asyncio import client

from devcluster import cluster
from tests import controllerkit as kit
from tests import runskit

pytestmark = pytest.mark.cluster


@pytest_asyncio.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def _token(api: client.ApiClient, namespace: str, sa: str, audience: str | None) -> str:
    """A token of ServiceAccount `sa` for `audience` (None: the API server's own)."""
    spec: dict[str, object] = {"expirationSeconds": 3600}
    if audience is not None:
        spec["audiences"] = [audience]
    tr = await client.CoreV1Api(api).create_namespaced_service_account_token(
        sa, namespace, {"spec": spec}
    )
    return str(tr.status.token)


async def test_an_agent_token_minted_for_the_api_server_is_refused_for_heartbeats(
    k8s: client.ApiClient,
    dev_cluster: cluster.Cluster,
    bin_dir: pathlib.Path,
    namespace: str,
    http: aiohttp.ClientSession,
) -> None:
    """The same agent pod's token is accepted with audience `taugrid` and refused (401) when
    it was minted for the API server: the dev cluster no longer adds `taugrid` to every token."""
    (node,) = await asyncio.to_thread(
        dev_cluster.ensure_nodes, bin_dir, 1, prefix=f"a-{namespace}"[:50].rstrip("-") + "-",
        labels={"taugrid.dev/test-fleet": namespace},
    )  # fmt: skip
    ctl = await kit.start_controller(dev_cluster.kubeconfig, namespace)
    try:
        await kit.wait_leader(ctl)
        api_audience = kit.Agent(node, await kit.agent_token(k8s, namespace, node, audience=None))
        taugrid = kit.Agent(node, await kit.agent_token(k8s, namespace, node))
        expected = (401, 202)
        actual = (await api_audience.send(http, ctl.url), await taugrid.send(http, ctl.url))
        assert expected == actual
    finally:
        await ctl.stop()
        await client.CoreV1Api(k8s).delete_node(node)


@pytest.mark.parametrize(
    ("user_audiences", "expected"),
    [
        pytest.param((), {None: 200, "taugrid": 401, "taugrid-api": 401},
                     id="by default only the API server's own audience is accepted"),
        pytest.param(("taugrid-api",), {None: 401, "taugrid": 401, "taugrid-api": 200},
                     id="with a dedicated audience only tokens for it are accepted"),
    ],
)  # fmt: skip
async def test_a_persons_token_must_carry_the_configured_audience(
    k8s: client.ApiClient,
    dev_cluster: cluster.Cluster,
    namespace: str,
    user_audiences: tuple[str, ...],
    expected: dict[str | None, int],
) -> None:
    """`user_audiences` decides which tokens of the same researcher list runs (200) and
    which are refused (401); the agents' audience `taugrid` is never a person's."""
    await runskit.make_token(k8s, namespace, "researcher", runskit.RESEARCHER_RULES)
    ctl = await kit.start_controller(
        dev_cluster.kubeconfig, namespace, user_audiences=user_audiences
    )
    try:
        actual = {}
        async with aiohttp.ClientSession() as http:
            for audience in expected:
                token = await _token(k8s, namespace, "researcher", audience)
                async with http.get(
                    f"{ctl.url}/v1/runs?namespace={namespace}",
                    headers={"Authorization": f"Bearer {token}"},
                ) as resp:
                    actual[audience] = resp.status
        assert expected == actual
    finally:
        await ctl.stop()
