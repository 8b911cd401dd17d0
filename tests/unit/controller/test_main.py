"""Graceful shutdown: readiness goes false first, and only then do the listeners close."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
import types
import typing

import aiohttp
from aiohttp import web

from controller import auth, leading, main, metrics, pages, serving
from controller.fleet import api as fleet_api
from controller.settings import ControllerSettings


class _NoLease:
    """A Lease store nobody ever asks (the elector does not run here)."""

    async def read(self) -> leading.LeaseRecord | None:
        return None

    async def write(
        self, record: leading.LeaseRecord, *, create: bool
    ) -> leading.LeaseRecord | None:
        return None


class _NoReviews:
    async def review_token(self, token: str, audiences: tuple[str, ...]) -> auth.Identity | None:
        return None

    async def review_access(self, identity: auth.Identity, access: auth.Access) -> bool:
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_readiness_turns_false_while_the_listener_still_answers() -> None:
    """On stop, /readyz answers 503 from a replica that still listens (so the endpoints
    controller takes it out of its Services before any connection is refused)."""
    settings = ControllerSettings(host="127.0.0.1", port=_free_port(), shutdown_grace_s=60.0)
    app = web.Application()
    pages.add_routes(app)
    async with aiohttp.ClientSession() as http:
        elector = leading.Elector(
            _NoLease(), "me", "", lease_duration_s=15, renew_deadline_s=10, retry_period_s=2
        )
        st = serving.ServingState(
            settings, metrics.make_metrics(), auth.Authenticator(_NoReviews()), elector, http, ""
        )
        st.ready = True
        app[serving.SERVING] = st
        stop = asyncio.Event()
        served = asyncio.create_task(main.serve(app, settings, stop))
        url = f"http://127.0.0.1:{settings.port}/readyz"
        seen: list[int] = []
        try:
            for _ in range(200):
                try:
                    async with http.get(url) as resp:
                        seen.append(resp.status)
                except aiohttp.ClientConnectionError:
                    await asyncio.sleep(0.05)
                    continue
                if resp.status == 200:
                    stop.set()
                if resp.status == 503:
                    break
                await asyncio.sleep(0.05)
        finally:
            served.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await served
    expected = (200, 503)
    assert expected == (seen[0], seen[-1]), seen


async def test_the_caches_are_frozen_out_of_the_collectors_way_once_both_have_synced() -> None:
    """`gc.freeze` runs once the node cache and the install namespace's pods are in, and not
    before (what is frozen then is never walked by a full collection again)."""
    nodes, pods = asyncio.Event(), asyncio.Event()
    app = web.Application()
    app[fleet_api.FLEET] = typing.cast("fleet_api.FleetContext", types.SimpleNamespace(
        cache=types.SimpleNamespace(synced=nodes),
        agents=types.SimpleNamespace(pods=types.SimpleNamespace(synced=pods)),
    ))  # fmt: skip
    gc.unfreeze()
    task = asyncio.create_task(main._freeze_once_synced(app))
    try:
        nodes.set()
        await asyncio.sleep(0.05)
        frozen_before = gc.get_freeze_count()
        pods.set()
        await asyncio.wait_for(task, 10)
        assert (frozen_before, gc.get_freeze_count() > 0) == (0, True)
    finally:
        task.cancel()
        gc.unfreeze()  # the test process's own objects go back to the collector
