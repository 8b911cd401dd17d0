"""Device quarantine on DRA nodes: scope, the two rules, release and every safety limit,
run pass by pass on a fake fleet whose rules a fake actuator creates and deletes."""

from __future__ import annotations

import copy
import datetime as dt
import json
from collections.abc import Iterable, Mapping
from typing import Any

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from controller import marks
from controller.fleet import actions, conditions, devicepolicy, devices, nodes, policy, state
from shared import health, heartbeat
from tests.unit.controller.fleet import fakes
from tests.unit.controller.fleet.fakes import at

NODE_SETTINGS = policy.Settings(
    stale_multiplier=3.0, default_interval_s=10.0, evict_grace_s=60, degraded_drain_after_s=1800,
    release_after_s=300, stale_quarantine_after_s=600, max_quarantined=None,
    max_quarantined_fraction=0.5, breaker_percent=50, breaker_window_s=300, breaker_min_nodes=2,
    breaker_healthy_close_s=300, dry_run=False,
)  # fmt: skip
SETTINGS = devicepolicy.Settings(
    mode=devicepolicy.GpuMode.AUTO, max_per_node=2, max_quarantined_devices=None,
    max_quarantined_devices_fraction=0.2, breaker_percent=25, breaker_min_devices=4,
    breaker_window_s=300, breaker_healthy_close_s=300, release_after_s=300,
    default_interval_s=10.0,
)  # fmt: skip
Faults = Mapping[int, Iterable[heartbeat.Reason]]
FOUR = [f"d{i}" for i in range(4)]
CONTAINED = frozenset({("taugrid.dev/gpu-unhealthy", "NoSchedule"),
                       ("taugrid.dev/gpu-evict", "NoExecute")})  # fmt: skip


def uncontained_ecc(since: float = 0) -> heartbeat.Reason:
    """Xid 95: uncontained ECC (Failed, ResetGPU)."""
    return fakes.reason("XidUncontainedEcc", health.Verdict.FAILED, health.Action.RESET_GPU,
                        latched=True, since=at(since))  # fmt: skip


def slice_of(node: str, gpus: int = 8) -> dict[str, Any]:
    """A ResourceSlice of NVIDIA's driver listing the node's fake GPUs."""
    return {"spec": {
        "driver": marks.DRA_DRIVER, "nodeName": node, "pool": {"name": node},
        "devices": [{"name": f"gpu-{i}",
                     "attributes": {"uuid": {"string": fakes.gpu_uuid(node, i)}}}
                    for i in range(gpus)],
    }}  # fmt: skip


class EveryNodeJudged(state.FleetState):
    """The reference for `FleetState.faulty`: while `everyone` is set, it names every node
    of the world, so `devicepolicy.decide` assesses the whole DRA fleet, as it did before
    it judged only the nodes with a fault or a rule."""

    def __init__(self, *, leader_since: dt.datetime, stale_multiplier: float) -> None:
        super().__init__(leader_since=leader_since, stale_multiplier=stale_multiplier)
        self.everyone: frozenset[str] | None = None

    def faulty(self) -> frozenset[str]:
        return super().faulty() if self.everyone is None else self.everyone


class DeviceWorld:
    """DRA nodes, their slices and rules, run through both policies and a fake actuator.

    Every step also decides with every node assessed (`EveryNodeJudged`) and checks that the
    decision is the same: judging only the faulty and fenced nodes loses nothing. It checks
    the gate's listing the same way (`fakes.every_gpu_judged`), with a memo kept from step to step
    as the quarantiner keeps it: emptied when the slices or the rules change."""

    def __init__(
        self,
        names: Iterable[str] = FOUR,
        *,
        settings: devicepolicy.Settings = SETTINGS,
        raw: Mapping[str, dict[str, Any]] | None = None,
        dry_run: bool = False,
        unlisted: frozenset[str] = frozenset(),
    ) -> None:
        self.settings = settings
        self.node_settings = NODE_SETTINGS.model_copy(update={"dry_run": dry_run})
        self.fleet = EveryNodeJudged(leader_since=at(-100), stale_multiplier=3.0)
        self.nodes = {n: fakes.raw_node(n, gpus=0) for n in names}
        self.nodes.update(copy.deepcopy(dict(raw or {})))
        self.slices = [slice_of(n) for n in self.nodes if n not in unlisted]
        self.rules: dict[str, dict[str, Any]] = {}
        self.breaker = actions.BreakerState()
        self.device_breaker = actions.BreakerState()
        self.seq = 0
        self.last: actions.DeviceDecision | None = None
        self.memo: dict[str, tuple[devicepolicy.Usable, ...]] = {}
        self.memo_for = ""

    def report(self, now: float, faults: Mapping[str, Faults] | None = None,
               *, silent: Iterable[str] = ()) -> None:  # fmt: skip
        for name in self.nodes:
            if name in silent:
                continue
            self.seq += 1
            hb = fakes.hb(name, faults=(faults or {}).get(name), seq=self.seq, sent_at=at(now))
            self.fleet.ingest(hb, at(now))

    def gate_listing(self, now: float) -> dict[str, tuple[bool, tuple[devicepolicy.Usable, ...]]]:
        """What the gate is told at `now`, checked against judging every GPU afresh."""
        inputs = json.dumps([self.slices, self.rules], sort_keys=True)
        if inputs != self.memo_for:
            self.memo.clear()
            self.memo_for = inputs
        inventory = devices.inventory(self.slices)
        rules = [devices.parse_rule(r) for r in self.rules.values()]
        found = devicepolicy.usable(self.fleet, self.nodes, self.settings, at(now),
                                    inventory=inventory, rules=rules, memo=self.memo)  # fmt: skip
        expected = fakes.every_gpu_judged(self.fleet, self.nodes, self.settings, at(now),
                                          inventory=inventory, rules=rules)  # fmt: skip
        assert expected == found, "the gate's listing differs from judging every GPU"
        return found

    def step(self, now: float) -> actions.DeviceDecision:
        self.gate_listing(now)
        views = {name: nodes.parse(raw) for name, raw in self.nodes.items()}

        def decide() -> actions.DeviceDecision:
            return devicepolicy.decide(
                self.fleet, views, self.settings, self.device_breaker, at(now),
                inventory=devices.inventory(self.slices),
                rules=[devices.parse_rule(r) for r in self.rules.values()],
                dry_run=self.node_settings.dry_run,
            )  # fmt: skip

        device = decide()
        self.fleet.everyone = frozenset(self.nodes)
        try:
            assert decide() == device, "judging every node decides otherwise"
        finally:
            self.fleet.everyone = None
        self.device_breaker = device.breaker
        decision = policy.decide(
            self.fleet, list(views.values()), self.node_settings, self.breaker, at(now),
            device_scope=device.scope, device_nodes=device.dra_nodes,
        )  # fmt: skip
        self.breaker = decision.breaker
        for action in decision.actions:
            if isinstance(action, actions.Skipped | actions.OpenBreaker | actions.CloseBreaker):
                continue
            patch = conditions.patch_for(action, self.nodes[action.node], at(now))
            if patch is not None:
                self.nodes[action.node] = fakes.apply(self.nodes[action.node], patch)
        for step in device.actions:
            if isinstance(step, actions.FenceDevice):
                for kind in step.kinds:
                    body = devices.render_rule(step.device, kind, step.record)
                    body["metadata"]["uid"] = f"uid-{body['metadata']['name']}"
                    self.rules[body["metadata"]["name"]] = body
            elif isinstance(step, actions.UnfenceDevice):
                for name, _uid in step.rules:
                    self.rules.pop(name, None)
        self.last = device
        return device

    def run(self, start: float, until: float, faults: Mapping[str, Faults] | None = None,
            *, every: float = 10.0, silent: Iterable[str] = ()) -> None:  # fmt: skip
        when = start
        while when <= until:
            self.report(when, faults, silent=silent)
            self.step(when)
            when += every

    def release_by_hand(self, node: str, now: float, reason: str = "checked") -> bool:
        """On-call releases `node`, its fenced GPUs included; whether anything was written."""
        h = self.fleet.assess(node, at(now), default_interval_s=10)
        fenced = node in self.fenced()
        release = policy.manual_release(nodes.parse(self.nodes[node]), h, by="alice",
                                        reason=reason, devices_fenced=fenced)  # fmt: skip
        patch = conditions.patch_for(release, self.nodes[node], at(now))
        if patch is not None:
            self.nodes[node] = fakes.apply(self.nodes[node], patch)
        return patch is not None

    def taints(self, node: str, device: str) -> frozenset[tuple[str, str]]:
        """(key, effect) of our rules on one device."""
        return frozenset(
            (r["spec"]["taint"]["key"], r["spec"]["taint"]["effect"])
            for r in self.rules.values()
            if r["spec"]["deviceSelector"] == {"driver": marks.DRA_DRIVER, "pool": node,
                                               "device": device}
        )  # fmt: skip

    def fenced(self) -> dict[str, set[str]]:
        """Devices with any of our rules, by node."""
        out: dict[str, set[str]] = {}
        for r in self.rules.values():
            sel = r["spec"]["deviceSelector"]
            out.setdefault(sel["pool"], set()).add(sel["device"])
        return out

    def quarantined(self, node: str) -> bool:
        view = nodes.parse(self.nodes[node])
        return view.quarantine is not None and view.tainted and view.unschedulable


def skips(decision: actions.DeviceDecision) -> list[tuple[str, str]]:
    return [(s.node, s.why.value) for s in decision.actions if isinstance(s, actions.SkippedDevice)]


def test_a_reset_class_fault_fences_exactly_that_gpu_with_two_rules_and_not_the_node() -> None:
    """ResetGPU on GPU 3 of d1: NoSchedule taugrid.dev/gpu-unhealthy and NoExecute
    taugrid.dev/gpu-evict on d1's gpu-3 only; the node keeps its other GPUs (no taint, no
    cordon), though its condition says a GPU is unhealthy."""
    world = DeviceWorld()
    world.run(0, 20, {"d1": {3: [fakes.ecc_rising()]}})

    view = nodes.parse(world.nodes["d1"])
    expected = ({"d1": {"gpu-3"}}, CONTAINED, False, False, "False")
    actual = (world.fenced(), world.taints("d1", "gpu-3"), view.tainted, view.unschedulable,
              view.condition.status.value if view.condition else None)  # fmt: skip
    assert expected == actual


def test_the_rules_are_labelled_ours_and_name_node_device_and_uuid() -> None:
    """Each rule: `taugrid-<node>-<device>-<kind>`, our label, annotations naming node,
    device and GPU UUID, and a record saying why and what clears it."""
    world = DeviceWorld()
    world.run(0, 0, {"d1": {3: [fakes.row_remap_failure()]}})

    parsed = sorted((devices.parse_rule(r) for r in world.rules.values()), key=lambda r: r.name)
    expected = [
        ("taugrid-d1-gpu-3-evict", True, devices.RuleKind.EVICT, "d1", fakes.gpu_uuid("d1", 3),
         "RowRemapFailure", nodes.Clearing.MANUAL_RELEASE),
        ("taugrid-d1-gpu-3-unhealthy", True, devices.RuleKind.UNHEALTHY, "d1",
         fakes.gpu_uuid("d1", 3), "RowRemapFailure", nodes.Clearing.MANUAL_RELEASE),
    ]  # fmt: skip
    actual = [(r.name, r.ours, r.kind, r.node, r.gpu_uuid, r.record.reason if r.record else "",
               r.record.clears_with if r.record else None) for r in parsed]  # fmt: skip
    assert expected == actual


def test_an_uncontained_fault_uses_a_noexecute_key_nothing_tolerates() -> None:
    """Xid 95: NoSchedule plus taugrid.dev/gpu-failed NoExecute (no grace for anyone)."""
    world = DeviceWorld()
    world.run(0, 0, {"d0": {1: [uncontained_ecc()]}})

    expected = {("taugrid.dev/gpu-unhealthy", "NoSchedule"),
                ("taugrid.dev/gpu-failed", "NoExecute")}  # fmt: skip
    assert expected == world.taints("d0", "gpu-1")


def test_an_escalation_adds_a_stricter_rule_and_never_switches_an_effect() -> None:
    """Contained, then uncontained on the same GPU: the evict rule stays as it was (its
    timeAdded must not move) and a failed rule is added beside it."""
    world = DeviceWorld()
    world.run(0, 10, {"d0": {1: [fakes.ecc_rising()]}})
    before = copy.deepcopy(world.rules["taugrid-d0-gpu-1-evict"])
    world.run(20, 30, {"d0": {1: [fakes.ecc_rising(), uncontained_ecc(20)]}})

    assert CONTAINED | {("taugrid.dev/gpu-failed", "NoExecute")} == world.taints("d0", "gpu-1")
    assert before == world.rules["taugrid-d0-gpu-1-evict"]


@pytest.mark.parametrize(
    ("faults", "kwargs", "why"),
    [
        pytest.param({"d1": {0: [fakes.xid79()]}}, {}, "RebootNode",
                     id="a RebootNode fault quarantines the node"),
        pytest.param({"d1": {i: [fakes.ecc_rising()] for i in range(3)}}, {}, "three",
                     id="more bad GPUs than deviceQuarantineMaxPerNode quarantine the node"),
        pytest.param({"d1": {0: [fakes.ecc_rising()]}}, {"unlisted": frozenset({"d1"})},
                     "no slice", id="a node whose GPUs are in no slice keeps node quarantine"),
        pytest.param({"d1": {0: [fakes.ecc_rising()]}},
                     {"settings": SETTINGS.model_copy(update={"mode": "device-plugin"})},
                     "mode", id="gpuMode device-plugin keeps node quarantine"),
        pytest.param({"d1": {0: [fakes.ecc_rising()]}},
                     {"settings": SETTINGS.model_copy(update={"max_per_node": 0})},
                     "off", id="deviceQuarantineMaxPerNode 0 turns device quarantine off"),
    ],
)  # fmt: skip
def test_faults_beyond_one_gpu_go_to_node_quarantine_as_today(
    faults: Mapping[str, Faults], kwargs: dict[str, Any], why: str
) -> None:
    """Scope follows the fault: node-scoped faults get node quarantine and no rules."""
    world = DeviceWorld(**kwargs)
    world.run(0, 10, faults)

    expected: tuple[bool, dict[str, set[str]]] = (True, {})
    assert expected == (world.quarantined("d1"), world.fenced()), why


def test_a_silent_node_is_quarantined_as_a_node_and_keeps_its_device_rules() -> None:
    """A fenced node that goes silent: node quarantine after staleQuarantineAfter; its
    device rules stay (stale data releases nothing)."""
    world = DeviceWorld()
    world.run(0, 20, {"d1": {2: [fakes.ecc_rising()]}})
    world.run(30, 700, silent=["d1"], every=30)

    assert (True, {"d1": {"gpu-2"}}) == (world.quarantined("d1"), world.fenced())


def test_rules_go_only_after_the_gpu_reported_healthy_for_release_after() -> None:
    """The fault clears at 100: the rules stay until 100 + releaseAfter, then both go."""
    world = DeviceWorld()
    world.run(0, 90, {"d1": {2: [fakes.ecc_rising()]}})
    world.run(100, 390)
    assert {"d1": {"gpu-2"}} == world.fenced()
    assert world.last is not None
    assert at(400) == world.last.next_deadline
    world.run(400, 400)
    assert not world.fenced()


def test_a_neighbours_fault_does_not_hold_back_the_release_of_a_cleared_gpu() -> None:
    """GPU 2 clears while GPU 5 stays bad: GPU 2 is released on its own healthy streak."""
    world = DeviceWorld()
    world.run(0, 90, {"d1": {2: [fakes.ecc_rising()], 5: [fakes.ecc_rising()]}})
    world.run(100, 400, {"d1": {5: [fakes.ecc_rising()]}})

    assert {"d1": {"gpu-5"}} == world.fenced()


def test_max_quarantined_devices_holds_back_the_rest_visibly() -> None:
    """With room for 2 devices, the third fault is Skipped(MaxQuarantinedDevices)."""
    world = DeviceWorld(settings=SETTINGS.model_copy(update={"max_quarantined_devices": 2,
                                                             "breaker_percent": 100}))  # fmt: skip
    faults = {"d0": {0: [fakes.row_remap_failure()]}, "d1": {0: [fakes.ecc_rising()]},
              "d2": {0: [fakes.ecc_rising()]}}  # fmt: skip
    world.report(0, faults)
    decision = world.step(0)

    assert {"d0": {"gpu-0"}, "d1": {"gpu-0"}} == world.fenced()
    expected = [("d2", "MaxQuarantinedDevices")]
    assert expected == skips(decision)


def test_the_device_breaker_opens_on_a_storm_and_fences_nothing_more() -> None:
    """8 of 32 GPUs turning bad at once is 25%, not more than the limit: all are fenced.
    9 of 32 opens the breaker: OpenBreaker (devices) and every new fence Skipped(BreakerOpen)."""
    roomy = SETTINGS.model_copy(update={"max_per_node": 8, "max_quarantined_devices": 32})
    world = DeviceWorld(settings=roomy)
    eight = {n: {i: [fakes.ecc_rising()] for i in range(2)} for n in FOUR}
    world.report(0, eight)
    first = world.step(0)
    assert not skips(first), "25% is not more than 25%"
    nine = {**eight, "d0": {i: [fakes.ecc_rising()] for i in range(3)}}
    world2 = DeviceWorld(settings=world.settings)
    world2.report(0, nine)
    decision = world2.step(0)

    opened = [a for a in decision.actions if isinstance(a, actions.OpenBreaker)]
    expected: tuple[int, bool, dict[str, set[str]]] = (1, True, {})
    assert expected == (len(opened), opened[0].devices, world2.fenced())
    assert {"BreakerOpen"} == {why for _, why in skips(decision)}


def test_dry_run_creates_one_rule_of_effect_none_and_ending_it_replaces_that_rule() -> None:
    """Dry run: only `taugrid-<node>-<device>-dry-run` (effect None, the key nothing
    tolerates, so KCM reports every pod NoExecute would evict). Off: the real rules are
    created, then the dry-run rule is deleted; never an effect switched in place."""
    world = DeviceWorld(dry_run=True)
    world.run(0, 20, {"d1": {4: [fakes.ecc_rising()]}})
    assert {("taugrid.dev/gpu-unhealthy", "None")} == world.taints("d1", "gpu-4")
    expected = ["taugrid-d1-gpu-4-dry-run"]
    assert expected == sorted(world.rules)

    world.node_settings = world.node_settings.model_copy(update={"dry_run": False})
    world.run(30, 40, {"d1": {4: [fakes.ecc_rising()]}})

    assert world.taints("d1", "gpu-4") == CONTAINED


def test_dry_run_deletes_no_real_rule() -> None:
    """A device fenced for real stays fenced while dry run is on, even once healthy."""
    world = DeviceWorld()
    world.run(0, 10, {"d1": {4: [fakes.ecc_rising()]}})
    world.node_settings = world.node_settings.model_copy(update={"dry_run": True})
    world.run(20, 400)

    assert {"d1": {"gpu-4"}} == world.fenced()
    assert world.last is not None
    expected = [("d1", "DryRun")]
    assert expected == skips(world.last)


def test_an_opted_out_node_is_never_written_to() -> None:
    """`taugrid.dev/managed=false`: no rule for its faults, none of its rules deleted."""
    raw = {"d1": fakes.raw_node("d1", gpus=0, labels={marks.MANAGED_LABEL: "false"})}
    world = DeviceWorld(raw=raw)
    world.run(0, 20, {"d1": {0: [fakes.ecc_rising()]}})

    assert not world.fenced()


def test_the_fleets_gpus_are_those_of_managed_nodes_with_slices() -> None:
    """The limits count the GPUs of managed DRA nodes: an opted-out node's 8 and a node
    without a slice count for nothing (4 nodes, 2 of them counted: 16 GPUs)."""
    raw = {"d1": fakes.raw_node("d1", gpus=0, labels={marks.MANAGED_LABEL: "false"})}
    world = DeviceWorld(raw=raw, unlisted=frozenset({"d2"}))
    world.run(0, 0)

    assert world.last is not None
    assert (16, frozenset({"d0", "d3"})) == (world.last.devices_total, world.last.dra_nodes)


def test_rules_we_did_not_create_are_never_deleted_but_count_as_taints() -> None:
    """Someone else's rule on a healthy device stays; a look-alike without our label is not
    ours even when named like ours."""
    world = DeviceWorld()
    foreign = {"metadata": {"name": "taugrid-d1-gpu-0-evict", "uid": "x"},
               "spec": {"deviceSelector": {"driver": marks.DRA_DRIVER, "pool": "d1",
                                           "device": "gpu-0"},
                        "taint": {"key": "example.com/maintenance",
                                  "effect": "NoSchedule"}}}  # fmt: skip
    world.rules["taugrid-d1-gpu-0-evict"] = foreign
    world.run(0, 400)

    assert "taugrid-d1-gpu-0-evict" in world.rules
    assert not devices.parse_rule(foreign).ours


def test_a_released_fault_is_not_fenced_again_until_a_new_fault() -> None:
    """Faults an on-call engineer released on the node are not fenced again."""
    key = state.FaultKey(fakes.gpu_uuid("d1", 0), "EccUncorrectedRising",
                         "2025-03-01T12:00:00Z")  # fmt: skip
    raw = {"d1": fakes.raw_node("d1", gpus=0, annotations={
        marks.RELEASED_FAULTS_ANNOTATION: nodes.render_released(frozenset({key}))})}  # fmt: skip
    world = DeviceWorld(raw=raw)
    world.run(0, 20, {"d1": {0: [fakes.ecc_rising()]}})

    assert not world.fenced()


def test_a_manual_release_of_the_node_releases_its_fenced_gpus() -> None:
    """On-call releases a node whose only quarantine is a fenced GPU: its faults are
    remembered as released and the rules go on the next pass, though the fault is still
    reported (an Inspect fault, which nothing else clears)."""
    world = DeviceWorld()
    faults = {"d1": {2: [fakes.row_remap_failure()]}}
    world.run(0, 10, faults)
    assert {"d1": {"gpu-2"}} == world.fenced()
    assert world.release_by_hand("d1", 10, reason="RMA filed")
    world.run(20, 30, faults)

    assert not world.fenced()


def test_the_decision_lists_fenced_gpus_with_what_clears_them() -> None:
    """For on-call: each fenced GPU, its rules, and (once healthy) when it is released."""
    world = DeviceWorld()
    world.run(0, 10, {"d1": {2: [fakes.ecc_rising()]}})
    world.run(20, 20)
    assert world.last is not None
    [fenced] = world.last.fenced["d1"]
    expected = ("gpu-2", fakes.gpu_uuid("d1", 2), 2, at(20), at(320),
                nodes.Clearing.HEALTHY_REPORTS)  # fmt: skip
    actual = (fenced.device, fenced.gpu_uuid, len(fenced.rules), fenced.healthy_since,
              fenced.release_at, fenced.record.clears_with if fenced.record else None)  # fmt: skip
    assert expected == actual


@pytest.mark.parametrize(
    ("mode", "published", "plugin_nodes", "expected"),
    [
        pytest.param("auto", True, 0, True, id="auto with only DRA GPUs renders claims"),
        pytest.param("auto", True, 3, False, id="auto on a mixed fleet keeps extended resources"),
        pytest.param("auto", False, 0, False, id="auto without DRA GPUs keeps extended resources"),
        pytest.param("dra", False, 3, True, id="gpuMode dra always renders claims"),
        pytest.param("device-plugin", True, 0, False, id="gpuMode device-plugin never does"),
    ],
)  # fmt: skip
def test_runs_ask_for_gpus_through_claims_when_the_mode_says_dra(
    mode: str, published: bool, plugin_nodes: int, expected: bool
) -> None:
    """The rendering mode: detected under auto, settable."""
    actual = devicepolicy.render_mode(
        devicepolicy.GpuMode(mode), dra_published=published, plugin_nodes=plugin_nodes
    )
    assert expected == actual


@pytest.mark.parametrize(
    ("node", "expected_len"),
    [
        pytest.param("d1", len("taugrid-d1-gpu-3-evict"), id="a short name is kept whole"),
        pytest.param("n" * 250, 253, id="a long node name is cut and digested to fit 253"),
    ],
)
def test_rule_names_fit_a_dns_subdomain_and_stay_unique(node: str, expected_len: int) -> None:
    """`taugrid-<node>-<device>-<kind>`, cut with a digest when it would not fit."""
    name = devices.rule_name(node, "gpu-3", devices.RuleKind.EVICT)
    other = devices.rule_name(node[:-1] + "m", "gpu-3", devices.RuleKind.EVICT)
    assert (expected_len, True, True) == (len(name), name.endswith("-gpu-3-evict"), name != other)


def test_a_damaged_record_on_our_rule_is_a_problem_not_an_exception() -> None:
    """A hand-edited annotation is reported naming the field; the rule still parses."""
    raw = {"metadata": {"name": "taugrid-d1-gpu-0-evict",
                        "labels": {marks.DEVICE_RULE_LABEL: marks.CONTROLLER_IDENTITY},
                        "annotations": {marks.DEVICE_RULE_RECORD_ANNOTATION: "{not json"}},
           "spec": {}}  # fmt: skip
    rule = devices.parse_rule(raw)
    expected = (True, devices.RuleKind.EVICT, None)
    assert expected == (rule.ours, rule.kind, rule.record)
    assert rule.problems[0].startswith(f"{marks.DEVICE_RULE_RECORD_ANNOTATION}: not JSON")


def test_the_gate_is_told_which_gpus_a_new_claim_may_use() -> None:
    """Per DRA node: fresh or not, and each GPU usable unless tainted (by us or anyone) or
    reported faulty before it is fenced; a silent node is reported stale."""
    world = DeviceWorld()
    world.run(0, 10, {"d1": {2: [fakes.ecc_rising()]}})
    foreign = {"metadata": {"name": "maintenance"},
               "spec": {"deviceSelector": {"driver": marks.DRA_DRIVER, "pool": "d0",
                                           "device": "gpu-7"},
                        "taint": {"key": "example.com/repair", "effect": "NoExecute"}}}  # fmt: skip
    world.rules["maintenance"] = foreign
    for when in (20, 40):
        world.report(when, {"d1": {2: [fakes.ecc_rising()], 6: [fakes.ecc_rising()]}},
                     silent=["d3"])  # fmt: skip
    found = world.gate_listing(45)
    expected = {
        "d0": (True, {"gpu-7": "tainted"}),
        "d1": (True, {"gpu-2": "tainted", "gpu-6": "faulty"}),
        "d2": (True, {}),
        "d3": (False, {}),
    }
    actual = {n: (fresh, {d.name: d.why for d in devs if not d.usable})
              for n, (fresh, devs) in found.items()}  # fmt: skip
    assert expected == actual


GPU_FAULTS: dict[str, Faults] = {
    "healthy": {},
    "ecc on gpu 1": {1: [fakes.ecc_rising()]},
    "ecc on gpu 5": {5: [fakes.ecc_rising()]},
    "row remap on gpu 1 (Inspect)": {1: [fakes.row_remap_failure()]},
    "uncontained on gpu 1": {1: [uncontained_ecc()]},
    "ecc and uncontained on gpu 1": {1: [fakes.ecc_rising(), uncontained_ecc()]},
    "three gpus": {i: [fakes.ecc_rising()] for i in range(3)},
    "xid 79": {0: [fakes.xid79()]},
}
TIGHT = SETTINGS.model_copy(update={"max_quarantined_devices": 2, "breaker_min_devices": 2})
steps = st.tuples(
    st.sampled_from([0, 1, 10, 30, 31, 100, 300, 301, 700]),
    st.fixed_dictionaries({n: st.sampled_from(sorted(GPU_FAULTS)) for n in FOUR}),
    st.frozensets(st.sampled_from(FOUR)),
    st.sampled_from(["", "", "", "d0", "d1"]),
    st.booleans(),
)


@given(st.sampled_from([SETTINGS, TIGHT]), st.lists(steps, min_size=1, max_size=25))
@hsettings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_judging_only_faulty_and_fenced_nodes_decides_what_judging_every_node_decides(
    settings: devicepolicy.Settings,
    script: list[tuple[int, dict[str, str], frozenset[str], str, bool]],
) -> None:
    """Over random histories (faults of every scope coming and going, silences, manual
    releases, dry run switched, both limits reached), each pass's decision from the nodes
    `FleetState.faulty` names is the one from assessing every DRA node (`DeviceWorld.step`
    checks it pass by pass); and `faulty` is exactly the nodes whose last report has a fault."""
    world = DeviceWorld(settings=settings)
    now = 0.0
    for advance, chosen, silent, release, dry_run in script:
        now += advance
        world.node_settings = world.node_settings.model_copy(update={"dry_run": dry_run})
        faults = {n: GPU_FAULTS[c] for n, c in chosen.items()}
        world.report(now, faults, silent=silent)
        quarantined = release and nodes.parse(world.nodes[release]).quarantine is not None
        if quarantined or release in world.fenced():
            world.release_by_hand(release, now)
        world.step(now)
        reported_faulty = {
            n for n in FOUR if (record := world.fleet.get(n)) is not None and record.faults
        }
        assert reported_faulty == world.fleet.faulty()
