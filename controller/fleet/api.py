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
import contextlib
import dataclasses
import datetime as dt
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pydantic
import structlog
from aiohttp import web

from controller import auth, errors, forwarding, serving
from controller.fleet import (
    agentproxy,
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


def utcnow() -> dt.datetime:
    """The controller's clock (UTC)."""
    return dt.datetime.now(dt.UTC)


def context_of(request: web.Request) -> FleetContext:
    """The fleet's live objects; 503 Starting before the runtime has made them."""
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
        _check_bounds(hb, utcnow(), st.settings)
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
        ctx = context_of(request)
        hb = _with_agent_url(hb, ctx, st, identity)
        before = _verdict_key(ctx.fleet.get(hb.node_name))
        ingested = ctx.fleet.ingest(hb, utcnow(), pod_uid=identity.pod_uid or "")
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


def _with_agent_url(
    hb: fastheartbeat.Report, ctx: FleetContext, st: serving.ServingState, who: auth.Identity
) -> fastheartbeat.Report:
    """The report with the agent's URL: the IP of the pod its token is bound to, and the
    agents' port; "" while that pod is not known. Never the `agentUrl` of the body (security
    review M6). The chart's agents send the same URL: no copy then."""
    ip = ctx.agents.ip_of(who.pod_uid or "")
    url = ""
    if ip:
        host = f"[{ip}]" if ":" in ip else ip
        url = f"{st.settings.agent_scheme}://{host}:{st.settings.agent_port}"
    return hb if hb.agent_url == url else fastheartbeat.with_agent_url(hb, url)


def _check_bounds(
    hb: fastheartbeat.Report, at: dt.datetime, s: ControllerSettings, where: str = ""
) -> None:
    """Refuse a report outside this controller's bounds (`reports.heartbeat_problem`, with
    `at` its receipt), naming the field (under `where`)."""
    problem = reports.heartbeat_problem(
        hb, at, min_interval_s=s.heartbeat_min_interval_s,
        max_interval_s=s.heartbeat_max_interval_s, max_skew_s=s.heartbeat_max_skew_s,
    )  # fmt: skip
    if problem is not None:
        raise errors.Invalid(problem[1], field=where + problem[0])


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
    ctx = context_of(request)
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
    now = utcnow()
    outcomes: list[str] = []
    need: list[str] = []
    needed: set[str] = set()
    """The nodes with an entry needed in full (after a failover: most of the batch)."""
    refused: list[dict[str, Any]] = []
    poke = False
    for index, entry in enumerate(entries):
        where = f"entries[{index}]"
        node, kind = entry.node, ("liveness" if entry.report is None else "full")
        try:
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
    _check_bounds(hb, last_at, s, where="report.")
    hb = _with_agent_url(hb, ctx, st, caller)
    pod_uid = caller.pod_uid or ""
    key = reports.change_key(hb, pod_uid)
    return ctx.fleet.ingest_relayed(hb, first_at, last_at, pod_uid=pod_uid, key=key)
