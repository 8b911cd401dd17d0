"""The composition root: `make_app(settings)` wires the monitor, reporter and HTTP API.

Endpoints (DESIGN.md section 4): `/metrics`, `/healthz`, `/readyz`, `GET /v1/gpus`,
`POST /v1/diag?level=1|2|3` and `POST /v1/release` (both authenticated). Pod names (which
tenant holds which GPU) are shown only to an authorised caller: on `/v1/gpus` to the on-call
right, on `/metrics` to a scrape allowed `get nodes/metrics` (security review 3, finding 3).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import structlog
from aiohttp import web

from agent import auth, latching, metrics, monitoring, readings, reporting, settings, snapshots
from agent.probing import dcgm
from shared import health, heartbeat

log = structlog.get_logger("agent.app")


@dataclasses.dataclass
class Lifecycle:
    """Readiness, flipped false first on shutdown."""

    ready: bool = False


SETTINGS = web.AppKey("settings", settings.Settings)
MONITOR = web.AppKey("monitor", monitoring.Monitor)
REPORTER = web.AppKey("reporter", reporting.Reporter)
AUTHENTICATOR = web.AppKey("authenticator", auth.Authenticator)
GATE = web.AppKey("gate", auth.Gate)
LIFECYCLE = web.AppKey("lifecycle", Lifecycle)
DIAG_TASKS: web.AppKey[set[asyncio.Task[Any]]] = web.AppKey("diag_tasks")


def _error(status: int, code: str, message: str, field: str = "") -> web.Response:
    body: dict[str, Any] = {"error": {"code": code, "message": message}}
    if field:
        body["error"]["field"] = field
    return web.json_response(body, status=status)


@web.middleware
async def errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Map domain errors to HTTP codes; anything unexpected is a 500 with a request id."""
    try:
        return await handler(request)
    except auth.AuthError as err:
        code = {401: "Unauthorized", 429: "TooManyRequests"}.get(err.status, "Forbidden")
        resp = _error(err.status, code, err.message)
        if err.status == 429:
            resp.headers["Retry-After"] = "1"
        return resp
    except web.HTTPException:
        raise
    except asyncio.CancelledError:
        raise
    except Exception:
        request_id = uuid.uuid4().hex[:12]
        log.exception("request_failed", request_id=request_id, path=request.path)
        return _error(500, "Internal", f"internal error (request id {request_id})")


async def handle_metrics(request: web.Request) -> web.Response:
    """Render the last probe view; NVML is never called here."""
    cfg = request.app[SETTINGS]
    text = metrics.render(
        request.app[MONITOR].view,
        export_dcgm=cfg.export_dcgm_families,
        hostname_label=cfg.hostname_label,
        host_label=cfg.host_label,
        pod_labels=cfg.pod_labels
        and await _may(request, verb=cfg.auth_metrics_verb, subresource="metrics"),
    )
    return web.Response(body=text.encode(), headers={"Content-Type": metrics.CONTENT_TYPE})


async def handle_healthz(request: web.Request) -> web.Response:
    """Alive when the probe loop has run recently."""
    view = request.app[MONITOR].view
    cfg = request.app[SETTINGS]
    if view.taken_at is None:
        return web.json_response({"status": "starting"}, status=200)
    age = (monitoring.utcnow() - view.taken_at).total_seconds()
    limit = max(10 * cfg.gauge_interval_s, 30.0)
    if age > limit:
        return web.json_response({"status": "stale", "lastProbeAgeS": age}, status=503)
    return web.json_response({"status": "ok", "lastProbeAgeS": age})


async def handle_readyz(request: web.Request) -> web.Response:
    """Ready once the first probe pass has run, and until shutdown begins."""
    ready = request.app[LIFECYCLE].ready and request.app[MONITOR].view.taken_at is not None
    return web.json_response({"ready": ready}, status=200 if ready else 503)


def gpus_document(
    view: snapshots.View,
    reporter: reporting.Reporter | None,
    *,
    dcgm_enabled: bool,
    show_pods: bool = True,
) -> dict[str, Any]:
    """Build the `/v1/gpus` document an on-call engineer reads.

    `show_pods` false leaves every GPU's `pods` empty: which tenant holds a GPU is for the
    on-call role only, never for anyone who can merely reach the node.
    """
    by_index = {s.index: s for s in view.snapshots}
    diag_by_index = {g.gpu_index: g for g in view.last_diag.gpus} if view.last_diag else {}
    health_by_index = {g.gpu_index: g for g in view.last_health.gpus} if view.last_health else {}
    gpus: list[dict[str, Any]] = []
    for v in view.verdicts:
        state = view.state.gpus.get(v.uuid)
        snap = by_index.get(v.index)
        latched = [
            {
                **f.model_dump(mode="json", by_alias=True),
                "clearsWhenText": latching.clears_when_text(
                    f.clears_when, dcgm_present=view.dcgm_status.available
                ),
            }
            for f in (state.latched if state else ())
        ]
        diag = diag_by_index.get(v.index)
        gpu_health = health_by_index.get(v.index)
        holders = view.pods.sharing.get(v.uuid, ()) if show_pods else ()
        gpus.append(
            {
                "index": v.index,
                "uuid": v.uuid,
                "name": snap.name if snap else "",
                "pciBusId": (
                    snap.pci_bus_id if snap else (state.pci_bus_id if state else v.pci_bus_id)
                ),
                "verdict": str(v.verdict),
                "action": str(v.action),
                "reasons": heartbeat.to_json(list(v.reasons)),
                "latchedFaults": latched,
                "readings": snap.model_dump(mode="json", by_alias=True) if snap else None,
                "recentEvents": [
                    e.model_dump(mode="json", by_alias=True, exclude_none=True)
                    for e in view.recent_events.get(v.index, ())
                ],
                "xidCounts": {str(k): n for k, n in (state.xid_counts if state else {}).items()},
                "lastDiagnostic": diag.model_dump(mode="json", by_alias=True) if diag else None,
                "dcgmHealth": (
                    gpu_health.model_dump(mode="json", by_alias=True) if gpu_health else None
                ),
                "pods": [
                    {"namespace": r.namespace, "pod": r.pod, "container": r.container}
                    for r in holders
                ],
            }
        )
    dcgm_detail = view.dcgm_status.detail if dcgm_enabled else "disabled by setting"
    return {
        "node": view.node_name,
        "bootId": view.boot_id,
        "takenAt": view.taken_at.isoformat() if view.taken_at else None,
        "driverVersion": view.driver_version,
        "verdict": str(health.worst_verdict([v.verdict for v in view.verdicts])),
        "action": str(health.worst_action([v.action for v in view.verdicts])),
        "nvml": {
            "available": view.nvml_available,
            "detail": view.nvml_detail,
            "eventsRegistered": view.events_registered,
            "calls": view.nvml_calls,
            "enumerationErrors": {str(i): e for i, e in view.enumeration_errors.items()},
        },
        "dcgm": {
            "available": view.dcgm_status.available,
            "detail": dcgm_detail,
            "hostengine": view.dcgm_status.hostengine,
            "diagRunning": view.diag_running,
            "failures": view.dcgm_status.failures,
            "retryAt": _iso(view.dcgm_status.retry_at),
            "watchesSetAgain": view.dcgm_status.rearmed,
            "lastCheckAt": _iso(view.dcgm_status.last_check_at),
        },
        "kernelLog": {"error": view.kmsg_detail},
        "podAttribution": {
            "enabled": view.attribution_status.enabled,
            "podsShown": show_pods,
            "detail": view.attribution_status.detail,
            "socket": view.attribution_status.socket,
            "refreshedAt": _iso(view.attribution_status.refreshed_at),
            "client": view.attribution_status.client,
            "unmatchedDevices": list(view.pods.unmatched),
        },
        "stateFile": {"problem": view.state_detail},
        "lastDiagnostic": (
            view.last_diag.model_dump(mode="json", by_alias=True) if view.last_diag else None
        ),
        "heartbeats": (
            {
                "sent": reporter.stats.sent,
                "failed": reporter.stats.failed,
                "lastSentAt": (
                    reporter.stats.last_sent_at.isoformat() if reporter.stats.last_sent_at else None
                ),
                "lastError": reporter.stats.last_error,
                "target": reporter.stats.target,
            }
            if reporter is not None
            else None
        ),
        "probeSeconds": view.probe_seconds,
        "gpus": gpus,
    }


def _iso(at: dt.datetime | None) -> str | None:
    return at.isoformat() if at is not None else None


async def handle_gpus(request: web.Request) -> web.Response:
    """`GET /v1/gpus`: open to all, but pod names only with an on-call token."""
    cfg = request.app[SETTINGS]
    doc = gpus_document(
        request.app[MONITOR].view,
        request.app.get(REPORTER),
        dcgm_enabled=cfg.dcgm_enabled,
        show_pods=await _may(request, verb=cfg.auth_verb),
    )
    return web.json_response(doc)


async def _authorize(
    request: web.Request, *, verb: str = "", subresource: str = ""
) -> auth.Identity:
    """Authenticate and authorise the caller through the gate (cache, then per-source limit)."""
    cfg = request.app[SETTINGS]
    token = auth.bearer(request.headers.get("Authorization"))
    return await request.app[GATE].authorize(
        token,
        verb=verb or cfg.auth_verb,
        node=cfg.node_name,
        subresource=subresource,
        source=request.remote or "",
        now=time.monotonic(),
    )


async def _may(request: web.Request, *, verb: str, subresource: str = "") -> bool:
    """Whether the caller holds a right that widens an open read; no token asks nothing."""
    if "Authorization" not in request.headers:
        return False
    try:
        await _authorize(request, verb=verb, subresource=subresource)
    except auth.AuthError as err:
        log.info("read_narrowed", path=request.path, status=err.status, reason=err.message)
        return False
    return True


def _flag(request: web.Request, name: str) -> bool:
    raw = request.query.get(name, "false").lower()
    if raw not in ("true", "false", "1", "0", ""):
        raise web.HTTPBadRequest(
            text=f'{{"error": {{"code": "Invalid", "message": "{name}: expected true or false",'
            f' "field": "{name}"}}}}',
            content_type="application/json",
        )
    return raw in ("true", "1")


async def handle_diag(request: web.Request) -> web.Response:
    """`POST /v1/diag?level=1|2|3[&wait=true]`: one diagnostic at a time."""
    identity = await _authorize(request)
    raw = request.query.get("level", "1")
    if raw not in ("1", "2", "3"):
        return _error(400, "Invalid", f"level: must be 1, 2 or 3, got {raw!r}", "level")
    level = int(raw)
    wait = _flag(request, "wait")
    monitor = request.app[MONITOR]
    if not monitor.view.dcgm_status.available:
        return _error(
            503, "DcgmUnavailable", f"DCGM is not available: {monitor.view.dcgm_status.detail}"
        )
    if monitor.diag_running or request.app[DIAG_TASKS]:
        return _error(409, "DiagRunning", "a diagnostic is already running; one at a time")
    if level > 1 and not monitor.idle_or_unhealthy():
        return _error(
            409,
            "NodeBusy",
            f"level {level} runs only on an idle or quarantined node; GPUs are in use",
            "level",
        )
    log.info("diag_requested", level=level, user=identity.user)
    task = asyncio.create_task(_diag(monitor, level), name=f"diag-{level}")
    request.app[DIAG_TASKS].add(task)
    task.add_done_callback(request.app[DIAG_TASKS].discard)
    if not wait:
        return web.json_response({"started": True, "level": level}, status=202)
    result = await asyncio.shield(task)
    if isinstance(result, dcgm.DiagBusyError):
        return _error(409, "DiagRunning", str(result))
    return web.json_response(result.model_dump(mode="json", by_alias=True))


async def _diag(
    monitor: monitoring.Monitor, level: int
) -> readings.DiagResult | dcgm.DiagBusyError:
    """Run a diagnostic; a lost race with another one is a value, never an unretrieved error."""
    try:
        return await monitor.run_diag(level)
    except dcgm.DiagBusyError as err:
        log.warning("diag_busy", level=level, error=str(err))
        return err


_GPU_INDEX = re.compile(r"[0-9]{1,4}", re.ASCII)
_GPU_UUID = re.compile(r"(?:GPU|MIG)-[0-9A-Za-z-]{1,100}", re.ASCII)
_FAULT_CODE = re.compile(r"[A-Za-z0-9_.:-]{1,64}", re.ASCII)


async def handle_release(request: web.Request) -> web.Response:
    """`POST /v1/release?gpu=&code=&force=`: release latched faults by hand."""
    identity = await _authorize(request)
    gpu_raw = request.query.get("gpu") or ""
    gpu: str | int | None = None
    if _GPU_INDEX.fullmatch(gpu_raw):
        gpu = int(gpu_raw)
    elif _GPU_UUID.fullmatch(gpu_raw):
        gpu = gpu_raw
    elif gpu_raw:
        return _error(400, "InvalidParameter",
                      "gpu must be a GPU index (0-9999) or a GPU/MIG UUID", "gpu")  # fmt: skip
    code = request.query.get("code") or ""
    if code and not _FAULT_CODE.fullmatch(code):
        return _error(400, "InvalidParameter",
                      "code must be a fault code (letters, digits, . _ : -; 64 at most)",
                      "code")  # fmt: skip
    force = _flag(request, "force")
    released = await request.app[MONITOR].release(gpu=gpu, code=code or None, force=force)
    log.info("release_requested", user=identity.user, released=len(released), force=force)
    if not released:
        return _error(
            404,
            "NothingReleased",
            "no latched fault matched; faults other than Inspect need force=true",
            "code",
        )
    return web.json_response(
        {
            "released": [
                {"gpuUuid": u, **f.model_dump(mode="json", by_alias=True)} for u, f in released
            ]
        }
    )


class _Unavailable:
    """Deny writes when no Kubernetes credentials could be loaded, saying why."""

    def __init__(self, reason: str) -> None:
        self._reason = reason

    async def authorize(
        self, token: str, *, verb: str, node: str, subresource: str = ""
    ) -> auth.Identity:
        del token, verb, node, subresource
        raise auth.AuthError(401, f"authentication is unavailable: {self._reason}")


def make_app(
    config: settings.Settings,
    *,
    authenticator: auth.Authenticator | None = None,
    monitor: monitoring.Monitor | None = None,
) -> web.Application:
    """Build the agent's application; nothing starts until the app runs."""
    app = web.Application(middlewares=[errors], client_max_size=1024 * 1024)
    app[SETTINGS] = config
    app[LIFECYCLE] = Lifecycle()
    diag_tasks: set[asyncio.Task[Any]] = set()
    app[DIAG_TASKS] = diag_tasks
    app[MONITOR] = monitor or monitoring.Monitor(config)

    async def auth_ctx(app: web.Application) -> AsyncIterator[None]:
        async for _ in _authenticators(app):
            app[GATE] = auth.Gate(
                app[AUTHENTICATOR],
                auth.RateLimiter(rate_per_s=config.auth_rate_per_s, burst=config.auth_burst),
                ttl_s=config.auth_cache_s,
            )
            yield

    async def _authenticators(app: web.Application) -> AsyncIterator[None]:
        if authenticator is not None:
            app[AUTHENTICATOR] = authenticator
            yield
            return
        if not config.auth_enabled:
            app[AUTHENTICATOR] = auth.AllowAll()
            yield
            return
        from agent import k8sauth  # noqa: PLC0415 - kubernetes_asyncio only when auth is on

        try:
            k8s = await k8sauth.KubernetesAuthenticator.in_cluster(
                audience=config.auth_audience,
                controller_audience=config.auth_controller_audience,
            )
        except Exception as err:  # noqa: BLE001 - any config failure means "deny, say why"
            log.error("auth_unavailable", error=str(err))
            app[AUTHENTICATOR] = _Unavailable(str(err))
            yield
            return
        app[AUTHENTICATOR] = k8s
        yield
        await k8s.close()

    async def monitor_ctx(app: web.Application) -> AsyncIterator[None]:
        mon = app[MONITOR]
        await mon.start()
        yield
        running: set[asyncio.Task[Any]] = app[DIAG_TASKS]
        for task in list(running):
            task.cancel()
        for task in list(running):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await mon.stop()

    async def reporter_ctx(app: web.Application) -> AsyncIterator[None]:
        reporter = reporting.Reporter(config, app[MONITOR])
        app[REPORTER] = reporter
        await reporter.start()
        app[LIFECYCLE].ready = True
        yield
        app[LIFECYCLE].ready = False
        await reporter.stop()

    app.cleanup_ctx.extend([auth_ctx, monitor_ctx, reporter_ctx])

    async def on_shutdown(app: web.Application) -> None:
        app[LIFECYCLE].ready = False

    app.on_shutdown.append(on_shutdown)
    app.router.add_get("/metrics", handle_metrics)
    app.router.add_get("/healthz", handle_healthz)
    app.router.add_get("/readyz", handle_readyz)
    app.router.add_get("/v1/gpus", handle_gpus)
    app.router.add_post("/v1/diag", handle_diag)
    app.router.add_post("/v1/release", handle_release)
    return app


async def serve(config: settings.Settings, stop: asyncio.Event) -> None:
    """Run the app until `stop` is set; readiness goes false first, then the site stops."""
    app = make_app(config)
    runner = web.AppRunner(app, handle_signals=False, keepalive_timeout=config.http_idle_timeout_s)
    await runner.setup()
    site = web.TCPSite(runner, config.listen_host, config.port)
    await site.start()
    log.info("listening", host=config.listen_host, port=config.port)
    await stop.wait()
    app[LIFECYCLE].ready = False
    # Endpoints controllers take a moment to see readiness go false; keep serving meanwhile.
    log.info("shutting_down", grace_s=config.shutdown_grace_s)
    await asyncio.sleep(config.shutdown_grace_s)
    await runner.cleanup()
