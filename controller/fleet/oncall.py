"""The on-call API of the fleet: nodes and their GPUs (`/v1/nodes*`), quarantine and release
by hand, the fleet's breaker and mode (`/v1/fleet*`), and the agent's own API proxied through
the controller (`/v1/nodes/{name}/gpus`, `/diag`, `/agent/release`). Every call needs the
on-call rights its verb stands for (`get nodes`, `patch nodes`)."""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import structlog
from aiohttp import web

from controller import auth, errors, forwarding, serving, timestamps
from controller.fleet import (
    actions,
    agentcalls,
    agentproxy,
    api,
    devices,
    nodes,
    quarantining,
    schemas,
)
from shared import fastheartbeat

log = structlog.get_logger()

TAG = "fleet"
"""The OpenAPI tag of these routes (the fleet's)."""


# ---------------------------------------------------------------------- on-call
def _node_json(ctx: api.FleetContext, name: str, *, detail: bool) -> dict[str, Any]:
    now = api.utcnow()
    raw = ctx.cache.nodes.get(name)
    view = nodes.parse(raw) if raw is not None else nodes.NodeView(name)  # none: no marks
    q = ctx.quarantiner
    h = q.last.health.get(name) if q.last is not None else None
    if h is None and name in ctx.fleet:
        h = ctx.fleet.assess(name, now, default_interval_s=q.settings.default_interval_s)
    rec = ctx.fleet.get(name)
    out: dict[str, Any] = {
        "name": name,
        "state": h.state.value if h else "Unknown",
        "reason": h.reason if h else "",
        "message": h.message if h else "",
        "lastHeartbeat": timestamps.rfc3339_exact(rec.received_at) if rec else None,
        "bootId": rec.heartbeat.boot_id if rec else None,
        "agentUrl": rec.heartbeat.agent_url if rec else None,
        "managed": view.managed,
        "unschedulable": view.unschedulable,
        "cordonedByUs": view.cordoned_by_us,
        "tainted": view.tainted,
        "gpuCapacity": view.gpu_capacity,
        "quarantine": None,
        "inCluster": raw is not None,
        "fencedGpus": len(_fenced(q, name)),
    }
    if (record := view.quarantine) is not None:
        out["quarantine"] = {
            "mode": record.mode.value,
            "by": record.by,
            "at": timestamps.rfc3339_exact(record.at),
            "reason": record.reason,
            "clearsWith": record.clears_with.value,
            "evictAfter": timestamps.rfc3339_exact(record.evict_after),
        }
    if detail:
        out["devices"] = [_fenced_json(f, q) for f in _fenced(q, name)]
        gpus = rec.heartbeat.gpus if rec else []
        out["gpus"] = [fastheartbeat.gpu_json(g) for g in gpus]
        out["history"] = [e.to_json() for e in view.history]
        out["problems"] = list(view.problems)
        c = view.condition
        out["condition"] = (
            {"status": c.status.value, "reason": c.reason, "message": c.message} if c else None
        )
    return out


NODE_DETAIL = {200: serving.Reply("The node, with per-GPU detail.", schemas.NodeDetail)}
FLEET_VIEW = {200: serving.Reply("The fleet's breaker, mode and counts.", schemas.FleetView)}


@serving.operation(
    "listNodes", tag=TAG, query=schemas.NodesQuery,
    replies={200: serving.Reply("Every GPU node.", schemas.NodeList)},
)  # fmt: skip
async def list_nodes(request: web.Request) -> web.StreamResponse:
    """Fleet health: every GPU node with its state and quarantine (on-call: `get nodes`)."""
    who = await serving.on_call(request, "get")
    if (leader := await forwarding.unless_leader(request, who)) is not None:
        return leader
    query = serving.query_of(request, schemas.NodesQuery)
    ctx = api.context_of(request)
    names = sorted(set(ctx.cache.nodes) | set(ctx.fleet))
    items = [_node_json(ctx, n, detail=False) for n in names]
    if query.state is not None:
        items = [i for i in items if i["state"] == query.state]
    return serving.json_response({"items": items})


@serving.operation("getNode", tag=TAG, path=schemas.NodePath, replies=NODE_DETAIL, errors=(404,))
async def get_node(request: web.Request) -> web.StreamResponse:
    """One node: per-GPU detail, quarantine state and history (on-call: `get nodes`)."""
    who = await serving.on_call(request, "get")
    if (leader := await forwarding.unless_leader(request, who)) is not None:
        return leader
    ctx = api.context_of(request)
    name = serving.path_of(request, schemas.NodePath).name
    if name not in ctx.cache.nodes and name not in ctx.fleet:
        raise errors.NotFound(f"node {name} is not known", field="name")
    return serving.json_response(_node_json(ctx, name, detail=True))


async def _manual(request: web.Request, release: bool) -> web.StreamResponse:
    identity = await serving.on_call(request, "patch")
    if (leader := await forwarding.unless_leader(request, identity)) is not None:
        return leader
    ctx = api.context_of(request)
    name = serving.path_of(request, schemas.NodePath).name
    body = await serving.json_body(request, schemas.QuarantineRequest)
    raw = ctx.cache.nodes.get(name)
    if raw is None:
        raise errors.NotFound(f"node {name} does not exist", field="name")
    await ctx.quarantiner.manual(nodes.parse(raw), release=release, by=identity.username,
                                 reason=body.reason, now=api.utcnow())  # fmt: skip
    return serving.json_response(_node_json(ctx, name, detail=True))


QUARANTINE_BODY = serving.Body(schemas.QuarantineRequest)


@serving.operation(
    "quarantineNode", tag=TAG, path=schemas.NodePath, body=QUARANTINE_BODY,
    replies=NODE_DETAIL, errors=(404, 409),
)  # fmt: skip
async def post_quarantine(request: web.Request) -> web.StreamResponse:
    """Quarantine a node by hand (reason required); only a manual release ends it.

    On-call: `patch nodes`.
    """
    return await _manual(request, release=False)


@serving.operation(
    "releaseNode", tag=TAG, path=schemas.NodePath, body=QUARANTINE_BODY,
    replies=NODE_DETAIL, errors=(404, 409),
)  # fmt: skip
async def delete_quarantine(request: web.Request) -> web.StreamResponse:
    """Release a node by hand (reason required). On-call: `patch nodes`."""
    return await _manual(request, release=True)


def _fenced(q: quarantining.Quarantiner, node: str) -> tuple[actions.FencedDevice, ...]:
    devs = q.last_devices
    return devs.fenced.get(node, ()) if devs is not None else ()


def _clears(f: actions.FencedDevice, q: quarantining.Quarantiner) -> str:
    """What clears a fenced GPU, in words, from its record and where its streak stands."""
    after = q.device_settings.release_after_s if q.device_settings else 0
    if f.release_at is not None:
        at = timestamps.rfc3339(f.release_at)
        return f"healthy since {timestamps.rfc3339(f.healthy_since)}: released at {at}"
    first = "the agent clearing its latched fault"
    if f.record is not None and f.record.clears_with is nodes.Clearing.MANUAL_RELEASE:
        first = "an on-call release of the latched fault on the agent (POST /v1/release)"
    elif f.record is not None:
        first = "a GPU reset the agent observes (then a passing diagnostic, with DCGM)"
    return f"{first}, then healthy reports for {after:g}s"


def _fenced_json(f: actions.FencedDevice, q: quarantining.Quarantiner) -> dict[str, Any]:
    record = f.record
    return {
        "device": f.device,
        "gpuUuid": f.gpu_uuid,
        "dryRun": all(r.kind is devices.RuleKind.DRY_RUN for r in f.rules),
        "reason": record.reason if record else "",
        "message": record.message if record else "",
        "since": timestamps.rfc3339_exact(record.at) if record else None,
        "clearsWith": record.clears_with.value if record else None,
        "clears": _clears(f, q),
        "healthySince": timestamps.rfc3339_exact(f.healthy_since),
        "releaseAt": timestamps.rfc3339_exact(f.release_at),
        "rules": [
            {
                "name": r.name,
                "key": r.key,
                "effect": r.effect,
                "timeAdded": timestamps.rfc3339(r.time_added),
                "evictionInProgress": (
                    {"status": r.eviction_status, "message": r.eviction_message}
                    if r.eviction_status
                    else None
                ),
            }
            for r in f.rules
        ],
    }


def _fleet_json(st: serving.ServingState, ctx: api.FleetContext) -> dict[str, Any]:
    q = ctx.quarantiner
    last = q.last
    states = collections.Counter(h.state.value for h in last.health.values()) if last else {}
    devs = q.last_devices
    device_json = {
        "gpuMode": q.device_settings.mode.value if q.device_settings else "device-plugin",
        "breaker": q.device_breaker.model_dump(mode="json", by_alias=True),
        "draNodes": len(devs.dra_nodes) if devs else 0,
        "gpus": devs.devices_total if devs else 0,
        "quarantined": devs.quarantined_devices if devs else 0,
        "maxQuarantined": devs.max_quarantined_devices if devs else None,
    }
    return {
        "leader": st.elector.identity,
        "dryRun": q.settings.dry_run,
        "breaker": q.breaker.model_dump(mode="json", by_alias=True),
        "nodes": len(set(ctx.cache.nodes) | set(ctx.fleet)),
        "quarantined": last.quarantined if last else 0,
        "maxQuarantined": last.max_quarantined if last else None,
        "states": dict(sorted(states.items())),
        "devices": device_json,
    }


@serving.operation("getFleet", tag=TAG, replies=FLEET_VIEW)
async def get_fleet(request: web.Request) -> web.StreamResponse:
    """Breaker state, dry-run mode and fleet counts (on-call: `get nodes`)."""
    who = await serving.on_call(request, "get")
    if (leader := await forwarding.unless_leader(request, who)) is not None:
        return leader
    return serving.json_response(_fleet_json(serving.serving_of(request), api.context_of(request)))


@serving.operation(
    "resetBreaker", tag=TAG,
    body=serving.Body(schemas.BreakerResetRequest, required=False), replies=FLEET_VIEW,
)  # fmt: skip
async def reset_breaker(request: web.Request) -> web.StreamResponse:
    """Close the quarantine circuit breaker (an operator's decision; `patch nodes`).

    The body `{"reason": "..."}` says why (1 to 1,024 characters), kept in the breaker's
    Event on the controller's Lease and in the controller's log with who reset it; it is
    optional, so a call without a body (older clients) still resets, with no reason recorded.
    """
    identity = await serving.on_call(request, "patch")
    if (leader := await forwarding.unless_leader(request, identity)) is not None:
        return leader
    reason = ""
    if request.body_exists:  # no body: no reason; a body must carry one, as a release's
        body = await serving.json_body(request, schemas.BreakerResetRequest, optional=True)
        reason = body.reason
    ctx = api.context_of(request)
    await ctx.quarantiner.reset_breaker(by=identity.username, now=api.utcnow(), reason=reason)
    return serving.json_response(_fleet_json(serving.serving_of(request), ctx))


@serving.operation(
    "setFleetMode", tag=TAG, body=serving.Body(schemas.ModeRequest), replies=FLEET_VIEW
)
async def put_mode(request: web.Request) -> web.StreamResponse:
    """Switch dry run on or off at runtime (`patch nodes`)."""
    identity = await serving.on_call(request, "patch")
    if (leader := await forwarding.unless_leader(request, identity)) is not None:
        return leader
    body = await serving.json_body(request, schemas.ModeRequest)
    ctx = api.context_of(request)
    ctx.quarantiner.set_dry_run(body.dry_run, by=identity.username)
    return serving.json_response(_fleet_json(serving.serving_of(request), ctx))


# ---------------------------------------------------------------------- the agent, proxied


def _agent_of(ctx: api.FleetContext, name: str) -> tuple[agentproxy.AgentClient, str]:
    """The client and the IP of the agent of node `name`: the pod its last heartbeat's token
    was bound to (never an address a report carried). NotFound for a node this controller
    does not know; BadGateway (502) when no agent of it can be reached, saying why."""
    if name not in ctx.cache.nodes and name not in ctx.fleet:
        raise errors.NotFound(f"node {name} is not known", field="name")
    if ctx.agent_client is None:
        msg = "this controller does not call agents (not wired); use a port-forward to the agent"
        raise errors.BadGateway(msg, code="AgentUnreachable")
    rec = ctx.fleet.get(name)
    if rec is None or not rec.pod_uid:
        msg = f"no agent of node {name} has reported to this controller; is its agent running?"
        raise errors.BadGateway(msg, code="AgentUnreachable")
    ip = ctx.agents.ip_of(rec.pod_uid)
    if not ip or not ctx.agents.alive(rec.pod_uid):
        msg = (
            f"the agent pod of node {name} that last reported (uid {rec.pod_uid}) is gone or"
            " has no IP; wait for its successor's first heartbeat"
        )
        raise errors.BadGateway(msg, code="AgentUnreachable")
    return ctx.agent_client, ip


async def _agent_call(
    request: web.Request, verb: str, make: Callable[[], agentcalls.AgentCall]
) -> web.StreamResponse:
    """Authorise the caller for `verb` on nodes (as every on-call call), on the leader (whose
    heartbeats say where each agent is), then make the call with the controller's own
    credential and relay the agent's answer."""
    identity = await serving.on_call(request, verb)
    if (leader := await forwarding.unless_leader(request, identity)) is not None:
        return leader
    ctx = api.context_of(request)
    name = serving.path_of(request, schemas.NodePath).name
    call = make()
    agent, ip = _agent_of(ctx, name)
    with_token = True
    if call.call is agentcalls.Call.GPUS:
        # Pod names (which tenant holds which GPU) go only to the on-call right the agent
        # shows them to (`patch nodes`): for a caller who may only read, the agent is asked
        # as anyone is, and leaves them out itself.
        with_token = await _may(request, identity, "patch")
    log.info("agent_call_requested", node=name, action=call.call.value, by=identity.username)
    relayed = await agent.call(name, ip, call, with_token=with_token)
    return web.Response(body=relayed.payload, status=relayed.status, content_type=serving.JSON)


async def _may(request: web.Request, who: auth.Identity, verb: str) -> bool:
    try:
        await serving.allow(request, who, auth.Access(verb=verb, resource="nodes"))
    except errors.Forbidden:
        return False
    return True


AGENT_GPUS = {200: serving.Reply("The agent's view of its GPUs.", schemas.AgentAnswer)}


@serving.operation(
    "getNodeAgentGpus", tag=TAG, path=schemas.NodePath, replies=AGENT_GPUS, errors=(404, 502)
)
async def get_agent_gpus(request: web.Request) -> web.StreamResponse:
    """The node's agent's own view of its GPUs, through the controller (`get nodes`).

    The agent's `GET /v1/gpus` (latched faults and what clears them, last diagnostics, DCGM
    and NVML status), called by the controller with its own credential. Pod names are shown
    to a caller who may also `patch nodes`, as the agent shows them. 502 when the node has
    no reachable agent, 504 when it does not answer in time.
    """
    return await _agent_call(request, "get", agentcalls.gpus)


@serving.operation(
    "runNodeDiagnostic", tag=TAG, path=schemas.NodePath, query=schemas.DiagQuery,
    replies={202: serving.Reply("The diagnostic started; its result appears in /gpus.",
                                schemas.AgentAnswer)},
    errors=(404, 409, 502),
)  # fmt: skip
async def post_agent_diag(request: web.Request) -> web.StreamResponse:
    """Start a DCGM diagnostic on the node's agent (`patch nodes`).

    The agent's `POST /v1/diag?level=N`, never waited for: read the result in
    `GET /v1/nodes/{name}/gpus` (`lastDiagnostic`). The agent refuses 409 while one runs,
    or a level above 1 on a node whose GPUs are in use, and 503 without DCGM.
    """
    level = serving.query_of(request, schemas.DiagQuery).level
    return await _agent_call(request, "patch", lambda: agentcalls.diag(level))


@serving.operation(
    "releaseNodeAgentLatch", tag=TAG, path=schemas.NodePath, query=schemas.LatchReleaseQuery,
    replies={200: serving.Reply("The faults released.", schemas.AgentAnswer)},
    errors=(404, 502),
)  # fmt: skip
async def post_agent_release(request: web.Request) -> web.StreamResponse:
    """Release latched faults on the node's agent (`patch nodes`).

    The agent's `POST /v1/release`: an Inspect fault stays latched (the node Failed) until a
    person releases it here; then release the node (`DELETE .../quarantine`). `force=true`
    releases other faults too. 404 NothingReleased when no latched fault matched.
    """
    q = serving.query_of(request, schemas.LatchReleaseQuery)
    return await _agent_call(
        request, "patch", lambda: agentcalls.release(gpu=q.gpu, code=q.code, force=q.force)
    )
