"""The follower's relay (pure core) and the leader's side of it in the fleet state.

Decisions first (change or liveness, coalescing, batches, refreshes, failures, what the
leader needs), then the property the design rests on: the leader's records come out the
same whether every report reached it directly or through followers as full reports on
change, liveness batches and `need` round trips.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Sequence

import hypothesis
import msgspec
import pytest
from hypothesis import strategies as st

from controller.fleet import relays, reports
from controller.fleet import state as fleet
from shared import fastheartbeat, health, heartbeat
from tests.unit.controller.fleet import fakes
from tests.unit.controller.fleet.fakes import at

ACCEPTED = relays.Answer(reports.Relayed.ACCEPTED)
LIMITS = relays.Limits(max_entries=500, refresh_s=60.0, max_age_s=300.0, down_after_s=5.0)


def _beat(node: str = "n1", *, seq: int = 1, fault: bool = False, boot: str = "boot-1",
          interval_s: float = 10.0) -> fastheartbeat.Heartbeat:  # fmt: skip
    """A report as the hot path decodes it (a msgspec struct)."""
    faults = {0: [fakes.xid79()]} if fault else None
    model = fakes.hb(node, seq=seq, faults=faults, boot=boot, interval_s=interval_s)
    return fastheartbeat.decode(fastheartbeat.wire(model))


def _offer(relay: relays.Relay, hb: fastheartbeat.Report, now: float, pod: str = "pod-1"
           ) -> tuple[relays.Kind, int | None]:  # fmt: skip
    return relay.offer(hb, pod, reports.change_key(hb, pod), now)


def _deliver(relay: relays.Relay, now: float) -> list[relays.Entry]:
    """Flush everything to a leader that accepts every entry."""
    sent: list[relays.Entry] = []
    while batch := relay.take(now):
        relay.settle(batch, [ACCEPTED] * len(batch), now)
        sent.extend(batch)
    return sent


# ---------------------------------------------------------------------- decisions
@dataclasses.dataclass(frozen=True)
class Step:
    at: float
    fault: bool = False
    boot: str = "boot-1"
    pod: str = "pod-1"
    deliver: bool = True
    """Flush to an accepting leader after this report."""


@dataclasses.dataclass(frozen=True)
class KindCase:
    id: str
    steps: tuple[Step, ...]
    expected: tuple[relays.Kind, ...]


C, L = relays.Kind.CHANGE, relays.Kind.LIVENESS
KIND_CASES = [
    KindCase("the first report of a node is a change", (Step(0),), (C,)),
    KindCase("a steady report after a delivered one is liveness",
             (Step(0), Step(10), Step(20)), (C, L, L)),
    KindCase("a verdict change is a change, and so is its recovery",
             (Step(0), Step(10, fault=True), Step(20, fault=True), Step(30)), (C, C, L, C)),
    KindCase("a new boot is a change", (Step(0), Step(10, boot="boot-2")), (C, C)),
    KindCase("a new agent pod is a change (its agentUrl must reach the leader)",
             (Step(0), Step(10, pod="pod-2")), (C, C)),
    KindCase("a report more than half a staleAfter after the last is a change",
             (Step(0), Step(15), Step(30.5)), (C, L, C)),
    KindCase("a report of a key queued but not yet delivered is still a change",
             (Step(0, deliver=False), Step(10)), (C, C)),
]  # fmt: skip


@pytest.mark.parametrize("case", KIND_CASES, ids=lambda c: c.id)
def test_a_report_is_relayed_as_a_change_or_as_liveness(case: KindCase) -> None:
    """A report is a change when its key is not the one this replica last delivered for the
    node (or it follows a gap of more than half a staleAfter, 15 s at a 10 s interval);
    otherwise it is liveness."""
    relay = relays.Relay(LIMITS)
    kinds = []
    for seq, step in enumerate(case.steps, start=1):
        hb = _beat(seq=seq, fault=step.fault, boot=step.boot)
        kinds.append(_offer(relay, hb, step.at, step.pod)[0])
        if step.deliver:
            _deliver(relay, step.at)
    assert case.expected == tuple(kinds)


def test_steady_reports_coalesce_into_one_entry_per_node_with_first_and_last_receipts() -> None:
    """Between two flushes a node has one pending entry: the newest report, and when its
    first and last reports arrived; a change gets a ticket, liveness none."""
    relay = relays.Relay(LIMITS)
    tickets = [_offer(relay, _beat(node, seq=1), 0.0)[1] for node in ("n1", "n2")]
    _deliver(relay, 0.0)
    for seq, now in enumerate((1.0, 2.0, 3.0), start=2):
        for node in ("n1", "n2"):
            _offer(relay, _beat(node, seq=seq), now)
    batch = relay.take(3.5)
    entries = sorted((e.node, e.report.sequence, e.first_at, e.last_at, e.full) for e in batch)
    actual = (None not in tickets, entries, [e.tickets for e in batch])
    expected: tuple[object, ...] = (
        True,
        [("n1", 4, 1.0, 3.0, False), ("n2", 4, 1.0, 3.0, False)],
        [[], []],
    )
    assert expected == actual


def test_batches_are_capped_and_the_rest_goes_in_the_next() -> None:
    """Five pending nodes with at most two entries a batch: batches of 2, 2, 1, then none."""
    relay = relays.Relay(dataclasses.replace(LIMITS, max_entries=2))
    for i in range(5):
        _offer(relay, _beat(f"n{i}"), 0.0)
    sizes = []
    while batch := relay.take(0.0):
        sizes.append(len(batch))
        relay.settle(batch, [ACCEPTED] * len(batch), 0.0)
    expected = [2, 2, 1]
    assert expected == sizes


def test_a_node_is_sent_in_full_again_once_its_refresh_is_due() -> None:
    """Liveness entries go as full reports once `refresh_s` passed since the leader last took
    one from this replica, so its readings are never older than that."""
    relay = relays.Relay(dataclasses.replace(LIMITS, refresh_s=60.0))
    _offer(relay, _beat(seq=1), 0.0)
    _deliver(relay, 0.0)
    fulls = []
    for seq, now in enumerate((10.0, 20.0, 61.0, 70.0), start=2):
        _offer(relay, _beat(seq=seq), now)
        fulls.append([e.full for e in _deliver(relay, now)])
    expected = [[False], [False], [True], [False]]
    assert expected == fulls


def test_a_failed_flush_keeps_its_entries_and_answers_its_waiters() -> None:
    """The leader not reached: the change's ticket comes back to be answered 503, both
    entries stay queued (in order, the change still in full), liveness is answered 503 only
    once flushes failed for `down_after_s`, and a success ends that."""
    relay = relays.Relay(dataclasses.replace(LIMITS, down_after_s=5.0))
    _offer(relay, _beat("n1", seq=1), 0.0)
    _deliver(relay, 0.0)
    _offer(relay, _beat("n1", seq=2), 1.0)
    _, ticket = _offer(relay, _beat("n2", seq=1), 1.0)
    batch = relay.take(1.0)
    answered = relay.failed(batch, 1.0, "connection refused")
    down = [relay.down(3.0), relay.down(6.0)]
    again = relay.take(7.0)
    relay.settle(again, [ACCEPTED] * len(again), 7.0)
    actual = (answered, down, sorted((e.node, e.full) for e in again), relay.down(8.0))
    expected = ([ticket], [False, True], [("n1", False), ("n2", True)], False)
    assert expected == actual


def test_what_the_leader_needs_is_queued_again_in_full_at_once() -> None:
    """A liveness entry answered NEED (a new leader without a record) goes again as the
    full report, and `settle` says to flush again at once; once taken, it is delivered."""
    relay = relays.Relay(LIMITS)
    _offer(relay, _beat(seq=1), 0.0)
    _deliver(relay, 0.0)
    _offer(relay, _beat(seq=2), 1.0)
    batch = relay.take(1.5)
    _, again = relay.settle(batch, [relays.Answer(reports.Relayed.NEED)], 1.5)
    resent = relay.take(1.5)
    actual = (again, [(e.report.sequence, e.full, e.first_at) for e in resent])
    expected = (True, [(2, True, 1.0)])
    assert expected == actual


def test_a_refused_change_answers_its_agent_with_the_leaders_reason() -> None:
    """A change the leader refuses answers its ticket with the leader's status and reason,
    and is not recorded as delivered (the next report is a change again)."""
    relay = relays.Relay(LIMITS)
    _, ticket = _offer(relay, _beat(seq=1), 0.0)
    batch = relay.take(0.0)
    refusal = relays.Answer(reports.Relayed.REFUSED, 403, "Forbidden", "not your node", "caller")
    done, _ = relay.settle(batch, [refusal], 0.0)
    assert ticket is not None
    actual = (done, _offer(relay, _beat(seq=2), 1.0)[0])
    assert ({ticket: refusal}, relays.Kind.CHANGE) == actual


def test_a_node_never_holds_more_than_its_bound_of_entries() -> None:
    """A node flapping while the leader is unreachable queues one entry per key, at most
    `max_queued_per_node`; past it they collapse into one full entry of the newest report
    that keeps every waiting ticket."""
    relay = relays.Relay(dataclasses.replace(LIMITS, max_queued_per_node=3))
    tickets = [_offer(relay, _beat(seq=s, fault=s % 2 == 0), float(s))[1] for s in range(1, 8)]
    batch = relay.take(8.0)
    actual = [(e.report.sequence, e.full, sorted(e.tickets)) for e in batch]
    assert [(7, True, sorted(t for t in tickets if t is not None))] == actual


def test_entries_older_than_the_age_bound_are_dropped_and_reset_forgets_everything() -> None:
    """An entry not delivered within `max_age_s` of its last report is dropped; `reset`
    (this replica now leads) forgets every entry and returns the waiting tickets."""
    relay = relays.Relay(dataclasses.replace(LIMITS, max_age_s=30.0))
    _offer(relay, _beat("n1"), 0.0)
    dropped = relay.take(31.0)
    _, ticket = _offer(relay, _beat("n2"), 40.0)
    assert ([], [ticket], 0) == (dropped, relay.reset(), len(relay))


# ---------------------------------------------------------------------- change keys
def _gpu0(hb: heartbeat.Heartbeat, **fields: object) -> heartbeat.Heartbeat:
    gpus = [msgspec.structs.replace(hb.gpus[0], **fields), *hb.gpus[1:]]
    return msgspec.structs.replace(hb, gpus=gpus)


BASE = fakes.hb("n1", seq=3, faults={1: [fakes.ecc_rising()]})
SAME_KEY = [
    pytest.param(msgspec.structs.replace(BASE, sequence=9), id="another sequence"),
    pytest.param(msgspec.structs.replace(BASE, sent_at=at(99)), id="another sentAt"),
    pytest.param(_gpu0(BASE, readings=heartbeat.GpuReadings(temperature_c=81.0)),
                 id="other GPU readings"),
    pytest.param(fastheartbeat.decode(fastheartbeat.wire(BASE)), id="the msgspec form"),
]  # fmt: skip
OTHER_KEY = [
    pytest.param(msgspec.structs.replace(BASE, boot_id="boot-2"), id="another boot"),
    pytest.param(msgspec.structs.replace(BASE, interval_s=5.0), id="another interval"),
    pytest.param(msgspec.structs.replace(BASE, driver_version="580.1"), id="another driver"),
    pytest.param(msgspec.structs.replace(BASE, dcgm_available=True), id="DCGM now available"),
    pytest.param(_gpu0(BASE, uuid="GPU-other"), id="another GPU UUID"),
    pytest.param(_gpu0(BASE, name="H200"), id="another GPU name"),
    pytest.param(_gpu0(BASE, pci_bus_id="0000:01:00.0"), id="another PCI bus ID"),
    pytest.param(_gpu0(BASE, verdict=health.Verdict.DEGRADED), id="another verdict"),
    pytest.param(_gpu0(BASE, action=health.Action.RESET_GPU), id="another action"),
    pytest.param(_gpu0(BASE, reasons=[fakes.xid79()]), id="another finding"),
    pytest.param(_gpu0(BASE, index=7), id="another index"),
    pytest.param(msgspec.structs.replace(BASE, gpus=BASE.gpus[:7]), id="one GPU fewer"),
]  # fmt: skip


@pytest.mark.parametrize("other", SAME_KEY)
def test_the_change_key_ignores_what_decides_nothing(other: fastheartbeat.Report) -> None:
    """Sequence, sentAt and readings leave the key as it is, in either form of a report."""
    assert reports.change_key(BASE, "pod-1") == reports.change_key(other, "pod-1")


@pytest.mark.parametrize("other", OTHER_KEY)
def test_the_change_key_covers_what_the_leader_decides_on(other: heartbeat.Heartbeat) -> None:
    """Every field the leader's decisions depend on changes the key."""
    assert reports.change_key(BASE, "pod-1") != reports.change_key(other, "pod-1")


def test_the_change_key_covers_the_agent_pod() -> None:
    """A new agent pod (a new agentUrl) is a new key."""
    assert reports.change_key(BASE, "pod-1") != reports.change_key(BASE, "pod-2")


# ---------------------------------------------------------------------- the leader's side
@pytest.mark.parametrize(
    ("setup", "entry", "expected"),
    [
        pytest.param("none", {}, reports.Relayed.NEED, id="a node without a record is needed"),
        pytest.param("same", {}, reports.Relayed.ACCEPTED,
                     id="the record's key is applied"),
        pytest.param("same", {"sequence": 5, "sent_at": at(5)}, reports.Relayed.REPLAY,
                     id="an entry no newer than the record is a replay"),
        pytest.param("other", {}, reports.Relayed.NEED,
                     id="a newer entry of another key is needed"),
        pytest.param("other", {"first_at": at(4), "last_at": at(4.5)}, reports.Relayed.OUTDATED,
                     id="an entry of another key received before the record is outdated"),
    ],
)  # fmt: skip
def test_the_leader_applies_a_liveness_entry_only_to_a_record_of_its_key(
    setup: str, entry: dict[str, object], expected: reports.Relayed
) -> None:
    """Liveness is applied when the record holds a report of the same key; otherwise the
    leader needs the full report, unless the entry reached its follower before the
    record's report reached the leader."""
    leader = fleet.FleetState(leader_since=at(0))
    key = reports.change_key(fakes.hb("n1"), "pod-1")
    if setup != "none":
        faults = {0: [fakes.xid79()]} if setup == "other" else None
        leader.ingest(fakes.hb("n1", seq=5, faults=faults), at(5), pod_uid="pod-1")
    fields = {"sequence": 6, "sent_at": at(6), "first_at": at(6), "last_at": at(7), **entry}
    actual = leader.ingest_liveness("n1", key=key, boot_id="boot-1", **fields)  # type: ignore[arg-type]
    assert expected == actual


def test_liveness_is_the_previous_report_with_its_sequence_moved_on() -> None:
    """An applied liveness entry leaves the record's verdict and faults, takes the entry's
    sequence and sentAt, and is received when its last report reached the follower."""
    leader = fleet.FleetState(leader_since=at(0))
    hb = _beat(seq=5, fault=True)
    leader.ingest(hb, at(5), pod_uid="pod-1")
    before = leader.get("n1")
    assert before is not None
    verdict, faults = before.verdict, before.faults
    outcome = leader.ingest_liveness(
        "n1", key=reports.change_key(hb, "pod-1"), boot_id="boot-1", sequence=8,
        sent_at=at(8), first_at=at(6), last_at=at(8),
    )  # fmt: skip
    after = leader.get("n1")
    assert after is not None
    actual = (outcome, after.verdict, after.faults == faults, after.heartbeat.sequence,
              after.heartbeat.sent_at, after.received_at)  # fmt: skip
    expected = (reports.Relayed.ACCEPTED, verdict, True, 8, at(8), at(8))
    assert expected == actual


# ---------------------------------------------------------------------- the property
STALE_MULTIPLIER = 3.0
INTERVAL_S = 1.0
STALE_S = STALE_MULTIPLIER * INTERVAL_S
BATCH_S = 0.5
NODES = ("n1", "n2")
GAPS = (0.1, 0.4, 0.5, 1.0, 1.5)
"""Gaps between one node's reports: at most half a staleAfter (1.5 s), or silences."""
SILENCES = (3.5, 6.0)
CHANGES = ("steady", "steady", "steady", "fault", "clear", "reboot", "restart")
ROUTES = ("a", "a", "b", "leader")
"""Where an agent's report lands: follower A, follower B, or the leader itself."""


@dataclasses.dataclass
class Agent:
    node: str
    boot: int = 1
    pod: int = 1
    seq: int = 0
    faulty: tuple[int, ...] = ()
    since: float = 0.0

    def report(self, change: str, t: float) -> fastheartbeat.Heartbeat:
        if change == "fault":
            self.faulty = (*self.faulty, len(self.faulty) % 8)
            self.since = t
        elif change == "clear":
            self.faulty = ()
        elif change == "reboot":
            self.boot, self.seq, self.faulty = self.boot + 1, 0, ()
        elif change == "restart":
            self.pod, self.seq = self.pod + 1, 0
        self.seq += 1
        faults = {i: [fakes.ecc_rising(since=at(self.since))] for i in self.faulty}
        model = fakes.hb(self.node, seq=self.seq, faults=faults, boot=f"boot-{self.boot}",
                         interval_s=INTERVAL_S, sent_at=at(t))  # fmt: skip
        return fastheartbeat.decode(fastheartbeat.wire(model))


@dataclasses.dataclass(frozen=True)
class Event:
    t: float
    node: str
    change: str
    route: str


def _events(*, mixed: bool) -> st.SearchStrategy[list[Event]]:
    """Each node's reports at its own gaps, merged in time order (at distinct instants):
    each through one follower (an agent keeps its connection), or (`mixed`) each report
    through either follower or the leader itself."""

    def one_node(node: str, offset: float) -> st.SearchStrategy[list[Event]]:
        step = st.tuples(
            st.one_of(st.sampled_from(GAPS), st.sampled_from(SILENCES)),
            st.sampled_from(CHANGES), st.sampled_from(ROUTES),
        )  # fmt: skip

        def build(steps: list[tuple[float, str, str]]) -> list[Event]:
            t, out = offset, []
            sticky = "b" if steps[0][2] == "b" else "a"
            for gap, change, route in steps:
                t += gap
                out.append(Event(round(t, 3), node, change, route if mixed else sticky))
            return out

        return st.lists(step, min_size=1, max_size=25).map(build)

    return st.tuples(one_node("n1", 0.0), one_node("n2", 0.013)).map(
        lambda pair: sorted(pair[0] + pair[1], key=lambda e: e.t)
    )


class RelayedWorld:
    """A leader fed by two followers' relays (and by agents posting to it directly)."""

    def __init__(self, outage: tuple[float, float] | None = None) -> None:
        self.outage = outage
        self.healed = False
        """The followers have flushed since the partition ended."""
        # Below the per-node bound (whose collapse, under a long partition, drops history:
        # tested on its own above).
        limits = relays.Limits(
            max_entries=3, refresh_s=4.0, max_age_s=300.0, stale_multiplier=STALE_MULTIPLIER,
            max_queued_per_node=64,
        )  # fmt: skip
        self.leader = fleet.FleetState(leader_since=at(0), stale_multiplier=STALE_MULTIPLIER)
        self.followers = {"a": relays.Relay(limits), "b": relays.Relay(limits)}

    def receive(self, event: Event, hb: fastheartbeat.Heartbeat, pod: str) -> None:
        if event.route == "leader":
            self.leader.ingest(hb, at(event.t), pod_uid=pod)
            return
        relay = self.followers[event.route]
        kind, _ = relay.offer(hb, pod, reports.change_key(hb, pod), event.t)
        if kind is relays.Kind.CHANGE:
            self.flush(relay, event.t, urgent=True)

    def flush(self, relay: relays.Relay, now: float, *, urgent: bool = False) -> None:
        """What the flusher and the peer endpoint do, with the wire's millisecond rounding;
        during the outage every flush fails and its entries stay queued."""
        if self.outage is not None and self.outage[0] <= now < self.outage[1]:
            relay.failed(relay.take(now, urgent=urgent), now, "the leader is unreachable")
            return
        if self.outage is not None and now >= self.outage[1]:
            self.healed = True
        while batch := relay.take(now, urgent=urgent):
            needed: set[str] = set()
            answers = []
            for e in batch:  # as the endpoint does: a node's entries in order
                answer = (
                    relays.Answer(reports.Relayed.NEED) if e.node in needed else self._apply(e, now)
                )
                if answer.outcome is reports.Relayed.NEED:
                    needed.add(e.node)
                answers.append(answer)
            relay.settle(batch, answers, now)

    def _apply(self, e: relays.Entry, now: float) -> relays.Answer:
        last_at = at(now - relays.ago_ms(now, e.last_at) / 1000)
        first_at = at(now - relays.ago_ms(now, e.first_at) / 1000)
        pod = str(e.caller)
        if e.full:
            key = reports.change_key(e.report, pod)
            return relays.Answer(
                self.leader.ingest_relayed(e.report, first_at, last_at, pod_uid=pod, key=key)
            )
        r = e.report
        outcome = self.leader.ingest_liveness(
            e.node, key=e.key, boot_id=r.boot_id, sequence=r.sequence, sent_at=r.sent_at,
            first_at=first_at, last_at=last_at,
        )  # fmt: skip
        return relays.Answer(outcome)


class Moment(float):
    """Seconds since T0, equal to another within the millisecond the wire carries."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, float) and abs(self - other) <= 0.001

    __hash__ = float.__hash__


Record = tuple[tuple[object, ...], tuple[float | None, ...]]
Records = dict[str, Record]


def _record(record: fleet.NodeRecord | None) -> Record:
    """What the leader decides on: the values, and the streaks' starts (`Moment`s)."""
    if record is None:
        return (), ()

    def ms(when: dt.datetime | None) -> Moment | None:
        return None if when is None else Moment((when - at(0)).total_seconds())

    gpus = sorted(record.gpu_since.items())
    values = (
        record.verdict, record.action, record.faults, record.previous_boot_id,
        ms(record.received_at), record.heartbeat.boot_id, record.heartbeat.sequence,
        record.pod_uid, [(uuid, ok) for uuid, (ok, _) in gpus],
    )  # fmt: skip
    starts = (
        ms(record.bad_since), ms(record.healthy_since), ms(record.boot_changed_at),
        *(ms(since) for _, (_, since) in gpus),
    )  # fmt: skip
    return values, starts


def _run(events: Sequence[Event], failover_at: float | None,
         ticks: Callable[[float, float], list[float]],
         outage: tuple[float, float] | None) -> tuple[Records, Records]:  # fmt: skip
    direct = fleet.FleetState(leader_since=at(0), stale_multiplier=STALE_MULTIPLIER)
    world = RelayedWorld(outage)
    agents = {n: Agent(n) for n in NODES}
    last = 0.0
    for event in events:
        for tick in ticks(last, event.t):
            for relay in world.followers.values():
                world.flush(relay, tick)
        if failover_at is not None and last < failover_at <= event.t:
            # At a flush: what a follower held at the failover would reach the new leader,
            # which then knows of reports received before it took over (more than a direct
            # one); the property compares from the failover on.
            for relay in world.followers.values():
                world.flush(relay, failover_at)
            direct = fleet.FleetState(
                leader_since=at(failover_at), stale_multiplier=STALE_MULTIPLIER
            )
            world.leader = fleet.FleetState(leader_since=at(failover_at),
                                            stale_multiplier=STALE_MULTIPLIER)  # fmt: skip
        agent = agents[event.node]
        hb = agent.report(event.change, event.t)
        pod = f"pod-{agent.pod}"
        direct.ingest(hb, at(event.t), pod_uid=pod)
        if outage is not None and outage[0] - 1.0 <= event.t and not world.healed:
            # While the leader is cut off, and until what was held back is flushed, agents
            # reach one follower only: with two paths, reports held back by the partition
            # can reach the leader in another order (docs/architecture.md says so).
            world.receive(dataclasses.replace(event, route="a"), hb, pod)
        else:
            world.receive(event, hb, pod)
        last = event.t
    end = max(last, outage[1] if outage else 0.0) + 0.01  # once the leader is reachable again
    for relay in world.followers.values():
        world.flush(relay, end)
    return (
        {n: _record(direct.get(n)) for n in NODES},
        {n: _record(world.leader.get(n)) for n in NODES},
    )


def _every_batch(skipped: frozenset[int]) -> Callable[[float, float], list[float]]:
    """Flush ticks every BATCH_S in (start, end), but those hypothesis chose to skip (a slow
    flusher: liveness waits longer)."""

    def ticks(start: float, end: float) -> list[float]:
        first, last = int(start / BATCH_S) + 1, int(end / BATCH_S)
        return [
            i * BATCH_S
            for i in range(first, last + 1)
            if i * BATCH_S < end and i % 7 not in skipped
        ]

    return ticks


HOLD_S = 5 * BATCH_S
"""The longest a liveness entry waits for a flush here (four ticks in a row skipped)."""
WORLDS = {
    "failover": st.one_of(st.none(), st.floats(min_value=0.5, max_value=30.0)),
    "skipped": st.frozensets(st.integers(min_value=0, max_value=6), max_size=4),
    "outage": st.one_of(
        st.none(),
        st.tuples(st.floats(0.0, 20.0), st.floats(1.0, 12.0)).map(lambda o: (o[0], o[0] + o[1])),
    ),
}
SETTINGS = hypothesis.settings(
    max_examples=1000, deadline=None, derandomize=True,
    suppress_health_check=[hypothesis.HealthCheck.too_slow],
)  # fmt: skip


def _comparable(failover: float | None, outage: tuple[float, float] | None) -> bool:
    """A failover during the partition hands the new leader reports its predecessor was
    sent and never took; direct ingestion has no such case to compare with."""
    return not (outage and failover and outage[0] - 1 <= failover <= outage[1] + 1)


@SETTINGS
@hypothesis.given(events=_events(mixed=False), **WORLDS)
def test_relayed_heartbeats_leave_the_leader_deciding_what_direct_ones_would(
    events: list[Event],
    failover: float | None,
    skipped: frozenset[int],
    outage: tuple[float, float] | None,
) -> None:
    """For reports of two nodes (steady beats, faults, recoveries, reboots, agent restarts,
    silences), each node's through one of two followers, with flushes skipped, the
    followers unable to reach the leader for a while, and a failover at any moment, the
    leader's record of each node (verdict, action, faults, streaks, boot fields, receipt,
    per-GPU streaks) is the one direct ingestion makes, to the millisecond the wire
    carries."""
    hypothesis.assume(_comparable(failover, outage))
    direct, relayed = _run(events, failover, _every_batch(skipped), outage)
    assert direct == relayed


@SETTINGS
@hypothesis.given(events=_events(mixed=True), **WORLDS)
def test_reports_reordered_between_followers_shift_a_streak_start_by_one_hold_at_most(
    events: list[Event],
    failover: float | None,
    skipped: frozenset[int],
    outage: tuple[float, float] | None,
) -> None:
    """When one node's reports land on both followers and on the leader, a steady report
    waiting in one follower's batch can reach the leader after a newer one that came
    another way. The leader still decides the same (verdict, action, faults, boot fields,
    receipt, which GPUs are healthy); only the start of a streak may be later than direct
    ingestion puts it, by at most the time a report waits for its batch."""
    hypothesis.assume(_comparable(failover, outage))
    direct, relayed = _run(events, failover, _every_batch(skipped), outage)
    late: list[tuple[str, float, float]] = []
    for node in NODES:
        (d_values, d_starts), (r_values, r_starts) = direct[node], relayed[node]
        assert (node, d_values) == (node, r_values)
        for d, r in zip(d_starts, r_starts, strict=True):
            if d is None or r is None:
                assert (node, d) == (node, r)
            elif not -0.001 <= r - d <= HOLD_S + 0.001:
                late.append((node, d, r))
    expected: list[tuple[str, float, float]] = []
    assert expected == late


def test_a_held_back_report_of_the_previous_boot_does_not_undo_a_reboot() -> None:
    """A full report of boot 1 that waited in one follower (a refresh of its pending entry)
    while boot 2's report reached the leader through another is outdated: it was received
    before the record's report, so direct ingestion would have been past it already."""
    leader = fleet.FleetState(leader_since=at(0))
    leader.ingest(_beat(seq=1), at(1), pod_uid="pod-1")
    leader.ingest(_beat(seq=1, boot="boot-2"), at(3), pod_uid="pod-1")
    held = _beat(seq=2)
    outcome = leader.ingest_relayed(held, at(2.5), at(2.5), pod_uid="pod-1")
    record = leader.get("n1")
    assert record is not None
    actual = (outcome, record.heartbeat.boot_id, record.previous_boot_id)
    expected = (reports.Relayed.OUTDATED, "boot-2", "boot-1")
    assert expected == actual


def test_an_urgent_take_sends_the_changes_and_leaves_the_fleets_liveness_for_the_interval() -> None:
    """A change is flushed with only its own node's pending entries before it, so it does
    not wait for the rest of the fleet's liveness; the interval's take sends the rest."""
    relay = relays.Relay(LIMITS)
    for node in ("n1", "n2", "n3"):
        _offer(relay, _beat(node, seq=1), 0.0)
    _deliver(relay, 0.0)
    for node in ("n1", "n2", "n3"):
        _offer(relay, _beat(node, seq=2), 1.0)
    _offer(relay, _beat("n2", seq=3, fault=True), 1.1)
    urgent = [(e.node, e.report.sequence, e.full) for e in relay.take(1.1, urgent=True)]
    rest = sorted((e.node, e.report.sequence, e.full) for e in relay.take(2.0))
    expected = ([("n2", 2, False), ("n2", 3, True)], [("n1", 2, False), ("n3", 2, False)])
    assert expected == (urgent, rest)
