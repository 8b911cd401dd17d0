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
import datetime as dt
import hashlib
import hmac
import json
from typing import Any

import pydantic
import structlog
from aiohttp import web

from controller import auth, errors, marks, serving, timestamps
from controller.kube import runs as kube_runs
from controller.runs import (
    checkpoints,
    context,
    experiments,
    keptlogs,
    lifecycle,
    logs,
    objects,
    preflight,
    queues,
    reconciling,
    records,
    reruns,
    results,
)
from shared import spec as specs

log = structlog.get_logger()

REQUEST_BODIES: dict[str, type[pydantic.BaseModel]] = {"ResultReport": results.ResultReport}
"""Request bodies of the runs API given as models, for the OpenAPI document."""

_SPEC_ERRORS: dict[specs.SpecErrorKind, type[errors.Invalid]] = {
    specs.SpecErrorKind.TOO_LARGE: errors.TooLarge,
    specs.SpecErrorKind.UNSUPPORTED_MEDIA_TYPE: errors.UnsupportedMediaType,
    specs.SpecErrorKind.MALFORMED: errors.Malformed,
    specs.SpecErrorKind.INVALID: errors.Invalid,
}


def add_routes(app: web.Application) -> None:
    """Register the researcher routes."""
    app.router.add_post("/v1/runs", post_run)
    app.router.add_get("/v1/runs", list_runs)
    app.router.add_get("/v1/runs/{namespace}/{name}", get_run)
    app.router.add_delete("/v1/runs/{namespace}/{name}", cancel_run)
    app.router.add_get("/v1/runs/{namespace}/{name}/logs", logs.get_logs)
    app.router.add_get("/v1/runs/{namespace}/{name}/evidence", get_evidence)
    app.router.add_post("/v1/runs/{namespace}/{name}/checkpoints", post_checkpoint)
    app.router.add_get("/v1/runs/{namespace}/{name}/checkpoints", list_checkpoints)
    app.router.add_get("/v1/runs/{namespace}/{name}/checkpoints/latest", get_latest_checkpoint)
    app.router.add_post("/v1/runs/{namespace}/{name}/resume", post_resume)
    app.router.add_post("/v1/runs/{namespace}/{name}/rerun", post_rerun)
    app.router.add_post("/v1/runs/{namespace}/{name}/results", post_results)
    app.router.add_get("/v1/runs/{namespace}/{name}/results", get_results)
    app.router.add_get("/v1/experiments", experiments.list_experiments)
    app.router.add_get("/v1/experiments/compare", experiments.compare)
    app.router.add_get("/v1/queues", queues.get_queues)
    app.router.add_get("/v1/schema/run", get_schema)


def _spec_error(err: specs.SpecError) -> errors.Invalid:
    kind = _SPEC_ERRORS.get(err.kind, errors.Invalid)
    problems = [p.as_dict() for p in err.problems]
    return kind(str(err), field=err.field, code=str(err.kind), problems=problems)


# ---------------------------------------------------------------------- submit
async def post_run(request: web.Request) -> web.StreamResponse:
    """Submit a run: the body is a tau.yaml (YAML or JSON)."""
    st = serving.serving_of(request)
    ctx = context.context_of(request)
    outcome = "invalid"
    try:
        identity = await serving.identity(request)
        namespace = request.query.get("namespace") or None
        if namespace is not None:
            context.check_namespace(namespace)
            await context.allow(request, identity, "create", namespace)
        raw = await serving.read_body(request, specs.MAX_SPEC_BYTES)
        try:
            parsed = await asyncio.to_thread(specs.parse_spec, raw, _content_type(request))
        except specs.SpecError as err:
            raise _spec_error(err) from err
        spec = parsed.spec
        if namespace is None:
            namespace = spec.namespace or "default"
            await context.allow(request, identity, "create", namespace)
        context.check_run_namespace(request, namespace)
        if (leader := await serving.unless_leader(request, identity, raw)) is not None:
            outcome = "forwarded"
            return leader
        checked = await preflight.run(ctx.store, spec, namespace)
        key = request.headers.get("Idempotency-Key", "").strip()
        annotations = {
            marks.SUBMITTED_BY_ANNOTATION: identity.username[:253],
            marks.MANAGED_BY_ANNOTATION: ctx.reconciler.manager,
        }
        if key:
            annotations[marks.IDEMPOTENCY_ANNOTATION] = _key_digest(key)
        try:
            created = await _create_run(request, spec, namespace, annotations)
        except kube_runs.ConflictError as err:
            existing = await ctx.store.get_run(namespace, spec.name)
            stored = ((existing or {}).get("metadata") or {}).get("annotations") or {}
            if (
                existing is not None
                and key
                and stored.get(marks.IDEMPOTENCY_ANNOTATION) == _key_digest(key)
            ):
                outcome = "replayed"
                return web.json_response(context.run_json(existing), status=200)
            outcome = "conflict"
            msg = (
                f"a run named {spec.name!r} already exists in namespace {namespace}; choose"
                " another name (or resend with the first submission's Idempotency-Key)"
            )
            raise errors.Conflict(msg, field="name", code="AlreadyExists") from err
        result = await ctx.reconciler.reconcile_now(namespace, spec.name) or created
        outcome = "created"
        log.info("run submitted", run=f"{namespace}/{spec.name}", user=identity.username)
        return web.json_response(
            {**context.run_json(result), "warnings": [*parsed.warnings, *checked]}, status=201
        )
    except errors.Forbidden:
        outcome = "forbidden"
        raise
    finally:
        st.metrics.run_submissions.labels(outcome).inc()


async def _create_run(
    request: web.Request, spec: specs.TauSpec, namespace: str, annotations: dict[str, str]
) -> dict[str, Any]:
    """Create the TauRun of a validated, pre-flighted spec; NotFound for a namespace that
    does not exist; kube_runs.ConflictError (for the caller to word) when the name is taken."""
    body = {
        "apiVersion": specs.API_VERSION,
        "kind": "TauRun",
        "metadata": {"name": spec.name, "namespace": namespace, "annotations": annotations},
        "spec": specs.spec_to_wire(spec),
    }
    serving.serving_of(request).elector.ensure_leader()
    try:
        return await context.context_of(request).store.create_run(namespace, body)
    except kube_runs.NotFoundError as err:
        msg = f"namespace {namespace!r} does not exist"
        raise errors.NotFound(msg, field="namespace") from err


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
    """List runs; filters: namespace, phase, queue, experiment (its name)."""
    identity = await serving.identity(request)
    namespace = request.query.get("namespace") or None
    if namespace is not None:
        context.check_namespace(namespace)
    await context.allow(request, identity, "list", namespace)
    with serving.serving_of(request).limits.expensive_reads.hold(
        identity.username, identity.username
    ):
        items = await context.context_of(request).store.list_runs(namespace)
    phase = request.query.get("phase")
    queue = request.query.get("queue")
    experiment = request.query.get("experiment")
    out = [context.run_json(i, with_spec=False) for i in items]
    if phase:
        out = [r for r in out if r["phase"].lower() == phase.lower()]
    if queue:
        out = [r for r in out if r["queue"] == queue]
    if experiment:
        out = [r for r in out if (r["experiment"] or {}).get("name") == experiment]
    out.sort(key=lambda r: (r["namespace"], r["createdAt"] or "", r["name"]))
    return web.json_response({"items": out})


async def get_run(request: web.Request) -> web.StreamResponse:
    """One run with its attempts, queue position, message and checkpoints."""
    _, item = await context.read_run(request)
    return web.json_response(context.run_json(item))


async def get_evidence(request: web.Request) -> web.StreamResponse:
    """The run's evidence record: enough to reproduce it and to see where it ran, and which
    workers' logs are kept (their text: `GET …/logs?attempt=N&worker=K`, needs pods/log)."""
    _, item = await context.read_run(request)
    status = item.get("status") or {}
    meta = item.get("metadata") or {}
    ref = objects.run_ref(item)
    logs_kept = await context.context_of(request).store.list_run_logs(
        ref.namespace, f"{marks.RUN_LABEL}={ref.name}"
    )
    body = {
        "name": meta.get("name"),
        "namespace": meta.get("namespace"),
        "uid": meta.get("uid"),
        "phase": status.get("phase", str(lifecycle.Phase.PENDING)),
        **(status.get("evidence") or {}),
        "attempts": status.get("attempts") or [],
        "keptLogs": keptlogs.index([k for k in logs_kept if keptlogs.read(k).owner_uid == ref.uid]),
    }
    return web.json_response(body)


# ---------------------------------------------------------------------- cancel
async def cancel_run(request: web.Request) -> web.StreamResponse:
    """Cancel a run: delete its attempt (freeing its quota); the TauRun stays, Cancelled."""
    identity = await serving.identity(request)
    namespace = context.check_namespace(request.match_info["namespace"])
    name = request.match_info["name"]
    try:
        await context.allow(request, identity, "delete", namespace)
    except errors.Forbidden:
        await context.allow(request, identity, "patch", namespace)
    if (leader := await serving.unless_leader(request, identity)) is not None:
        return leader
    ctx = context.context_of(request)
    item = await ctx.store.get_run(namespace, name)
    if item is None:
        raise reconciling.RunNotFoundError(namespace, name)
    phase = (item.get("status") or {}).get("phase")
    if phase in {lifecycle.Phase.SUCCEEDED, lifecycle.Phase.FAILED}:
        msg = f"run {name!r} has already ended ({phase}); there is nothing to cancel"
        raise errors.Conflict(msg, field="name", code="AlreadyEnded")
    if phase != lifecycle.Phase.CANCELLED:
        stamp = timestamps.rfc3339(dt.datetime.now(dt.UTC))
        serving.serving_of(request).elector.ensure_leader()
        await ctx.store.annotate_run(
            namespace, name, {marks.CANCEL_ANNOTATION: f"{identity.username[:200]} {stamp}"}
        )
        item = await ctx.reconciler.reconcile_now(namespace, name) or item
        log.info("run cancelled", run=f"{namespace}/{name}", user=identity.username)
    return web.json_response(context.run_json(item))


# ---------------------------------------------------------------------- checkpoints
async def _run_caller(request: web.Request, verb: str, subresource: str = "") -> auth.Identity:
    """Authenticate a checkpoint call: the run's own token (from its pods), or a Kubernetes
    identity allowed `verb` on the TauRun (a person). Return who called.

    Run-scoped tokens carry a prefix, so one is never sent to TokenReview, and one run's
    token used on another run is refused with 403 at once. A follower that checked a run's
    token speaks for the run (`auth.run_caller`); the leader accepts that only from a
    replica, and only for the same run.
    """
    namespace = context.check_namespace(request.match_info["namespace"])
    name = request.match_info["name"]
    token = auth.bearer_token(request.headers.get("Authorization"))
    if token.startswith(objects.RUN_TOKEN_PREFIX):
        expected = await context.context_of(request).run_token_digest(
            namespace, name, before_read=serving.unseen_credential(request)
        )
        got = objects.token_digest(token)
        if expected is None or not hmac.compare_digest(got.encode(), expected.encode()):
            msg = (
                f"this run-scoped token does not belong to run {namespace}/{name}: a run's"
                " token works only for that run"
            )
            raise errors.Forbidden(msg, field="Authorization")
        return auth.run_caller(namespace, name)
    identity = await serving.identity(request)
    if serving.forwarded(request) and identity == auth.run_caller(namespace, name):
        return identity
    await context.allow(request, identity, verb, namespace, subresource=subresource)
    return identity


async def _json_body(request: web.Request, *, optional: bool = False) -> Any:
    limit = serving.serving_of(request).settings.max_body_bytes
    raw = await serving.read_body(request, limit)
    if not raw.strip():
        if optional:
            return {}
        raise errors.Malformed("the body is empty; send a JSON object", field="body")
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as err:
        msg = f"the body is not JSON: {err}"
        raise errors.Malformed(msg, field="body") from err


async def post_checkpoint(request: web.Request) -> web.StreamResponse:
    """A run's pod reports a checkpoint it saved (`tau checkpoint --step N --path P`)."""
    caller = await _run_caller(request, "update", "status")
    if (leader := await serving.unless_leader(request, caller)) is not None:
        return leader
    namespace, name = request.match_info["namespace"], request.match_info["name"]
    report = checkpoints.parse_report(await _json_body(request))
    entry = await context.context_of(request).reconciler.record_checkpoint(namespace, name, report)
    log.debug("checkpoint reported", run=f"{namespace}/{name}", by=caller.username)
    return web.json_response(entry, status=201)


async def _checkpoints_of(request: web.Request) -> list[dict[str, Any]]:
    await _run_caller(request, "get")
    namespace, name = request.match_info["namespace"], request.match_info["name"]
    item = await context.context_of(request).store.get_run(namespace, name)
    if item is None:
        raise reconciling.RunNotFoundError(namespace, name)
    return list((item.get("status") or {}).get("checkpoints") or [])


async def list_checkpoints(request: web.Request) -> web.StreamResponse:
    """The checkpoints the run's status keeps, oldest first."""
    return web.json_response({"items": await _checkpoints_of(request)})


async def get_latest_checkpoint(request: web.Request) -> web.StreamResponse:
    """The newest checkpoint (`tau checkpoint latest`); 404 when none was reported."""
    kept = await _checkpoints_of(request)
    if not kept:
        name = request.match_info["name"]
        raise errors.NotFound(f"run {name!r} has reported no checkpoint", code="NoCheckpoint")
    return web.json_response(kept[-1])


async def post_resume(request: web.Request) -> web.StreamResponse:
    """Start the next attempt of a Failed or Cancelled run, from the latest checkpoint or
    the one named in the body (`{"checkpoint": "/ckpt/step-100"}`)."""
    identity = await serving.identity(request)
    namespace = context.check_namespace(request.match_info["namespace"])
    name = request.match_info["name"]
    await context.allow(request, identity, "patch", namespace)
    if (leader := await serving.unless_leader(request, identity)) is not None:
        return leader
    body = await _json_body(request, optional=True)
    if not isinstance(body, dict):
        raise errors.Invalid("the body must be a JSON object", field="body")
    unknown = sorted(set(body) - {"checkpoint"})
    if unknown:
        msg = f"unknown field {unknown[0]!r}; allowed: checkpoint"
        raise errors.Invalid(msg, field=unknown[0])
    checkpoint = body.get("checkpoint")
    if checkpoint is not None and (
        not isinstance(checkpoint, str) or not checkpoint.strip()
        or len(checkpoint) > checkpoints.MAX_PATH or "\n" in checkpoint
    ):  # fmt: skip
        msg = f"checkpoint must be a path of at most {checkpoints.MAX_PATH} characters"
        raise errors.Invalid(msg, field="checkpoint")
    item = await context.context_of(request).reconciler.request_resume(
        namespace, name, checkpoint=checkpoint, by=identity.username[:200]
    )
    return web.json_response(context.run_json(item))


# ---------------------------------------------------------------------- rerun
async def post_rerun(request: web.Request) -> web.StreamResponse:
    """Submit a new run from a run's evidence: the same spec, its image pinned to the digest
    that ran when the evidence has one, a new name (`<name>-r<N>`, or `{"name": …}`); the new
    run's evidence points back at the old one. Needs `get` and `create tauruns`."""
    identity, item = await context.read_run(request)
    namespace = request.match_info["namespace"]
    old = request.match_info["name"]
    await context.allow(request, identity, "create", namespace)
    context.check_run_namespace(request, namespace)
    if (leader := await serving.unless_leader(request, identity)) is not None:
        return leader
    body = await _json_body(request, optional=True)
    if not isinstance(body, dict):
        raise errors.Invalid("the body must be a JSON object", field="body")
    unknown = sorted(set(body) - {"name"})
    if unknown:
        raise errors.Invalid(f"unknown field {unknown[0]!r}; allowed: name", field=unknown[0])
    ctx = context.context_of(request)
    try:
        status = records.read(item.get("status"), results=False)
    except ValueError as err:
        msg = f"run {old!r} has a status this controller cannot read ({err})"
        raise errors.Conflict(msg, code="UnreadableStatus") from err
    requested = body.get("name")
    if requested is not None and not isinstance(requested, str):
        raise errors.Invalid("name must be a string", field="name")
    name = requested or reruns.next_name(
        old,
        [
            str((i.get("metadata") or {}).get("name", ""))
            for i in await ctx.store.list_runs(namespace)
        ],
    )
    image, pin_warning = reruns.pinned_image(
        str((item.get("spec") or {}).get("image", "")),
        status.evidence.image_id if status.evidence else None,
    )
    try:
        parsed = reruns.validated(item.get("spec") or {}, name=name, image=image)
    except specs.SpecError as err:
        if err.field == "name":
            raise _spec_error(err) from err
        msg = f"run {old!r} cannot be rerun: its spec is not valid ({err})"
        raise errors.Conflict(msg, field="name", code="NotRerunnable") from err
    spec = parsed.spec
    checked = await preflight.run(ctx.store, spec, namespace)
    src = reruns.source(item, status)
    annotations = {
        marks.SUBMITTED_BY_ANNOTATION: identity.username[:253],
        marks.MANAGED_BY_ANNOTATION: ctx.reconciler.manager,
        marks.RERUN_OF_ANNOTATION: reruns.annotation(src),
    }
    try:
        created = await _create_run(request, spec, namespace, annotations)
    except kube_runs.ConflictError as err:
        msg = f"a run named {name!r} already exists in namespace {namespace}; pick another name"
        raise errors.Conflict(msg, field="name", code="AlreadyExists") from err
    result = await ctx.reconciler.reconcile_now(namespace, name) or created
    log.info("run rerun", run=f"{namespace}/{name}", of=old, image=image, user=identity.username)
    warnings = [*parsed.warnings, *([pin_warning] if pin_warning else []), *checked]
    return web.json_response(
        {**context.run_json(result), "rerunOf": src.model_dump(mode="json", by_alias=True,
                                                               exclude_none=True),
         "warnings": warnings}, status=201,
    )  # fmt: skip


# ---------------------------------------------------------------------- results
async def post_results(request: web.Request) -> web.StreamResponse:
    """A run's pod reports metrics, artifacts or a summary (`tau result`); 202: written
    within `writtenWithinS`, in one status write with the rest of the burst."""
    caller = await _run_caller(request, "update", "status")
    if (leader := await serving.unless_leader(request, caller)) is not None:
        return leader
    namespace, name = request.match_info["namespace"], request.match_info["name"]
    report = results.parse_report(await _json_body(request))
    collector = context.context_of(request).reconciler.collector
    accepted = await collector.accept(namespace, name, report)
    log.debug("results reported", run=f"{namespace}/{name}", by=caller.username)
    return web.json_response(accepted, status=202)


async def get_results(request: web.Request) -> web.StreamResponse:
    """The run's results: metrics over steps (each with its last point), artifacts, the
    summary; `?metric=NAME` gives that metric alone (404 when the run has none of it)."""
    await _run_caller(request, "get")
    namespace, name = request.match_info["namespace"], request.match_info["name"]
    item = await context.context_of(request).store.get_run(namespace, name)
    if item is None:
        raise reconciling.RunNotFoundError(namespace, name)
    metric = request.query.get("metric") or None
    kept = context.results_of(item)
    body = results.wire(kept, metric=metric)
    if metric is not None and not body["metrics"]:
        known = ", ".join(s.name for s in (kept.metrics if kept else ())) or "none yet"
        msg = f"run {name!r} has reported no metric {metric!r} (it has: {known})"
        raise errors.NotFound(msg, field="metric", code="NoMetric")
    run = context.run_json(item, with_spec=False)
    head = {k: run[k] for k in ("name", "namespace", "phase", "attempt", "experiment")}
    return web.json_response({**head, **body})


async def get_schema(request: web.Request) -> web.StreamResponse:
    """The JSON Schema of tau.yaml."""
    return web.json_response(specs.spec_json_schema())
