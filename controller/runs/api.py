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
import contextlib
import datetime as dt
import hashlib
from collections.abc import Iterator, Sequence
from typing import Any

import structlog
from aiohttp import web

from controller import auth, errors, forwarding, marks, serving, timestamps
from controller.kube import refusals as kube_refusals
from controller.runs import (
    context,
    experiments,
    keptlogs,
    logs,
    objects,
    plans,
    policy,
    preflight,
    queues,
    records,
    rendering,
    reporting,
    reruns,
    schemas,
)
from controller.settings import ControllerSettings
from shared import spec as specs

log = structlog.get_logger()

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
    app.router.add_post("/v1/runs/{namespace}/{name}/checkpoints", reporting.post_checkpoint)
    app.router.add_get("/v1/runs/{namespace}/{name}/checkpoints", reporting.list_checkpoints)
    app.router.add_get(
        "/v1/runs/{namespace}/{name}/checkpoints/latest", reporting.get_latest_checkpoint
    )
    app.router.add_post("/v1/runs/{namespace}/{name}/resume", post_resume)
    app.router.add_post("/v1/runs/{namespace}/{name}/rerun", post_rerun)
    app.router.add_post("/v1/runs/{namespace}/{name}/results", reporting.post_results)
    app.router.add_get("/v1/runs/{namespace}/{name}/results", reporting.get_results)
    app.router.add_get("/v1/experiments", experiments.list_experiments)
    app.router.add_get("/v1/experiments/compare", experiments.compare)
    app.router.add_get("/v1/queues", queues.get_queues)
    app.router.add_get("/v1/schema/run", get_schema)


def _spec_error(err: specs.SpecError) -> errors.Invalid:
    kind = _SPEC_ERRORS.get(err.kind, errors.Invalid)
    problems = [p.as_dict() for p in err.problems]
    return kind(str(err), field=err.field, code=str(err.kind), problems=problems)


TAG = "runs"
RUN_VIEW = {200: serving.Reply("The run.", schemas.RunView)}
SPEC_MEDIA_TYPES = ("application/yaml", "application/json")
DRY_RUN_UID = "00000000-0000-0000-0000-000000000000"
"""The owner UID of objects checked by the API server's dry run before their TauRun exists:
the API server wants one, and no object is stored with it."""


# ---------------------------------------------------------------------- submit
@serving.operation(
    "createRun", tag=TAG, query=schemas.SubmitQuery,
    body=serving.Body(specs.TauSpec, media_types=SPEC_MEDIA_TYPES, checks_media_type=True),
    replies={
        201: serving.Reply("Created: the run, and advice about its spec.", schemas.RunCreated),
        200: serving.Reply(
            "With `dryRun=true`, what would be created (nothing was); else the run the same"
            " `Idempotency-Key` created before.",
            any_of=(schemas.DryRun, schemas.RunView),
        ),
    },
    errors=(404, 409),
)  # fmt: skip
async def post_run(request: web.Request) -> web.StreamResponse:
    """Submit a run: the body is a tau.yaml (YAML or JSON).

    The caller is authorised (`create tauruns`) before the body is parsed: in `?namespace=`,
    else in a namespace the body declares on a plain `namespace: NAME` line (found by a scan
    of the bytes, not a parse; the parsed spec's namespace is then checked too), else in
    `default`. So a body from an identity that may not submit anywhere is never parsed.
    Before anything is created the API server checks the run's first objects (its dry run),
    so a spec it would refuse is a 422 naming the field, never a run that cannot start.
    """
    st = serving.serving_of(request)
    ctx = context.context_of(request)
    query = serving.query_of(request, schemas.SubmitQuery)
    outcome = "invalid"
    try:
        identity = await serving.identity(request)
        raw = await serving.read_body(request, specs.MAX_SPEC_BYTES)
        namespace = await _authorise_submission(request, identity, query, raw)
        try:
            with st.limits.spec_parses.hold(identity.username, identity.username):
                parsed = await asyncio.to_thread(specs.parse_spec, raw, _content_type(request))
        except specs.SpecError as err:
            raise _spec_error(err) from err
        spec = parsed.spec
        if query.namespace is None and (spec.namespace or "default") != namespace:
            namespace = spec.namespace or "default"
            await context.allow(request, identity, "create", namespace)
        _check_priority(spec, st.settings)
        context.check_run_namespace(request, namespace)
        await _check_secrets(request, identity, spec, namespace)
        if (leader := await forwarding.unless_leader(request, identity, raw)) is not None:
            outcome = "forwarded"
            return leader
        checked = await _preflight(request, identity, spec, namespace)
        warnings = [*parsed.warnings, *checked]
        key = request.headers.get("Idempotency-Key", "").strip()
        annotations = _annotations(identity, ctx.reconciler.manager)
        if key:
            annotations[marks.IDEMPOTENCY_ANNOTATION] = _key_digest(key)
        body = _taurun(spec, namespace, annotations)
        if query.dry_run:
            outcome = "dry-run"
            return web.json_response(await _dry_run(request, identity, spec, body, warnings))
        try:
            created = await _create_run(request, identity, spec, body, warnings)
        except kube_refusals.ConflictError as err:
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
        return web.json_response({**context.run_json(result), "warnings": warnings}, status=201)
    except errors.Forbidden:
        outcome = "forbidden"
        raise
    finally:
        st.metrics.run_submissions.labels(outcome).inc()


async def _authorise_submission(
    request: web.Request, who: auth.Identity, query: schemas.SubmitQuery, raw: bytes
) -> str:
    """Authorise `create tauruns` before the body is parsed (see `post_run`); return the
    namespace authorised. Of several a body may declare, the first the caller may use."""
    if query.namespace is not None:
        await context.allow(request, who, "create", query.namespace)
        return query.namespace
    candidates = specs.declared_namespaces(raw) or ["default"]
    refusals: list[errors.Forbidden] = []
    for candidate in candidates:
        try:
            await context.allow(request, who, "create", candidate)
        except errors.Forbidden as err:
            refusals.append(err)
            continue
        return candidate
    refusal = refusals[0]
    if candidates == ["default"]:
        refusal.message += (
            " (no namespace was given as ?namespace= or on a `namespace:` line of the body)"
        )
    raise refusal


def _check_priority(spec: specs.TauSpec, settings: ControllerSettings) -> None:
    """Refuse a priority class the platform did not allow (DESIGN.md section 10): the
    controller's resume class always, and any outside a configured allowlist."""
    if spec.priority is None:
        return
    if spec.priority == settings.resume_priority_class:
        msg = f"{spec.priority!r} is the controller's own priority class (resumed attempts)"
        raise errors.Invalid(msg, field="priority", code="PriorityNotAllowed")
    allowed = settings.allowed_priority_classes
    if allowed and spec.priority not in allowed:
        msg = f"priority {spec.priority!r} is not allowed here; allowed: {', '.join(allowed)}"
        raise errors.Invalid(msg, field="priority", code="PriorityNotAllowed")


async def _check_secrets(
    request: web.Request, who: auth.Identity, spec: specs.TauSpec, namespace: str
) -> None:
    """Refuse a `secretEnv` naming a Secret the caller may not `get` in the namespace (403
    naming it): the run would hand its value to the caller's code, so only someone who could
    read it anyway may ask for it. kubectl-made TauRuns are checked by the chart's policy."""
    for variable, ref in sorted(spec.secret_env.items()):
        access = auth.Access(verb="get", resource="secrets", namespace=namespace, name=ref.secret)
        if not await _may(request, who, access):
            msg = (
                f"secretEnv.{variable}: {who.username} may not get Secret {ref.secret!r} in"
                f" namespace {namespace}, so a run may not read it for you"
            )
            raise errors.Forbidden(msg, field=f"secretEnv.{variable}")


async def _may(request: web.Request, who: auth.Identity, access: auth.Access) -> bool:
    """Whether RBAC lets `who` make `access`: the API's cached review (its caps and budget
    too: a capped review is a 429, never a guess)."""
    try:
        await serving.allow(request, who, access)
    except errors.Forbidden:
        return False
    return True


async def _preflight(
    request: web.Request, who: auth.Identity, spec: specs.TauSpec, namespace: str
) -> Sequence[str]:
    """`preflight.run`, telling `who` only what `who` may read (review 3, finding 10)."""
    settings = serving.serving_of(request).settings
    return await preflight.run(
        context.context_of(request).store, spec, namespace,
        lambda access: _may(request, who, access), settings.allowed_priority_classes,
    )  # fmt: skip


def _annotations(who: auth.Identity, manager: str) -> dict[str, str]:
    """The annotations every TauRun the API creates carries."""
    return {marks.SUBMITTED_BY_ANNOTATION: who.username[:253], marks.MANAGED_BY_ANNOTATION: manager}


def _taurun(spec: specs.TauSpec, namespace: str, annotations: dict[str, str]) -> dict[str, Any]:
    """The TauRun a submission (or a rerun) creates."""
    return {
        "apiVersion": specs.API_VERSION,
        "kind": objects.TAURUN_KIND,
        "metadata": {"name": spec.name, "namespace": namespace, "annotations": annotations},
        "spec": specs.spec_to_wire(spec),
    }


async def _create_run(
    request: web.Request, who: auth.Identity, spec: specs.TauSpec, body: dict[str, Any],
    warnings: list[str],
) -> dict[str, Any]:  # fmt: skip
    """Create the TauRun of a validated, pre-flighted spec, once the API server has checked
    attempt 1's objects (`_server_check`, whose warnings join `warnings`); NotFound for a
    namespace that does not exist, a 422 for a refusal; kube_refusals.ConflictError (for the
    caller to word) when the name is taken."""
    ctx = context.context_of(request)
    namespace = str(body["metadata"]["namespace"])
    ref = objects.RunRef(spec.name, namespace, DRY_RUN_UID)
    warnings.extend(await _server_check(request, who, spec, ref))
    serving.serving_of(request).elector.ensure_leader()
    with _refusals(namespace):
        return await ctx.store.create_run(namespace, body)


def _first_objects(
    ctx: context.RunsContext, spec: specs.TauSpec, ref: objects.RunRef
) -> list[dict[str, Any]]:
    """What the reconciler creates for a new run, from its own decision step
    (`policy.decide_run`): the run's checkpoint ConfigMap, then attempt 1's objects."""
    run = plans.RunInput(
        ref=ref, spec=specs.spec_to_wire(spec), status=records.RunStatus(), observed=False
    )
    now = dt.datetime.now(dt.UTC)
    return list(policy.decide_run(run, ctx.reconciler.settings, now).creates)


async def _server_check(
    request: web.Request, who: auth.Identity, spec: specs.TauSpec, ref: objects.RunRef
) -> list[str]:
    """Have the API server (and Kueue's webhooks) check the run's first objects without
    storing them, so a spec it would refuse is refused now, naming the field, instead of a
    run the reconciler could never start (security review M1); and refuse a run whose names
    somebody else's object already holds (review M4: 409 NameTaken naming it), before
    anything is created. Whether a name is taken is told only to a caller who may `get`
    that kind there (`preflight.name_check`; any name: one cached review per kind, however
    many runs are tried); anyone else gets a warning that it was not checked, the same
    whether it is taken or free (review 3, finding 10)."""
    ctx = context.context_of(request)
    names: list[preflight.Name] = []
    for obj in _first_objects(ctx, spec, ref):
        with _refusals(ref.namespace):
            free = await ctx.store.dry_run_create(obj)
        kind, meta = str(obj["kind"]), obj["metadata"]
        group, resource = preflight.OBJECT_RESOURCES.get(kind, ("", ""))
        access = auth.Access(verb="get", resource=resource, group=group,
                             namespace=meta["namespace"])  # fmt: skip
        readable = bool(resource) and await _may(request, who, access)
        existing = None
        if readable and not free:
            existing = await ctx.store.read_object(kind, meta["namespace"], meta["name"])
        names.append(preflight.Name(kind, meta["namespace"], meta["name"], readable, existing))
    return preflight.name_check(spec.name, names)


@contextlib.contextmanager
def _refusals(namespace: str) -> Iterator[None]:
    """The API server's refusals of what a submission writes, as the API's: NotFound for a
    namespace that does not exist, a 422 naming the tau.yaml field behind the object's."""
    try:
        yield
    except kube_refusals.NotFoundError as err:
        msg = f"namespace {namespace!r} does not exist"
        raise errors.NotFound(msg, field="namespace") from err
    except kube_refusals.RejectedError as err:
        field = rendering.spec_field(err.kind, err.field)
        raise errors.Invalid(err.message, field=field, code=err.code) from err


async def _dry_run(
    request: web.Request, who: auth.Identity, spec: specs.TauSpec, body: dict[str, Any],
    warnings: Sequence[str],
) -> dict[str, Any]:  # fmt: skip
    """What a submission would create, checked by the API server's own dry run."""
    ctx = context.context_of(request)
    namespace = str(body["metadata"]["namespace"])
    try:
        with _refusals(namespace):
            checked = await ctx.store.create_run(namespace, body, dry_run=True)
    except kube_refusals.ConflictError as err:
        msg = f"a run named {spec.name!r} already exists in namespace {namespace}"
        raise errors.Conflict(msg, field="name", code="AlreadyExists") from err
    uid = str((checked.get("metadata") or {}).get("uid") or DRY_RUN_UID)
    ref = objects.RunRef(spec.name, namespace, uid)
    noted = await _server_check(request, who, spec, ref)
    created = _first_objects(ctx, spec, ref)
    return {"dryRun": True, "run": body, "objects": created, "warnings": [*warnings, *noted]}


def _content_type(request: web.Request) -> str | None:
    """The body's type; what curl and generic clients send by default reads as YAML (which
    also reads JSON), so `curl --data-binary @tau.yaml` works as a researcher expects."""
    value = request.headers.get("Content-Type")
    media = (value or "").split(";", 1)[0].strip().lower()
    return None if media in _GENERIC_TYPES else value


_GENERIC_TYPES = frozenset({"", "application/x-www-form-urlencoded", "application/octet-stream"})


def _key_digest(key: str) -> str:
    """Keys are stored hashed: they may be long, and they are the client's business."""
    return hashlib.sha256(key.encode()).hexdigest()[:40]


# ---------------------------------------------------------------------- read
@serving.operation(
    "listRuns", tag=TAG, query=schemas.ListQuery,
    replies={200: serving.Reply("The runs.", schemas.RunList)},
)  # fmt: skip
async def list_runs(request: web.Request) -> web.StreamResponse:
    """List runs; filters: namespace, phase, queue, experiment (`list tauruns`)."""
    identity = await serving.identity(request)
    query = serving.query_of(request, schemas.ListQuery)
    await context.allow(request, identity, "list", query.namespace)
    with context.expensive_read(request, identity):
        items = await context.context_of(request).store.list_runs(query.namespace)
    out = [context.run_json(i, with_spec=False) for i in items]
    if query.phase is not None:
        out = [r for r in out if str(r["phase"]).lower() == query.phase.lower()]
    if query.queue is not None:
        out = [r for r in out if r["queue"] == query.queue]
    if query.experiment is not None:
        out = [r for r in out if (r["experiment"] or {}).get("name") == query.experiment]
    out.sort(key=lambda r: (r["namespace"], r["createdAt"] or "", r["name"]))
    return web.json_response({"items": out})


@serving.operation("getRun", tag=TAG, path=schemas.RunPath, replies=RUN_VIEW, errors=(404,))
async def get_run(request: web.Request) -> web.StreamResponse:
    """One run with its attempts, queue position, message and checkpoints (`get tauruns`)."""
    _, item = await context.read_run(request)
    return web.json_response(context.run_json(item))


@serving.operation(
    "getRunEvidence", tag=TAG, path=schemas.RunPath, errors=(404,),
    replies={200: serving.Reply("The evidence record.", schemas.Evidence)},
)  # fmt: skip
async def get_evidence(request: web.Request) -> web.StreamResponse:
    """The run's evidence record: enough to reproduce it and to see where it ran, and which
    workers' logs are kept (their text: `GET …/logs?attempt=N&worker=K`, needs pods/log)."""
    identity, item = await context.read_run(request)
    status = item.get("status") or {}
    meta = item.get("metadata") or {}
    ref = objects.run_ref(item)
    # A LIST of the run's kept logs per call: the same per-identity slots as a run list.
    with context.expensive_read(request, identity):
        logs_kept = await context.context_of(request).store.list_run_logs(
            ref.namespace, f"{marks.RUN_LABEL}={ref.name}"
        )
    body = {
        "name": meta.get("name"),
        "namespace": meta.get("namespace"),
        "uid": meta.get("uid"),
        "phase": status.get("phase", str(records.Phase.PENDING)),
        **(status.get("evidence") or {}),
        "attempts": status.get("attempts") or [],
        "keptLogs": keptlogs.index([k for k in logs_kept if keptlogs.read(k).belongs_to(ref)]),
    }
    return web.json_response(body)


# ---------------------------------------------------------------------- cancel
@serving.operation("cancelRun", tag=TAG, path=schemas.RunPath, replies=RUN_VIEW, errors=(404, 409))
async def cancel_run(request: web.Request) -> web.StreamResponse:
    """Cancel a run: delete its attempt (freeing its quota); the TauRun stays, Cancelled.

    Needs `delete` (or `patch`) on tauruns in the run's namespace.
    """
    identity = await serving.identity(request)
    namespace, name = context.run_path(request)
    try:
        await context.allow(request, identity, "delete", namespace)
    except errors.Forbidden:
        await context.allow(request, identity, "patch", namespace)
    if (leader := await forwarding.unless_leader(request, identity)) is not None:
        return leader
    ctx = context.context_of(request)
    item = await context.get_run(request, namespace, name)
    phase = (item.get("status") or {}).get("phase")
    if phase in {records.Phase.SUCCEEDED, records.Phase.FAILED}:
        msg = f"run {name!r} has already ended ({phase}); there is nothing to cancel"
        raise errors.Conflict(msg, field="name", code="AlreadyEnded")
    if phase != records.Phase.CANCELLED:
        stamp = timestamps.rfc3339(dt.datetime.now(dt.UTC))
        serving.serving_of(request).elector.ensure_leader()
        await ctx.store.annotate_run(
            namespace, name, {marks.CANCEL_ANNOTATION: f"{identity.username[:200]} {stamp}"}
        )
        item = await ctx.reconciler.reconcile_now(namespace, name) or item
        log.info("run cancelled", run=f"{namespace}/{name}", user=identity.username)
    return web.json_response(context.run_json(item))


# ---------------------------------------------------------------------- resume
@serving.operation(
    "resumeRun", tag=TAG, path=schemas.RunPath,
    body=serving.Body(schemas.ResumeRequest, required=False), replies=RUN_VIEW,
    errors=(404, 409),
)  # fmt: skip
async def post_resume(request: web.Request) -> web.StreamResponse:
    """Start the next attempt of a Failed or Cancelled run.

    From the latest checkpoint, or the one named in the body (`{"checkpoint":
    "/ckpt/step-100"}`). Needs `patch tauruns`; a run that has not ended badly is a 409.
    """
    identity = await serving.identity(request)
    namespace, name = context.run_path(request)
    await context.allow(request, identity, "patch", namespace)
    if (leader := await forwarding.unless_leader(request, identity)) is not None:
        return leader
    body = await serving.json_body(request, schemas.ResumeRequest, optional=True)
    item = await context.context_of(request).reconciler.request_resume(
        namespace, name, checkpoint=body.checkpoint, by=identity.username[:200]
    )
    return web.json_response(context.run_json(item))


# ---------------------------------------------------------------------- rerun
@serving.operation(
    "rerunRun", tag=TAG, path=schemas.RunPath,
    body=serving.Body(schemas.RerunRequest, required=False),
    replies={201: serving.Reply("The new run, and advice about its spec.", schemas.RunRerun)},
    errors=(404, 409),
)  # fmt: skip
async def post_rerun(request: web.Request) -> web.StreamResponse:
    """Submit a new run from a run's evidence.

    The same spec, its image pinned to the digest that ran when the evidence has one, a new
    name (`<name>-r<N>`, or `{"name": …}`); the new run's evidence points back at the old
    one. Needs `get` and `create tauruns`.
    """
    identity, item = await context.read_run(request)
    namespace, old = context.run_path(request)
    await context.allow(request, identity, "create", namespace)
    context.check_run_namespace(request, namespace)
    if (leader := await forwarding.unless_leader(request, identity)) is not None:
        return leader
    body = await serving.json_body(request, schemas.RerunRequest, optional=True)
    ctx = context.context_of(request)
    try:
        status = records.read(item.get("status"), results=False)
    except ValueError as err:
        msg = f"run {old!r} has a status this controller cannot read ({err})"
        raise errors.Conflict(msg, code="UnreadableStatus") from err
    if not (name := body.name):
        existing = [objects.run_ref(i).name for i in await ctx.store.list_runs(namespace)]
        name = reruns.next_name(old, existing)
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
    _check_priority(spec, serving.serving_of(request).settings)
    await _check_secrets(request, identity, spec, namespace)
    checked = [*await _preflight(request, identity, spec, namespace)]
    src = reruns.source(item, status)
    annotations = _annotations(identity, ctx.reconciler.manager)
    annotations[marks.RERUN_OF_ANNOTATION] = reruns.annotation(src)
    try:
        created = await _create_run(
            request, identity, spec, _taurun(spec, namespace, annotations), checked
        )
    except kube_refusals.ConflictError as err:
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


SCHEMA_DOCUMENT = {"type": "object", "description": "A JSON Schema (draft 2020-12)."}


@serving.operation(
    "getRunSchema", tag=TAG, auth=serving.Auth.NONE,
    replies={200: serving.Reply("The JSON Schema of tau.yaml.", schema=SCHEMA_DOCUMENT)},
)  # fmt: skip
async def get_schema(request: web.Request) -> web.StreamResponse:
    """The JSON Schema of tau.yaml."""
    return web.json_response(specs.spec_json_schema())
