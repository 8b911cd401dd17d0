"""What a run's own pods report, and who reads it back: checkpoints (`POST/GET
/v1/runs/{namespace}/{name}/checkpoints`) and results (`/results`). A report is accepted only
from a pod of the run's current attempt, with the run's own token (`_run_caller`), and at a
rate per caller and run."""

from __future__ import annotations

from typing import Any

import structlog
from aiohttp import web

from controller import auth, errors, forwarding, serving
from controller.runs import (
    checkpoints,
    context,
    results,
    schemas,
)

log = structlog.get_logger()

TAG = "runs"
"""The OpenAPI tag of these routes (the run API's)."""


# ---------------------------------------------------------------------- checkpoints
async def _run_caller(request: web.Request, verb: str, subresource: str = "") -> auth.Identity:
    """Authenticate a report: a pod of the run (its projected `taugrid-run` token), or a
    Kubernetes identity allowed `verb` on the TauRun (a person). Return who called.

    A token for the run audience is reviewed for that audience alone and mapped to its run
    and attempt through the pod it is bound to (`controller.runs.identity`); a pod of another
    run is refused with 403. A follower does that mapping itself and speaks for the run pod
    (`auth.run_caller`); the leader accepts that only from a replica, and only for the same
    run.
    """
    namespace, name = context.run_path(request)
    token = auth.bearer_token(request.headers.get("Authorization"))
    audience = serving.serving_of(request).settings.run_token_audience
    if audience in auth.token_audiences(token):
        who = await serving.identity(request, (audience,))
        pod = await context.context_of(request).run_pods.resolve(
            who, before_read=serving.unseen_credential(request)
        )
        if (pod.namespace, pod.run) != (namespace, name):
            msg = (
                f"this token is pod {pod.namespace}/{pod.pod}'s, of run {pod.namespace}/"
                f"{pod.run}: a run's token works only for that run"
            )
            raise errors.Forbidden(msg, field="Authorization")
        return auth.run_caller(namespace, name, pod.attempt)
    identity = await serving.identity(request)
    run = auth.run_of(identity)
    if forwarding.forwarded(request) and run is not None and run[:2] == (namespace, name):
        return identity
    await context.allow(request, identity, verb, namespace, subresource=subresource)
    return identity


def _check_attempt(caller: auth.Identity, attempt: int) -> None:
    """A run pod reports only for its own attempt (the one its pod's labels name)."""
    run = auth.run_of(caller)
    if run is not None and run[2] != attempt:
        msg = f"this token is a pod of attempt {run[2]}'s; it may not report for attempt {attempt}"
        raise errors.Forbidden(msg, field="attempt")


CHECKPOINT = {201: serving.Reply("The checkpoint, as kept.", schemas.CheckpointRecord)}


@serving.operation(
    "reportCheckpoint", tag=TAG, path=schemas.RunPath,
    body=serving.Body(checkpoints.ReportBody), replies=CHECKPOINT, errors=(404, 409),
)  # fmt: skip
async def post_checkpoint(request: web.Request) -> web.StreamResponse:
    """A run's pod reports a checkpoint it saved (`tau checkpoint --step N --path P`).

    With the token of a pod of the run (for its own attempt only), or as a person allowed
    `update tauruns/status`. A report from an attempt that is over (or not begun) is a 409.
    """
    caller = await _run_caller(request, "update", "status")
    if (leader := await forwarding.unless_leader(request, caller)) is not None:
        return leader
    namespace, name = context.run_path(request)
    _report_rate(request, caller, namespace, name)
    body = await serving.json_body(request, checkpoints.ReportBody)
    _check_attempt(caller, body.attempt)
    report = checkpoints.Report(attempt=body.attempt, step=body.step, path=body.path)
    entry = await context.context_of(request).reconciler.record_checkpoint(namespace, name, report)
    log.debug("checkpoint reported", run=f"{namespace}/{name}", by=caller.username)
    return web.json_response(entry, status=201)


def _report_rate(request: web.Request, caller: auth.Identity, namespace: str, name: str) -> None:
    """One token of the caller's bucket for this run (429 past `reports_per_s_per_run`):
    each report reads the TauRun from the API server (security review 3, finding 10)."""
    serving.serving_of(request).limits.reports.take(
        (caller.username, namespace, name), f"reports for run {name!r} from {caller.username}"
    )


async def _read_run(request: web.Request) -> tuple[str, dict[str, Any]]:
    """Authorise a read of what the run reported (`_run_caller`, `get tauruns`); the run's
    name and the run."""
    await _run_caller(request, "get")
    namespace, name = context.run_path(request)
    return name, await context.get_run(request, namespace, name)


async def _checkpoints_of(request: web.Request) -> list[dict[str, Any]]:
    _, item = await _read_run(request)
    return list((item.get("status") or {}).get("checkpoints") or [])


@serving.operation(
    "listCheckpoints", tag=TAG, path=schemas.RunPath, errors=(404,),
    replies={200: serving.Reply("The kept checkpoints.", schemas.CheckpointList)},
)  # fmt: skip
async def list_checkpoints(request: web.Request) -> web.StreamResponse:
    """The checkpoints the run's status keeps, oldest first."""
    return web.json_response({"items": await _checkpoints_of(request)})


@serving.operation(
    "getLatestCheckpoint", tag=TAG, path=schemas.RunPath, errors=(404,),
    replies={200: serving.Reply("The newest checkpoint.", schemas.CheckpointRecord)},
)  # fmt: skip
async def get_latest_checkpoint(request: web.Request) -> web.StreamResponse:
    """The newest checkpoint (`tau checkpoint latest`); 404 when none was reported."""
    kept = await _checkpoints_of(request)
    if not kept:
        name = context.run_path(request)[1]
        raise errors.NotFound(f"run {name!r} has reported no checkpoint", code="NoCheckpoint")
    return web.json_response(kept[-1])


# ---------------------------------------------------------------------- results
@serving.operation(
    "reportResults", tag=TAG, path=schemas.RunPath, body=serving.Body(results.ResultReport),
    replies={202: serving.Reply("Taken; written within `writtenWithinS`.",
                                schemas.ResultsAccepted)},
    errors=(404, 409),
)  # fmt: skip
async def post_results(request: web.Request) -> web.StreamResponse:
    """A run's pod reports metrics, artifacts or a summary (`tau result`).

    202: written within `writtenWithinS`, in one status write with the rest of the burst.
    With the token of a pod of the run (for its own attempt only), or as a person allowed
    `update tauruns/status`.
    """
    caller = await _run_caller(request, "update", "status")
    if (leader := await forwarding.unless_leader(request, caller)) is not None:
        return leader
    namespace, name = context.run_path(request)
    _report_rate(request, caller, namespace, name)
    report = results.parse_report(await serving.json_document(request, results.ResultReport))
    _check_attempt(caller, report.attempt)
    collector = context.context_of(request).reconciler.collector
    accepted = await collector.accept(namespace, name, report)
    log.debug("results reported", run=f"{namespace}/{name}", by=caller.username)
    return web.json_response(accepted, status=202)


@serving.operation(
    "getResults", tag=TAG, path=schemas.RunPath, query=schemas.ResultsQuery,
    replies={200: serving.Reply("The run's results.", schemas.ResultsView)}, errors=(404, 409),
)  # fmt: skip
async def get_results(request: web.Request) -> web.StreamResponse:
    """The run's results: metrics over steps (each with its last point), artifacts, summary.

    `?metric=NAME` gives that metric alone (404 when the run has none of it).
    """
    name, item = await _read_run(request)
    metric = serving.query_of(request, schemas.ResultsQuery).metric
    kept = context.results_of(item)
    body = results.wire(kept, metric=metric)
    if metric is not None and not body["metrics"]:
        known = ", ".join(s.name for s in (kept.metrics if kept else ())) or "none yet"
        msg = f"run {name!r} has reported no metric {metric!r} (it has: {known})"
        raise errors.NotFound(msg, field="metric", code="NoMetric")
    run = context.run_json(item, with_spec=False)
    head = {k: run[k] for k in ("name", "namespace", "phase", "attempt", "experiment")}
    return web.json_response({**head, **body})
