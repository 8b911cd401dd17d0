"""The quarantine policy: every limit of DESIGN.md section 6, run pass by pass on a fake fleet.

Each test drives `policy.decide` through `fakes.World`, which applies the returned actions
with `conditions.patch_for` the way the actuator will, and asserts on the resulting Nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import pytest

from controller import errors, marks
from controller.fleet import actions, nodes, policy
from shared import health, heartbeat
from tests.unit.controller.fleet import fakes
from tests.unit.controller.fleet.fakes import at

SETTINGS = policy.Settings(
    stale_multiplier=3.0,
    default_interval_s=10.0,
    evict_grace_s=60,
    degraded_drain_after_s=1800,
    release_after_s=300,
    stale_quarantine_after_s=600,
    max_quarantined=None,
    max_quarantined_fraction=0.2,
    breaker_percent=50,
    breaker_window_s=300,
    breaker_min_nodes=2,
    breaker_healthy_close_s=300,
    dry_run=False,
)
Faults = Mapping[int, Iterable[heartbeat.Reason]]
TEN = [f"n{i}" for i in range(10)]
QUARANTINED = ("False", True, True, True)
"""(condition, tainted, unschedulable, cordoned by us) of a node we quarantined."""
CLEAN = ("True", False, False, False)


def _world(names: list[str] = TEN, **overrides: object) -> fakes.World:
    return fakes.World(names, SETTINGS.model_copy(update=overrides))


def _run(
    world: fakes.World, until: float, *, every: float = 10.0, bad: Mapping[str, Faults]
) -> None:
    """Report every `every` seconds up to `until`, with the given faults per node, and step."""
    when = 0.0
    while when <= until:
        for name in world.nodes:
            faults = bad.get(name)
            world.report(at(when), [name], faults=faults)
        world.step(at(when))
        when += every


def test_a_failed_node_is_quarantined_at_once_and_drained_after_the_grace() -> None:
    """Failed: condition False, taint and our cordon at once; GPU pods evicted after the grace."""
    world = _world()
    _run(world, 50, bad={"n1": {0: [fakes.xid79()]}})

    assert (world.marks("n1"), world.evictions) == (QUARANTINED, [])

    _run_from(world, 60, 80, bad={"n1": {0: [fakes.xid79()]}})

    history = [entry.action for entry in world.view("n1").history]
    assert ("n1", at(60)) == world.evictions[0]
    assert len(world.evictions) == 3, "eviction is retried on every pass while due"
    assert history == ["Quarantine", "EvictGpuPods"]
    assert world.marks("n2") == CLEAN


def _run_from(
    world: fakes.World,
    start: float,
    until: float,
    *,
    bad: Mapping[str, Faults],
    every: float = 10.0,
) -> None:
    when = start
    while when <= until:
        for name in world.nodes:
            world.report(at(when), [name], faults=bad.get(name))
        world.step(at(when))
        when += every


def test_a_degraded_node_keeps_running_work_until_the_drain_deadline() -> None:
    """Degraded: quarantined at once, but its GPU pods stay until degradedDrainAfter."""
    world = _world(degraded_drain_after_s=100)
    bad = {"n1": {0: [fakes.ecc_rising()]}}
    _run(world, 90, bad=bad)

    assert (world.marks("n1"), world.evictions) == (QUARANTINED, [])

    _run_from(world, 100, 100, bad=bad)

    assert [("n1", at(100))] == world.evictions


def test_degraded_then_failed_brings_the_eviction_forward() -> None:
    """An escalation to Failed while quarantined sets the shorter Failed grace from then."""
    world = _world()
    _run(world, 100, bad={"n1": {0: [fakes.ecc_rising()]}})
    _run_from(world, 110, 170, bad={"n1": {0: [fakes.xid79(at(110))]}})

    record = world.view("n1").quarantine
    assert record is not None
    expected = (nodes.Clearing.NEW_BOOT_ID, at(170), [("n1", at(170))])
    assert expected == (record.clears_with, record.evict_after, world.evictions)


def test_the_quarantine_record_says_whether_a_gpu_failed() -> None:
    """Runs on a node whose GPU failed are lost at once: the record says so, and keeps
    saying so after a Degraded node escalates to Failed (the run reconciler reads it)."""
    world = _world()
    _run(world, 50, bad={"n1": {0: [fakes.xid79()]}, "n2": {0: [fakes.ecc_rising()]}})
    failed, degraded = world.view("n1").quarantine, world.view("n2").quarantine
    assert failed is not None
    assert degraded is not None
    assert (failed.failed, degraded.failed) == (True, False)
    assert '"failed":true' in failed.to_annotation()

    _run_from(world, 60, 60, bad={"n1": {0: [fakes.xid79()]}, "n2": {0: [fakes.xid79(at(60))]}})
    escalated = world.view("n2").quarantine
    assert escalated is not None
    assert escalated.failed


def test_a_silent_node_is_unknown_then_quarantined_after_the_set_time() -> None:
    """Stale: condition Unknown after staleAfter; taint and cordon only after staleQuarantineAfter;
    its work is not evicted."""
    world = _world()
    _run(world, 0, bad={})
    for when in (20, 40, 60):
        world.report(at(when), [n for n in TEN if n != "n1"])
    world.step(at(31))

    assert world.marks("n1") == ("Unknown", False, False, False)

    for when in range(70, 630, 10):
        world.report(at(when), [n for n in TEN if n != "n1"])
    before = world.step(at(629))
    assert world.marks("n1") == ("Unknown", False, False, False)
    assert at(630) == before.next_deadline

    world.step(at(631))

    assert (world.marks("n1"), world.evictions) == (("Unknown", True, True, True), [])


def test_a_failover_quarantines_no_node_for_staleness() -> None:
    """A new leader with no heartbeats yet judges nothing for one staleAfter, then sees reports."""
    raw = {
        name: fakes.raw_node(
            name,
            conditions_=[
                {
                    "type": "GPUHealthy",
                    "status": "True",
                    "reason": "GpusHealthy",
                    "message": "all 8 GPUs healthy",
                    "lastTransitionTime": "2025-03-01T00:00:00Z",
                }
            ],
        )
        for name in TEN
    }
    world = fakes.World(TEN, SETTINGS, leader_since=at(0), raw=raw)

    during = world.step(at(25))
    world.report(at(26), TEN)
    after = world.step(at(40))

    assert (during.actions, after.actions) == ((), ())
    assert not during.breaker.open


@pytest.mark.parametrize(
    ("bad", "expected_quarantined", "expected_skipped"),
    [
        pytest.param(
            {"n1": {0: [fakes.xid79()]}, "n2": {0: [fakes.xid79()]}, "n3": {0: [fakes.xid79()]}},
            ["n1", "n2"],
            ["n3"],
            id="no more than 20 percent of ten nodes are quarantined, by name on a tie",
        ),
        pytest.param(
            {
                "n1": {0: [fakes.ecc_rising()]},
                "n2": {0: [fakes.ecc_rising()]},
                "n3": {0: [fakes.xid79()]},
            },
            ["n1", "n3"],
            ["n2"],
            id="failed nodes go before degraded ones",
        ),
    ],
)
def test_max_quarantined_limits_automatic_quarantine(
    bad: Mapping[str, Faults], expected_quarantined: list[str], expected_skipped: list[str]
) -> None:
    """maxQuarantined (20 % of GPU nodes, at least 1) caps quarantine; the rest are reported."""
    world = _world()
    world.report(at(0), TEN)
    for name, faults in bad.items():
        world.report(at(1), [name], faults=faults)

    decision = world.step(at(2))

    quarantined = sorted(n for n in TEN if world.view(n).quarantine is not None)
    skipped = [
        a.node
        for a in decision.actions
        if isinstance(a, actions.Skipped) and a.why is actions.SkipReason.MAX_QUARANTINED
    ]
    assert (expected_quarantined, expected_skipped, 2) == (
        quarantined,
        skipped,
        decision.max_quarantined,
    )


@pytest.mark.parametrize(
    ("fleet_size", "fraction", "expected"),
    [
        pytest.param(3, 0.2, 1, id="a small fleet may still quarantine one node"),
        pytest.param(10, 0.2, 2, id="twenty percent of ten is two"),
        pytest.param(5000, 0.2, 1000, id="twenty percent of five thousand is a thousand"),
    ],
)
def test_max_quarantined_default(fleet_size: int, fraction: float, expected: int) -> None:
    """The default limit is a share of managed GPU nodes, never below one."""
    settings = SETTINGS.model_copy(update={"max_quarantined_fraction": fraction})

    assert expected == settings.limit_for(fleet_size)


def _storm(world: fakes.World, silent: list[str]) -> None:
    """Every node reports at 0; `silent` stop there, the others report every 10 s until 700."""
    world.report(at(0), TEN)
    world.step(at(0))
    for when in range(10, 710, 10):
        world.report(at(when), [n for n in TEN if n not in silent])


def test_breaker_opens_when_more_than_half_the_fleet_goes_stale_at_once() -> None:
    """Six of ten nodes silent at once: the breaker opens, nothing is quarantined, even after
    staleQuarantineAfter; the conditions still say Unknown."""
    world = _world()
    silent = TEN[:6]
    _storm(world, silent)

    opened = world.step(at(31))
    later = world.step(at(700))

    assert [k for k in fakes.kinds(opened) if k[0] == "OpenBreaker"] == [("OpenBreaker", "")]
    assert later.breaker.open
    assert [f"{n}:BreakerOpen" for n in silent] == [
        node for kind, node in fakes.kinds(later) if kind == "SkippedQuarantine"
    ]
    assert [world.marks(n) for n in silent] == [("Unknown", False, False, False)] * 6


def test_breaker_reset_closes_it_and_old_onsets_do_not_reopen_it() -> None:
    """After an operator's reset, the nodes that tripped it are judged one by one, within
    maxQuarantined, and do not open the breaker again."""
    world = _world()
    _storm(world, TEN[:6])
    world.step(at(31))
    world.breaker = policy.reset_breaker(world.breaker, by="alice", now=at(650))

    decision = world.step(at(700))

    assert not decision.breaker.open
    assert sorted(n for n in TEN if world.view(n).quarantine is not None) == ["n0", "n1"]


def test_breaker_closes_by_itself_after_the_fleet_is_healthy_for_a_window() -> None:
    """Open, then every silent node reports again: the breaker closes breakerCloseAfter later."""
    world = _world()
    _storm(world, TEN[:6])
    world.step(at(31))
    for when in range(710, 1100, 10):
        world.report(at(when), TEN)
        decision = world.step(at(when))
        if not decision.breaker.open:
            break

    assert ("CloseBreaker", at(1010)) == (fakes.kinds(decision)[0][0], at(when))


def test_breaker_stays_open_while_a_bad_node_is_not_contained() -> None:
    """A storm of Failed nodes keeps the breaker open as long as they stay unquarantined."""
    world = _world()
    bad = {n: {0: [fakes.xid79()]} for n in TEN[:6]}
    _run(world, 1000, bad=bad)

    assert (
        world.breaker.open,
        [n for n in TEN if world.view(n).quarantine is not None],
    ) == (True, [])


def test_breaker_needs_more_than_one_node() -> None:
    """In a one-node fleet a fault is a fault, not a storm: breakerMinNodes keeps it closed."""
    world = _world(["solo"])
    _run(world, 0, bad={"solo": {0: [fakes.xid79()]}})

    assert (world.breaker.open, world.marks("solo")) == (False, QUARANTINED)


def test_an_open_breaker_holds_back_due_evictions() -> None:
    """Evictions of nodes quarantined before a storm wait while the breaker is open."""
    world = _world()
    world.report(at(0), TEN)
    world.report(at(1), ["n9"], faults={0: [fakes.xid79()]})
    world.step(at(1))
    _storm_from = TEN[:6]
    for when in range(10, 100, 10):
        world.report(at(when), [n for n in TEN if n not in _storm_from and n != "n9"])
        world.report(at(when), ["n9"], faults={0: [fakes.xid79()]})
    decision = world.step(at(90))

    assert decision.breaker.open
    assert (
        world.evictions,
        [n for k, n in fakes.kinds(decision) if k == "SkippedEvictGpuPods"],
    ) == ([], ["n9:BreakerOpen"])


def test_dry_run_decides_but_writes_nothing() -> None:
    """dryRun: every node action comes back Skipped(DryRun) and no Node changes."""
    world = _world(dry_run=True)
    before = {n: dict(world.nodes[n]) for n in TEN}
    world.report(at(0), TEN)
    world.report(at(1), ["n1"], faults={0: [fakes.xid79()]})

    decision = world.step(at(2))

    assert before == world.nodes
    assert {"SkippedSetCondition", "SkippedQuarantine"} == {k for k, _ in fakes.kinds(decision)}
    assert ("SkippedQuarantine", "n1:DryRun") in fakes.kinds(decision)


def test_opted_out_nodes_are_left_alone_and_not_counted() -> None:
    """`taugrid.dev/managed=false`: no condition, taint or cordon, and outside fleet limits."""
    raw = {"n1": fakes.raw_node("n1", labels={marks.MANAGED_LABEL: "false"})}
    world = fakes.World(TEN, SETTINGS, raw=raw)
    _run(world, 0, bad={"n1": {0: [fakes.xid79()]}})

    decision = world.step(at(1))

    assert world.marks("n1") == (None, False, False, False)
    assert "n1" not in decision.health
    assert len(decision.health) == 9


@pytest.mark.parametrize(
    ("fault", "boot_after", "expected_release_at"),
    [
        pytest.param(
            fakes.ecc_rising,
            "boot-1",
            400.0,
            id="a reset-class fault releases after releaseAfter of healthy reports",
        ),
        pytest.param(
            fakes.xid79,
            "boot-2",
            400.0,
            id="a reboot-class fault releases after a new boot ID and releaseAfter",
        ),
        pytest.param(
            fakes.xid79,
            "boot-1",
            None,
            id="a reboot-class fault is held when the node looks healthy without rebooting",
        ),
        pytest.param(
            fakes.row_remap_failure,
            "boot-2",
            None,
            id="an Inspect fault is never released automatically",
        ),
    ],
)
def test_release_needs_the_clearing_condition_and_release_after(
    fault: Callable[[], heartbeat.Reason], boot_after: str, expected_release_at: float | None
) -> None:
    """Release: the latched fault's clearing condition, then healthy for releaseAfter; taint and
    our cordon go and the condition turns True."""
    world = _world()
    world.report(at(0), TEN)
    world.report(at(1), ["n1"], faults={0: [fault()]})
    world.step(at(1))
    released_at = None
    for when in range(100, 800, 10):
        world.report(at(when), TEN, boot=boot_after)
        world.step(at(when))
        if released_at is None and world.view("n1").quarantine is None:
            released_at = float(when)

    assert expected_release_at == released_at
    assert (CLEAN if expected_release_at else ("True", True, True, True)) == world.marks("n1")


def test_a_foreign_cordon_survives_quarantine_and_release() -> None:
    """A node cordoned by someone else before the fault stays cordoned after our release."""
    raw = {"n1": fakes.raw_node("n1", unschedulable=True)}
    world = fakes.World(TEN, SETTINGS, raw=raw)
    world.report(at(0), TEN)
    world.report(at(1), ["n1"], faults={0: [fakes.ecc_rising()]})
    world.step(at(1))
    during = world.marks("n1")
    for when in range(100, 500, 10):
        world.report(at(when), TEN)
        world.step(at(when))

    assert (
        during,
        world.marks("n1"),
    ) == (("False", True, True, False), ("True", False, True, False))


def _uncordon(world: fakes.World, name: str) -> None:
    world.nodes[name]["spec"]["unschedulable"] = False


def test_a_persons_uncordon_is_a_manual_release_that_is_not_undone() -> None:
    """kubectl uncordon of a quarantined node: recorded, taint removed, never re-cordoned for the
    same fault; a new fault quarantines it again."""
    world = _world()
    old = {0: [fakes.xid79(at(1))]}
    _run(world, 10, bad={"n1": old})
    _uncordon(world, "n1")
    _run_from(world, 20, 200, bad={"n1": old})

    view = world.view("n1")
    assert (
        world.marks("n1"),
        view.history[-1].action,
    ) == (("False", False, False, False), "ManualRelease")

    _run_from(world, 210, 210, bad={"n1": {**old, 1: [fakes.xid79(at(205))]}})

    assert world.marks("n1") == QUARANTINED


def test_a_manual_release_is_forgotten_once_the_node_is_healthy() -> None:
    """After a healthy report, the same finding coming back is a new fault."""
    world = _world()
    bad = {"n1": {0: [fakes.reason("GpuThermal", *_degraded_inspect())]}}
    _run(world, 10, bad=bad)
    _uncordon(world, "n1")
    _run_from(world, 20, 40, bad=bad)
    held = world.marks("n1")
    _run_from(world, 50, 50, bad={})
    forgotten = world.view("n1").released_faults
    _run_from(world, 60, 60, bad=bad)

    assert (
        held,
        forgotten,
        world.marks("n1"),
    ) == (("False", False, False, False), None, QUARANTINED)


def _degraded_inspect() -> tuple[health.Verdict, health.Action]:
    return health.Verdict.DEGRADED, health.Action.INSPECT


def test_on_call_quarantine_and_release() -> None:
    """A manual quarantine holds a healthy node until a manual release, which is not undone."""
    world = _world()
    world.report(at(0), TEN)
    world.step(at(0))
    quarantine = policy.manual_quarantine(
        world.view("n1"), None, by="alice", reason="fan noise", now=at(5)
    )
    world.carry_out(quarantine, at(5))
    for when in range(10, 1000, 10):
        world.report(at(when), TEN)
        world.step(at(when))
    held = world.marks("n1")
    release = policy.manual_release(world.view("n1"), None, by="alice", reason="fan replaced")
    world.carry_out(release, at(1000))
    world.step(at(1000))

    assert (held, world.marks("n1")) == (("True", True, True, True), CLEAN)
    expected = [("Quarantine", "alice", "fan noise"), ("ManualRelease", "alice", "fan replaced")]
    assert expected == [(e.action, e.by, e.reason) for e in world.view("n1").history]


@pytest.mark.parametrize(
    ("by", "reason", "expected"),
    [
        pytest.param("alice", "  ", "reason: required", id="a blank reason is refused"),
        pytest.param("", "broken", "by: required", id="an anonymous request is refused"),
    ],
)
def test_on_call_requests_need_a_reason_and_a_name(by: str, reason: str, expected: str) -> None:
    """Manual quarantine and release name the missing field."""
    view = nodes.parse(fakes.raw_node("n1"))
    with pytest.raises(errors.Invalid, match=expected):
        policy.manual_quarantine(view, None, by=by, reason=reason, now=at(0))


def test_manual_release_of_a_node_not_in_quarantine_is_refused() -> None:
    """Releasing a node TauGrid does not hold is an error naming the node."""
    view = nodes.parse(fakes.raw_node("n1"))
    with pytest.raises(errors.Conflict, match="node: n1 is not quarantined"):
        policy.manual_release(view, None, by="alice", reason="done")


def test_a_second_pass_on_the_same_state_does_nothing() -> None:
    """Level-triggered: once a pass's actions are applied, the same inputs yield no action."""
    world = _world()
    world.report(at(0), TEN)
    world.report(at(1), ["n1"], faults={0: [fakes.xid79()]})
    first = world.step(at(2))
    second = world.step(at(2))

    assert first.actions
    assert second.actions == ()


def test_a_removed_taint_is_restored_on_a_quarantined_node() -> None:
    """Someone deleting our taint but leaving the cordon gets it put back."""
    world = _world()
    _run(world, 0, bad={"n1": {0: [fakes.xid79()]}})
    world.nodes["n1"]["spec"]["taints"] = []

    decision = world.step(at(1))

    assert (
        [k for k in fakes.kinds(decision) if k[0] == "RestoreTaint"],
        world.marks("n1"),
    ) == ([("RestoreTaint", "n1")], QUARANTINED)


def test_next_deadline_is_the_earliest_time_based_change() -> None:
    """The pass says when to look again: here the Failed node's eviction before any staleness."""
    world = _world()
    world.report(at(0), TEN)
    world.report(at(1), ["n1"], faults={0: [fakes.xid79()]})

    decision = world.step(at(1))

    assert at(30) == decision.next_deadline  # n-others turn stale at 30 s before eviction at 61 s


def test_missing_node_without_an_agent_is_not_ours() -> None:
    """A GPU node that never reported to any leader gets no condition and no quarantine."""
    world = _world(["n1"])

    decision = world.step(at(10_000))

    assert (decision.actions, world.marks("n1")) == ((), (None, False, False, False))


def test_decide_rejects_nothing_for_an_empty_fleet() -> None:
    """No nodes: no actions, no breaker, no deadline."""
    decision = policy.decide(
        fakes.World([], SETTINGS).fleet, [], SETTINGS, actions.BreakerState(), at(0)
    )

    assert (decision.actions, decision.breaker.open, decision.next_deadline) == ((), False, None)


def test_settings_name_the_bad_field() -> None:
    """A negative or out-of-range limit is refused with its camelCase field name."""
    with pytest.raises(ValueError, match="breakerPercent"):
        policy.Settings.model_validate({"breakerPercent": 150})


@pytest.mark.parametrize(
    ("now", "expected_released"),
    [
        pytest.param(399.9, False, id="a moment before releaseAfter the node is still held"),
        pytest.param(400.0, True, id="at releaseAfter of healthy reports the node is released"),
    ],
)
def test_release_happens_exactly_at_release_after(now: float, expected_released: bool) -> None:
    """The healthy streak starts at the first healthy report received (here at 100 s)."""
    world = _world()
    world.report(at(0), TEN)
    world.report(at(1), ["n1"], faults={0: [fakes.ecc_rising()]})
    world.step(at(1))
    for when in range(100, 400, 10):
        world.report(at(when), TEN)
    world.step(at(now))

    assert expected_released == (world.view("n1").quarantine is None)


@pytest.mark.parametrize(
    ("silent", "expected_open"),
    [
        pytest.param(5, False, id="exactly half the fleet silent does not open the breaker"),
        pytest.param(6, True, id="more than half the fleet silent opens the breaker"),
    ],
)
def test_breaker_threshold_is_strictly_more_than_the_percentage(
    silent: int, expected_open: bool
) -> None:
    """breakerPercent is a strict limit: more than 50 % of nodes, not 50 %."""
    world = _world()
    _storm(world, TEN[:silent])

    decision = world.step(at(31))

    assert expected_open == decision.breaker.open


def test_nodes_that_turned_bad_before_the_window_do_not_count() -> None:
    """Only onsets inside breakerWindow count: old silences are not a storm."""
    world = _world(breaker_window_s=20)
    _storm(world, TEN[:6])

    decision = world.step(at(60))  # onsets at 30 s, window (40 s, 60 s]

    assert not decision.breaker.open
