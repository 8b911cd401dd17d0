"""Build the kubernetes_asyncio clients from a kubeconfig or the in-cluster ServiceAccount.

Every call to the API server has a timeout (review finding H2): kubernetes_asyncio's default
is `aiohttp.ClientTimeout()`, no timeout at all, not even for waiting on a pooled connection.
`TimedApiClient` gives each request one unless the call names its own: a plain call gets
`timeout_s` in total; a watch gets its server-side `timeoutSeconds` plus a margin between
bytes (bookmarks keep a healthy watch talking); a followed log, which may be quiet for hours,
gets a bound only on connecting (including the wait for a pooled connection). The
controller uses several clients, each with its own pool, so that one kind of traffic can
never take another's connections (app.py). They share one `ratelimit.Limiter`: every write
we send waits for the replica's API write budget, served by priority (lease first).
"""

from __future__ import annotations

import pathlib
import time
import urllib.parse
from collections.abc import Iterable
from typing import Any

import aiohttp
from kubernetes_asyncio import client, config

from controller import budget
from controller.kube import ratelimit
from shared import kubetoken

WATCH_MARGIN_S = 30.0
"""How much longer than its `timeoutSeconds` a watch may stay silent before it is dropped."""


def timeout_for(query: Iterable[tuple[str, Any]] | None, default_s: float) -> aiohttp.ClientTimeout:
    """The timeout of one request to the API server, from its query parameters."""
    params = {str(k): v for k, v in query or ()}

    def on(name: str) -> bool:
        return str(params.get(name, "")).lower() == "true"

    if on("watch"):
        server_s = float(params.get("timeoutSeconds") or 0) or default_s
        return aiohttp.ClientTimeout(sock_connect=default_s, connect=default_s,
                                     sock_read=server_s + WATCH_MARGIN_S)  # fmt: skip
    if on("follow"):
        return aiohttp.ClientTimeout(sock_connect=default_s, connect=default_s)
    return aiohttp.ClientTimeout(total=default_s)


class TimedApiClient(client.ApiClient):  # type: ignore[misc]  # an untyped base
    """An ApiClient whose requests all have a timeout (`timeout_for`) unless given one, and
    whose writes wait for `limiter`'s budget when there is one."""

    def __init__(
        self,
        configuration: client.Configuration,
        *,
        timeout_s: float,
        limiter: ratelimit.Limiter | None = None,
    ) -> None:
        super().__init__(configuration=configuration)
        self.timeout_s = timeout_s
        self.limiter = limiter

    async def request(  # noqa: PLR0917  (kubernetes_asyncio's own signature)
        self,
        method: str,
        url: str,
        query_params: Any = None,
        headers: Any = None,
        post_params: Any = None,
        body: Any = None,
        _preload_content: bool = True,
        _request_timeout: Any = None,
    ) -> Any:
        """Send one request with its timeout (kubernetes_asyncio calls this for every call)."""
        if self.limiter is not None:
            cls = ratelimit.classify(method, urllib.parse.urlsplit(url).path)
            if cls is not None:
                _request_timeout = await _spend(self.limiter, cls, _request_timeout)
        if _request_timeout is None:
            _request_timeout = timeout_for(query_params, self.timeout_s)
        return await super().request(method, url, query_params, headers, post_params, body,
                                     _preload_content, _request_timeout)  # fmt: skip


async def _spend(limiter: ratelimit.Limiter, cls: budget.WriteClass, request_timeout: Any) -> Any:
    """Wait for the budget of a write of `cls`. A caller that gave its own deadline in seconds
    (the Lease's, within the renew deadline) has the wait counted inside it: the request gets
    what is left, and a wait past it fails as a timed-out call would (security review 3,
    finding 1: the wait was outside the Lease's deadline). Returns the request's timeout."""
    if not isinstance(request_timeout, int | float) or isinstance(request_timeout, bool):
        await limiter.acquire(cls)
        return request_timeout
    started = time.monotonic()
    await limiter.acquire(cls, max_wait_s=float(request_timeout))
    return remaining_timeout(float(request_timeout), time.monotonic() - started)


def remaining_timeout(deadline_s: float, waited_s: float) -> float:
    """What is left of a call's deadline for the request after it waited `waited_s` for the
    budget (never quite 0: aiohttp reads 0 as no timeout)."""
    return max(deadline_s - waited_s, MIN_REQUEST_S)


MIN_REQUEST_S = 0.001
"""The least timeout a request is sent with."""


async def make_client(
    kubeconfig: str = "",
    *,
    pool: int = 64,
    timeout_s: float = 10.0,
    limiter: ratelimit.Limiter | None = None,
) -> client.ApiClient:
    """Return an ApiClient with a pool of `pool` connections and `timeout_s` on every call,
    its writes spending `limiter`'s budget."""
    cfg = client.Configuration()
    if kubeconfig:
        await config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        rotated = kubetoken.token_file(pathlib.Path(kubeconfig))
        if rotated is not None:  # a token renewed on disk before it expires
            cfg.refresh_api_key_hook = kubetoken.refresh_hook(rotated)
    else:
        config.load_incluster_config(client_configuration=cfg)
    cfg.connection_pool_maxsize = pool
    return TimedApiClient(cfg, timeout_s=timeout_s, limiter=limiter)
