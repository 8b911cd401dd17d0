"""The researcher's HTTP API: submit, list, inspect, cancel and follow runs (DESIGN.md §4).

Every call is authorised by SubjectAccessReview against the Kubernetes verb it stands for,
in the run's namespace: `create tauruns.taugrid.dev` to submit, `get`/`list` to read,
`delete` (or `patch`) to cancel, `get pods/log` to read logs. So a researcher can act only
where RBAC lets them, and the controller's own, wider rights are never lent out.

Namespace of a submission: `?namespace=`, else the spec's `namespace`, else `default`.
Names are the spec's `name`: a second submission of the same name answers 409, unless it
carries the same `Idempotency-Key` as the first (then 200 with the existing run), so a client
can retry a POST whose answer it lost.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import hashlib
import hmac
import json
import pathlib
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from aiohttp import web

from controller import app as controller_app
from controller import auth, errors, marks, timestamps
from controller.kube import runs as kube_runs
from controller.runs import checkpoints, lifecycle, reconciling, rendering
from shared import spec as specs

log = structlog.get_logger()

GROUP = "taugrid.dev"
RESOURCE = "tauruns"
CLIENT_SCRIPT = pathlib.Path(__file__).resolve().parent / "assets" / "tau"
_NAMESPACE_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_STATUS_BY_KIND = {
    specs.SpecErrorKind.TOO_LARGE: 413,
    specs.SpecErrorKind.UNSUPPORTED_MEDIA_TYPE: 415,
    specs.SpecErrorKind.MALFORMED: 400,
    specs.SpecErrorKind.INVALID: 422,
}
LOG_POLL_S = 0.5
RUN_TOKEN_TTL_S = 60.0
MAX_CACHED_RUN_TOKENS = 10_000

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclasses.dataclass
class RunsContext:
    """The run reconciler and its adapter, shared by the handlers."""

    store: kube_runs.RunStore
    reconciler: reconciling.Reconciler
    run_tokens: dict[tuple[str, str], tuple[str, float]] = dataclasses.field(default_factory=dict)
    """(namespace, run) -> (the digest of its run-scoped token, when read)."""

    async def run_token_digest(self, namespace: str, name: str) -> str | None:
        """The SHA-256 of the run's token, from its status; cached for RUN_TOKEN_TTL_S (a
        run without one yet is not cached: its first reconcile is about to record it)."""
        now = time.monotonic()
        cached = self.run_tokens.get((namespace, name))
        if cached is not None and now - cached[1] < RUN_TOKEN_TTL_S:
            return cached[0]
        item = await self.store.get_run(namespace, name)
        digest = str(((item or {}).get("status") or {}).get(reconciling.TOKEN_DIGEST_FIELD) or "")
        if not digest:
            return None
        if len(self.run_tokens) >= MAX_CACHED_RUN_TOKENS:
            self.run_tokens.clear()
        self.run_tokens[(namespace, name)] = (digest, now)
        return digest


RUNS = web.AppKey("runs", RunsContext)


def start(app: web.Application, api: Any, st: controller_app.ControllerState) -> asyncio.Task[None]:
    """Build the reconciler for a started app and return its running task (the cleanup
    context that calls this cancels it)."""
    s = st.settings
    store = kube_runs.RunStore(api)
    render = rendering.RenderSettings(
        controller_url=s.run_controller_url or st.url,
        termination_grace_period_s=s.run_termination_grace_s,
        ray_version=s.ray_version,
        ca_pem=controller_app.read_run_ca(s),
    )
    reconciler = reconciling.Reconciler(
        store, st.elector, st.metrics, render,
        pass_interval_s=s.run_pass_interval_s,
        ttl_after_finished_s=s.run_ttl_after_finished_s,
        pod_annotations=s.run_pod_annotations,
        manager=s.run_manager,
        resume_priority_class=s.resume_priority_class,
        checkpoints_kept=s.run_checkpoints_kept,
        gate_message=st.gate.message_for,
    )  # fmt: skip
    if s.run_urgent_resume:
        st.quarantiner.on_quarantine.append(reconciler.urgent)
    else:
        st.quarantiner.on_quarantine.append(lambda _node: reconciler.poke())
    app[RUNS] = RunsContext(store, reconciler)
    return asyncio.create_task(reconciler.run(), name="runs")


def add_routes(app: web.Application) -> None:
    """Register the researcher routes."""
    app.router.add_post("/v1/runs", post_run)
    app.router.add_get("/v1/runs", list_runs)
    app.router.add_get("/v1/runs/{namespace}/{name}", get_run)
    app.router.add_delete("/v1/runs/{namespace}/{name}", cancel_run)
    app.router.add_get("/v1/runs/{namespace}/{name}/logs", get_logs)
    app.router.add_get("/v1/runs/{namespace}/{name}/evidence", get_evidence)
    app.router.add_post("/v1/runs/{namespace}/{name}/checkpoints", post_checkpoint)
    app.router.add_get("/v1/runs/{namespace}/{name}/checkpoints", list_checkpoints)
    app.router.add_get("/v1/runs/{namespace}/{name}/checkpoints/latest", get_latest_checkpoint)
    app.router.add_post("/v1/runs/{namespace}/{name}/resume", post_resume)
    app.router.add_get("/v1/queues", get_queues)
    app.router.add_get("/v1/schema/run", get_schema)
    app.router.add_get("/tau", get_client)


# ---------------------------------------------------------------------- helpers
def _leader_only(handler: Handler) -> Handler:
    """`app.leader_only`, looked up at call time: `controller.app` imports this module."""

    async def wrapped(request: web.Request) -> web.StreamResponse:
        return await controller_app.leader_only(handler)(request)

    wrapped.__doc__ = handler.__doc__
    wrapped.__name__ = handler.__name__
    return wrapped


def _ctx(request: web.Request) -> RunsContext:
    if RUNS not in request.app:
        raise errors.ApiError(503, "Starting", "the controller is starting; retry shortly")
    return request.app[RUNS]


async def _identity(request: web.Request) -> auth.Identity:
    st = controller_app.state_of(request)
    return await st.authn.authenticate(request.headers.get("Authorization"))


async def _allow(
    request: web.Request,
    identity: auth.Identity,
    verb: str,
    namespace: str | None,
    *,
    resource: str = RESOURCE,
    group: str = GROUP,
    subresource: str = "",
) -> None:
    st = controller_app.state_of(request)
    access = auth.Access(verb=verb, resource=resource, group=group, namespace=namespace,
                         subresource=subresource)  # fmt: skip
    await st.authn.authorize(identity, access)


def _check_namespace(namespace: str, field: str = "namespace") -> str:
    if len(namespace) > 63 or not _NAMESPACE_RE.match(namespace):
        msg = f"{namespace!r} is not a valid namespace name"
        raise errors.ApiError(400, "Invalid", msg, field)
    return namespace


def _spec_error(err: specs.SpecError) -> errors.ApiError:
    return errors.ApiError(
        _STATUS_BY_KIND.get(err.kind, 422), str(err.kind), str(err), err.field,
        problems=[p.as_dict() for p in err.problems],
    )  # fmt: skip


def run_json(item: dict[str, Any], *, with_spec: bool = True) -> dict[str, Any]:
    """The API's view of a TauRun: what a researcher asks about, in camelCase."""
    meta = item.get("metadata") or {}
    spec = item.get("spec") or {}
    status = item.get("status") or {}
    out: dict[str, Any] = {
        "name": meta.get("name", ""),
        "namespace": meta.get("namespace", ""),
        "kind": spec.get("kind", str(specs.RunKind.JOB)),
        "queue": spec.get("queue", specs.DEFAULT_QUEUE),
        "phase": status.get("phase", str(lifecycle.Phase.PENDING)),
        "reason": status.get("reason", ""),
        "message": status.get("message", ""),
        "attempt": status.get("currentAttempt", 0),
        "queuePosition": status.get("queuePosition"),
        "queuePositionInLocalQueue": status.get("queuePositionInLocalQueue"),
        "queuePositionSource": status.get("queuePositionSource"),
        "gpus": int((spec.get("resources") or {}).get("gpus") or 0) * int(spec.get("workers") or 1),
        "createdAt": meta.get("creationTimestamp"),
        "startTime": status.get("startTime"),
        "endTime": status.get("endTime"),
        "attempts": status.get("attempts") or [],
        "conditions": status.get("conditions") or [],
        "checkpoints": status.get("checkpoints") or [],
    }
    if with_spec:
        out["spec"] = spec
    return out


# ---------------------------------------------------------------------- submit
@_leader_only
async def post_run(request: web.Request) -> web.StreamResponse:
    """Submit a run: the body is a tau.yaml (YAML or JSON)."""
    st = controller_app.state_of(request)
    ctx = _ctx(request)
    outcome = "invalid"
    try:
        identity = await _identity(request)
        namespace = request.query.get("namespace") or None
        if namespace is not None:
            _check_namespace(namespace)
            await _allow(request, identity, "create", namespace)
        raw = await controller_app.read_body(request, specs.MAX_SPEC_BYTES)
        try:
            parsed = await asyncio.to_thread(specs.parse_spec, raw, _content_type(request))
        except specs.SpecError as err:
            raise _spec_error(err) from err
        spec = parsed.spec
        if namespace is None:
            namespace = spec.namespace or "default"
            await _allow(request, identity, "create", namespace)
        key = request.headers.get("Idempotency-Key", "").strip()
        annotations = {
            marks.SUBMITTED_BY_ANNOTATION: identity.username[:253],
            marks.MANAGED_BY_ANNOTATION: ctx.reconciler.manager,
        }
        if key:
            annotations[marks.IDEMPOTENCY_ANNOTATION] = _key_digest(key)
        body = {
            "apiVersion": specs.API_VERSION,
            "kind": "TauRun",
            "metadata": {"name": spec.name, "namespace": namespace, "annotations": annotations},
            "spec": specs.spec_to_wire(spec),
        }
        st.elector.ensure_leader()
        try:
            created = await ctx.store.create_run(namespace, body)
        except kube_runs.NotFoundError as err:
            msg = f"namespace {namespace!r} does not exist"
            raise errors.ApiError(404, "NotFound", msg, "namespace") from err
        except kube_runs.ConflictError as err:
            existing = await ctx.store.get_run(namespace, spec.name)
            stored = ((existing or {}).get("metadata") or {}).get("annotations") or {}
            if (
                existing is not None
                and key
                and stored.get(marks.IDEMPOTENCY_ANNOTATION) == _key_digest(key)
            ):
                outcome = "replayed"
                return web.json_response(run_json(existing), status=200)
            outcome = "conflict"
            msg = (
                f"a run named {spec.name!r} already exists in namespace {namespace}; choose"
                " another name (or resend with the first submission's Idempotency-Key)"
            )
            raise errors.ApiError(409, "AlreadyExists", msg, "name") from err
        result = await ctx.reconciler.reconcile_now(namespace, spec.name) or created
        outcome = "created"
        log.info("run submitted", run=f"{namespace}/{spec.name}", user=identity.username)
        return web.json_response(
            {**run_json(result), "warnings": list(parsed.warnings)}, status=201
        )
    except auth.Forbidden:
        outcome = "forbidden"
        raise
    finally:
        st.metrics.run_submissions.labels(outcome).inc()


def _content_type(request: web.Request) -> str | None:
    """The body's type; what curl and generic clients send by default reads as YAML (which
    also reads JSON), so `curl --data-binary @tau.yaml` works as a researcher expects."""
    value = request.headers.get("Content-Type")
    media = (value or "").split(";", 1)[0].strip().lower()
    if media in _GENERIC_TYPES:
        return None
    return value


_GENERIC_TYPES = frozenset({"", "application/x-www-form-urlencoded", "application/octet-stream"})


def _key_digest(key: str) -> str:
    """Keys are stored hashed: they may be long, and they are the client's business."""
    return hashlib.sha256(key.encode()).hexdigest()[:40]


# ---------------------------------------------------------------------- read
async def list_runs(request: web.Request) -> web.StreamResponse:
    """List runs; filters: namespace, phase, queue."""
    identity = await _identity(request)
    namespace = request.query.get("namespace") or None
    if namespace is not None:
        _check_namespace(namespace)
    await _allow(request, identity, "list", namespace)
    items = await _ctx(request).store.list_runs(namespace)
    phase = request.query.get("phase")
    queue = request.query.get("queue")
    out = [run_json(i, with_spec=False) for i in items]
    if phase:
        out = [r for r in out if r["phase"].lower() == phase.lower()]
    if queue:
        out = [r for r in out if r["queue"] == queue]
    out.sort(key=lambda r: (r["namespace"], r["createdAt"] or "", r["name"]))
    return web.json_response({"items": out})


async def _read_run(
    request: web.Request, verb: str = "get"
) -> tuple[auth.Identity, dict[str, Any]]:
    identity = await _identity(request)
    namespace = _check_namespace(request.match_info["namespace"])
    name = request.match_info["name"]
    await _allow(request, identity, verb, namespace)
    item = await _ctx(request).store.get_run(namespace, name)
    if item is None:
        msg = f"no run named {name!r} in namespace {namespace}"
        raise errors.ApiError(404, "NotFound", msg, "name")
    return identity, item


async def get_run(request: web.Request) -> web.StreamResponse:
    """One run with its attempts, queue position, message and checkpoints."""
    _, item = await _read_run(request)
    return web.json_response(run_json(item))


async def get_evidence(request: web.Request) -> web.StreamResponse:
    """The run's evidence record: enough to reproduce it and to see where it ran."""
    _, item = await _read_run(request)
    status = item.get("status") or {}
    meta = item.get("metadata") or {}
    body = {
        "name": meta.get("name"),
        "namespace": meta.get("namespace"),
        "uid": meta.get("uid"),
        "phase": status.get("phase", str(lifecycle.Phase.PENDING)),
        **(status.get("evidence") or {}),
        "attempts": status.get("attempts") or [],
    }
    return web.json_response(body)


# ---------------------------------------------------------------------- cancel
@_leader_only
async def cancel_run(request: web.Request) -> web.StreamResponse:
    """Cancel a run: delete its attempt (freeing its quota); the TauRun stays, Cancelled."""
    identity = await _identity(request)
    namespace = _check_namespace(request.match_info["namespace"])
    name = request.match_info["name"]
    try:
        await _allow(request, identity, "delete", namespace)
    except auth.Forbidden:
        await _allow(request, identity, "patch", namespace)
    ctx = _ctx(request)
    item = await ctx.store.get_run(namespace, name)
    if item is None:
        msg = f"no run named {name!r} in namespace {namespace}"
        raise errors.ApiError(404, "NotFound", msg, "name")
    phase = (item.get("status") or {}).get("phase")
    if phase in {lifecycle.Phase.SUCCEEDED, lifecycle.Phase.FAILED}:
        msg = f"run {name!r} has already ended ({phase}); there is nothing to cancel"
        raise errors.ApiError(409, "AlreadyEnded", msg, "name")
    if phase != lifecycle.Phase.CANCELLED:
        stamp = timestamps.rfc3339(dt.datetime.now(dt.UTC))
        controller_app.state_of(request).elector.ensure_leader()
        await ctx.store.annotate_run(
            namespace, name, {marks.CANCEL_ANNOTATION: f"{identity.username[:200]} {stamp}"}
        )
        item = await ctx.reconciler.reconcile_now(namespace, name) or item
        log.info("run cancelled", run=f"{namespace}/{name}", user=identity.username)
    return web.json_response(run_json(item))


# ---------------------------------------------------------------------- checkpoints
async def _run_caller(request: web.Request, verb: str, subresource: str = "") -> str:
    """Authenticate a checkpoint call: the run's own token (from its pods), or a Kubernetes
    identity allowed `verb` on the TauRun (a person). Return who called, for the log.

    Run-scoped tokens carry a prefix, so one is never sent to TokenReview, and one run's
    token used on another run is refused with 403 at once.
    """
    namespace = _check_namespace(request.match_info["namespace"])
    name = request.match_info["name"]
    token = auth.bearer_token(request.headers.get("Authorization"))
    if token.startswith(reconciling.RUN_TOKEN_PREFIX):
        expected = await _ctx(request).run_token_digest(namespace, name)
        got = reconciling.token_digest(token)
        if expected is None or not hmac.compare_digest(got.encode(), expected.encode()):
            msg = (
                f"this run-scoped token does not belong to run {namespace}/{name}: a run's"
                " token works only for that run"
            )
            raise errors.ApiError(403, "Forbidden", msg, "Authorization")
        return f"run {namespace}/{name}"
    identity = await _identity(request)
    await _allow(request, identity, verb, namespace, subresource=subresource)
    return identity.username


async def _json_body(request: web.Request, *, optional: bool = False) -> Any:
    limit = controller_app.state_of(request).settings.max_body_bytes
    raw = await controller_app.read_body(request, limit)
    if not raw.strip():
        if optional:
            return {}
        raise errors.ApiError(400, "Malformed", "the body is empty; send a JSON object", "body")
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as err:
        msg = f"the body is not JSON: {err}"
        raise errors.ApiError(400, "Malformed", msg, "body") from err


@_leader_only
async def post_checkpoint(request: web.Request) -> web.StreamResponse:
    """A run's pod reports a checkpoint it saved (`tau checkpoint --step N --path P`)."""
    caller = await _run_caller(request, "update", "status")
    namespace, name = request.match_info["namespace"], request.match_info["name"]
    try:
        report = checkpoints.parse_report(await _json_body(request))
    except checkpoints.ReportError as err:
        raise errors.ApiError(422, "Invalid", str(err), err.field) from err
    try:
        entry = await _ctx(request).reconciler.record_checkpoint(namespace, name, report)
    except reconciling.RunNotFoundError as err:
        msg = f"no run named {name!r} in namespace {namespace}"
        raise errors.ApiError(404, "NotFound", msg, "name") from err
    except checkpoints.FencedError as err:
        raise errors.ApiError(409, err.reason, str(err), "attempt") from err
    log.debug("checkpoint reported", run=f"{namespace}/{name}", by=caller)
    return web.json_response(entry, status=201)


async def _checkpoints_of(request: web.Request) -> list[dict[str, Any]]:
    await _run_caller(request, "get")
    namespace, name = request.match_info["namespace"], request.match_info["name"]
    item = await _ctx(request).store.get_run(namespace, name)
    if item is None:
        msg = f"no run named {name!r} in namespace {namespace}"
        raise errors.ApiError(404, "NotFound", msg, "name")
    return list((item.get("status") or {}).get("checkpoints") or [])


async def list_checkpoints(request: web.Request) -> web.StreamResponse:
    """The checkpoints the run's status keeps, oldest first."""
    return web.json_response({"items": await _checkpoints_of(request)})


async def get_latest_checkpoint(request: web.Request) -> web.StreamResponse:
    """The newest checkpoint (`tau checkpoint latest`); 404 when none was reported."""
    kept = await _checkpoints_of(request)
    if not kept:
        name = request.match_info["name"]
        raise errors.ApiError(404, "NoCheckpoint", f"run {name!r} has reported no checkpoint")
    return web.json_response(kept[-1])


@_leader_only
async def post_resume(request: web.Request) -> web.StreamResponse:
    """Start the next attempt of a Failed or Cancelled run, from the latest checkpoint or
    the one named in the body (`{"checkpoint": "/ckpt/step-100"}`)."""
    identity = await _identity(request)
    namespace = _check_namespace(request.match_info["namespace"])
    name = request.match_info["name"]
    await _allow(request, identity, "patch", namespace)
    body = await _json_body(request, optional=True)
    if not isinstance(body, dict):
        raise errors.ApiError(422, "Invalid", "the body must be a JSON object", "body")
    unknown = sorted(set(body) - {"checkpoint"})
    if unknown:
        msg = f"unknown field {unknown[0]!r}; allowed: checkpoint"
        raise errors.ApiError(422, "Invalid", msg, unknown[0])
    checkpoint = body.get("checkpoint")
    if checkpoint is not None and (
        not isinstance(checkpoint, str) or not checkpoint.strip()
        or len(checkpoint) > checkpoints.MAX_PATH or "\n" in checkpoint
    ):  # fmt: skip
        msg = f"checkpoint must be a path of at most {checkpoints.MAX_PATH} characters"
        raise errors.ApiError(422, "Invalid", msg, "checkpoint")
    try:
        item = await _ctx(request).reconciler.request_resume(
            namespace, name, checkpoint=checkpoint, by=identity.username[:200]
        )
    except reconciling.RunNotFoundError as err:
        msg = f"no run named {name!r} in namespace {namespace}"
        raise errors.ApiError(404, "NotFound", msg, "name") from err
    except reconciling.ResumeRefusedError as err:
        raise errors.ApiError(409, "NotResumable", str(err), "name") from err
    return web.json_response(run_json(item))


# ---------------------------------------------------------------------- logs
def _pick_pod(
    kind: str, pods: list[dict[str, Any]], worker: int
) -> tuple[dict[str, Any], str] | None:
    """The pod and container of worker `worker` (ray: 0 is the head, 1.. the workers)."""
    views = sorted(
        ((lifecycle.parse_pod(p), p) for p in pods),
        key=lambda vp: (vp[0].index if vp[0].index is not None else 0, vp[0].created or
                        dt.datetime.min.replace(tzinfo=dt.UTC), vp[0].name),
    )  # fmt: skip
    if kind == str(specs.RunKind.RAY):
        heads = [vp for vp in views if rendering.RAY_HEAD_CONTAINER in vp[0].containers]
        workers = [vp for vp in views if rendering.RAY_WORKER_CONTAINER in vp[0].containers]
        if worker == 0:
            return (heads[0][1], rendering.RAY_HEAD_CONTAINER) if heads else None
        if worker - 1 < len(workers):
            return workers[worker - 1][1], rendering.RAY_WORKER_CONTAINER
        return None
    live = [vp for vp in views if not vp[0].deleting] or views
    if worker < len(live):
        return live[worker][1], rendering.CONTAINER_NAME
    return None


async def get_logs(request: web.Request) -> web.StreamResponse:
    """Stream a worker's log (`follow=true` keeps it open until the container ends)."""
    identity = await _identity(request)
    namespace = _check_namespace(request.match_info["namespace"])
    name = request.match_info["name"]
    await _allow(request, identity, "get", namespace, resource="pods", group="",
                 subresource="log")  # fmt: skip
    st = controller_app.state_of(request)
    ctx = _ctx(request)
    follow = request.query.get("follow", "").lower() in {"1", "true", "yes"}
    try:
        worker = int(request.query.get("worker", "0"))
        attempt_q = request.query.get("attempt")
        tail = request.query.get("tail")
        tail_lines = int(tail) if tail else None
        attempt = int(attempt_q) if attempt_q else None
    except ValueError as err:
        raise errors.ApiError(400, "Invalid", "attempt, worker and tail are numbers") from err
    if worker < 0:
        raise errors.ApiError(400, "Invalid", "worker counts from 0", "worker")
    deadline = asyncio.get_running_loop().time() + (st.settings.logs_wait_s if follow else 0)
    while True:
        item = await ctx.store.get_run(namespace, name)
        if item is None:
            msg = f"no run named {name!r} in namespace {namespace}"
            raise errors.ApiError(404, "NotFound", msg, "name")
        status = item.get("status") or {}
        number = attempt or int(status.get("currentAttempt") or 0)
        kind = str((item.get("spec") or {}).get("kind") or specs.RunKind.JOB)
        selector = f"{marks.RUN_LABEL}={name},{marks.ATTEMPT_LABEL}={number}"
        picked = _pick_pod(kind, await ctx.store.list_pods(namespace, selector), worker)
        started = picked is not None and lifecycle.parse_pod(picked[0]).phase != "Pending"
        if started or asyncio.get_running_loop().time() >= deadline:
            break
        if status.get("phase") in {lifecycle.Phase.CANCELLED, lifecycle.Phase.FAILED}:
            break
        await asyncio.sleep(LOG_POLL_S)
    if picked is None:
        msg = f"run {name!r} has no pod for worker {worker} of attempt {number} (yet)"
        raise errors.ApiError(404, "NoPod", msg, "worker")
    pod, container = picked
    pod_name = str(pod["metadata"]["name"])
    resp = web.StreamResponse(headers={"Content-Type": "text/plain; charset=utf-8",
                                       "X-TauGrid-Pod": pod_name})  # fmt: skip
    chunks = ctx.store.stream_log(namespace, pod_name, container, follow=follow,
                                  tail_lines=tail_lines)  # fmt: skip
    try:
        first = await anext(chunks, b"")
    except Exception as err:
        text = getattr(err, "body", None) or str(err)
        msg = f"the log of pod {pod_name} is not available: {text}"
        raise errors.ApiError(409, "LogUnavailable", msg) from err
    await resp.prepare(request)
    try:
        if first:
            await resp.write(first)
        async for chunk in chunks:
            await resp.write(chunk)
    except (ConnectionResetError, asyncio.CancelledError):
        await chunks.aclose()  # type: ignore[attr-defined]
        raise
    await resp.write_eof()
    return resp


# ---------------------------------------------------------------------- queues
async def get_queues(request: web.Request) -> web.StreamResponse:
    """The namespace's LocalQueues: their ClusterQueue's quota and usage, and who waits."""
    identity = await _identity(request)
    namespace = _check_namespace(request.query.get("namespace") or "default")
    await _allow(request, identity, "list", namespace)
    ctx = _ctx(request)
    lqs, cqs, items = await asyncio.gather(
        ctx.store.list_kueue("localqueues", namespace),
        ctx.store.list_kueue("clusterqueues"),
        ctx.store.list_runs(namespace),
    )
    by_cq = {str(cq["metadata"]["name"]): cq for cq in cqs}
    out = []
    for lq in lqs:
        name = str(lq["metadata"]["name"])
        cq_name = str((lq.get("spec") or {}).get("clusterQueue", ""))
        cq = by_cq.get(cq_name) or {}
        waiting = [
            run_json(i, with_spec=False) for i in items
            if (i.get("spec") or {}).get("queue", specs.DEFAULT_QUEUE) == name
            and (i.get("status") or {}).get("phase") == lifecycle.Phase.QUEUED
        ]  # fmt: skip
        waiting.sort(key=lambda r: (r["queuePosition"] is None, r["queuePosition"] or 0))
        lq_status = lq.get("status") or {}
        out.append(
            {
                "name": name,
                "namespace": namespace,
                "clusterQueue": cq_name,
                "pendingWorkloads": int(lq_status.get("pendingWorkloads") or 0),
                "admittedWorkloads": int(lq_status.get("admittedWorkloads") or 0),
                "resources": _cq_resources(cq),
                "waiting": [
                    {
                        k: r[k]
                        for k in ("name", "gpus", "queuePosition", "queuePositionSource", "message")
                    }
                    for r in waiting
                ],
            }
        )
    return web.json_response({"namespace": namespace, "items": out})


def _cq_resources(cq: dict[str, Any]) -> list[dict[str, Any]]:
    """Quota and usage per flavor and resource of a ClusterQueue."""
    used: dict[tuple[str, str], str] = {}
    for flavor in (cq.get("status") or {}).get("flavorsReservation") or []:
        for res in flavor.get("resources") or []:
            used[(str(flavor.get("name")), str(res.get("name")))] = str(res.get("total", "0"))
    out = []
    for group in (cq.get("spec") or {}).get("resourceGroups") or []:
        for flavor in group.get("flavors") or []:
            for res in flavor.get("resources") or []:
                key = (str(flavor.get("name")), str(res.get("name")))
                out.append({"flavor": key[0], "resource": key[1],
                            "quota": str(res.get("nominalQuota", "0")),
                            "used": used.get(key, "0")})  # fmt: skip
    return out


# ---------------------------------------------------------------------- static
async def get_schema(request: web.Request) -> web.StreamResponse:
    """The JSON Schema of tau.yaml."""
    return web.json_response(specs.spec_json_schema())


async def get_client(request: web.Request) -> web.StreamResponse:
    """The `tau` client script (Python 3, standard library only)."""
    body = await asyncio.to_thread(CLIENT_SCRIPT.read_bytes)
    return web.Response(
        body=body,
        headers={"Content-Type": "text/x-python; charset=utf-8",
                 "Content-Disposition": 'attachment; filename="tau"'},
    )  # fmt: skip
