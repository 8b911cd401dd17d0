"""A run's logs: `GET /v1/runs/{ns}/{name}/logs`, streamed from the worker's pod.

`follow=true` waits (up to `logs_wait_s`) for the pod to start, then keeps the stream open
until the container ends. The pods are the attempt's by their controller chain, not by their
labels alone (`attempt_pods`: a look-alike pod's log is never the run's). A client that
hangs up cancels the handler (the runner's `handler_cancellation`), which ends both the
wait's polling and the upstream stream. One identity holds at most
`log_streams_per_identity` calls at once and a replica at most `log_streams_max` (429
beyond), so streams cannot take the API server connections the lease and the quarantine
loop need (they are on other clients anyway). When the pod is gone
(or its log cannot be read), or `kept=true` asks for it, the tail the controller kept
(`keeping`) is served instead, marked as such by `X-TauGrid-Log-Source: kept`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Protocol

from aiohttp import web

from controller import errors, marks, serving, timestamps
from controller.runs import (
    context,
    keptlogs,
    logtext,
    objects,
    owners,
    reconciling,
    records,
    schemas,
    views,
)

LOG_POLL_S = 0.5


class PodStore(Protocol):
    """What `attempt_pods` reads (`controller.kube.runs.RunStore` implements it)."""

    async def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        """Pods of one namespace by label selector."""
        ...

    async def read_object(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """A run's object by kind and name; None when there is none."""
        ...


async def attempt_pods(
    store: PodStore, item: Mapping[str, Any], attempt: int
) -> list[dict[str, Any]]:
    """The pods of attempt `attempt` of the TauRun `item`: those its labels select whose
    controller chain leads to that attempt of that run (`owners.owned_pods`), so a
    look-alike pod's log is never served as the run's. Two reads: the pods, and (when any
    carries the labels) the attempt's Job or RayJob."""
    ref = objects.run_ref(item)
    selector = f"{marks.RUN_LABEL}={ref.name},{marks.ATTEMPT_LABEL}={attempt}"
    labelled = await store.list_pods(ref.namespace, selector)
    if not labelled:
        return []
    name = objects.attempt_name(ref.name, attempt)
    found = await store.read_object(reconciling.attempt_kind(item), ref.namespace, name)
    return owners.owned_pods(labelled, [found] if found else [], run=ref, attempt=attempt)


async def _kept(request: web.Request, item: dict[str, Any], attempt: int, worker: int,
                tail_lines: int | None) -> web.StreamResponse | None:  # fmt: skip
    """The kept tail of one worker's log as the answer, None when none was kept."""
    kept = await context.context_of(request).keeper.read_kept(
        objects.run_ref(item), attempt, worker
    )
    if kept is None:
        return None
    text = kept.log
    if tail_lines is not None:
        text = "".join(text.splitlines(keepends=True)[-tail_lines:] if tail_lines else [])
    headers = {
        "Content-Type": "text/plain; charset=utf-8", "X-TauGrid-Pod": kept.pod,
        "X-TauGrid-Log-Source": "kept", "X-TauGrid-Log-Complete": str(kept.complete).lower(),
        "X-TauGrid-Log-Truncated": str(kept.truncated).lower(),
        "X-TauGrid-Log-Captured-At": timestamps.rfc3339(kept.captured_at)
        if kept.captured_at else "",
    }  # fmt: skip
    return web.Response(body=text.encode(), headers=headers)


LOG_TEXT = {"type": "string", "description": "The container's log, as it writes it."}
LOG_HEADERS = (
    "X-TauGrid-Pod", "X-TauGrid-Log-Source", "X-TauGrid-Log-Complete",
    "X-TauGrid-Log-Truncated", "X-TauGrid-Log-Captured-At",
)  # fmt: skip


@serving.operation(
    "getRunLogs", tag="runs", path=schemas.RunPath, query=schemas.LogsQuery,
    replies={200: serving.Reply("The log, streamed.", media_type="text/plain",
                                schema=LOG_TEXT, headers=LOG_HEADERS)},
    errors=(404,),
)  # fmt: skip
@serving.streaming
async def get_logs(request: web.Request) -> web.StreamResponse:
    """Stream a worker's log (`follow=true` keeps it open until the container ends).

    Needs `get pods/log` in the run's namespace. When the pod is gone, or `kept=true`, the
    tail the controller kept is served (`X-TauGrid-Log-Source: kept`).
    """
    identity = await serving.identity(request)
    namespace, name = context.run_path(request)
    await context.allow(request, identity, "get", namespace, resource="pods", group="",
                 subresource="log")  # fmt: skip
    with serving.serving_of(request).limits.log_streams.hold(identity.username, identity.username):
        return await _stream(request, namespace, name)


async def _stream(request: web.Request, namespace: str, name: str) -> web.StreamResponse:
    st = serving.serving_of(request)
    ctx = context.context_of(request)
    query = serving.query_of(request, schemas.LogsQuery)
    follow, worker, attempt, tail_lines = query.follow, query.worker, query.attempt, query.tail
    want_kept = query.kept
    deadline = asyncio.get_running_loop().time() + (st.settings.logs_wait_s if follow else 0)
    # The pod and container of worker `worker` (ray: 0 is the head, 1.. the workers).
    picked: tuple[Mapping[str, Any], str] | None = None
    while True:
        item = await context.get_run(request, namespace, name)
        status = item.get("status") or {}
        number = attempt or int(status.get("currentAttempt") or 0)
        if want_kept:
            break
        workers = keptlogs.workers(await attempt_pods(ctx.store, item, number))
        picked = workers[worker] if worker < len(workers) else None
        started = picked is not None and views.parse_pod(picked[0]).phase != "Pending"
        ended = status.get("phase") in {records.Phase.CANCELLED, records.Phase.FAILED}
        if started or ended or asyncio.get_running_loop().time() >= deadline:
            break
        await asyncio.sleep(LOG_POLL_S)
    if want_kept or picked is None:
        kept = await _kept(request, item, number, worker, tail_lines)
        if kept is not None:
            return kept
    if want_kept:
        msg = f"run {name!r} has no kept log of worker {worker} of attempt {number}"
        raise errors.NotFound(msg, field="worker", code="NoKeptLog")
    if picked is None:
        msg = f"run {name!r} has no pod for worker {worker} of attempt {number} (yet)"
        raise errors.NotFound(msg, field="worker", code="NoPod")
    pod, container = picked
    pod_name = str(pod["metadata"]["name"])
    resp = web.StreamResponse(headers={"Content-Type": "text/plain; charset=utf-8",
                                       "X-TauGrid-Pod": pod_name})  # fmt: skip
    chunks = ctx.store.stream_log(
        namespace, pod_name, container, follow=follow, tail_lines=tail_lines,
        since_seconds=query.since_seconds,
    )  # fmt: skip
    try:
        first = await anext(chunks, b"")
    except Exception as err:
        kept = await _kept(request, item, number, worker, tail_lines)
        if kept is not None:
            return kept
        node = str((pod.get("spec") or {}).get("nodeName") or "")
        why = logtext.unavailable(
            pod=pod_name, node=node, container=container,
            upstream_status=getattr(err, "status", None),
            upstream=str(getattr(err, "reason", None) or getattr(err, "body", None) or err),
            simulated=await _simulated(ctx, node),
        )  # fmt: skip
        if why.status == 404:
            raise errors.NotFound(why.message, code=why.code) from err
        raise errors.Unavailable(why.message, code=why.code) from err
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


async def _simulated(ctx: Any, node: str) -> bool:
    """Whether KWOK plays the node's kubelet (its annotation says so)."""
    if not node:
        return False
    try:
        found = await ctx.store.list_nodes([node])
    except Exception:  # noqa: BLE001  (the answer is only a better sentence)
        return False
    return any(
        marks.SIMULATED_NODE_ANNOTATION in ((n.get("metadata") or {}).get("annotations") or {})
        for n in found
    )
