"""A run's logs: `GET /v1/runs/{ns}/{name}/logs`, streamed from the worker's pod.

`follow=true` waits (up to `logs_wait_s`) for the pod to start, then keeps the stream open
until the container ends; a client that hangs up ends the upstream stream too.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

from aiohttp import web

from controller import errors, marks, serving
from controller.runs import context, lifecycle, logtext, reconciling, rendering, views
from shared import spec as specs

LOG_POLL_S = 0.5


def _pick_pod(
    kind: str, pods: list[dict[str, Any]], worker: int
) -> tuple[dict[str, Any], str] | None:
    """The pod and container of worker `worker` (ray: 0 is the head, 1.. the workers)."""
    ordered = sorted(
        ((views.parse_pod(p), p) for p in pods),
        key=lambda vp: (vp[0].index if vp[0].index is not None else 0, vp[0].created or
                        dt.datetime.min.replace(tzinfo=dt.UTC), vp[0].name),
    )  # fmt: skip
    if kind == str(specs.RunKind.RAY):
        heads = [vp for vp in ordered if rendering.RAY_HEAD_CONTAINER in vp[0].containers]
        workers = [vp for vp in ordered if rendering.RAY_WORKER_CONTAINER in vp[0].containers]
        if worker == 0:
            return (heads[0][1], rendering.RAY_HEAD_CONTAINER) if heads else None
        if worker - 1 < len(workers):
            return workers[worker - 1][1], rendering.RAY_WORKER_CONTAINER
        return None
    live = [vp for vp in ordered if not vp[0].deleting] or ordered
    if worker < len(live):
        return live[worker][1], rendering.CONTAINER_NAME
    return None


@serving.streaming
async def get_logs(request: web.Request) -> web.StreamResponse:
    """Stream a worker's log (`follow=true` keeps it open until the container ends)."""
    identity = await serving.identity(request)
    namespace = context.check_namespace(request.match_info["namespace"])
    name = request.match_info["name"]
    await context.allow(request, identity, "get", namespace, resource="pods", group="",
                 subresource="log")  # fmt: skip
    st = serving.serving_of(request)
    ctx = context.context_of(request)
    follow = request.query.get("follow", "").lower() in {"1", "true", "yes"}
    try:
        worker = int(request.query.get("worker", "0"))
        attempt_q = request.query.get("attempt")
        tail = request.query.get("tail")
        tail_lines = int(tail) if tail else None
        attempt = int(attempt_q) if attempt_q else None
    except ValueError as err:
        raise errors.InvalidParameter("attempt, worker and tail are numbers") from err
    if worker < 0:
        raise errors.InvalidParameter("worker counts from 0", field="worker")
    deadline = asyncio.get_running_loop().time() + (st.settings.logs_wait_s if follow else 0)
    while True:
        item = await ctx.store.get_run(namespace, name)
        if item is None:
            raise reconciling.RunNotFoundError(namespace, name)
        status = item.get("status") or {}
        number = attempt or int(status.get("currentAttempt") or 0)
        kind = str((item.get("spec") or {}).get("kind") or specs.RunKind.JOB)
        selector = f"{marks.RUN_LABEL}={name},{marks.ATTEMPT_LABEL}={number}"
        picked = _pick_pod(kind, await ctx.store.list_pods(namespace, selector), worker)
        started = picked is not None and views.parse_pod(picked[0]).phase != "Pending"
        if started or asyncio.get_running_loop().time() >= deadline:
            break
        if status.get("phase") in {lifecycle.Phase.CANCELLED, lifecycle.Phase.FAILED}:
            break
        await asyncio.sleep(LOG_POLL_S)
    if picked is None:
        msg = f"run {name!r} has no pod for worker {worker} of attempt {number} (yet)"
        raise errors.NotFound(msg, field="worker", code="NoPod")
    pod, container = picked
    pod_name = str(pod["metadata"]["name"])
    resp = web.StreamResponse(headers={"Content-Type": "text/plain; charset=utf-8",
                                       "X-TauGrid-Pod": pod_name})  # fmt: skip
    chunks = ctx.store.stream_log(namespace, pod_name, container, follow=follow,
                                  tail_lines=tail_lines)  # fmt: skip
    try:
        first = await anext(chunks, b"")
    except Exception as err:
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
