"""The controller's composition root: `make_app(settings)` wires everything; nothing at import.

Background work (the Kubernetes client, the node cache, leader election, the quarantine loop)
lives in cleanup contexts, so no loop outlives its app. Shutdown: readiness turns false
first, then the sites stop, then the cleanup contexts cancel their loops (the elector releases
its lease so a follower takes over at once).
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import dataclasses
import datetime as dt
import hashlib
import json
import os
import pathlib
import re
import secrets
import socket
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import prometheus_client
import pydantic
import structlog
from aiohttp import web

from controller import auth, errors, leading, metrics, timestamps
from controller.admission import admitting
from controller.fleet import nodes, policy, quarantining, state
from controller.kube import admission as kube_admission
from controller.kube import client as kube_client
from controller.kube import leases, reviews
from controller.kube import nodes as kube_nodes
from controller.runs import api as runs_api
from controller.settings import ControllerSettings
from shared import heartbeat

log = structlog.get_logger()

SETTINGS = web.AppKey("settings", ControllerSettings)


@dataclasses.dataclass
class ControllerState:
    """Everything the handlers share; built by the cleanup context at startup."""

    settings: ControllerSettings
    metrics: metrics.ControllerMetrics
    fleet: state.FleetState
    authn: auth.Authenticator
    elector: leading.Elector
    quarantiner: quarantining.Quarantiner
    cache: kube_nodes.NodeCache
    http: aiohttp.ClientSession
    gate: admitting.Gate
    ready: bool = False
    url: str = ""


STATE = web.AppKey("state", ControllerState)


def policy_settings(s: ControllerSettings) -> policy.Settings:
    """Translate process settings into the pure policy's settings."""
    return policy.Settings(
        stale_multiplier=s.stale_multiplier,
        stale_quarantine_after_s=s.stale_quarantine_after_s,
        failed_evict_grace_s=s.evict_grace_s,
        degraded_drain_after_s=s.degraded_drain_after_s,
        release_after_s=s.release_after_s,
        max_quarantined=s.max_quarantined,
        max_quarantined_percent=s.max_quarantined_fraction * 100,
        breaker_percent=s.breaker_percent,
        breaker_window_s=s.breaker_window_s,
        breaker_close_after_s=s.breaker_healthy_close_s,
        dry_run=s.dry_run,
    )


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


# ---------------------------------------------------------------------- plumbing
def state_of(request: web.Request) -> ControllerState:
    """The shared state of the app handling `request`."""
    return request.app[STATE]


async def read_body(request: web.Request, limit: int) -> bytes:
    """Read the body, refusing (413) anything above `limit` before reading it all."""
    if request.content_length is not None and request.content_length > limit:
        msg = f"body of {request.content_length} bytes exceeds the limit of {limit} bytes"
        raise errors.ApiError(413, "TooLarge", msg)
    chunks = []
    size = 0
    async for chunk in request.content.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > limit:
            msg = f"body exceeds the limit of {limit} bytes"
            raise errors.ApiError(413, "TooLarge", msg)
        chunks.append(chunk)
    return b"".join(chunks)


async def forward_to_leader(request: web.Request, body: bytes | None = None) -> web.Response:
    """Send a request the leader must handle to the leader; 503 with its URL on failure."""
    st = state_of(request)
    url = st.elector.leader_url
    if not url or url == st.url:
        raise errors.ApiError(503, "NoLeader", "no leader is elected yet; retry shortly")
    headers = {k: v for k, v in request.headers.items() if k.lower() in
               ("authorization", "content-type", "x-request-id", "idempotency-key")}  # fmt: skip
    headers["X-TauGrid-Forwarded"] = "1"
    if request.headers.get("X-TauGrid-Forwarded"):
        raise errors.ApiError(503, "NotLeader", "this replica is not the leader", leaderUrl=url)
    if body is None and request.can_read_body:
        body = await read_body(request, st.settings.max_body_bytes)
    try:
        async with st.http.request(
            request.method,
            url.rstrip("/") + request.path_qs,
            data=body,
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=10),
        ) as resp:
            payload = await resp.read()
            return web.Response(
                body=payload,
                status=resp.status,
                content_type=resp.content_type,
                headers={"X-TauGrid-Leader": url},
            )
    except (aiohttp.ClientError, TimeoutError) as err:
        msg = f"could not reach the leader at {url}: {err}"
        raise errors.ApiError(503, "LeaderUnreachable", msg, leaderUrl=url) from err


async def on_call(request: web.Request, verb: str) -> auth.Identity:
    """Authenticate an on-call caller and authorise the matching verb on nodes."""
    st = state_of(request)
    identity = await st.authn.authenticate(request.headers.get("Authorization"))
    await st.authn.authorize(identity, auth.Access(verb=verb, resource="nodes"))
    return identity


def leader_only(
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """Serve on the leader; forward from a follower (only the leader has the fleet state)."""

    async def wrapped(request: web.Request) -> web.StreamResponse:
        if not state_of(request).elector.is_leader():
            return await forward_to_leader(request)
        return await handler(request)

    wrapped.__doc__ = handler.__doc__
    wrapped.__name__ = handler.__name__
    return wrapped


# ---------------------------------------------------------------------- heartbeats
async def post_heartbeat(request: web.Request) -> web.StreamResponse:
    """Ingest one node's report (agents only, each for its own node)."""
    st = state_of(request)
    started = time.perf_counter()
    try:
        identity = await st.authn.authenticate(
            request.headers.get("Authorization"), (st.settings.token_audience,)
        )
        raw = await read_body(request, st.settings.max_body_bytes)
        try:
            # The fast path: pydantic-core parses and validates the JSON in one step.
            hb = heartbeat.Heartbeat.model_validate_json(raw)
        except (pydantic.ValidationError, ValueError):
            hb = _explain_bad_heartbeat(raw)
        auth.check_heartbeat_sender(
            identity,
            auth.agent_username(st.settings.namespace, st.settings.agent_service_account),
            hb.node_name,
        )
        if not st.elector.is_leader():
            st.metrics.heartbeats.labels("forwarded").inc()
            return await forward_to_leader(request, raw)
        before = _verdict_key(st.fleet.get(hb.node_name))
        if st.fleet.ingest(hb, _now()) and _verdict_key(st.fleet.get(hb.node_name)) != before:
            # Only a change of verdict, faults or boot wakes the quarantine loop at once; a
            # steady report does not, so a big fleet's heartbeats do not cost a pass each.
            st.quarantiner.poke()
        st.metrics.heartbeats.labels("accepted").inc()
        log.debug("heartbeat", node=hb.node_name, sequence=hb.sequence)
        return web.json_response({"accepted": True, "node": hb.node_name, "sequence": hb.sequence},
                                 status=202)  # fmt: skip
    except (errors.ApiError, auth.AuthError):
        st.metrics.heartbeats.labels("rejected").inc()
        raise
    finally:
        st.metrics.heartbeat_seconds.observe(time.perf_counter() - started)


def _explain_bad_heartbeat(raw: bytes) -> heartbeat.Heartbeat:
    """Re-read a body the fast path refused, to say exactly what is wrong with it (4xx)."""
    data = errors.read_json(raw)
    if isinstance(data, dict) and data.get("schemaVersion") not in (None, heartbeat.SCHEMA_VERSION):
        msg = (
            f"schemaVersion {data.get('schemaVersion')!r} is not supported; "
            f"this controller speaks {heartbeat.SCHEMA_VERSION}"
        )
        raise errors.ApiError(422, "UnsupportedSchema", msg, "schemaVersion")
    try:
        return heartbeat.Heartbeat.model_validate(data)
    except pydantic.ValidationError as err:
        raise errors.validation_error(err) from err


def _verdict_key(record: state.NodeRecord | None) -> object:
    if record is None:
        return None
    return (record.verdict, record.action, record.faults, record.heartbeat.boot_id)


# ---------------------------------------------------------------------- on-call
def _gpu_json(gpu: heartbeat.GpuReport) -> dict[str, Any]:
    return gpu.model_dump(mode="json", by_alias=True)


def _node_json(st: ControllerState, name: str, *, detail: bool) -> dict[str, Any]:
    now = _now()
    raw = st.cache.nodes.get(name)
    view = nodes.parse(raw) if raw is not None else None
    h = None
    if st.quarantiner.last is not None:
        h = st.quarantiner.last.health.get(name)
    if h is None and name in st.fleet:
        h = st.fleet.assess(
            name, now, default_interval_s=st.quarantiner.settings.default_interval_s
        )
    rec = st.fleet.get(name)
    out: dict[str, Any] = {
        "name": name,
        "state": h.state.value if h else "Unknown",
        "reason": h.reason if h else "",
        "message": h.message if h else "",
        "lastHeartbeat": timestamps.rfc3339_exact(rec.received_at) if rec else None,
        "bootId": rec.heartbeat.boot_id if rec else None,
        "agentUrl": rec.heartbeat.agent_url if rec else None,
        "managed": view.managed if view else True,
        "unschedulable": view.unschedulable if view else False,
        "cordonedByUs": view.cordoned_by_us if view else False,
        "tainted": view.tainted if view else False,
        "gpuCapacity": view.gpu_capacity if view else 0,
        "quarantine": None,
        "inCluster": raw is not None,
    }
    if view is not None and view.quarantine is not None:
        q = view.quarantine
        out["quarantine"] = {
            "mode": q.mode.value,
            "by": q.by,
            "at": timestamps.rfc3339_exact(q.at),
            "reason": q.reason,
            "clearsWith": q.clears_with.value,
            "evictAfter": timestamps.rfc3339_exact(q.evict_after),
        }
    if detail:
        out["gpus"] = [_gpu_json(g) for g in rec.heartbeat.gpus] if rec else []
        out["history"] = [dataclasses.asdict(e) for e in view.history] if view else []
        out["problems"] = list(view.problems) if view else []
        out["condition"] = (
            {
                "status": view.condition.status.value,
                "reason": view.condition.reason,
                "message": view.condition.message,
            }
            if view and view.condition
            else None
        )
    return out


@leader_only
async def list_nodes(request: web.Request) -> web.StreamResponse:
    """Fleet health: every GPU node with its state and quarantine."""
    await on_call(request, "get")
    st = state_of(request)
    names = sorted(set(st.cache.nodes) | set(st.fleet))
    items = [_node_json(st, n, detail=False) for n in names]
    wanted = request.query.get("state")
    if wanted:
        items = [i for i in items if i["state"] == wanted]
    return web.json_response({"items": items}, dumps=_dumps)


@leader_only
async def get_node(request: web.Request) -> web.StreamResponse:
    """One node: per-GPU detail, quarantine state and history."""
    await on_call(request, "get")
    st = state_of(request)
    name = request.match_info["name"]
    if name not in st.cache.nodes and name not in st.fleet:
        raise errors.ApiError(404, "NotFound", f"node {name} is not known", "name")
    return web.json_response(_node_json(st, name, detail=True), dumps=_dumps)


class QuarantineRequest(pydantic.BaseModel):
    """Body of the on-call quarantine and release calls."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)
    reason: str = pydantic.Field(min_length=1, max_length=1024)


async def _manual(request: web.Request, release: bool) -> web.StreamResponse:
    identity = await on_call(request, "patch")
    st = state_of(request)
    name = request.match_info["name"]
    raw_body = await read_body(request, st.settings.max_body_bytes)
    try:
        body = QuarantineRequest.model_validate(errors.read_json(raw_body or b"{}"))
    except pydantic.ValidationError as err:
        raise errors.validation_error(err) from err
    raw = st.cache.nodes.get(name)
    if raw is None:
        raise errors.ApiError(404, "NotFound", f"node {name} does not exist", "name")
    view = nodes.parse(raw)
    now = _now()
    h = st.fleet.assess(name, now, default_interval_s=st.quarantiner.settings.default_interval_s) \
        if name in st.fleet else None  # fmt: skip
    try:
        action: policy.NodeAction
        if release:
            action = policy.manual_release(view, h, by=identity.username, reason=body.reason)
        else:
            action = policy.manual_quarantine(view, h, by=identity.username, reason=body.reason,
                                              now=now)  # fmt: skip
    except policy.ManualRequestError as err:
        field = str(err).split(":", 1)[0]
        raise errors.ApiError(409 if field == "node" else 422, "Refused", str(err), field) from err
    await st.quarantiner.apply(action, now)
    st.quarantiner.poke()
    return web.json_response(_node_json(st, name, detail=True), dumps=_dumps)


@leader_only
async def post_quarantine(request: web.Request) -> web.StreamResponse:
    """Quarantine a node by hand (reason required); only a manual release ends it."""
    return await _manual(request, release=False)


@leader_only
async def delete_quarantine(request: web.Request) -> web.StreamResponse:
    """Release a node by hand (reason required)."""
    return await _manual(request, release=True)


def _fleet_json(st: ControllerState) -> dict[str, Any]:
    b = st.quarantiner.breaker
    last = st.quarantiner.last
    states = collections.Counter(h.state.value for h in last.health.values()) if last else {}
    return {
        "leader": st.elector.identity,
        "dryRun": st.quarantiner.settings.dry_run,
        "breaker": b.model_dump(mode="json", by_alias=True),
        "nodes": len(set(st.cache.nodes) | set(st.fleet)),
        "quarantined": last.quarantined if last else 0,
        "maxQuarantined": last.max_quarantined if last else None,
        "states": dict(sorted(states.items())),
    }


@leader_only
async def get_fleet(request: web.Request) -> web.StreamResponse:
    """Breaker state, dry-run mode and fleet counts."""
    await on_call(request, "get")
    return web.json_response(_fleet_json(state_of(request)), dumps=_dumps)


@leader_only
async def reset_breaker(request: web.Request) -> web.StreamResponse:
    """Close the quarantine circuit breaker (an operator's decision)."""
    identity = await on_call(request, "patch")
    st = state_of(request)
    st.quarantiner.breaker = policy.reset_breaker(st.quarantiner.breaker, by=identity.username,
                                                  now=_now())  # fmt: skip
    await st.quarantiner.apply(policy.CloseBreaker(reason="Reset", by=identity.username), _now())
    st.quarantiner.poke()
    return web.json_response(_fleet_json(st), dumps=_dumps)


class ModeRequest(pydantic.BaseModel):
    """Body of `PUT /v1/fleet/mode`."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    dry_run: bool = pydantic.Field(alias="dryRun")


@leader_only
async def put_mode(request: web.Request) -> web.StreamResponse:
    """Switch dry run on or off at runtime."""
    identity = await on_call(request, "patch")
    st = state_of(request)
    raw = await read_body(request, st.settings.max_body_bytes)
    try:
        body = ModeRequest.model_validate(errors.read_json(raw))
    except pydantic.ValidationError as err:
        raise errors.validation_error(err) from err
    st.quarantiner.settings = st.quarantiner.settings.model_copy(update={"dry_run": body.dry_run})
    log.warning("dry run switched", dry_run=body.dry_run, by=identity.username)
    st.quarantiner.poke()
    return web.json_response(_fleet_json(st), dumps=_dumps)


# ---------------------------------------------------------------------- health, metrics
async def healthz(request: web.Request) -> web.StreamResponse:
    """Liveness: the process answers."""
    return web.json_response({"ok": True})


async def readyz(request: web.Request) -> web.StreamResponse:
    """Readiness: the node cache is synced and we are not shutting down."""
    st = state_of(request)
    ok = st.ready and st.cache.synced.is_set()
    body = {"ready": ok, "leader": st.elector.is_leader(), "leaderUrl": st.elector.leader_url}
    return web.json_response(body, status=200 if ok else 503)


async def get_metrics(request: web.Request) -> web.StreamResponse:
    """Prometheus text exposition of the controller's own registry."""
    st = state_of(request)
    st.metrics.is_leader.set(1 if st.elector.is_leader() else 0)
    data = prometheus_client.generate_latest(st.metrics.registry)
    return web.Response(body=data, headers={"Content-Type": prometheus_client.CONTENT_TYPE_LATEST})


async def openapi(request: web.Request) -> web.StreamResponse:
    """The OpenAPI document of this API."""
    paths: dict[str, Any] = {}
    for resource in request.app.router.resources():
        info = resource.get_info()
        path = info.get("path") or info.get("formatter")
        if not path:
            continue
        for route in resource:
            if route.method == "HEAD":
                continue
            lines = (route.handler.__doc__ or "").strip().splitlines()
            paths.setdefault(path, {})[route.method.lower()] = {
                "summary": lines[0] if lines else "",
                "responses": {
                    "default": {"description": "JSON; errors are {error: {code, message, field}}"}
                },
            }
    schemas = {
        "Heartbeat": heartbeat.Heartbeat.model_json_schema(by_alias=True),
        "QuarantineRequest": QuarantineRequest.model_json_schema(),
        "ModeRequest": ModeRequest.model_json_schema(by_alias=True),
    }
    doc = {
        "openapi": "3.1.0",
        "info": {"title": "TauGrid controller", "version": "v1"},
        "paths": paths,
        "components": {"schemas": schemas},
    }
    return web.json_response(doc)


def _dumps(obj: Any) -> str:
    return json.dumps(obj, default=str)


# ---------------------------------------------------------------------- web page
WEB_PAGE = pathlib.Path(__file__).resolve().parent / "assets" / "index.html"


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


def web_page(path: pathlib.Path = WEB_PAGE) -> Callable[[web.Request], Awaitable[web.Response]]:
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

    async def index(request: web.Request) -> web.Response:
        """The web page: fleet, queues and runs, live (no data in it; its calls carry a token)."""
        return web.Response(body=body, headers=headers)

    return index


# ---------------------------------------------------------------------- wiring
def make_identity(settings: ControllerSettings) -> str:
    """This replica's Lease identity."""
    return settings.identity or f"{socket.gethostname()}-{secrets.token_hex(3)}"


def make_app(
    settings: ControllerSettings,
    *,
    reviewer: auth.Reviewer | None = None,
) -> web.Application:
    """Build the controller app; background work starts with the app, not here."""
    app = web.Application(
        middlewares=[errors.make_middleware(settings.handler_timeout_s)],
        client_max_size=settings.max_body_bytes,
    )
    app[SETTINGS] = settings
    app.router.add_post("/v1/heartbeats", post_heartbeat)
    app.router.add_get("/v1/nodes", list_nodes)
    app.router.add_get("/v1/nodes/{name}", get_node)
    app.router.add_post("/v1/nodes/{name}/quarantine", post_quarantine)
    app.router.add_delete("/v1/nodes/{name}/quarantine", delete_quarantine)
    app.router.add_get("/v1/fleet", get_fleet)
    app.router.add_post("/v1/fleet/breaker/reset", reset_breaker)
    app.router.add_put("/v1/fleet/mode", put_mode)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", get_metrics)
    app.router.add_get("/openapi.json", openapi)
    app.router.add_get("/", web_page())
    runs_api.add_routes(app)
    app.cleanup_ctx.append(_runtime(settings, reviewer))
    app.on_shutdown.append(_not_ready)
    return app


async def _not_ready(app: web.Application) -> None:
    if STATE in app:
        app[STATE].ready = False


def _runtime(
    settings: ControllerSettings, reviewer: auth.Reviewer | None
) -> Callable[[web.Application], AsyncIterator[None]]:
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        peer_ssl = peer_ssl_context(settings)  # first: a bad CA file fails before any client
        api = await kube_client.make_client(settings.kubeconfig)
        http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=peer_ssl))
        m = metrics.make_metrics()
        authn = auth.Authenticator(
            reviewer or reviews.KubeReviewer(api),
            token_ttl_s=settings.token_cache_max_s,
            access_ttl_s=settings.auth_cache_ttl_s,
        )
        pol = policy_settings(settings)
        state_fleet = state.FleetState(
            leader_since=_now(), stale_multiplier=settings.stale_multiplier
        )
        url = settings.advertise_url or _default_url(settings, app)
        holder: dict[str, quarantining.Quarantiner] = {}

        async def started() -> None:
            state_fleet.become_leader(_now())
            holder["q"].restore(elector.lease_state)
            log.info("became leader", identity=elector.identity, url=url)
            holder["q"].poke()

        async def stopped() -> None:
            log.warning("stopped leading", identity=elector.identity)

        lease_store = leases.KubeLeaseStore(api, settings.namespace, settings.lease_name)
        elector = leading.Elector(
            lease_store,
            make_identity(settings),
            url,
            lease_duration_s=settings.lease_duration_s,
            renew_deadline_s=settings.renew_deadline_s,
            retry_period_s=settings.retry_period_s,
            on_started=started,
            on_stopped=stopped,
        )

        gate = admitting.Gate(
            kube_admission.AdmissionStore(api, component=elector.identity), elector, m,
            check=settings.admission_check, retry_after_s=settings.admission_retry_after_s,
            pass_interval_s=settings.admission_pass_interval_s,
        )  # fmt: skip

        def poke() -> None:
            holder["q"].poke()
            gate.poke()  # a quarantine or a release changes what fits: decide again at once

        cache = kube_nodes.NodeCache(api, on_change=poke, label_selector=settings.node_selector)
        writer = kube_nodes.NodeWriter(api, settings.namespace, component=elector.identity)
        q = quarantining.Quarantiner(
            state_fleet, cache=cache, writer=writer, settings=pol, elector=elector, metrics=m,
            pass_interval_s=settings.pass_interval_s, lease_name=settings.lease_name,
            save_state=lease_store.save_state,
        )  # fmt: skip
        holder["q"] = q
        st = ControllerState(settings, m, state_fleet, authn, elector, q, cache, http, gate,
                             url=url)  # fmt: skip
        app[STATE] = st
        tasks = [
            asyncio.create_task(cache.run(), name="node-cache"),
            asyncio.create_task(elector.run(), name="elector"),
            asyncio.create_task(q.run(), name="quarantine"),
            asyncio.create_task(gate.run(), name="admission"),
            runs_api.start(app, api, st),
        ]
        st.ready = True
        try:
            yield
        finally:
            st.ready = False
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await t
            await http.close()
            await api.close()

    return ctx


def peer_ssl_context(settings: ControllerSettings) -> ssl.SSLContext:
    """Build the client context for calls to other replicas: the system store plus
    `tls_ca_file`, so a follower verifies the leader's certificate (issued by a private CA,
    for the name in its advertised URL) instead of failing or trusting anything."""
    context = ssl.create_default_context()
    if settings.tls_ca_file:
        context.load_verify_locations(cafile=settings.tls_ca_file)
    return context


def read_run_ca(settings: ControllerSettings) -> str:
    """Read the PEM bundle run pods trust (`run_ca_file`, else `tls_ca_file`) once, at
    startup; '' when neither is set. A file that holds no certificate fails here, not in
    every run pod."""
    path = settings.run_ca_file or settings.tls_ca_file
    if not path:
        return ""
    pem = pathlib.Path(path).read_text(encoding="ascii")
    ssl.create_default_context(cadata=pem)  # raises ssl.SSLError on anything but certificates
    return pem


def pod_dns_name(pod_ip: str, domain: str) -> str:
    """Return the name DNS serves for `pod_ip` as an endpoint of the headless Service whose
    domain is `domain` (`10.1.2.3` -> `10-1-2-3.<domain>`). A Deployment's pods get no
    `<pod name>.<service>` record (that takes `spec.hostname`, one value for all replicas),
    so this is the per-pod name a wildcard certificate for `*.<domain>` can cover."""
    return f"{pod_ip.replace('.', '-').replace(':', '-')}.{domain}"


def _default_url(settings: ControllerSettings, app: web.Application) -> str:
    scheme = "https" if settings.tls_cert_file else "http"
    pod_ip = os.environ.get("POD_IP", "")
    host = pod_ip or settings.host
    if host in ("0.0.0.0", "", "::"):  # noqa: S104
        host = "127.0.0.1"
    if pod_ip and settings.advertise_domain:
        host = pod_dns_name(pod_ip, settings.advertise_domain)
    return f"{scheme}://{host}:{settings.port}"
