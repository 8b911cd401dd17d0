"""What every replica serves besides the domains' APIs: health, metrics, the page, the client.

`/healthz` (the process answers), `/readyz` (started, not shutting down, the node cache
synced), `/metrics` (the controller's own registry), `/` (the web page, with a strict
content security policy), `/tau` (the `tau` client script, with its SHA-256 in the
`X-Tau-SHA256` and `Repr-Digest` headers), `/tau.sha256` (that digest in `sha256sum`'s
format, so `sha256sum -c` checks a download) and `/ca.crt` (the CA that issued the
controller's certificate, so nobody needs read access to the TLS Secret, which also holds
the private key).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import pathlib
import re

import prometheus_client
from aiohttp import web

from controller import errors, serving, wire

ASSETS = pathlib.Path(__file__).resolve().parent / "assets"
WEB_PAGE = ASSETS / "index.html"
CLIENT_SCRIPT = ASSETS / "tau.py"


def add_routes(app: web.Application, *, ca_file: str = "") -> None:
    """Register health, metrics, the web page, the client script and the CA (`ca_file`:
    the settings' `tls_ca_file`)."""
    app.router.add_get("/ca.crt", ca_certificate(ca_file))
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", get_metrics)
    app.router.add_get("/", web_page())
    script, digest = client_script()
    app.router.add_get("/tau", script)
    app.router.add_get("/tau.sha256", digest)


TAG = "service"


class Health(wire.Wire):
    """The process answers."""

    ok: bool


class Readiness(wire.Wire):
    """Whether this replica serves and whether it leads (never where the leader is: review
    finding L6)."""

    ready: bool
    leader: bool


TEXT = {"type": "string"}


@serving.operation(
    "getHealth", tag=TAG, auth=serving.Auth.NONE,
    replies={200: serving.Reply("Alive.", Health)},
)  # fmt: skip
async def healthz(request: web.Request) -> web.StreamResponse:
    """Liveness: the process answers."""
    return web.json_response({"ok": True})


@serving.operation(
    "getReadiness", tag=TAG, auth=serving.Auth.NONE,
    replies={
        200: serving.Reply("Ready to serve.", Readiness),
        503: serving.Reply("Starting, shutting down, or the node cache not synced.", Readiness),
    },
)  # fmt: skip
async def readyz(request: web.Request) -> web.StreamResponse:
    """Readiness: the node cache is synced and we are not shutting down."""
    if serving.SERVING not in request.app:
        return web.json_response({"ready": False, "leader": False}, status=503)
    st = request.app[serving.SERVING]
    ok = st.is_ready()
    # No leader address: followers reach the leader through the leader-only Service, and an
    # unauthenticated caller learns nothing about where (review finding L6).
    body = {"ready": ok, "leader": st.elector.is_leader()}
    return web.json_response(body, status=200 if ok else 503)


@serving.operation(
    "getMetrics", tag=TAG, auth=serving.Auth.NONE, errors=(503,),
    replies={200: serving.Reply("Prometheus text exposition.", media_type="text/plain",
                                schema=TEXT)},
)  # fmt: skip
async def get_metrics(request: web.Request) -> web.StreamResponse:
    """Prometheus text exposition of the controller's own registry."""
    st = serving.serving_of(request)
    st.metrics.is_leader.set(1 if st.elector.is_leader() else 0)
    data = prometheus_client.generate_latest(st.metrics.registry)
    return web.Response(body=data, headers={"Content-Type": prometheus_client.CONTENT_TYPE_LATEST})


def page_csp(html: str) -> str:
    """Allow the page's own inline script and style (by hash) and API calls to this origin,
    so even a string that slipped into the DOM as markup could not run or load anything."""

    def hashes(tag: str) -> str:
        found = re.findall(rf"<{tag}>(.*?)</{tag}>", html, flags=re.DOTALL)
        digests = (base64.b64encode(hashlib.sha256(f.encode()).digest()).decode() for f in found)
        return " ".join(f"'sha256-{d}'" for d in digests) or "'none'"

    return (
        f"default-src 'none'; script-src {hashes('script')}; style-src {hashes('style')}; "
        "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; "
        "frame-ancestors 'none'"
    )


def web_page(path: pathlib.Path = WEB_PAGE) -> serving.Handler:
    """Read the page once (at app build) and return the handler that serves it."""
    html = path.read_text(encoding="utf-8")
    body = html.encode()
    headers = {
        "Content-Type": "text/html; charset=utf-8",
        "Content-Security-Policy": page_csp(html),
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-cache",
    }

    @serving.operation(
        "getWebPage", tag=TAG, auth=serving.Auth.NONE,
        replies={200: serving.Reply("The page.", media_type="text/html", schema=TEXT)},
    )  # fmt: skip
    async def index(request: web.Request) -> web.StreamResponse:
        """The web page: fleet, queues and runs, live (no data in it; its calls carry a token)."""
        return web.Response(body=body, headers=headers)

    return index


def client_script(
    path: pathlib.Path = CLIENT_SCRIPT,
) -> tuple[serving.Handler, serving.Handler]:
    """Read the `tau` script once (at app build) and return the handlers that serve it and
    its SHA-256. The digest travels with every copy, so a download can be checked against
    the digest the platform team publishes for the release (docs/researcher.md)."""
    body = path.read_bytes()
    raw = hashlib.sha256(body).digest()
    hex_digest = raw.hex()
    headers = {
        "Content-Type": "text/x-python; charset=utf-8",
        "Content-Disposition": 'attachment; filename="tau"',
        "X-Tau-SHA256": hex_digest,
        "Repr-Digest": f"sha-256=:{base64.b64encode(raw).decode()}:",
        "X-Content-Type-Options": "nosniff",
    }
    line = f"{hex_digest}  tau\n".encode()

    @serving.operation(
        "getClient", tag=TAG, auth=serving.Auth.NONE,
        replies={200: serving.Reply("The script.", media_type="text/x-python", schema=TEXT)},
    )  # fmt: skip
    async def get_client(request: web.Request) -> web.StreamResponse:
        """The `tau` client script (Python 3, standard library only), with its SHA-256."""
        return web.Response(body=body, headers=headers)

    @serving.operation(
        "getClientDigest", tag=TAG, auth=serving.Auth.NONE,
        replies={200: serving.Reply("`<hex>  tau`.", media_type="text/plain", schema=TEXT)},
    )  # fmt: skip
    async def get_client_digest(request: web.Request) -> web.StreamResponse:
        """The SHA-256 of the `tau` script, as `sha256sum` prints it (`<hex>  tau`)."""
        return web.Response(body=line, content_type="text/plain", charset="utf-8")

    return get_client, get_client_digest


def ca_certificate(ca_file: str) -> serving.Handler:
    """Return the handler serving the PEM bundle at `ca_file`, read at each request: a CA
    that cert-manager rotates is served as the replicas trust it, without a restart. A CA is
    public by nature, so the handler needs no token: a researcher or on-call engineer fetches
    it before having anything to verify with (checking it against the fingerprint the
    platform team hands out)."""

    @serving.operation(
        "getCACertificate", tag=TAG, auth=serving.Auth.NONE, errors=(404, 503),
        replies={200: serving.Reply("The CA bundle (PEM).", media_type="application/x-pem-file",
                                    schema=TEXT)},
    )  # fmt: skip
    async def get_ca(request: web.Request) -> web.StreamResponse:
        """The CA that issued the controller's certificate, PEM (`curl -o ca.crt URL/ca.crt`)."""
        if not ca_file:
            msg = (
                "this controller has no CA to publish (tls_ca_file is not set): it serves"
                " plain HTTP, or a certificate your system already trusts"
            )
            raise errors.NotFound(msg, code="NoCA")
        try:
            pem = await asyncio.to_thread(pathlib.Path(ca_file).read_bytes)
        except OSError as err:
            msg = f"the CA file {ca_file} cannot be read now: {err.strerror}"
            raise errors.Unavailable(msg, code="CAUnreadable") from None
        headers = {
            "Content-Type": "application/x-pem-file",
            "Content-Disposition": 'attachment; filename="ca.crt"',
            "X-Content-Type-Options": "nosniff",
            "Cache-Control": "no-cache",
        }
        return web.Response(body=pem, headers=headers)

    return get_ca
