"""`taugrid-controller`: run the controller with settings from the environment."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import ssl
import sys
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import pydantic
from aiohttp import web

from controller import app as controller_app
from controller import certs
from controller.settings import ControllerSettings
from shared import logs


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _background(
    work: Coroutine[Any, Any, None],
) -> Callable[[web.Application], AsyncIterator[None]]:
    """A cleanup context that runs `work` while the app runs."""

    async def ctx(_: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(work)
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    return ctx


def main() -> int:
    """Start the controller; exit 2 on bad settings."""
    try:
        settings = ControllerSettings()
    except pydantic.ValidationError as err:
        print(f"invalid settings:\n{err}", file=sys.stderr)
        return 2
    logs.setup("controller")
    context: ssl.SSLContext | None = None
    app = controller_app.make_app(settings)
    if settings.tls_cert_file:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(settings.tls_cert_file, settings.tls_key_file or None)
        reloader = certs.Reloader(context, settings.tls_cert_file, settings.tls_key_file)
        app.cleanup_ctx.append(_background(reloader.run(settings.tls_reload_interval_s)))
    elif not _loopback(settings.host) and not settings.allow_insecure_http:
        print(
            "refusing plain HTTP on a non-loopback address: set TAUGRID_CONTROLLER_TLS_CERT_FILE "
            "and _TLS_KEY_FILE, or TAUGRID_CONTROLLER_ALLOW_INSECURE_HTTP=true behind a TLS proxy",
            file=sys.stderr,
        )
        return 2
    web.run_app(
        app,
        host=settings.host,
        port=settings.port,
        ssl_context=context,
        shutdown_timeout=10.0,
        access_log=None,
        print=None,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
