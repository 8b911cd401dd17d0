"""Every call to the API server has a timeout, even against one that never answers."""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
from collections.abc import AsyncIterator

import aiohttp
import pytest
import pytest_asyncio
import yaml
from kubernetes_asyncio import client

from controller.kube import _api, leases
from controller.kube import client as kube_client
from controller.kube import nodes as kube_nodes


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        pytest.param([("labelSelector", "a=b")], aiohttp.ClientTimeout(total=10.0),
                     id="a plain call gets the total timeout"),
        pytest.param([("watch", True), ("timeoutSeconds", 300)],
                     aiohttp.ClientTimeout(connect=10.0, sock_connect=10.0, sock_read=330.0),
                     id="a watch may be silent for its server timeout and a margin"),
        pytest.param([("follow", True), ("container", "main")],
                     aiohttp.ClientTimeout(connect=10.0, sock_connect=10.0),
                     id="a followed log is bounded only in connecting"),
        pytest.param(None, aiohttp.ClientTimeout(total=10.0), id="no query is a plain call"),
    ],
)  # fmt: skip
def test_each_kind_of_request_gets_its_timeout(
    query: list[tuple[str, object]] | None, expected: aiohttp.ClientTimeout
) -> None:
    """The timeout follows from the request's query (kubernetes_asyncio's tuples)."""
    assert expected == kube_client.timeout_for(query, 10.0)


@pytest_asyncio.fixture
async def silent_server(tmp_path: pathlib.Path) -> AsyncIterator[pathlib.Path]:
    """A kubeconfig for an API server on loopback that accepts connections and never
    answers; yields the kubeconfig."""
    held: list[asyncio.StreamWriter] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        del reader
        held.append(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    config = tmp_path / "kubeconfig"
    config.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }))  # fmt: skip
    try:
        yield config
    finally:
        for w in held:
            w.close()
        server.close()
        await server.wait_closed()


async def test_a_call_to_an_api_server_that_never_answers_times_out(
    silent_server: pathlib.Path,
) -> None:
    """A call without a timeout of its own gives up after the client's; a Lease read after
    the store's (the renew deadline's share)."""
    api = await kube_client.make_client(str(silent_server), timeout_s=0.2)
    try:
        store = leases.KubeLeaseStore(api, "ns", "lease", timeout_s=0.2)
        outcomes = []
        for call in (client.CoreV1Api(api).list_node, store.read):
            try:
                await call()
                outcomes.append("answered")
            except TimeoutError:
                outcomes.append("timed out")
    finally:
        await api.close()
    expected = ["timed out", "timed out"]
    assert expected == outcomes


async def test_an_event_never_holds_up_the_action_it_records(
    silent_server: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Against an API server that never answers, `emit` returns at once; past the bound of
    queued Events more are dropped and counted; a flush gives up on the rest in its time."""
    monkeypatch.setattr(_api, "MAX_PENDING_EVENTS", 2)
    api = await kube_client.make_client(str(silent_server), timeout_s=30)
    try:
        recorder = _api.EventRecorder(api, controller="c", instance="i")
        regarding = {"apiVersion": "v1", "kind": "Node", "name": "gpu-node-0"}
        async with asyncio.timeout(5):  # generous: an emit that waited would take 30 s
            for _ in range(3):
                await recorder.emit("default", regarding, "Quarantine", "note", warning=True)
        assert recorder.dropped == 1
        await recorder.flush(0.05)
        assert recorder.dropped == 1
    finally:
        await api.close()


async def test_a_heartbeat_never_waits_for_the_agent_pod_list(
    silent_server: pathlib.Path,
) -> None:
    """While the watch's first LIST of the install namespace's pods hangs, a heartbeat's
    pod is answered at once: no IP known, not alive (so its token gets the short TTL)."""
    api = await kube_client.make_client(str(silent_server), timeout_s=30)
    try:
        pods = kube_nodes.AgentPods(api, "taugrid")
        watch = asyncio.create_task(pods.run())
        await asyncio.sleep(0.05)  # the watch is in its LIST
        answers = (pods.ip_of("uid-a"), pods.alive("uid-a"), pods.pods.synced.is_set())
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch
    finally:
        await api.close()
    assert answers == (None, False, False)
