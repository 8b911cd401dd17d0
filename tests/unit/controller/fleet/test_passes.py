"""Incremental quarantine passes: `passes.decide_changed` decides exactly what the full
`policy.decide` decides for the same state, whatever happened before.

The property is checked over random sequences of events (hypothesis): heartbeats healthy or
with faults of every kind, reboots, interval changes, silences and time passing, Nodes
changed in the cache (opt-out label, a person uncordoning, deleted and added back), manual
quarantines and releases, the breaker reset, dry run switched, device quarantine taking nodes
in and out of its scope, a new leader's warm-up, and writes that fail. Only the changes the
real sources report are handed to the incremental pass: `FleetState.take_changed` for
heartbeats, and the names of the Nodes the events touched (what the node cache reports).
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from controller import errors, marks
from controller.fleet import actions, nodes, passes, policy, state
from shared import health, heartbeat
from tests.unit.controller.fleet import fakes, test_conditions
from tests.unit.controller.fleet.fakes import at

NAMES = ("n0", "n1", "n2", "n3", "n4")
SETTINGS = policy.Settings(
    stale_multiplier=3.0,
    default_interval_s=10.0,
    evict_grace_s=20,
    degraded_drain_after_s=90,
    release_after_s=12,
    stale_quarantine_after_s=30,
    max_quarantined=None,
    max_quarantined_fraction=0.4,
    breaker_percent=40,
    breaker_window_s=60,
    breaker_min_nodes=2,
    breaker_healthy_close_s=50,
    dry_run=False,
)
"""Limits sized to a 5-node fleet and to time steps of seconds, so that every deadline,
both limits and the breaker are reached within a short sequence."""

FAULTS: dict[str, dict[int, list[heartbeat.Reason]]] = {
    "healthy": {},
    "xid79": {0: [fakes.xid79()]},
    "inspect": {1: [fakes.row_remap_failure()]},
    "degraded": {2: [fakes.ecc_rising()]},
    "two": {0: [fakes.xid79()], 3: [fakes.ecc_rising(at(5))]},
    "nvlink": {
        1: [
            fakes.reason(
                "NvlinkDown",
                health.Verdict.DEGRADED,
                health.Action.REBOOT_NODE,
                latched=True,
                since=fakes.T0,
            )
        ]
    },
}

node_names = st.sampled_from(NAMES)
events = st.one_of(
    st.tuples(st.just("report"), node_names, st.sampled_from(sorted(FAULTS)),
              st.sampled_from(["boot-1", "boot-2"]), st.sampled_from([10.0, 10.0, 5.0]),
              st.sampled_from([8, 8, 4])),
    st.tuples(st.just("reports"), st.sampled_from(sorted(FAULTS))),
    st.tuples(st.just("advance"), st.sampled_from([0, 1, 3, 10, 15, 20, 30, 31, 45, 60])),
    st.tuples(st.just("reports"), st.sampled_from(["healthy", "healthy", "xid79"])),
    st.tuples(st.just("advance"), st.sampled_from([10, 30, 31])),
    st.tuples(st.just("pass"), st.just(False)),
    st.tuples(st.just("manual"), node_names, st.booleans()),
    st.tuples(st.just("label"), node_names, st.booleans()),
    st.tuples(st.just("uncordon"), node_names),
    st.tuples(st.just("delete"), node_names, st.sampled_from([8, 0])),
    st.tuples(st.just("forget"), node_names),
    st.tuples(st.just("reset_breaker")),
    st.tuples(st.just("dry_run"), st.booleans()),
    st.tuples(st.just("scope"), st.frozensets(node_names), st.frozensets(node_names)),
    st.tuples(st.just("leader")),
)  # fmt: skip


@dataclasses.dataclass
class Harness:
    """A fleet and its Nodes, judged on every pass by both deciders."""

    world: fakes.World
    now: dt.datetime = fakes.T0
    ledger: passes.Ledger = dataclasses.field(default_factory=passes.Ledger)
    touched: set[str] = dataclasses.field(default_factory=set)
    """Nodes changed in the cache since the last pass (what the node cache reports)."""
    device_scope: frozenset[str] = frozenset()
    device_nodes: frozenset[str] = frozenset()
    seq: int = 0
    passes_compared: int = 0

    def report(self, name: str, kind: str, boot: str, interval_s: float, gpus: int = 8) -> None:
        self.seq += 1
        beat = fakes.hb(name, faults=FAULTS[kind], boot=boot, seq=self.seq, sent_at=self.now,
                        interval_s=interval_s, gpus=gpus)  # fmt: skip
        self.world.fleet.ingest(beat, self.now)

    def write(self, name: str, raw: dict[str, Any]) -> None:
        raw["metadata"]["resourceVersion"] = str(int(raw["metadata"]["resourceVersion"]) + 1)
        self.world.nodes[name] = raw
        self.touched.add(name)

    def carry_out(self, action: actions.NodeAction) -> None:
        if action.node in self.world.nodes:
            self.world.carry_out(action, self.now)
            self.touched.add(action.node)

    def health(self, name: str) -> state.NodeHealth | None:
        if name not in self.world.fleet:
            return None
        return self.world.fleet.assess(name, self.now, default_interval_s=10.0)

    def step(self, event: tuple[Any, ...]) -> None:
        kind = event[0]
        world = self.world
        if kind == "report":
            self.report(event[1], event[2], event[3], event[4], event[5])
        elif kind == "reports":
            for name in NAMES:
                self.report(name, event[1], "boot-1", 10.0)
        elif kind == "advance":
            self.now += dt.timedelta(seconds=event[1])
        elif kind == "pass":
            self.compare(carry_out=event[1])
        elif kind == "manual" and event[1] in world.nodes:
            view = nodes.parse(world.nodes[event[1]])
            try:
                if event[2]:
                    action: actions.NodeAction = policy.manual_release(
                        view, self.health(event[1]), by="oncall", reason="checked"
                    )
                else:
                    action = policy.manual_quarantine(
                        view, self.health(event[1]), by="oncall", reason="suspect", now=self.now
                    )
            except errors.ControllerError:
                return  # refused, as the API would answer 409
            self.carry_out(action)
        elif kind == "label" and event[1] in world.nodes:
            raw = copy.deepcopy(world.nodes[event[1]])
            raw["metadata"]["labels"][marks.MANAGED_LABEL] = "true" if event[2] else "false"
            self.write(event[1], raw)
        elif kind == "uncordon" and event[1] in world.nodes:
            raw = copy.deepcopy(world.nodes[event[1]])
            raw["spec"]["unschedulable"] = False
            self.write(event[1], raw)
        elif kind == "delete":
            if world.nodes.pop(event[1], None) is None:
                # added back bare, as a GPU node or as a DRA node (no nvidia.com/gpu)
                world.nodes[event[1]] = fakes.raw_node(event[1], gpus=event[2])
            self.touched.add(event[1])
        elif kind == "forget":
            world.fleet.forget(event[1])
        elif kind == "reset_breaker":
            world.breaker = policy.reset_breaker(world.breaker, by="oncall", now=self.now)
        elif kind == "dry_run":
            world.settings = world.settings.model_copy(update={"dry_run": event[1]})
        elif kind == "scope":
            self.device_nodes = event[2]
            self.device_scope = event[1] & event[2]
        elif kind == "leader":
            world.fleet.become_leader(self.now)

    def compare(self, *, carry_out: bool) -> None:
        world = self.world
        views = {name: nodes.parse(raw) for name, raw in world.nodes.items()}
        scope, dra = self.device_scope, self.device_nodes
        full = policy.decide(world.fleet, views.values(), world.settings, world.breaker,
                             self.now, device_scope=scope, device_nodes=dra)  # fmt: skip
        changed = world.fleet.take_changed() | self.touched
        self.touched = set()
        incremental = passes.decide_changed(
            world.fleet, views, world.settings, world.breaker, self.now, ledger=self.ledger,
            changed=changed, device_scope=scope, device_nodes=dra,
        )  # fmt: skip
        assert full.actions == incremental.actions
        assert full.breaker == incremental.breaker
        assert (full.quarantined, full.max_quarantined) == (
            incremental.quarantined,
            incremental.max_quarantined,
        )
        assert {n: h.state for n, h in full.health.items()} == {
            n: h.state for n, h in incremental.health.items()
        }
        if full.next_deadline is not None:
            assert incremental.next_deadline is not None
            assert incremental.next_deadline <= full.next_deadline
        self.passes_compared += 1
        world.breaker = full.breaker
        if not carry_out:
            return  # every write of this pass failed (a conflict): nothing changed
        for action in full.actions:
            if not isinstance(action, actions.Skipped | actions.OpenBreaker
                              | actions.CloseBreaker):  # fmt: skip
                self.carry_out(action)


@example(  # a DRA node that never reported counts once device quarantine lists it
    [
        (("delete", "n0", 8), 0),
        (("delete", "n0", 0), 2),
        (("scope", frozenset(), frozenset({"n0"})), 1),
    ],
)
@example(  # a reboot alone (same verdict) starts the NewBootId release's streak
    [
        (("report", "n0", "nvlink", "boot-1", 10.0, 8), 2),
        (("report", "n0", "healthy", "boot-1", 10.0, 8), 2),
        (("report", "n0", "healthy", "boot-2", 10.0, 8), 1),
        (("advance", 15), 1),
    ],
)
@example(  # a shorter interval moves the staleness deadline earlier
    [(("reports", "healthy"), 2), (("report", "n0", "healthy", "boot-1", 5.0, 8), 0),
     (("advance", 20), 1)],
)  # fmt: skip
@given(st.lists(st.tuples(events, st.sampled_from([0, 1, 1, 2])), min_size=1, max_size=60))
@hsettings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_the_incremental_pass_decides_what_the_full_pass_decides(
    script: list[tuple[tuple[Any, ...], int]],
) -> None:
    """After any sequence of events, judging only what changed or fell due gives the full
    pass's actions, breaker, counts and states, and a next deadline no later than its own
    (each event is followed by 0 to 2 passes whose writes succeed)."""
    harness = Harness(fakes.World(NAMES, SETTINGS))
    for event, then in [*script, (("pass", True), 0)]:
        harness.step(event)
        for _ in range(then):
            harness.compare(carry_out=True)
    assert harness.passes_compared >= 1


@pytest.mark.parametrize(
    ("silence_s", "judged"),
    [
        pytest.param(1, set(), id="a steady fleet a second later judges no node"),
        pytest.param(31, set(NAMES), id="a fleet silent past staleAfter judges every node"),
    ],
)
def test_a_pass_judges_only_the_nodes_whose_inputs_changed_or_whose_deadline_came(
    silence_s: int, judged: set[str]
) -> None:
    """The cost follows what changed: healthy nodes already judged are not judged again
    until their staleness deadline, and a steady heartbeat is not a change."""
    harness = Harness(fakes.World(NAMES, SETTINGS))
    for name in NAMES:
        harness.report(name, "healthy", "boot-1", 10.0)
    harness.compare(carry_out=True)  # first pass: conditions written
    harness.compare(carry_out=True)  # the written Nodes read back: nothing left to do
    harness.now += dt.timedelta(seconds=1)
    for name in NAMES:
        harness.report(name, "healthy", "boot-1", 10.0)  # steady: no change
    harness.compare(carry_out=True)
    harness.now += dt.timedelta(seconds=silence_s - 1)
    views = {name: nodes.parse(raw) for name, raw in harness.world.nodes.items()}
    passes.decide_changed(
        harness.world.fleet, views, SETTINGS, harness.world.breaker, harness.now,
        ledger=harness.ledger, changed=harness.world.fleet.take_changed(),
    )  # fmt: skip
    assert judged == set(harness.ledger.judged)


def _healthy(node: str) -> actions.SetCondition:
    return actions.SetCondition(
        node, nodes.Condition(nodes.ConditionStatus.TRUE, "GPUsHealthy", "")
    )


def _bad(node: str) -> actions.SetCondition:
    return actions.SetCondition(node, nodes.Condition(nodes.ConditionStatus.FALSE, "Xid79", "m"))


@pytest.mark.parametrize(
    ("by_node", "cap", "expected"),
    [
        pytest.param(
            {"h1": [_healthy("h1")], "f1": [_bad("f1")], "h2": [_healthy("h2")],
             "h3": [_healthy("h3")]},
            2, (["f1", "h1", "h2"], 1),
            id="a fault goes first and at most the cap of healthy conditions follow",
        ),
        pytest.param(
            {"u1": [_healthy("u1"), actions.EvictGpuPods("u1", at(0), "Xid79", first=True)],
             "h1": [_healthy("h1")]},
            0, (["u1"], 1),
            id="a node with more than a healthy condition to write is never left out",
        ),
        pytest.param(
            {"h1": [_healthy("h1")]}, 64, (["h1"], 0),
            id="under the cap everything goes this pass",
        ),
    ],
)  # fmt: skip
def test_a_pass_acts_on_faults_first_and_leaves_surplus_healthy_conditions_for_the_next(
    by_node: dict[str, list[actions.Action]], cap: int, expected: tuple[list[str], int]
) -> None:
    """The first pass over a fresh fleet writes a healthy condition on every node; a pass
    takes the urgent nodes first and at most `cap` of those, the rest the next pass."""
    todo, deferred = passes.urgent_first(by_node, max_routine=cap)
    assert expected == ([n for n, _ in todo], deferred)


def _unknown(node: str) -> actions.SetCondition:
    return actions.SetCondition(
        node, nodes.Condition(nodes.ConditionStatus.UNKNOWN, "HeartbeatStale", "m")
    )


def test_a_fleet_gone_stale_at_once_writes_its_conditions_a_share_a_pass_behind_every_fence(
) -> None:  # fmt: skip
    """Thousands of nodes gone stale at once each have an Unknown condition to write; a pass
    writes at most `max_conditions` of them (and `max_routine` healthy ones), after every
    node that has a fence or an eviction to write, however many; an action held back by a
    limit writes nothing, so its node's condition is capped like any other."""
    held = actions.Skipped("b1", _fence("b1"), actions.SkipReason.BREAKER_OPEN)
    by_node: dict[str, list[actions.Action]] = {
        **{f"s{i}": [_unknown(f"s{i}")] for i in range(5)},
        "h1": [_healthy("h1")], "h2": [_healthy("h2")],
        "b1": [held, _bad("b1")],
        **{f"f{i}": [_bad(f"f{i}"), _fence(f"f{i}")] for i in range(3)},
        "e1": [actions.EvictGpuPods("e1", at(0), "Xid79", first=True)],
    }  # fmt: skip
    todo, deferred = passes.urgent_first(by_node, max_routine=1, max_conditions=2)
    assert [n for n, _ in todo] == ["f0", "f1", "f2", "e1", "s0", "s1", "h1"]
    assert deferred == 5  # s2, s3, s4, b1 and h2: the next pass
    todo, deferred = passes.urgent_first(by_node)
    assert (len(todo), deferred) == (len(by_node), 0)


def _fence(node: str) -> actions.Quarantine:
    return actions.Quarantine(node, test_conditions.RECORD, "m", cordon=True)


@pytest.mark.parametrize(
    ("todo", "expected"),
    [
        pytest.param(
            [("f1", [_bad("f1"), _fence("f1")]), ("f2", [_bad("f2"), _fence("f2")])],
            [[("f1", [_fence("f1")]), ("f2", [_fence("f2")])],
             [("f1", [_bad("f1")]), ("f2", [_bad("f2")])]],
            id="every failed node is tainted before any failed node's condition is written",
        ),
        pytest.param(
            [("r1", [actions.RestoreTaint("r1"),
                     actions.EvictGpuPods("r1", at(0), "Xid79", first=True)]),
             ("h1", [_healthy("h1")])],
            [[("r1", [actions.RestoreTaint("r1")])],
             [("r1", [actions.EvictGpuPods("r1", at(0), "Xid79", first=True)]),
              ("h1", [_healthy("h1")])]],
            id="a taint put back goes first and an eviction after every fence",
        ),
        pytest.param(
            [("h1", [_healthy("h1")]), ("h2", [_healthy("h2")])],
            [[], [("h1", [_healthy("h1")]), ("h2", [_healthy("h2")])]],
            id="a pass with nothing to fence has an empty first wave",
        ),
    ],
)  # fmt: skip
def test_a_pass_fences_every_node_before_writing_anything_else(
    todo: list[tuple[str, list[actions.Action]]], expected: list[list[tuple[str, list[object]]]]
) -> None:
    """Fencing is what keeps work off a failed GPU: a pass writes every node's taint and
    cordon before any node's condition, update or eviction, each node's in its own order."""
    assert expected == passes.fencing_first(todo)
