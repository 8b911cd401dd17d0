"""A follower's relay of heartbeats to the leader, as pure code (DESIGN.md section 6).

A follower authenticates, decodes and checks every heartbeat it receives, as the leader
would; what it then sends the leader is only what the leader needs:
- a **change** (a report whose `reports.change_key` differs from the one this replica last
  delivered for the node, or the first it sees of it, or one after a gap of more than half
  the node's staleAfter) goes as the full report at once, and the agent's POST waits for
  the leader's answer to it: a verdict, fault or boot change keeps the latency and the
  end-to-end answer of a direct heartbeat;
- a steady report is **liveness**: it is coalesced into the node's pending entry (one per
  node), answered at once, and reaches the leader in the next batch as a few fields (node,
  key, boot, sequence, `sentAt`, how long ago it arrived here, and how long ago the first
  report the entry coalesced did). The leader applies it to its own record of that key
  (`FleetState.ingest_liveness`), or answers that it needs the full report (a failover
  leader that never saw the node), which goes at once.

Why coalescing is exact: the leader ingests an entry at its first report's receipt and then
moves the receipt to the last one's. Ingesting every report in between would only have
done the same, because reports of one key change nothing but the receipt, and none of them
is more than half a staleAfter after the one before it (else it would be a change), so none
would have found the node stale. The property test in tests/unit/controller/fleet/
test_relays.py checks that the leader's records come out the same either way.

Bounded: per node at most `max_queued_per_node` entries (in practice one: a change is sent
at once), batches of at most `max_entries`, a full report at least every `refresh_s` per
node so the leader's readings are never older, entries older than `max_age_s` dropped.
Pending entries survive a failed flush and go in the next one.

Pure: `now` is a monotonic clock reading in seconds, passed in; no I/O.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import math
from collections.abc import Hashable, Sequence
from typing import Annotated

import msgspec

from controller.fleet import reports
from shared import fastheartbeat, heartbeat, patterns


class Kind(enum.StrEnum):
    """How a follower relays one report."""

    CHANGE = "change"
    """Sent in full at once; the agent waits for the leader's answer."""
    LIVENESS = "liveness"
    """Coalesced into the node's pending entry; answered at once."""


@dataclasses.dataclass(slots=True)
class Entry:
    """What this replica holds for the leader about one node: the latest report of one key,
    and the receipt times of the first and last report it coalesced."""

    node: str
    key: str
    report: fastheartbeat.Report
    caller: Hashable
    """The agent identity this replica reviewed for the report (sent with a full report)."""
    first_at: float
    last_at: float
    full: bool
    """Send the report itself, not only its liveness."""
    tickets: list[int] = dataclasses.field(default_factory=list)
    """The agents' POSTs waiting for the leader's answer to this entry."""


@dataclasses.dataclass(frozen=True, slots=True)
class Answer:
    """The leader's answer to one entry, as the waiting agent gets it."""

    outcome: reports.Relayed
    status: int = 202
    code: str = ""
    message: str = ""
    field: str = ""


@dataclasses.dataclass(slots=True)
class _Node:
    delivered: str | None = None
    """The key the leader last took from this replica for the node."""
    received_at: float = -math.inf
    """The last receipt of a report of the node here."""
    full_at: float = -math.inf
    """When the leader last took a full report of the node from here."""


@dataclasses.dataclass(frozen=True, slots=True)
class Limits:
    """The relay's bounds (the settings `peer_*`)."""

    max_entries: int = 500
    """Entries per batch; more go in the next batches of the same flush."""
    refresh_s: float = 60.0
    """A node's report goes in full at least this often, so the leader's readings (and
    `agentUrl`) are never older."""
    max_age_s: float = 300.0
    """An entry not delivered this long after its last report is dropped."""
    down_after_s: float = 5.0
    """Flushes failing this long make liveness answers 503, as a forward would be."""
    stale_multiplier: float = 3.0
    """The leader's staleAfter multiplier: a report more than half a staleAfter after the
    node's previous one here is a change, so coalescing never hides a silence."""
    max_queued_per_node: int = 4
    """Entries one node may have queued (distinct keys while the leader is unreachable);
    past it they collapse into one full entry of the newest report."""


class Relay:
    """The relay's state on one follower: pending entries per node and what was delivered."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._queues: dict[str, list[Entry]] = {}
        self._urgent: set[str] = set()
        """Nodes with a full entry queued (a change, or what the leader needs)."""
        self._nodes: dict[str, _Node] = {}
        self._tickets = itertools.count(1)
        self._failing_since: float | None = None
        self._swept_at = -math.inf
        self.problem = ""
        """Why the last flush failed ('' after a success)."""

    def __len__(self) -> int:
        """Entries queued for the leader."""
        return sum(len(q) for q in self._queues.values())

    def offer(
        self, report: fastheartbeat.Report, caller: Hashable, key: str, now: float
    ) -> tuple[Kind, int | None]:
        """Queue one checked report received at `now`; return how it is relayed and, for a
        change, the ticket its answer comes back under (`settle`)."""
        node = report.node_name
        known = self._nodes.get(node)
        if known is None:
            known = self._nodes[node] = _Node()
        fresh = now - known.received_at <= self.limits.stale_multiplier * report.interval_s / 2
        known.received_at = max(known.received_at, now)
        kind = Kind.LIVENESS if fresh and known.delivered == key else Kind.CHANGE
        ticket = next(self._tickets) if kind is Kind.CHANGE else None
        queue = self._queues.setdefault(node, [])
        tail = queue[-1] if queue else None
        if tail is not None and fresh and tail.key == key:
            tail.report, tail.caller, tail.last_at = report, caller, now
        else:
            tail = Entry(node, key, report, caller, now, now, full=False)
            queue.append(tail)
        if ticket is not None:
            tail.full = True
            tail.tickets.append(ticket)
            self._urgent.add(node)
        if len(queue) > self.limits.max_queued_per_node:
            self._collapse(queue)
        return kind, ticket

    @staticmethod
    def _collapse(queue: list[Entry]) -> None:
        newest = queue[-1]
        newest.full = True
        newest.tickets = [t for e in queue for t in e.tickets]
        queue[:] = [newest]

    def take(self, now: float, *, urgent: bool = False) -> list[Entry]:
        """The next batch to send, in each node's order; empty when nothing is queued. An
        entry due a refresh goes in full. `urgent`: only the nodes with a change or a
        needed report queued (with what is queued before it), so a change does not wait
        for the rest of the fleet's liveness to be encoded and applied."""
        limits = self.limits
        batch: list[Entry] = []
        for node in list(self._urgent if urgent else self._queues):
            self._urgent.discard(node)
            if node not in self._queues:
                continue
            queue = self._queues[node]
            while queue and len(batch) < limits.max_entries:
                entry = queue.pop(0)
                if now - entry.last_at > limits.max_age_s:
                    continue  # its agents' POSTs ended long ago; its node has reported since
                known = self._nodes.get(node)
                full_at = known.full_at if known is not None else -math.inf
                if not entry.full and now - full_at >= limits.refresh_s:
                    entry.full = True
                batch.append(entry)
            if not queue:
                del self._queues[node]
            elif any(e.full for e in queue):
                self._urgent.add(node)
            if len(batch) >= limits.max_entries:
                break
        if now - self._swept_at >= limits.refresh_s:
            self._sweep(now)
        return batch

    def _sweep(self, now: float) -> None:
        """Forget nodes silent here for longer than `max_age_s` (they left, or report to
        another replica now): the memory of a node does not outlive it."""
        self._swept_at = now
        horizon = now - self.limits.max_age_s
        for node in [n for n, k in self._nodes.items() if k.received_at < horizon]:
            if node not in self._queues:
                del self._nodes[node]

    def settle(
        self,
        batch: Sequence[Entry],
        answers: Sequence[Answer],
        now: float,
    ) -> tuple[dict[int, Answer], bool]:
        """Take the leader's answers to a batch `take` gave (one per entry, in order);
        return the answer of each waiting ticket, and whether entries the leader needs in
        full were queued again (flush again at once)."""
        if len(answers) != len(batch):
            msg = f"{len(answers)} answers to a batch of {len(batch)} entries"
            raise ValueError(msg)
        done: dict[int, Answer] = {}
        resend: list[Entry] = []
        for entry, answer in zip(batch, answers, strict=True):
            if answer.outcome is reports.Relayed.NEED:
                # A liveness entry the leader cannot apply, or an entry of a node the leader
                # needs an earlier entry of first: all go again, in order, in full.
                entry.full = True
                resend.append(entry)
                continue
            if answer.outcome is not reports.Relayed.REFUSED:
                known = self._nodes.setdefault(entry.node, _Node())
                known.delivered = entry.key
                if entry.full and answer.outcome is reports.Relayed.ACCEPTED:
                    known.full_at = now
            done.update(dict.fromkeys(entry.tickets, answer))
        self._requeue(resend)
        self._failing_since = None
        self.problem = ""
        return done, bool(resend)

    def failed(self, batch: Sequence[Entry], now: float, problem: str) -> list[int]:
        """The leader could not be reached with `batch`: queue it again (before anything
        queued since) and return the tickets waiting on it, which are answered 503."""
        tickets = [t for e in batch for t in e.tickets]
        for entry in batch:
            entry.tickets = []
        self._requeue(batch)
        if self._failing_since is None:
            self._failing_since = now
        self.problem = problem
        return tickets

    def _requeue(self, entries: Sequence[Entry]) -> None:
        for entry in reversed(entries):
            queue = self._queues.setdefault(entry.node, [])
            queue.insert(0, entry)
            if entry.full:
                self._urgent.add(entry.node)
            if len(queue) > self.limits.max_queued_per_node:
                self._collapse(queue)

    def down(self, now: float) -> bool:
        """Whether flushes have been failing for `down_after_s`: liveness is answered 503."""
        since = self._failing_since
        return since is not None and now - since >= self.limits.down_after_s

    def reset(self) -> list[int]:
        """Forget everything (this replica now leads, and ingests itself); return the
        tickets waiting, which are answered 503 so their agents retry."""
        tickets = [t for q in self._queues.values() for e in q for t in e.tickets]
        self._queues.clear()
        self._urgent.clear()
        self._nodes.clear()
        self._failing_since = None
        self.problem = ""
        return tickets


# ---------------------------------------------------------------------- the wire
MAX_BATCH_ENTRIES = 10_000
"""The schema's ceiling on a batch; the leader's setting `peer_batch_max_entries` is lower."""
MAX_AGO_MS = 2**31 - 1
MAX_CALLER = 6000
"""Bytes of an encoded caller (`controller.auth.MAX_CALLER_HEADER`, checked again there)."""
KEY_PATTERN = r"[0-9a-f]{16}"


class _Wire(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """Unknown fields refused, camelCase on the wire."""


class WireEntry(_Wire, frozen=True):
    """One entry of `POST /v1/peer/heartbeats`: a node's liveness, or its full report."""

    node: Annotated[str, msgspec.Meta(max_length=253, pattern=patterns.search(heartbeat.NODE_NAME))]
    key: Annotated[str, msgspec.Meta(pattern=patterns.search(KEY_PATTERN))]
    boot_id: Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
    sequence: Annotated[int, msgspec.Meta(ge=0, le=heartbeat.MAX_SEQUENCE)]
    sent_at: fastheartbeat.Stamp
    received_ago_ms: Annotated[int, msgspec.Meta(ge=0, le=MAX_AGO_MS)]
    """How long before the batch was sent the entry's last report reached the follower."""
    first_ago_ms: Annotated[int, msgspec.Meta(ge=0, le=MAX_AGO_MS)]
    """The same for the first report the entry coalesced (`receivedAgoMs` or more)."""
    report: fastheartbeat.Heartbeat | None = None
    """The full report; absent for liveness."""
    caller: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_CALLER)] | None = None
    """The agent the follower reviewed for it (`X-TauGrid-Caller`'s form); with `report`."""


class WireBatch(_Wire, frozen=True):
    """The body of `POST /v1/peer/heartbeats`; each entry is decoded on its own, so a bad
    one is refused alone."""

    entries: Annotated[list[msgspec.Raw], msgspec.Meta(max_length=MAX_BATCH_ENTRIES)]


class WireRefusal(_Wire, frozen=True):
    """Why the leader refused one entry."""

    index: int
    node: str
    status: int
    code: str
    message: str
    field: str


class WireAnswer(_Wire, frozen=True):
    """The leader's answer: an outcome per entry, in order; the nodes it needs in full; the
    entries it refused, with why."""

    outcomes: list[reports.Relayed]
    need: list[str] = []
    refused: list[WireRefusal] = []


BATCH_DECODER = msgspec.json.Decoder(WireBatch)
ENTRY_DECODER = fastheartbeat.decoder(WireEntry)
ANSWER_DECODER = msgspec.json.Decoder(WireAnswer)
ENCODER = fastheartbeat.encoder()


def answers_of(answer: WireAnswer) -> list[Answer]:
    """The per-entry answers of the leader's reply."""
    refused = {r.index: r for r in answer.refused}
    return [
        Answer(o)
        if (r := refused.get(i)) is None
        else Answer(o, r.status, r.code, r.message, r.field)
        for i, o in enumerate(answer.outcomes)
    ]


def ago_ms(now: float, then: float) -> int:
    """Whole milliseconds from `then` to `now`, within the wire's bounds."""
    return min(max(round((now - then) * 1000), 0), MAX_AGO_MS)
