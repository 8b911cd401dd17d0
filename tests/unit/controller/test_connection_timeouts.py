"""Connections that never finish a request head are closed (security review 3, finding 14).

The controller's `serve` runs on a real socket with short configured timeouts: a client
that sends nothing, one that trickles header bytes, and one that opens TLS and never
handshakes each see the server hang up; a normal request is answered, and a request whose
head is complete but whose body is slow to arrive is not cut by the head timer. Before the
fix aiohttp's keep-alive timer was an hour and all of them stayed open.
"""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import ssl
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from controller import main as controller_main
from controller.settings import ControllerSettings
from devcluster import pki
from tests import controllerkit as kit
from tests import support

TIMEOUT_S = 0.5
DEADLINE_S = 30.0
"""Generous: the server must hang up long before this; the test never measures the time."""


async def _echo(request: web.Request) -> web.Response:
    return web.Response(text=f"got {len(await request.read())} bytes")


@contextlib.asynccontextmanager
async def _serving(context: ssl.SSLContext | None) -> AsyncIterator[int]:
    port = kit.free_port()
    settings = ControllerSettings(
        host="127.0.0.1", port=port, shutdown_grace_s=0,
        http_idle_timeout_s=TIMEOUT_S, tls_handshake_timeout_s=TIMEOUT_S,
    )  # fmt: skip
    app = web.Application()
    app.router.add_post("/echo", _echo)
    app.router.add_get("/echo", _echo)
    stop = asyncio.Event()
    task = asyncio.create_task(controller_main.serve(app, settings, stop, ssl_context=context))
    for _ in range(200):
        with contextlib.suppress(OSError):
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            break
        await asyncio.sleep(0.05)
    try:
        yield port
    finally:
        stop.set()
        await task


async def test_silent_and_trickling_connections_are_closed_and_requests_still_served() -> None:
    async with _serving(None) as port:
        closed = await support.silent_and_trickling_closed(
            port, "/echo", TIMEOUT_S / 10, DEADLINE_S
        )
        assert closed == (True, True), "(sent nothing, trickled its head) stayed open"

        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = await reader.read()
        assert answer.startswith(b"HTTP/1.1 200"), answer
        writer.close()


async def test_a_complete_head_with_a_slow_body_is_not_cut() -> None:
    """The timer is for the head: a body that takes several timeouts to arrive is read."""
    async with _serving(None) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        chunks = 6
        writer.write(
            b"POST /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            + f"Content-Length: {chunks}\r\n\r\n".encode()
        )
        for _ in range(chunks):
            await asyncio.sleep(TIMEOUT_S)
            writer.write(b"x")
        answer = await reader.read()
        assert answer.startswith(b"HTTP/1.1 200"), answer
        assert answer.endswith(b"got 6 bytes"), answer
        writer.close()


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[ssl.SSLContext, pathlib.Path]:
    d = pki.ensure(tmp_path_factory.mktemp("pki"))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(d / "serving.crt", d / "serving.key")
    return context, d / "ca.crt"


async def test_a_tls_connection_that_never_handshakes_is_closed(
    tls: tuple[ssl.SSLContext, pathlib.Path],
) -> None:
    context, ca = tls
    async with _serving(context) as port:
        silent_r, silent_w = await asyncio.open_connection("127.0.0.1", port)
        assert await support.hung_up(silent_r, DEADLINE_S), (
            "a TLS connection that never handshook stayed open"
        )
        silent_w.close()

        client = ssl.create_default_context(cafile=ca)
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client)
        writer.write(b"GET /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = await reader.read()
        assert answer.startswith(b"HTTP/1.1 200"), answer
        writer.close()
        silent_r, silent_w = await asyncio.open_connection("127.0.0.1", port, ssl=client)
        assert await support.hung_up(silent_r, DEADLINE_S), (
            "a handshaken TLS connection sending nothing stayed"
        )
        silent_w.close()
