"""The fleet's HTTP API: heartbeats from agents, and the on-call calls (DESIGN.md section 4).

`POST /v1/heartbeats` is the hot path: it authenticates (cached), decodes and validates the
JSON in one msgspec step (`shared.fastheartbeat`, the strict schema of `shared.heartbeat`;
a refused body is read again by the pydantic model only to say what is wrong), ingests,
and wakes the quarantine loop only when a verdict, the faults or the boot changed. The
on-call calls read and act on the leader's fleet state: each is authorised here as the
Kubernetes verb on nodes it stands for (`get` to read, `patch` to act), and a follower then
sends it to the leader for the caller it reviewed, under its own peer token
(`forwarding.unless_leader`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import datetime as dt
import re
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
import pydantic
import structlog
from aiohttp import web

from controller import auth, errors, forwarding, serving, timestamps
from controller.fleet import (
    actions,
    agentcalls,
    agentproxy,
    devices,
    nodes,
    quarantining,
    relaying,
    relays,
    reports,
    schemas,
    state,
)
from controller.kube import nodes as kube_nodes
from controller.settings import ControllerSettings
from shared import fastheartbeat, heartbeat, jsonsafe

log = structlog.get_logger()


@dataclasses.dataclass
class FleetContext:
    """The fleet's live objects the handlers read and act through."""

    fleet: state.FleetState
    quarantiner: quarantining.Quarantiner
    cache: kube_nodes.NodeCache
    agents: kube_nodes.AgentPods
    """The pods agent tokens are bound to: where `agentUrl` comes from."""
    relayer: relaying.Relayer | None = None
    """A follower's relay of heartbeats to the leader (`relay_context`); None: forward each."""
    agent_client: agentproxy.AgentClient | None = None
    """How the on-call calls reach a node's agent; None: not wired (502 saying so)."""


FLEET = web.AppKey("fleet", FleetContext)


def add_routes(app: web.Application) -> None:
    """Register the fleet routes."""
    app.router.add_post("/v1/heartbeats", post_heartbeat)
    app.router.add_post(relaying.PATH, post_peer_heartbeats)
    app.router.add_get("/v1/nodes", list_nodes)
    app.router.add_get("/v1/nodes/{name}", get_node)
    app.router.add_post("/v1/nodes/{name}/quarantine", post_quarantine)
    app.router.add_delete("/v1/nodes/{name}/quarantine", delete_quarantine)
    app.router.add_get("/v1/nodes/{name}/gpus", get_agent_gpus)
    app.router.add_post("/v1/nodes/{name}/diag", post_agent_diag)
    app.router.add_post("/v1/nodes/{name}/agent/release", post_agent_release)
    app.router.add_get("/v1/fleet", get_fleet)
    app.router.add_post("/v1/fleet/breaker/reset", reset_breaker)
    app.router.add_put("/v1/fleet/mode", put_mode)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _ctx(request: web.Request) -> FleetContext:
    if FLEET not in request.app:
        raise errors.Unavailable("the controller is starting; retry shortly", code="Starting")
    return request.app[FLEET]


# ---------------------------------------------------------------------- heartbeats
TAG = "fleet"


def _heartbeat_limits(settings: ControllerSettings) -> dict[str, dict[str, Any]]:
    """The interval range this controller accepts, as the document publishes it."""
    return {
        "intervalS": {
            "minimum": settings.heartbeat_min_interval_s,
            "maximum": settings.heartbeat_max_interval_s,
        }
    }


@serving.operation(
    "postHeartbeat", tag=TAG,
    body=serving.Body(heartbeat.Heartbeat, limits=_heartbeat_limits),
    replies={202: serving.Reply("Taken in (a replay of a report already taken too).",
                                schemas.HeartbeatAccepted)},
)  # fmt: skip
async def post_heartbeat(request: web.Request) -> web.StreamResponse:
    """Ingest one node's report (agents only, each for its own node).

    The token must be the agent ServiceAccount's, bound to a pod on the node the report names;
    any other identity is refused before the body is read. `intervalS` and `sentAt` must lie
    within the controller's range and skew window; `agentUrl` is ignored (the controller
    derives it from the pod the token is bound to).
    """
    st = serving.serving_of(request)
    started = time.perf_counter()
    try:
        identity = await serving.identity(request, (st.settings.token_audience,))
        agent = auth.agent_username(st.settings.namespace, st.settings.agent_service_account)
        auth.check_heartbeat_identity(identity, agent)  # nobody else's body is ever parsed
        raw = await serving.read_body(request, st.settings.max_body_bytes)
        hb: fastheartbeat.Report
        try:
            # The fast path: msgspec decodes and validates the JSON in one step.
            hb = fastheartbeat.decode(raw)
        except msgspec.DecodeError:  # ValidationError is one
            hb = _explain_bad_heartbeat(raw)
        auth.check_heartbeat_sender(identity, agent, hb.node_name)
        s = st.settings
        problem = reports.heartbeat_problem(
            hb, _now(), min_interval_s=s.heartbeat_min_interval_s,
            max_interval_s=s.heartbeat_max_interval_s, max_skew_s=s.heartbeat_max_skew_s,
        )  # fmt: skip
        if problem is not None:
            raise errors.Invalid(problem[1], field=problem[0])
        if not st.elector.is_leader():
            # The leader gets the report as parsed here, for the agent reviewed here, under
            # this replica's own peer token: the agent's token stays with this replica.
            relayer = request.app[FLEET].relayer if FLEET in request.app else None
            if relayer is None:
                st.metrics.count_heartbeat("forwarded")
                return await forwarding.forward(request, identity, fastheartbeat.wire(hb))
            kind = await relayer.submit(hb, identity)
            st.metrics.count_heartbeat("relayed")
            body = {"accepted": True, "node": hb.node_name, "sequence": hb.sequence,
                    "relayed": kind.value}  # fmt: skip
            return heartbeat_accepted(body)
        ctx = _ctx(request)
        url = _agent_url(ctx, st, identity)
        if hb.agent_url != url:  # the chart's agents send the same URL: no copy then
            hb = fastheartbeat.with_agent_url(hb, url)
        before = _verdict_key(ctx.fleet.get(hb.node_name))
        ingested = ctx.fleet.ingest(hb, _now(), pod_uid=identity.pod_uid or "")
        if ingested and _verdict_key(ctx.fleet.get(hb.node_name)) != before:
            # Only a change of verdict, faults or boot wakes the quarantine loop at once; a
            # steady report does not, so a big fleet's heartbeats do not cost a pass each.
            ctx.quarantiner.poke()
        st.metrics.count_heartbeat("accepted")
        log.debug("heartbeat", node=hb.node_name, sequence=hb.sequence)
        return heartbeat_accepted({"accepted": True, "node": hb.node_name, "sequence": hb.sequence})
    except errors.ControllerError:
        st.metrics.count_heartbeat("rejected")
        raise
    finally:
        st.metrics.heartbeat_seconds.observe(time.perf_counter() - started)


_ENCODE = msgspec.json.Encoder().encode


def heartbeat_accepted(body: dict[str, object]) -> web.Response:
    """The 202 of a heartbeat, encoded by msgspec (aiohttp's `json_response` costs ~3× as
    much, on the hot path)."""
    return web.Response(body=_ENCODE(body), status=202, content_type="application/json")


def _agent_url(ctx: FleetContext, st: serving.ServingState, who: auth.Identity) -> str:
    """The agent's URL: the IP of the pod its token is bound to, and the agents' port; ""
    while that pod is not known. Never the `agentUrl` of the body (security review M6)."""
    ip = ctx.agents.ip_of(who.pod_uid or "")
    if not ip:
        return ""
    host = f"[{ip}]" if ":" in ip else ip
    return f"{st.settings.agent_scheme}://{host}:{st.settings.agent_port}"


def _explain_bad_heartbeat(raw: bytes) -> heartbeat.Heartbeat:
    """Re-read a body the fast path refused, to say exactly what is wrong with it (4xx): the
    limits of `shared.jsonsafe` first (integer length, depth, NaN, duplicate keys), then the
    strict model, which names the field. The model is the authority: a body it accepted would
    be taken (the differential test in tests/unit/shared/test_fastheartbeat.py says none is)."""
    data = errors.read_json(raw)
    if isinstance(data, dict) and data.get("schemaVersion") not in (None, heartbeat.SCHEMA_VERSION):
        msg = (
            f"schemaVersion {str(data.get('schemaVersion'))[:40]!r} is not supported; "
            f"this controller speaks {heartbeat.SCHEMA_VERSION}"
        )
        raise errors.Invalid(msg, field="schemaVersion", code="UnsupportedSchema")
    try:
        return heartbeat.validate_json(raw)
    except pydantic.ValidationError as err:
        raise errors.validation_error(err) from err


def _verdict_key(record: state.NodeRecord | None) -> object:
    if record is None:
        return None
    return (record.verdict, record.action, record.faults, record.heartbeat.boot_id)


# ---------------------------------------------------------------------- relayed heartbeats
async def relay_context(app: web.Application) -> AsyncIterator[None]:
    """Run this replica's heartbeat relay (used while it follows) for the app's lifetime;
    after the runtime's context, whose serving state and fleet it uses."""
    st = app[serving.SERVING]
    if not st.settings.heartbeat_relay:
        yield
        return
    relayer = relaying.Relayer(st)
    app[FLEET].relayer = relayer
    task = asyncio.create_task(relayer.run(), name="heartbeat-relay")
    try:
        yield
    finally:
        app[FLEET].relayer = None
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


_MSGSPEC_PATH = re.compile(r" - at `\$(?P<path>[^`]*)`\Z")


def _decode_problem(err: msgspec.MsgspecError, where: str) -> errors.ControllerError:
    """A msgspec refusal as a 4xx naming the field (`entries[3].report.gpus[0].uuid`)."""
    text = str(err)
    found = _MSGSPEC_PATH.search(text)
    path = found.group("path") if found else ""
    field = f"{where}{path}".lstrip(".")
    message = text[: found.start()] if found else text
    if isinstance(err, msgspec.ValidationError):
        return errors.Invalid(f"{field or 'body'}: {message}", field=field or "body")
    return errors.Malformed(f"{where or 'the body'} is not JSON: {message}", field=where or "body")


@serving.operation(
    "postPeerHeartbeats", tag=TAG, body=serving.Body(schemas.PeerBatch),
    replies={200: serving.Reply("What the leader made of each entry.", schemas.PeerAnswer)},
)  # fmt: skip
async def post_peer_heartbeats(request: web.Request) -> web.StreamResponse:
    """Take a follower's batch of heartbeats (controller replicas only; the leader only).

    The peer token must be a controller replica's (audience `peer_audience`, the replicas'
    ServiceAccount); anyone else is refused before the body is read. A full report is
    checked as a direct heartbeat is, for the agent the follower reviewed; a liveness entry
    is applied to the record of its key, or its node is named in `need`. An entry the schema
    refuses refuses the batch (422 naming it); a well-formed entry that is not acceptable is
    refused alone (`refused`), never the batch.
    """
    st = serving.serving_of(request)
    await serving.peer(request)
    if not st.elector.is_leader():
        raise errors.Unavailable("this replica does not lead; retry", code="NotLeader")
    ctx = _ctx(request)
    raw = await serving.read_body(request, st.settings.peer_max_body_bytes)
    try:
        # Before decoding: msgspec recurses into an entry's raw JSON (security review 3,
        # finding 12: 100,000 `[` were a RecursionError, a 500).
        jsonsafe.check_raw_depth(raw)
    except jsonsafe.JsonError as err:
        raise errors.Malformed(f"the body is not JSON we read: {err}", field="body") from err
    try:
        batch = relays.BATCH_DECODER.decode(raw)
    except msgspec.MsgspecError as err:
        raise _decode_problem(err, "") from err
    if len(batch.entries) > st.settings.peer_batch_max_entries:
        msg = (
            f"a batch of {len(batch.entries)} entries exceeds the limit of"
            f" {st.settings.peer_batch_max_entries} (peer_batch_max_entries)"
        )
        raise errors.Invalid(msg, field="entries")
    # An entry that is not one (the schema) refuses the batch, 422 naming it: no replica of
    # this version sends one. What is refused alone is an entry that is well formed but not
    # acceptable (its agent, its times), as a direct heartbeat would be.
    entries: list[relays.WireEntry] = []
    for index, entry_raw in enumerate(batch.entries):
        try:
            entry = relays.ENTRY_DECODER.decode(entry_raw)
        except msgspec.MsgspecError as err:
            raise _decode_problem(err, f"entries[{index}]") from err
        if entry.report is not None:
            where = f"entries[{index}].report"
            try:
                fastheartbeat.check(entry.report)
            except msgspec.ValidationError as err:
                raise errors.Invalid(f"{where}: {err}", field=f"{where}.gpus") from err
            # The interval range is the published schema's too (the Heartbeat component).
            problem = reports.interval_problem(
                entry.report, min_interval_s=st.settings.heartbeat_min_interval_s,
                max_interval_s=st.settings.heartbeat_max_interval_s,
            )  # fmt: skip
            if problem is not None:
                raise errors.Invalid(f"{where}: {problem}", field=f"{where}.intervalS")
        entries.append(entry)
    now = _now()
    outcomes: list[str] = []
    need: list[str] = []
    needed: set[str] = set()
    """The nodes with an entry needed in full (after a failover: most of the batch)."""
    refused: list[dict[str, Any]] = []
    poke = False
    for index, entry in enumerate(entries):
        where = f"entries[{index}]"
        kind = "liveness"
        node = ""
        try:
            node = entry.node
            kind = "liveness" if entry.report is None else "full"
            if node in needed:
                # A node's entries apply in order: after one the leader needs in full, the
                # rest come again after it.
                outcome = reports.Relayed.NEED
            else:
                before = _verdict_key(ctx.fleet.get(entry.node))
                outcome = await _relayed(ctx, st, entry, now)
                poke = poke or _verdict_key(ctx.fleet.get(entry.node)) != before
        except errors.ControllerError as err:
            outcome = reports.Relayed.REFUSED
            field = err.field if err.field.startswith(where) else f"{where}.{err.field}"
            refused.append({"index": index, "node": node, "status": serving.status_of(err),
                            "code": err.code, "message": err.message,
                            "field": field.rstrip(".")})  # fmt: skip
        if outcome is reports.Relayed.NEED and node not in needed:
            needed.add(node)
            need.append(node)
        outcomes.append(outcome.value)
        st.metrics.peer_entries.labels(kind, outcome.value).inc()
    if poke:
        ctx.quarantiner.poke()
    body = {"outcomes": outcomes, "need": need, "refused": refused}
    return web.json_response(body)


async def _relayed(
    ctx: FleetContext, st: serving.ServingState, entry: relays.WireEntry, now: dt.datetime
) -> reports.Relayed:
    """Apply one entry of a follower's batch: as a direct heartbeat received when the
    follower received it (within the skew window of now), or as liveness."""
    s = st.settings
    if entry.node not in ctx.cache.nodes:
        # A peer reports only nodes the cluster has (review 3, finding 8): a record of a node
        # that is not there would never be forgotten.
        msg = f"node {entry.node[:64]!r} is not a node of this cluster (as the node cache has it)"
        raise errors.NotFound(msg, field="node")
    bound_ms = int(s.heartbeat_max_skew_s * 1000)
    last_ago = min(entry.received_ago_ms, bound_ms)
    first_ago = max(min(entry.first_ago_ms, bound_ms), last_ago)
    last_at = now - dt.timedelta(milliseconds=last_ago)
    first_at = now - dt.timedelta(milliseconds=first_ago)
    if entry.report is None:
        if entry.caller is not None:
            raise errors.Invalid("a liveness entry carries no caller", field="caller")
        skew = abs(entry.sent_at.timestamp() - last_at.timestamp())
        if skew > s.heartbeat_max_skew_s:
            msg = f"sentAt is {skew:.0f} s from its receipt; at most {s.heartbeat_max_skew_s:g}"
            raise errors.Invalid(msg, field="sentAt")
        return ctx.fleet.ingest_liveness(
            entry.node, key=entry.key, boot_id=entry.boot_id, sequence=entry.sequence,
            sent_at=entry.sent_at, first_at=first_at, last_at=last_at,
        )  # fmt: skip
    hb: fastheartbeat.Report = entry.report  # checked with the batch
    for name, value, carried in (("nodeName", hb.node_name, entry.node),
                                 ("bootId", hb.boot_id, entry.boot_id),
                                 ("sequence", hb.sequence, entry.sequence)):  # fmt: skip
        if value != carried:
            msg = f"the report's {name} is not the entry's ({str(value)[:64]!r})"
            raise errors.Invalid(msg, field=f"report.{name}")
    if entry.caller is None:
        raise errors.Invalid("a full report carries the agent's caller", field="caller")
    try:
        caller = auth.decode_caller(entry.caller)
    except errors.Malformed as err:
        raise errors.Invalid(err.message, field="caller") from err
    agent = auth.agent_username(s.namespace, s.agent_service_account)
    try:
        auth.check_heartbeat_sender(caller, agent, hb.node_name)
    except errors.Forbidden as err:
        raise errors.Forbidden(err.message, field="caller") from err
    problem = reports.heartbeat_problem(
        hb, last_at, min_interval_s=s.heartbeat_min_interval_s,
        max_interval_s=s.heartbeat_max_interval_s, max_skew_s=s.heartbeat_max_skew_s,
    )  # fmt: skip
    if problem is not None:
        raise errors.Invalid(problem[1], field=f"report.{problem[0]}")
    url = _agent_url(ctx, st, caller)
    if hb.agent_url != url:
        hb = fastheartbeat.with_agent_url(hb, url)
    pod_uid = caller.pod_uid or ""
    key = reports.change_key(hb, pod_uid)
    return ctx.fleet.ingest_relayed(hb, first_at, last_at, pod_uid=pod_uid, key=key)


# ---------------------------------------------------------------------- on-call
def _node_json(ctx: FleetContext, name: str, *, detail: bool) -> dict[str, Any]:
    now = _now()
    raw = ctx.cache.nodes.get(name)
    view = nodes.parse(raw) if raw is not None else None
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
        "managed": view.managed if view else True,
        "unschedulable": view.unschedulable if view else False,
        "cordonedByUs": view.cordoned_by_us if view else False,
        "tainted": view.tainted if view else False,
        "gpuCapacity": view.gpu_capacity if view else 0,
        "quarantine": None,
        "inCluster": raw is not None,
        "fencedGpus": len(_fenced(q, name)),
    }
    if view is not None and view.quarantine is not None:
        record = view.quarantine
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
        out["history"] = [e.to_json() for e in view.history] if view else []
        out["problems"] = list(view.problems) if view else []
        condition = view.condition if view else None
        out["condition"] = (
            {
                "status": condition.status.value,
                "reason": condition.reason,
                "message": condition.message,
            }
            if condition
            else None
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
    ctx = _ctx(request)
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
    ctx = _ctx(request)
    name = serving.path_of(request, schemas.NodePath).name
    if name not in ctx.cache.nodes and name not in ctx.fleet:
        raise errors.NotFound(f"node {name} is not known", field="name")
    return serving.json_response(_node_json(ctx, name, detail=True))


async def _manual(request: web.Request, release: bool) -> web.StreamResponse:
    identity = await serving.on_call(request, "patch")
    if (leader := await forwarding.unless_leader(request, identity)) is not None:
        return leader
    ctx = _ctx(request)
    name = serving.path_of(request, schemas.NodePath).name
    body = await serving.json_body(request, schemas.QuarantineRequest)
    raw = ctx.cache.nodes.get(name)
    if raw is None:
        raise errors.NotFound(f"node {name} does not exist", field="name")
    await ctx.quarantiner.manual(nodes.parse(raw), release=release, by=identity.username,
                                 reason=body.reason, now=_now())  # fmt: skip
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
        return f"healthy since {timestamps.rfc3339(f.healthy_since)}: released at " + str(
            timestamps.rfc3339(f.release_at)
        )
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


def _fleet_json(st: serving.ServingState, ctx: FleetContext) -> dict[str, Any]:
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
    return serving.json_response(_fleet_json(serving.serving_of(request), _ctx(request)))


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
    sent = request.body_exists  # no body: no reason; a body must carry one, as a release's
    body = await serving.json_document(request, schemas.BreakerResetRequest, optional=True)
    reason = ""
    if sent:
        try:
            reason = schemas.BreakerResetRequest.model_validate(body).reason
        except pydantic.ValidationError as err:
            raise errors.validation_error(err, root="body") from err
    ctx = _ctx(request)
    await ctx.quarantiner.reset_breaker(by=identity.username, now=_now(), reason=reason)
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
    ctx = _ctx(request)
    ctx.quarantiner.set_dry_run(body.dry_run, by=identity.username)
    return serving.json_response(_fleet_json(serving.serving_of(request), ctx))


# ---------------------------------------------------------------------- the agent, proxied
AGENT_ANSWER = "The agent's own answer, relayed as it is (its `error` envelope on a refusal)."


def _agent_of(ctx: FleetContext, name: str) -> tuple[agentproxy.AgentClient, str]:
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
    ctx = _ctx(request)
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
