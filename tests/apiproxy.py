"""A counting proxy in front of the dev cluster's API server, for load tests that assert
counts: how many requests a controller made, of which kind, and when they stopped.

It terminates TLS with the dev cluster's serving certificate (issued for 127.0.0.1 by the
dev CA, which the controller's kubeconfig trusts), counts each request by method and path,
and relays it to the real API server as the dev cluster's admin, streaming the answer back
(watches and followed logs included). The controller under test gets `kubeconfig`, which
points at the proxy.
"""

from __future__ import annotations

import asyncio
import collections
import pathlib
import ssl
from collections.abc import Callable

import aiohttp
import yaml
from aiohttp import web

from devcluster import cluster

HOP_BY_HOP = frozenset({
    "host", "authorization", "connection", "keep-alive", "transfer-encoding", "te", "trailer",
    "upgrade", "proxy-authorization", "proxy-authenticate", "content-length",
})  # fmt: skip


class ApiProxy:
    """Count and relay every request a controller makes to the API server."""

    def __init__(self, dev: cluster.Cluster, state: pathlib.Path) -> None:
        self._dev = dev
        self._state = state
        self.counts: collections.Counter[tuple[str, str]] = collections.Counter()
        self._runner: web.AppRunner | None = None
        self._http: aiohttp.ClientSession | None = None
        self.kubeconfig = state / "kubeconfig-via-proxy"

    def count(self, method: str, path: str) -> int:
        """Requests seen with this method and path (query excluded)."""
        return self.counts[(method, path)]

    async def start(self) -> ApiProxy:
        pki = self._dev.pki
        upstream = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        upstream.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        self._http = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=upstream, limit=0),
            timeout=aiohttp.ClientTimeout(total=None),
            auto_decompress=False,
        )
        app = web.Application(client_max_size=16 << 20)
        app.router.add_route("*", "/{tail:.*}", self._relay)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        serving = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        serving.load_cert_chain(str(pki / "serving.crt"), str(pki / "serving.key"))
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=serving)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "proxy",
            "clusters": [{"name": "proxy", "cluster": {
                "server": f"https://127.0.0.1:{port}",
                "certificate-authority": str(pki / "ca.crt")}}],
            "users": [{"name": "proxy", "user": {"token": "the-proxy-authenticates-upstream"}}],
            "contexts": [{"name": "proxy", "context": {"cluster": "proxy", "user": "proxy"}}],
        }))  # fmt: skip
        return self

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._http is not None:
            await self._http.close()

    async def _relay(self, request: web.Request) -> web.StreamResponse:
        assert self._http is not None
        self.counts[(request.method, request.path)] += 1
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        body = await request.read()
        async with self._http.request(
            request.method, self._dev.server + request.path_qs, headers=headers,
            data=body or None, allow_redirects=False,
        ) as upstream:  # fmt: skip
            resp = web.StreamResponse(status=upstream.status)
            for k, v in upstream.headers.items():
                if k.lower() not in HOP_BY_HOP:
                    resp.headers[k] = v
            await resp.prepare(request)
            async for chunk in upstream.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
            return resp


class HoldingProxy(ApiProxy):
    """The counting proxy, holding the requests `held` picks (method, path) while `released`
    is clear: what is in flight is then what the controller's limits allow."""

    def __init__(
        self, dev: cluster.Cluster, state: pathlib.Path, held: Callable[[str, str], bool]
    ) -> None:
        super().__init__(dev, state)
        self._held = held
        self.released = asyncio.Event()
        self.released.set()

    async def _relay(self, request: web.Request) -> web.StreamResponse:
        if self._held(request.method, request.path):
            await self.released.wait()
        return await super()._relay(request)
