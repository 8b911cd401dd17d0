"""`taugrid-controller`: run the controller with settings from the environment."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import signal
import ssl
import sys
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import pydantic
from aiohttp import web

from controller import app as controller_app
from controller import certs, serving
from controller import settings as settings_mod
from controller.fleet import api as fleet_api
from controller.settings import ControllerSettings
from shared import logs


def _background(
    work: Callable[[], Coroutine[Any, Any, None]],
) -> Callable[[web.Application], AsyncIterator[None]]:
    """A cleanup context that runs `work()` while the app runs (started there: an app that
    never starts leaves no coroutine never awaited)."""

    async def ctx(_: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(work())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    return ctx


async def _freeze_once_synced(app: web.Application) -> None:
    """Once the node cache and the install namespace's pods are in, what they hold lives
    about as long as the code does: freeze it too (`gc.freeze`, as `main` does with what
    importing made). A full collection walks every tracked object, and at 10,000 nodes
    these caches are a few hundred thousand of them. What they replace later is freed as
    ever (cached JSON holds no cycles), and what is new is tracked as ever."""
    fleet = app[fleet_api.FLEET]
    await fleet.cache.synced.wait()
    await fleet.agents.pods.synced.wait()
    _freeze()


def _freeze() -> None:
    """Move every object alive now out of the collector's full collections (garbage first)."""
    gc.collect()
    gc.freeze()


def make_runner(
    app: web.Application, *, shutdown_timeout: float = 10.0, idle_timeout_s: float = 10.0
) -> web.AppRunner:
    """The runner every controller serves through (tests too). `handler_cancellation`: a
    client that hangs up cancels its handler, and with it the upstream calls and polls it
    was making (review H2; aiohttp leaves handlers running by default). `idle_timeout_s`
    is aiohttp's keep-alive timer, which closes a connection whose request head has not
    fully arrived that long after it opened or after its last response (security review 3,
    finding 14: aiohttp's default is an hour)."""
    return web.AppRunner(
        app, handle_signals=False, access_log=None, shutdown_timeout=shutdown_timeout,
        handler_cancellation=True, keepalive_timeout=idle_timeout_s,
    )  # fmt: skip


class Site(web.TCPSite):
    """A TCP site whose TLS handshakes must end within `handshake_timeout_s` (aiohttp's
    TCPSite leaves asyncio's 60 s): the request-head timer starts only after it."""

    def __init__(
        self,
        runner: web.AppRunner,
        host: str,
        port: int,
        *,
        ssl_context: ssl.SSLContext | None,
        handshake_timeout_s: float,
    ) -> None:
        super().__init__(runner, host, port, ssl_context=ssl_context)
        self._handshake_timeout_s = handshake_timeout_s

    async def start(self) -> None:
        if self._ssl_context is None:
            await super().start()
            return
        await web.BaseSite.start(self)
        server = self._runner.server
        assert server is not None
        self._server = await asyncio.get_running_loop().create_server(
            server, self._host, self._port, ssl=self._ssl_context, backlog=self._backlog,
            ssl_handshake_timeout=self._handshake_timeout_s,
        )  # fmt: skip
        self._bound_port = self._server.sockets[0].getsockname()[1]


async def serve(
    app: web.Application,
    settings: ControllerSettings,
    stop: asyncio.Event,
    *,
    ssl_context: ssl.SSLContext | None = None,
) -> None:
    """Serve `app` until `stop` is set; then readiness goes false, and only after
    `shutdown_grace_s` do the listeners close and the cleanup contexts stop the loops."""
    runner = make_runner(app, idle_timeout_s=settings.http_idle_timeout_s)
    await runner.setup()
    site = Site(
        runner, settings.host, settings.port, ssl_context=ssl_context,
        handshake_timeout_s=settings.tls_handshake_timeout_s,
    )  # fmt: skip
    await site.start()
    try:
        await stop.wait()
        if serving.SERVING in app:
            app[serving.SERVING].ready = False
        await asyncio.sleep(settings.shutdown_grace_s)
    finally:
        await runner.cleanup()


async def _run(
    app: web.Application, settings: ControllerSettings, context: ssl.SSLContext | None
) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await serve(app, settings, stop, ssl_context=context)


def main() -> int:
    """Start the controller; exit 2 on bad settings."""
    try:
        settings = ControllerSettings()
    except pydantic.ValidationError as err:
        print(f"invalid settings:\n{err}", file=sys.stderr)
        return 2
    logs.setup("controller", level=settings.log_level, json=settings.log_json)
    context: ssl.SSLContext | None = None
    app = controller_app.make_app(settings)
    if settings.tls_cert_file:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(settings.tls_cert_file, settings.tls_key_file or None)
        reloader = certs.Reloader(context, settings.tls_cert_file, settings.tls_key_file)
        app.cleanup_ctx.append(
            _background(functools.partial(reloader.run, settings.tls_reload_interval_s))
        )
    elif not settings_mod.is_loopback(settings.host) and not settings.allow_insecure_http:
        print(
            "refusing plain HTTP on a non-loopback address: set TAUGRID_CONTROLLER_TLS_CERT_FILE "
            "and _TLS_KEY_FILE, or TAUGRID_CONTROLLER_ALLOW_INSECURE_HTTP=true behind a TLS proxy",
            file=sys.stderr,
        )
        return 2
    app.cleanup_ctx.append(_background(functools.partial(_freeze_once_synced, app)))
    # What importing and building the controller made lives as long as it does: ~100,000
    # objects the collector would otherwise walk in every full collection (~50 ms each on
    # the project's machines), a pause every request waiting behind it shares. Only here,
    # in the process's own entry point: a test process's garbage is not to be frozen.
    _freeze()
    asyncio.run(_run(app, settings, context))
    return 0


if __name__ == "__main__":
    sys.exit(main())
