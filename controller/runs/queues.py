"""The namespace's queues: `GET /v1/queues`, quota and usage, and who waits in line."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from controller import serving
from controller.runs import context, records, schemas
from shared import spec as specs


@serving.operation(
    "listQueues", tag="runs", query=schemas.QueuesQuery,
    replies={200: serving.Reply("The namespace's LocalQueues.", schemas.QueueList)},
)  # fmt: skip
async def get_queues(request: web.Request) -> web.StreamResponse:
    """The namespace's LocalQueues: their ClusterQueue's quota and usage, and who waits.

    Needs `list tauruns` in the namespace.
    """
    identity = await serving.identity(request)
    namespace = serving.query_of(request, schemas.QueuesQuery).namespace
    await context.allow(request, identity, "list", namespace)
    ctx = context.context_of(request)
    with context.expensive_read(request, identity):
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
            context.run_json(i, with_spec=False) for i in items
            if (i.get("spec") or {}).get("queue", specs.DEFAULT_QUEUE) == name
            and (i.get("status") or {}).get("phase") == records.Phase.QUEUED
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
                "waiting": [{k: r[k] for k in _WAITING} for r in waiting],
            }
        )
    return web.json_response({"namespace": namespace, "items": out})


_WAITING = ("name", "gpus", "queuePosition", "queuePositionSource", "message")
"""What a queue shows of each run waiting in it."""


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
