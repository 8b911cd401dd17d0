"""The leader-only Service on the dev cluster, reached as kube-proxy would reach it.

Replicas in tests run on the host, standing in for the chart's controller pods: each has a
Pod object (KWOK runs it) that its `pod_name` names and its peer token is bound to, so the
leader labels its own pod as in production. The Service, its selector and its EndpointSlices
are the real API server's and the real endpointslice controller's. What the dev cluster lacks
is kube-proxy, so `ServiceProxy` stands in for it: a TCP relay on loopback that, for each
connection, reads the Service's EndpointSlices and connects to the replica whose pod is the
ready endpoint (pod name to loopback port: the test started both). Like kube-proxy it relays
bytes and knows nothing of HTTP or TLS; it keeps what it relayed from client to server, so a
test can show that a caller's token never crossed, and counts connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
from typing import Any

from kubernetes_asyncio import client

SERVICE = "leader"
SERVICE_ACCOUNT = "taugrid-controller"
APP = {"app.kubernetes.io/component": "controller"}
LEADER_LABEL = "taugrid.dev/leader"
PEER_AUDIENCE = "taugrid-peer"


async def replica_pod(api: client.ApiClient, namespace: str, name: str, node: str) -> Any:
    """The Pod a replica stands in for, on a KWOK node, run as the replicas' ServiceAccount."""
    core = client.CoreV1Api(api)
    with contextlib.suppress(client.ApiException):  # 409: made for an earlier replica
        await core.create_namespaced_service_account(
            namespace, {"metadata": {"name": SERVICE_ACCOUNT}}
        )
    return await core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": name, "labels": dict(APP)},
            "spec": {
                "nodeName": node,
                "serviceAccountName": SERVICE_ACCOUNT,
                "tolerations": [{"operator": "Exists"}],
                "containers": [{"name": "controller",
                                "image": "taugrid/controller@sha256:" + "4" * 64}],
            },
        },
    )  # fmt: skip


async def leader_service(api: client.ApiClient, namespace: str) -> None:
    """The chart's leader-only Service: the controller pods that carry the leader label."""
    await client.CoreV1Api(api).create_namespaced_service(
        namespace,
        {
            "metadata": {"name": SERVICE},
            "spec": {
                "selector": {**APP, LEADER_LABEL: "true"},
                "ports": [{"name": "api", "port": 8080, "targetPort": 8080}],
            },
        },
    )


async def peer_token(
    api: client.ApiClient, namespace: str, pod: Any, path: pathlib.Path, *,
    service_account: str = SERVICE_ACCOUNT, audience: str = PEER_AUDIENCE,
) -> str:  # fmt: skip
    """A token of the replicas' ServiceAccount for the peer audience, bound to `pod`, as the
    chart's projected volume holds it; written to `path` and returned."""
    tr = await client.CoreV1Api(api).create_namespaced_service_account_token(
        service_account,
        namespace,
        {
            "spec": {
                "audiences": [audience],
                "expirationSeconds": 3600,
                "boundObjectRef": {"apiVersion": "v1", "kind": "Pod",
                                   "name": pod.metadata.name, "uid": pod.metadata.uid},
            }
        },
    )  # fmt: skip
    token = str(tr.status.token)
    await asyncio.to_thread(path.write_text, token)
    return token


async def endpoints(api: client.ApiClient, namespace: str) -> list[str]:
    """The pods the leader-only Service's EndpointSlices name as ready endpoints."""
    slices = await client.DiscoveryV1Api(api).list_namespaced_endpoint_slice(
        namespace, label_selector=f"kubernetes.io/service-name={SERVICE}"
    )
    return sorted(
        ep.target_ref.name
        for s in slices.items
        for ep in s.endpoints or []
        if ep.target_ref is not None and (ep.conditions is None or ep.conditions.ready is not False)
    )


class ServiceProxy:
    """kube-proxy for the leader-only Service: a loopback TCP relay to its endpoint."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self._api = api
        self._namespace = namespace
        self.backends: dict[str, tuple[str, int]] = {}
        """Pod name → the loopback address of the replica standing in for it."""
        self.relayed = bytearray()
        """Every byte clients sent through the relay."""
        self.connections = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        """What a replica's `leader_url` is set to (plain http: the replicas' own scheme)."""
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    def https_url(self) -> str:
        """The same relay for replicas serving HTTPS (TLS passes through, end to end)."""
        return self.url.replace("http://", "https://", 1)

    async def start(self) -> ServiceProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await t

    async def cut(self) -> dict[str, tuple[str, int]]:
        """Cut every client off: no backend for new connections, and the relayed ones closed
        (a client's kept-alive connection would still reach the leader otherwise). Returns
        the backends, for `backends.update` to restore."""
        backends, self.backends = self.backends, {}
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await t
        return backends

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        upstream = None
        for pod in await endpoints(self._api, self._namespace):
            if pod not in self.backends:
                continue
            try:
                upstream = await asyncio.open_connection(*self.backends[pod])
                break
            except OSError:
                # A killed replica's pod keeps its label (KWOK runs no readiness probe to take
                # it out of the Service, as a kubelet would): try the next endpoint.
                continue
        if upstream is None:  # no endpoint: kube-proxy rejects the connection
            writer.close()
            return
        up_reader, up_writer = upstream
        pumps = [
            asyncio.create_task(self._pump(reader, up_writer, record=True)),
            asyncio.create_task(self._pump(up_reader, writer, record=False)),
        ]
        self._tasks.update(pumps)
        await asyncio.gather(*pumps, return_exceptions=True)
        self._tasks.difference_update(pumps)

    async def _pump(
        self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, *, record: bool
    ) -> None:
        try:
            while chunk := await src.read(65536):
                if record:
                    self.relayed.extend(chunk)
                dst.write(chunk)
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            dst.close()
