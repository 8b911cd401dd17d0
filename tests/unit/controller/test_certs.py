"""The serving certificate is reloaded from disk: a renewed pair is served from the next
handshake on, and a half-written pair is never taken (the old one stays in service)."""

from __future__ import annotations

import asyncio
import os
import pathlib
import shutil
import ssl

import pytest
from aiohttp import web

from controller import certs
from devcluster import pki


@pytest.fixture(scope="module")
def two_cas(tmp_path_factory: pytest.TempPathFactory) -> tuple[pathlib.Path, pathlib.Path]:
    """Two CAs, each with a serving certificate for 127.0.0.1 (openssl, as the dev PKI)."""
    return pki.ensure(tmp_path_factory.mktemp("a")), pki.ensure(tmp_path_factory.mktemp("b"))


def _install(src: pathlib.Path, dst: pathlib.Path, stamp: int) -> None:
    for name in ("serving.crt", "serving.key"):
        shutil.copy(src / name, dst / name)
        os.utime(dst / name, ns=(stamp, stamp))


async def _presented(port: int, cas: tuple[pathlib.Path, pathlib.Path]) -> bytes:
    """The DER of the certificate the server presents now (a fresh handshake)."""
    client = ssl.create_default_context()
    for d in cas:
        client.load_verify_locations(cafile=d / "ca.crt")
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client)
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.close()
    await writer.wait_closed()
    return bytes(der)


def _der(cert: pathlib.Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(cert.read_text())


async def test_a_renewed_certificate_is_served_without_a_restart(
    two_cas: tuple[pathlib.Path, pathlib.Path], tmp_path: pathlib.Path
) -> None:
    """Old pair served; the files change; `check` loads the new pair into the live context,
    and the next handshake presents it. An unchanged or broken pair is not loaded."""
    first, second = two_cas
    _install(first, tmp_path, 1_000_000_000)
    cert, key = tmp_path / "serving.crt", tmp_path / "serving.key"
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    reloader = certs.Reloader(context, str(cert), str(key))
    runner = web.AppRunner(web.Application())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        assert await _presented(port, two_cas) == _der(first / "serving.crt")
        assert reloader.check() is False, "nothing changed"

        shutil.copy(second / "serving.crt", cert)  # the key of the first: a mismatched pair
        os.utime(cert, ns=(2_000_000_000, 2_000_000_000))
        assert reloader.check() is False, "a half-written pair is not taken"
        assert await _presented(port, two_cas) == _der(first / "serving.crt")

        _install(second, tmp_path, 3_000_000_000)
        assert reloader.check() is True
        assert await _presented(port, two_cas) == _der(second / "serving.crt")
    finally:
        await runner.cleanup()
