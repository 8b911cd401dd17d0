"""Fleet state: the last heartbeat of every node and what it says about the node, as pure code.

The HTTP handler calls `FleetState.ingest` once per accepted heartbeat; the policy reads
`FleetState.assess` for every node on each pass. Nothing here reads the clock: `now` is passed
in, and the time a heartbeat was *received* (the controller's clock, never the agent's `sentAt`)
is what staleness is measured against.

Ingestion is the hot path (3,000+ heartbeats/s on one core): it replaces one record in a dict
and summarises only the GPUs that are not healthy. Everything time-dependent (staleness, the
leader's warm-up) is derived at `assess` time, so an idle fleet costs nothing between passes.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
from collections.abc import Iterator
from typing import NamedTuple

import msgspec

from controller import timestamps
from controller.fleet import reports
from shared import fastheartbeat, health

DEFAULT_STALE_MULTIPLIER = 3.0
"""staleAfter = this × the agent's own `intervalS` (DESIGN.md section 6)."""

MAX_MESSAGE_CHARS = 1024
"""Condition messages are bounded so a node with 8 broken GPUs still gets a readable line."""

_INTERVALS_KEPT = 64
"""How many agent intervals `FleetState.stale_after` keeps its answer for."""

REASON_HEARTBEAT_STALE = "HeartbeatStale"
REASON_HEARTBEAT_MISSING = "HeartbeatMissing"
REASON_GPUS_HEALTHY = "GpusHealthy"
REASON_NO_GPUS = "NoGpusReported"


class FaultKey(NamedTuple):
    """Identity of one fault occurrence: which GPU, which finding, since when.

    `since` is the agent's ISO timestamp of the finding ("" when the agent gave none). A stale
    heartbeat is keyed with an empty GPU UUID, code `HeartbeatStale` and the staleness onset,
    so each silence is a distinct occurrence.
    """

    gpu_uuid: str
    code: str
    since: str


@dataclasses.dataclass(frozen=True, slots=True)
class Fault:
    """One finding on one GPU that makes the node not healthy."""

    gpu_uuid: str
    gpu_index: int
    code: str
    verdict: health.Verdict
    action: health.Action
    latched: bool
    since: dt.datetime | None
    message: str

    @property
    def finding(self) -> str:
        """The fault in words: `XidFallenOffBus (Failed, RebootNode, latched)`."""
        latched = ", latched" if self.latched else ""
        return f"{self.code} ({self.verdict.value}, {self.action.value}{latched})"

    @property
    def key(self) -> FaultKey:
        """Return the identity used to tell a new fault from one already handled."""
        return FaultKey(self.gpu_uuid, self.code, timestamps.rfc3339_exact(self.since) or "")


class NodeState(enum.StrEnum):
    """What the controller concludes about a node as a whole."""

    HEALTHY = "Healthy"
    DEGRADED = "Degraded"
    FAILED = "Failed"
    UNKNOWN = "Unknown"
    """The agent reported a GPU it could not judge; not a reason to quarantine."""
    STALE = "Stale"
    """Heartbeats stopped for longer than staleAfter."""
    MISSING = "Missing"
    """No heartbeat reached this leader since it took over, past its warm-up."""
    WARMING_UP = "WarmingUp"
    """No heartbeat yet, and the leader is still inside its warm-up: no judgement."""


BAD_STATES = frozenset(
    {NodeState.DEGRADED, NodeState.FAILED, NodeState.UNKNOWN, NodeState.STALE, NodeState.MISSING}
)
"""States that count towards the circuit breaker (a node that turned bad or went silent)."""


@dataclasses.dataclass(slots=True)
class NodeRecord:
    """The controller's memory of one node: its last report and the streaks derived from it."""

    heartbeat: fastheartbeat.Report
    """As the hot path decoded it (a `fastheartbeat.Heartbeat`), or a model the tests built."""
    received_at: dt.datetime
    verdict: health.Verdict
    """The worst GPU verdict in the last report (Healthy for a node reporting no GPUs)."""
    action: health.Action
    faults: tuple[Fault, ...]
    """Findings of GPUs whose verdict is not Healthy, worst first."""
    bad_since: dt.datetime | None
    """Receipt time of the first report of the current non-healthy streak."""
    healthy_since: dt.datetime | None
    """Receipt time of the first report of the current healthy streak."""
    previous_boot_id: str | None = None
    boot_changed_at: dt.datetime | None = None
    """When a report first carried a boot ID different from the one before it."""
    gpu_since: dict[str, tuple[bool, dt.datetime]] = dataclasses.field(default_factory=dict)
    """Per GPU UUID: whether its last report was healthy, and the receipt time of the first
    report of that streak (a device fenced by itself is released on its own streak)."""
    pod_uid: str = ""
    """The agent pod the last report's token was bound to ('' when not known)."""
    key: str | None = None
    """`change_key` of the last report and `pod_uid`; None until first asked for (a direct
    heartbeat does not pay for it; a relayed liveness entry is matched against it)."""


@dataclasses.dataclass(frozen=True, slots=True)
class NodeHealth:
    """A node's health at one instant, as the policy and the on-call API need it."""

    node: str
    state: NodeState
    reason: str
    """PascalCase code for the NodeCondition (`XidFallenOffBus`, `HeartbeatStale`)."""
    message: str
    """One line naming the GPU UUIDs involved."""
    faults: tuple[Fault, ...] = ()
    boot_id: str | None = None
    received_at: dt.datetime | None = None
    bad_since: dt.datetime | None = None
    """Onset of the current non-healthy state; for a silent node, the moment it turned stale."""
    healthy_since: dt.datetime | None = None
    stale_at: dt.datetime | None = None
    """When the node turns (or turned) stale if nothing more arrives; None before any report."""
    action: health.Action = health.Action.NONE
    boot_changed_at: dt.datetime | None = None
    """When this leader last saw the boot ID change (a reboot clears RebootNode faults)."""

    @property
    def fault_keys(self) -> frozenset[FaultKey]:
        """Return the identities of the current faults, including a silence."""
        keys = {fault.key for fault in self.faults}
        if self.state in (NodeState.STALE, NodeState.MISSING) and self.stale_at is not None:
            keys.add(
                FaultKey("", REASON_HEARTBEAT_STALE, timestamps.rfc3339_exact(self.stale_at) or "")
            )
        return frozenset(keys)


class FleetState:
    """The last heartbeat of every node, keyed by node name; mutated in place on ingest.

    A mutable class rather than a value copied per heartbeat: copying a 5,000-node mapping on
    every report would cost more than the report itself. Only the leader's instance is judged,
    and `leader_since` (set when the lease is acquired) holds staleness back for one staleAfter.
    """

    __slots__ = (
        "_changed", "_faulty", "_records", "_stale_after", "leader_since", "stale_multiplier",
    )  # fmt: skip

    def __init__(
        self,
        *,
        leader_since: dt.datetime,
        stale_multiplier: float = DEFAULT_STALE_MULTIPLIER,
    ) -> None:
        if stale_multiplier <= 0:
            msg = f"stale_multiplier must be positive, got {stale_multiplier}"
            raise ValueError(msg)
        timestamps.require_aware("leader_since", leader_since)
        self._records: dict[str, NodeRecord] = {}
        self._changed: set[str] = set()
        self._faulty: set[str] = set()
        self._stale_after: dict[float, dt.timedelta] = {}
        """staleAfter by agent interval: a fleet has a few intervals, and a pass asks it of
        every node it judges (bounded: any agent may send any interval in range)."""
        self.leader_since = leader_since
        self.stale_multiplier = stale_multiplier

    def __len__(self) -> int:
        return len(self._records)

    def __contains__(self, node: object) -> bool:
        return node in self._records

    def __iter__(self) -> Iterator[str]:
        return iter(self._records)

    def get(self, node: str) -> NodeRecord | None:
        """Return the record of `node`, or None when it never reported to this process."""
        return self._records.get(node)

    def become_leader(self, now: dt.datetime) -> None:
        """Start the warm-up: no node is judged stale before one staleAfter from `now`."""
        timestamps.require_aware("now", now)
        self.leader_since = now

    def forget(self, node: str) -> None:
        """Drop a node that left the cluster, so its memory does not outlive it."""
        if self._records.pop(node, None) is not None:
            self._changed.add(node)
        self._faulty.discard(node)

    def faulty(self) -> frozenset[str]:
        """The nodes whose last report names a fault (whatever the time says of it now): the
        only nodes whose `assess` can have faults, kept as reports come, so a pass can find
        them without assessing every node."""
        return frozenset(self._faulty)

    def take_changed(self) -> set[str]:
        """The nodes whose health may read differently since the last call, other than by
        time passing: a first report, a change of verdict, action, faults, boot ID, GPU count
        or interval, a report after a silence, a node forgotten. A steady report is not a
        change: it only moves the node's staleness deadline later, which a pass scheduled at
        the earlier deadline finds out then (`controller.fleet.passes`)."""
        changed, self._changed = self._changed, set()
        return changed

    def ingest(
        self,
        hb: fastheartbeat.Report,
        now: dt.datetime,
        *,
        pod_uid: str = "",
        key: str | None = None,
    ) -> bool:
        """Record one heartbeat received at `now`; return False when it was a replay.

        A report is a replay when it comes from the same boot with a sequence number and a send
        time no later than the last one accepted (a forwarded copy or a retried POST). An agent
        restarted without a reboot restarts its sequence but not its clock, so its reports are
        accepted by their later `sentAt`.
        """
        old = self._records.get(hb.node_name)
        if (
            old is not None
            and old.heartbeat.boot_id == hb.boot_id
            and hb.sequence <= old.heartbeat.sequence
            and hb.sent_at <= old.heartbeat.sent_at
        ):
            return False
        verdict, action, faults = _summarise(hb)
        healthy = verdict is health.Verdict.HEALTHY
        if old is None:
            record = NodeRecord(
                heartbeat=hb,
                received_at=now,
                verdict=verdict,
                action=action,
                faults=faults,
                bad_since=None if healthy else now,
                healthy_since=now if healthy else None,
                pod_uid=pod_uid,
                key=key,
            )
            _track_gpus(record.gpu_since, hb, faults, now, restart=True)
            self._records[hb.node_name] = record
            self._changed.add(hb.node_name)
            if faults:
                self._faulty.add(hb.node_name)
            return True
        # A healthy report after a silence starts a new healthy streak: the silence was not one.
        was_stale = now - old.received_at > self.stale_after(old.heartbeat)
        if faults or old.faults or was_stale or len(old.gpu_since) != len(hb.gpus):
            _track_gpus(old.gpu_since, hb, faults, now, restart=was_stale)
        previous = old.heartbeat
        if (
            was_stale
            or verdict is not old.verdict
            or action is not old.action
            or faults != old.faults
            or previous.boot_id != hb.boot_id
            or previous.interval_s != hb.interval_s
            or len(previous.gpus) != len(hb.gpus)
        ):
            self._changed.add(hb.node_name)
        if old.heartbeat.boot_id != hb.boot_id:
            old.previous_boot_id = old.heartbeat.boot_id
            old.boot_changed_at = now
        if healthy:
            old.bad_since = None
            if old.healthy_since is None or was_stale:
                old.healthy_since = now
        else:
            old.healthy_since = None
            if old.bad_since is None:
                old.bad_since = now
        old.heartbeat = hb
        old.received_at = now
        old.verdict = verdict
        old.action = action
        old.faults = faults
        if faults:
            self._faulty.add(hb.node_name)
        else:
            self._faulty.discard(hb.node_name)
        old.pod_uid = pod_uid
        old.key = key
        return True

    def ingest_relayed(
        self,
        hb: fastheartbeat.Report,
        first_at: dt.datetime,
        last_at: dt.datetime,
        *,
        pod_uid: str,
        key: str | None = None,
    ) -> reports.Relayed:
        """Record a report a follower relayed: first received there at `first_at`, and, when
        it coalesced later reports of the same key into it, last at `last_at`.

        Ingesting at `first_at` and then moving the receipt to `last_at` is what ingesting
        every coalesced report would have done, because the follower coalesces only reports
        less than half a staleAfter apart (`controller.fleet.relays`): none of them would have
        found the node stale, and a report of the same key changes nothing else.

        Reports of one node can reach the leader out of the order they reached the
        replicas (one waited in a follower's batch while a newer one came another way). A
        relayed report of another key than the record's that reached its follower before
        the record's report did is `OUTDATED`: it is not applied (a direct heartbeat would
        have been superseded by the record's), whatever its boot. A receipt earlier than the
        record's counts as the record's own, so `received_at` never goes back.
        """
        node = hb.node_name
        old = self._records.get(node)
        if key is None:
            key = reports.change_key(hb, pod_uid)
        if old is not None and last_at < old.received_at and self.record_key(node) != key:
            return reports.Relayed.OUTDATED
        at = first_at if old is None else max(first_at, old.received_at)
        if not self.ingest(hb, at, pod_uid=pod_uid, key=key):
            return reports.Relayed.REPLAY
        record = self._records[node]
        record.received_at = max(record.received_at, last_at)
        return reports.Relayed.ACCEPTED

    def record_key(self, node: str) -> str | None:
        """The `change_key` of the node's record (computed once, then kept); None without one."""
        record = self._records.get(node)
        if record is None:
            return None
        if record.key is None:
            record.key = reports.change_key(record.heartbeat, record.pod_uid)
        return record.key

    def ingest_liveness(
        self,
        node: str,
        *,
        key: str,
        boot_id: str,
        sequence: int,
        sent_at: dt.datetime,
        first_at: dt.datetime,
        last_at: dt.datetime,
    ) -> reports.Relayed:
        """Apply a follower's liveness entry: a report of `node` whose key is `key`, relayed
        without its body.

        When the record holds a report of that key, that report is ingested again with only
        its sequence and `sentAt` replaced, so every decision is the one the full report
        would have made (its readings are the record's: a follower sends a full report at
        least every `peer_full_refresh_s`). Otherwise the leader needs the full report
        (`NEED`), unless the entry reached its follower before the record's report reached
        the leader (`OUTDATED`, as in `ingest_relayed`).
        """
        record = self._records.get(node)
        if record is None:
            return reports.Relayed.NEED
        if self.record_key(node) != key or record.heartbeat.boot_id != boot_id:
            late = last_at < record.received_at
            return reports.Relayed.OUTDATED if late else reports.Relayed.NEED
        hb = _with_beat(record.heartbeat, sequence, sent_at)
        return self.ingest_relayed(hb, first_at, last_at, pod_uid=record.pod_uid, key=key)

    def gpu_streak(self, node: str, gpu_uuid: str) -> tuple[bool, dt.datetime] | None:
        """Whether the GPU's last report was healthy and since when (receipt time of the
        streak's first report); None when this leader never heard of it."""
        record = self._records.get(node)
        return None if record is None else record.gpu_since.get(gpu_uuid)

    def stale_after(self, hb: fastheartbeat.Report) -> dt.timedelta:
        """Return how long a node may stay silent: the multiplier × its agent's interval."""
        known = self._stale_after.get(hb.interval_s)
        if known is None:
            if len(self._stale_after) >= _INTERVALS_KEPT:
                self._stale_after.clear()
            known = self._stale_after[hb.interval_s] = dt.timedelta(
                seconds=self.stale_multiplier * hb.interval_s
            )
        return known

    def fresh(self, node: str, now: dt.datetime) -> bool:
        """Whether `assess` finds the node reporting at `now` (not warming up, missing or
        stale), without building its health: what the admission gate asks of every node."""
        record = self._records.get(node)
        if record is None:
            return False
        stale_at = max(record.received_at, self.leader_since) + self.stale_after(record.heartbeat)
        return now <= stale_at

    def assess(self, node: str, now: dt.datetime, *, default_interval_s: float) -> NodeHealth:
        """Judge one node at `now`.

        Silence is measured from the later of the last receipt and `leader_since`, which gives a
        new leader one staleAfter of observation before it calls anything stale, and makes a
        node that never reported to it Missing only after the same warm-up (computed with
        `default_interval_s`, since there is no agent interval to use).
        """
        record = self._records.get(node)
        if record is None:
            missing_at = self.leader_since + dt.timedelta(
                seconds=self.stale_multiplier * default_interval_s
            )
            if now <= missing_at:
                return NodeHealth(
                    node=node,
                    state=NodeState.WARMING_UP,
                    reason=REASON_HEARTBEAT_MISSING,
                    message="no heartbeat yet; the controller is still observing",
                    stale_at=missing_at,
                )
            return NodeHealth(
                node=node,
                state=NodeState.MISSING,
                reason=REASON_HEARTBEAT_MISSING,
                message="no heartbeat received since"
                f" {timestamps.rfc3339_exact(self.leader_since)}",
                bad_since=missing_at,
                stale_at=missing_at,
            )
        hb = record.heartbeat
        stale_at = max(record.received_at, self.leader_since) + self.stale_after(hb)
        if now > stale_at:
            return NodeHealth(
                node=node,
                state=NodeState.STALE,
                reason=REASON_HEARTBEAT_STALE,
                message=(
                    f"last heartbeat received {timestamps.rfc3339_exact(record.received_at)}, "
                    f"agent interval {hb.interval_s:g}s"
                ),
                faults=record.faults,
                boot_id=hb.boot_id,
                received_at=record.received_at,
                bad_since=stale_at if record.bad_since is None else record.bad_since,
                stale_at=stale_at,
                action=record.action,
                boot_changed_at=record.boot_changed_at,
            )
        state, reason, message = _describe(record)
        return NodeHealth(
            node=node,
            state=state,
            reason=reason,
            message=message,
            faults=record.faults,
            boot_id=hb.boot_id,
            received_at=record.received_at,
            bad_since=record.bad_since,
            healthy_since=record.healthy_since,
            stale_at=stale_at,
            action=record.action,
            boot_changed_at=record.boot_changed_at,
        )


_HEALTHY = health.Verdict.HEALTHY
_VSEV = health.VERDICT_SEVERITY
_ASEV = health.ACTION_SEVERITY


def _summarise(
    hb: fastheartbeat.Report,
) -> tuple[health.Verdict, health.Action, tuple[Fault, ...]]:
    """Reduce a report to the node's worst verdict and action and its faults, worst first."""
    verdict = _HEALTHY
    action = health.Action.NONE
    faults: list[Fault] = []
    for gpu in hb.gpus:
        if gpu.verdict is _HEALTHY:
            continue
        if _VSEV[gpu.verdict] > _VSEV[verdict]:
            verdict = gpu.verdict
        if _ASEV[gpu.action] > _ASEV[action]:
            action = gpu.action
        bad = [r for r in gpu.reasons if r.verdict is not _HEALTHY]
        if not bad:
            faults.append(
                Fault(
                    gpu_uuid=gpu.uuid,
                    gpu_index=gpu.index,
                    code=f"Gpu{gpu.verdict.value}",
                    verdict=gpu.verdict,
                    action=gpu.action,
                    latched=False,
                    since=None,
                    message="",
                )
            )
        faults.extend(
            Fault(
                gpu_uuid=gpu.uuid,
                gpu_index=gpu.index,
                code=reason.code,
                verdict=reason.verdict,
                action=reason.action,
                latched=reason.latched,
                since=reason.since,
                message=reason.message,
            )
            for reason in bad
        )
    if len(faults) > 1:
        faults.sort(key=lambda f: (-_VSEV[f.verdict], -_ASEV[f.action], f.gpu_index, f.code))
    return verdict, action, tuple(faults)


def _with_beat(
    hb: fastheartbeat.Report, sequence: int, sent_at: dt.datetime
) -> fastheartbeat.Report:
    """The same report with another sequence number and send time."""
    stamp = sent_at if isinstance(sent_at, fastheartbeat.Stamp) else fastheartbeat.stamp(sent_at)
    return msgspec.structs.replace(hb, sequence=sequence, sent_at=stamp)


def _track_gpus(
    streaks: dict[str, tuple[bool, dt.datetime]],
    hb: fastheartbeat.Report,
    faults: tuple[Fault, ...],
    now: dt.datetime,
    *,
    restart: bool,
) -> None:
    """Update each GPU's streak from one report (`restart`: after a silence every streak
    starts again, as the node's does). GPUs the report no longer lists are forgotten."""
    bad = {f.gpu_uuid for f in faults}
    seen = set()
    for gpu in hb.gpus:
        seen.add(gpu.uuid)
        healthy = gpu.uuid not in bad
        previous = streaks.get(gpu.uuid)
        if restart or previous is None or previous[0] != healthy:
            streaks[gpu.uuid] = (healthy, now)
    for uuid in [u for u in streaks if u not in seen]:
        del streaks[uuid]


def _describe(record: NodeRecord) -> tuple[NodeState, str, str]:
    """Return the state, condition reason and message of a node with a fresh report."""
    if not record.faults:
        count = len(record.heartbeat.gpus)
        if count == 0:
            return NodeState.HEALTHY, REASON_NO_GPUS, "the agent reports no GPUs"
        return NodeState.HEALTHY, REASON_GPUS_HEALTHY, f"all {count} GPUs healthy"
    state = NodeState(record.verdict.value)  # a node reporting takes its worst GPU's name
    return state, record.faults[0].code, describe_faults(record.faults)


def describe_faults(faults: tuple[Fault, ...]) -> str:
    """Name every GPU UUID with its findings in one bounded line, worst first."""
    by_gpu: dict[str, list[str]] = {}
    for fault in faults:
        by_gpu.setdefault(fault.gpu_uuid, []).append(fault.finding)
    message = "; ".join(f"{uuid}: {', '.join(found)}" for uuid, found in by_gpu.items())
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[: MAX_MESSAGE_CHARS - 1] + "…"
    return message
