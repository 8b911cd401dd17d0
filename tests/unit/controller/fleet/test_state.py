"""Fleet state: verdict per node, staleness, leader warm-up, replays and boot changes."""

from __future__ import annotations

import dataclasses
import datetime as dt

import msgspec
import pytest

from controller.fleet import reports
from controller.fleet import state as fleet
from shared import fastheartbeat, health, heartbeat
from tests.unit.controller.fleet import fakes
from tests.unit.controller.fleet.fakes import at


def _assess(state: fleet.FleetState, now: dt.datetime, node: str = "n1") -> fleet.NodeHealth:
    return state.assess(node, now, default_interval_s=10.0)


@dataclasses.dataclass(frozen=True)
class VerdictCase:
    id: str
    faults: dict[int, list[object]]
    state: fleet.NodeState
    reason: str
    message: str


VERDICT_CASES = [
    VerdictCase(
        "all healthy GPUs make a healthy node",
        {},
        fleet.NodeState.HEALTHY,
        "GpusHealthy",
        "all 8 GPUs healthy",
    ),
    VerdictCase(
        "one fallen-off GPU fails the node and names its UUID",
        {3: [fakes.xid79()]},
        fleet.NodeState.FAILED,
        "XidFallenOffBus",
        "GPU-n1-3: XidFallenOffBus (Failed, RebootNode, latched)",
    ),
    VerdictCase(
        "the worst GPU decides the node and leads the message",
        {1: [fakes.ecc_rising()], 5: [fakes.row_remap_failure()]},
        fleet.NodeState.FAILED,
        "RowRemapFailure",
        "GPU-n1-5: RowRemapFailure (Failed, Inspect, latched); "
        "GPU-n1-1: EccUncorrectedRising (Degraded, ResetGPU, latched)",
    ),
    VerdictCase(
        "a degraded GPU degrades the node",
        {0: [fakes.ecc_rising()]},
        fleet.NodeState.DEGRADED,
        "EccUncorrectedRising",
        "GPU-n1-0: EccUncorrectedRising (Degraded, ResetGPU, latched)",
    ),
]


@pytest.mark.parametrize("case", VERDICT_CASES, ids=lambda c: c.id)
def test_node_verdict_is_the_worst_gpu_verdict(case: VerdictCase) -> None:
    """A fresh report's node state, reason code and GPU-naming message follow its worst GPU."""
    state = fleet.FleetState(leader_since=at(0))
    state.ingest(fakes.hb("n1", faults=case.faults), at(1))  # type: ignore[arg-type]

    actual = _assess(state, at(2))

    assert (case.state, case.reason, case.message) == (actual.state, actual.reason, actual.message)


@pytest.mark.parametrize(
    ("multiplier", "seconds_after_last", "expected"),
    [
        pytest.param(3.0, 30.0, fleet.NodeState.HEALTHY, id="exactly three intervals is fresh"),
        pytest.param(3.0, 30.5, fleet.NodeState.STALE, id="past three intervals is stale"),
        pytest.param(2.0, 20.5, fleet.NodeState.STALE, id="the multiplier is a setting"),
    ],
)
def test_staleness_is_measured_from_receipt_against_the_agent_interval(
    multiplier: float, seconds_after_last: float, expected: fleet.NodeState
) -> None:
    """A node is stale once silent for longer than multiplier × its own intervalS."""
    state = fleet.FleetState(leader_since=at(-1000), stale_multiplier=multiplier)
    state.ingest(fakes.hb("n1", interval_s=10.0), at(100))

    actual = _assess(state, at(100 + seconds_after_last))

    assert expected == actual.state


def test_stale_node_reports_heartbeat_stale_with_its_onset() -> None:
    """A stale node says HeartbeatStale, when it went quiet, and keys the silence by its onset."""
    state = fleet.FleetState(leader_since=at(-1000))
    state.ingest(fakes.hb("n1"), at(0))

    actual = _assess(state, at(100))

    expected = (
        fleet.NodeState.STALE,
        "HeartbeatStale",
        at(30),
        frozenset({fleet.FaultKey("", "HeartbeatStale", "2025-03-01T12:00:30Z")}),
    )
    assert expected == (actual.state, actual.reason, actual.bad_since, actual.fault_keys)


@pytest.mark.parametrize(
    ("received", "now", "expected"),
    [
        pytest.param(
            -500.0,
            20.0,
            fleet.NodeState.HEALTHY,
            id="an old report is not stale inside a new leader's warm-up",
        ),
        pytest.param(
            -500.0,
            31.0,
            fleet.NodeState.STALE,
            id="an old report turns stale one staleAfter after the leader took over",
        ),
        pytest.param(
            None,
            29.0,
            fleet.NodeState.WARMING_UP,
            id="a node never heard from is not judged during the warm-up",
        ),
        pytest.param(
            None,
            31.0,
            fleet.NodeState.MISSING,
            id="a node never heard from is missing after the warm-up",
        ),
    ],
)
def test_a_new_leader_observes_for_one_stale_after(
    received: float | None, now: float, expected: fleet.NodeState
) -> None:
    """Leader warm-up: silence is measured from the later of the report and leader_since."""
    state = fleet.FleetState(leader_since=at(-1000))
    if received is not None:
        state.ingest(fakes.hb("n1"), at(received))
    state.become_leader(at(0))

    actual = _assess(state, at(now))

    assert expected == actual.state


@pytest.mark.parametrize(
    ("boot", "seq", "sent", "expected_accepted"),
    [
        pytest.param(
            "boot-1", 5, 5.0, False, id="the same sequence from the same boot is a replay"
        ),
        pytest.param(
            "boot-1", 4, 4.0, False, id="an older sequence from the same boot is a replay"
        ),
        pytest.param("boot-1", 6, 6.0, True, id="a newer sequence is accepted"),
        pytest.param(
            "boot-1", 1, 9.0, True, id="a restarted agent's lower sequence but later send counts"
        ),
        pytest.param("boot-2", 1, 1.0, True, id="any report from a new boot is accepted"),
    ],
)
def test_replayed_heartbeats_are_ignored(
    boot: str, seq: int, sent: float, expected_accepted: bool
) -> None:
    """Forwarded copies and retried POSTs never move the node's state backwards."""
    state = fleet.FleetState(leader_since=at(0))
    state.ingest(fakes.hb("n1", seq=5, sent_at=at(5)), at(5))

    actual = state.ingest(fakes.hb("n1", boot=boot, seq=seq, sent_at=at(sent)), at(10))

    assert expected_accepted == actual


def test_a_boot_id_change_is_recorded() -> None:
    """The previous boot ID and the time of the change are kept for RebootNode releases."""
    state = fleet.FleetState(leader_since=at(0))
    state.ingest(fakes.hb("n1", boot="boot-1", seq=1), at(1))
    state.ingest(fakes.hb("n1", boot="boot-2", seq=1, sent_at=at(50)), at(50))

    record = state.get("n1")

    assert record is not None
    assert ("boot-1", at(50)) == (record.previous_boot_id, record.boot_changed_at)
    assert at(50) == _assess(state, at(51)).boot_changed_at


@pytest.mark.parametrize(
    ("reports", "expected_healthy_since", "expected_bad_since"),
    [
        pytest.param(
            [(0, False), (5, False), (10, True), (15, True)],
            at(10),
            None,
            id="a healthy streak starts at its first healthy report",
        ),
        pytest.param(
            [(0, True), (10, False), (20, False)],
            None,
            at(10),
            id="a bad streak starts at its first bad report",
        ),
        pytest.param(
            [(0, True), (100, True), (105, True)],
            at(100),
            None,
            id="a silence in the middle restarts the healthy streak",
        ),
    ],
)
def test_streaks(
    reports: list[tuple[float, bool]],
    expected_healthy_since: dt.datetime | None,
    expected_bad_since: dt.datetime | None,
) -> None:
    """Healthy and bad streaks are measured in receipt time, for release and the breaker."""
    state = fleet.FleetState(leader_since=at(-1000))
    for index, (when, healthy) in enumerate(reports):
        faults = None if healthy else {0: [fakes.xid79()]}
        state.ingest(fakes.hb("n1", faults=faults, seq=index + 1, sent_at=at(when)), at(when))

    record = state.get("n1")

    assert record is not None
    assert (expected_healthy_since, expected_bad_since) == (record.healthy_since, record.bad_since)


def test_a_gpu_with_a_bad_verdict_and_no_reasons_still_counts() -> None:
    """An agent that fails a GPU without findings still fails the node, with a generic reason."""
    hb = fakes.hb("n1")
    gpus = list(hb.gpus)
    gpus[2] = msgspec.structs.replace(gpus[2], verdict=health.Verdict.FAILED)
    state = fleet.FleetState(leader_since=at(0))
    state.ingest(msgspec.structs.replace(hb, gpus=gpus), at(1))

    actual = _assess(state, at(2))

    expected = (fleet.NodeState.FAILED, "GpuFailed")
    assert expected == (actual.state, actual.reason)


def test_naive_times_are_refused_naming_the_field() -> None:
    """A clock without a zone is a programming error, reported with the parameter name."""
    with pytest.raises(ValueError, match="leader_since must be timezone-aware"):
        fleet.FleetState(leader_since=dt.datetime(2025, 1, 1))  # noqa: DTZ001


def test_each_gpu_keeps_its_own_healthy_streak() -> None:
    """GPU 2 recovers at 20 while GPU 5 stays bad: GPU 2's streak starts at 20 (the node's
    has not started), GPU 5 is bad since 0, GPU 0 healthy since the first report."""
    state = fleet.FleetState(leader_since=at(0))
    bad = {2: [fakes.ecc_rising()], 5: [fakes.ecc_rising()]}
    state.ingest(fakes.hb("n1", faults=bad, seq=1, sent_at=at(0)), at(0))
    state.ingest(fakes.hb("n1", faults=bad, seq=2, sent_at=at(10)), at(10))
    only5 = {5: [fakes.ecc_rising()]}
    state.ingest(fakes.hb("n1", faults=only5, seq=3, sent_at=at(20)), at(20))
    state.ingest(fakes.hb("n1", faults=only5, seq=4, sent_at=at(30)), at(30))
    expected = ((True, at(20)), (False, at(0)), (True, at(0)), None)
    streaks = [state.gpu_streak("n1", fakes.gpu_uuid("n1", i)) for i in (2, 5, 0)]
    actual = (*streaks, _assess(state, at(30)).healthy_since)
    assert expected == actual


def test_a_silence_restarts_every_gpu_streak() -> None:
    """After a silence longer than staleAfter, every GPU's streak starts again."""
    state = fleet.FleetState(leader_since=at(0))
    state.ingest(fakes.hb("n1", seq=1, sent_at=at(0)), at(0))
    state.ingest(fakes.hb("n1", seq=2, sent_at=at(100)), at(100))  # staleAfter is 30 s
    assert (True, at(100)) == state.gpu_streak("n1", fakes.gpu_uuid("n1", 3))


# ---------------------------------------------------------------- bounds (security review M6)
@pytest.mark.parametrize(
    ("interval_s", "sent_at", "expected"),
    [
        pytest.param(5.0, at(100), None, id="a report within every bound is taken"),
        pytest.param(1.0, at(100), None, id="the shortest interval is within the range"),
        pytest.param(300.0, at(100), None, id="the longest interval is within the range"),
        pytest.param(0.5, at(100), "intervalS", id="an interval under the range is refused"),
        pytest.param(3600.0, at(100), "intervalS",
                     id="an interval of an hour would hide a dead node for three"),
        pytest.param(5.0, at(100) + dt.timedelta(days=30000), "sentAt",
                     id="a report dated decades ahead would make genuine ones replays"),
        pytest.param(5.0, at(100) - dt.timedelta(minutes=6), "sentAt",
                     id="a report six minutes behind is refused"),
        pytest.param(5.0, at(100) + dt.timedelta(minutes=4), None,
                     id="four minutes of clock skew are tolerated"),
        pytest.param(5.0, at(100).replace(tzinfo=None), "sentAt",
                     id="a time without a zone cannot be compared, so it is refused"),
    ],
)  # fmt: skip
def test_heartbeat_bounds(interval_s: float, sent_at: dt.datetime, expected: str | None) -> None:
    """The interval must lie in the controller's range, sentAt within the skew window of
    the receive time (DESIGN.md section 10: every field of a heartbeat is bounded). The
    time is set without validation: the wire schema already refuses a time without a zone,
    and the controller's own check must hold even so."""
    hb = msgspec.structs.replace(fakes.hb("n1", interval_s=interval_s), sent_at=sent_at)
    problem = reports.heartbeat_problem(
        hb, at(100), min_interval_s=1.0, max_interval_s=300.0, max_skew_s=300.0
    )
    assert expected == (problem[0] if problem else None)


@pytest.mark.parametrize(
    "faults",
    [
        pytest.param(None, id="a healthy node"),
        pytest.param({3: [fakes.xid79()]}, id="a node with a latched Xid"),
        pytest.param({0: [fakes.ecc_rising()], 5: [fakes.row_remap_failure()]},
                     id="a node with two faulty GPUs"),
    ],
)  # fmt: skip
def test_a_decoded_report_is_judged_as_its_model_is(
    faults: dict[int, list[heartbeat.Reason]] | None,
) -> None:
    """The hot path ingests msgspec's struct (fastheartbeat), the tests build models: the
    fleet state judges the same report the same way in either form, streaks included."""
    model = fakes.hb("n1", seq=1, sent_at=at(0), faults=faults)
    decoded = fastheartbeat.decode(fastheartbeat.wire(model))
    expected, actual = fleet.FleetState(leader_since=at(0)), fleet.FleetState(leader_since=at(0))
    expected.ingest(model, at(1))
    actual.ingest(decoded, at(1))
    judged = [s.assess("n1", at(2), default_interval_s=10.0) for s in (expected, actual)]
    assert judged[0] == judged[1]
    uuids = [fakes.gpu_uuid("n1", i) for i in range(8)]
    assert [expected.gpu_streak("n1", u) for u in uuids] == [
        actual.gpu_streak("n1", u) for u in uuids
    ]


@pytest.mark.parametrize(
    ("second", "received_s", "changed"),
    [
        pytest.param(fakes.hb("n1", seq=2, sent_at=at(10)), 10, False,
                     id="a steady report is no change"),
        pytest.param(fakes.hb("n1", seq=2, sent_at=at(10), faults={0: [fakes.xid79()]}), 10,
                     True, id="a new fault is a change"),
        pytest.param(fakes.hb("n1", seq=2, sent_at=at(10), boot="boot-2"), 10, True,
                     id="a new boot ID is a change"),
        pytest.param(fakes.hb("n1", seq=2, sent_at=at(10), gpus=4), 10, True,
                     id="a different GPU count is a change"),
        pytest.param(fakes.hb("n1", seq=2, sent_at=at(10), interval_s=5.0), 10, True,
                     id="a different interval is a change"),
        pytest.param(fakes.hb("n1", seq=2, sent_at=at(40)), 40, True,
                     id="a report after a silence is a change"),
        pytest.param(fakes.hb("n1", seq=1, sent_at=at(0)), 10, False,
                     id="a replay is no change"),
    ],
)  # fmt: skip
def test_the_fleet_names_the_nodes_whose_health_may_read_differently(
    second: heartbeat.Heartbeat, received_s: float, changed: bool
) -> None:
    """`take_changed` names a node after its first report and after a report that changes
    what the policy reads; a steady report only moves staleness later (no change)."""
    state = fleet.FleetState(leader_since=at(-100))
    state.ingest(fakes.hb("n1", seq=1, sent_at=at(0)), at(0))
    assert {"n1"} == state.take_changed()
    state.ingest(second, at(received_s))
    assert ({"n1"} if changed else set()) == state.take_changed()


def test_the_fleet_names_the_nodes_whose_last_report_has_a_fault() -> None:
    """`faulty`: a fault in the first report or a later one names the node, a report without
    faults or forgetting the node removes it, and a replay changes nothing."""
    state = fleet.FleetState(leader_since=at(-100))
    bad = {0: [fakes.ecc_rising()]}
    state.ingest(fakes.hb("n1", seq=1, sent_at=at(0), faults=bad), at(0))
    state.ingest(fakes.hb("n2", seq=1, sent_at=at(0)), at(0))
    seen = [state.faulty()]
    state.ingest(fakes.hb("n2", seq=2, sent_at=at(10), faults=bad), at(10))
    state.ingest(fakes.hb("n1", seq=2, sent_at=at(10)), at(10))
    seen.append(state.faulty())
    state.ingest(fakes.hb("n2", seq=1, sent_at=at(0)), at(11))
    seen.append(state.faulty())
    state.forget("n2")
    seen.append(state.faulty())

    assert [{"n1"}, {"n2"}, {"n2"}, set()] == seen


@pytest.mark.parametrize(
    ("leader_since", "received", "now", "expected"),
    [
        pytest.param(0, None, 20, False, id="never reported, the leader still warming up"),
        pytest.param(0, None, 40, False, id="never reported, past the warm-up: missing"),
        pytest.param(-100, 0, 30, True, id="reported, up to its staleAfter"),
        pytest.param(-100, 0, 31, False, id="reported, a second past its staleAfter: stale"),
        pytest.param(25, 0, 50, True, id="a new leader gives an old report one staleAfter"),
        pytest.param(25, 0, 56, False, id="and not more"),
    ],
)
def test_a_node_is_fresh_exactly_when_its_assessment_is_a_verdict(
    leader_since: float, received: float | None, now: float, expected: bool
) -> None:
    """`fresh` (the gate asks it of every node) agrees with `assess`: warming up, missing and
    stale are not fresh; a report within its staleAfter is, whatever its verdict."""
    state = fleet.FleetState(leader_since=at(leader_since), stale_multiplier=3.0)
    if received is not None:
        state.ingest(fakes.hb("n1", seq=1, sent_at=at(received), faults={0: [fakes.xid79()]}),
                     at(received))  # fmt: skip
    h = state.assess("n1", at(now), default_interval_s=10.0)
    verdicts = {fleet.NodeState.HEALTHY, fleet.NodeState.DEGRADED, fleet.NodeState.FAILED,
                fleet.NodeState.UNKNOWN}  # fmt: skip
    assert (expected, expected) == (h.state in verdicts, state.fresh("n1", at(now))), h.state


def test_staleafter_is_kept_per_interval_and_bounded_whatever_intervals_agents_send() -> None:
    """Every interval in range gets its own staleAfter (3 × it), however many distinct ones
    agents send; what is kept of them stays bounded (a hostile agent cannot grow it)."""
    state = fleet.FleetState(leader_since=at(0), stale_multiplier=3.0)
    intervals = [1.0 + i / 8 for i in range(500)] + [10.0, 1.0]
    found = [state.stale_after(fakes.hb("n1", seq=1, sent_at=at(0), interval_s=i))
             for i in intervals]  # fmt: skip
    assert [dt.timedelta(seconds=3 * i) for i in intervals] == found
    assert len(state._stale_after) <= 64  # the bound is the point: a private look
