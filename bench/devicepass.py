"""The device-quarantine pass's cost: judging the faulty and fenced nodes against judging
every DRA node, side by side.

Pure core only, in one process (no cluster, no HTTP): N DRA nodes × 8 GPUs, each with the
ResourceSlice NVIDIA's driver publishes and a heartbeat parsed from JSON as the handler
parses it; `k` nodes report a ResetGPU-class fault on one GPU (ECC errors rising), so the
pass has `k` devices to fence. For each N and k, in the same run and on the same state:

- `devicepolicy.decide` as the loop calls it: it assesses only the nodes `FleetState.faulty`
  names (their last report has a fault) and those with a rule of ours;
- the same call with a `FleetState` that names every node as faulty, which assesses every
  DRA node as each pass did before (the reference of the unit tests' property);

and checks that both decide the same. Then what the admission gate is told of the same
fleet's GPUs (`devicepolicy.usable`): with its memo kept from the pass before (the nodes
without a fault keep their listing until the slices or the rules change), with the memo
empty, and with every node assessed and every GPU listed afresh (`fakes.every_gpu_judged`,
what it did before), checking they agree. Timings are medians of repeated calls; the machine is
shared, so read the ratio within a row. The 100,000-node row is a simulation of the
leader's pure core, not a fleet.

Run: `.venv/bin/python -m bench.devicepass [N ...]` (default 1000 10000 100000).
"""

from __future__ import annotations

import datetime as dt
import json
import statistics
import sys
import time
from collections.abc import Callable

from controller import marks
from controller.fleet import actions, devicepolicy, devices, nodes, state
from controller.kube import nodes as kube_nodes
from controller.settings import ControllerSettings
from shared import heartbeat
from tests.unit.controller.fleet import fakes

T0 = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)
_PROCESS = ControllerSettings(max_quarantined_devices=100_000, device_breaker_percent=100)
SETTINGS = devicepolicy.settings_from(_PROCESS.devices, _PROCESS.fleet)
FAULTY_COUNTS = (0, 10, 100)


class EveryNode(state.FleetState):
    """The reference: every node named faulty, so `decide` assesses the whole DRA fleet."""

    def __init__(self, names: frozenset[str], *, leader_since: dt.datetime) -> None:
        super().__init__(leader_since=leader_since)
        self.names = names

    def faulty(self) -> frozenset[str]:
        return self.names


def _uuid(name: str, index: int) -> str:
    return f"GPU-{name}-{index}"


def _body(name: str, *, fault: bool) -> bytes:
    gpus = []
    for index in range(8):
        bad = fault and index == 0
        gpus.append({
            "index": index, "uuid": _uuid(name, index),
            "verdict": "Degraded" if bad else "Healthy",
            "action": "ResetGPU" if bad else "None",
            "reasons": [{"code": "EccUncorrectedRising", "verdict": "Degraded",
                         "action": "ResetGPU", "latched": True,
                         "since": T0.isoformat()}] if bad else [],
            "readings": {"temperatureC": 55.0, "powerW": 300.0},
        })  # fmt: skip
    return json.dumps({
        "schemaVersion": heartbeat.SCHEMA_VERSION, "nodeName": name, "bootId": "boot-1",
        "intervalS": 10.0, "sequence": 1, "sentAt": T0.isoformat(), "gpus": gpus,
    }).encode()  # fmt: skip


def _slice(name: str) -> dict[str, object]:
    return {"spec": {
        "driver": marks.DRA_DRIVER, "nodeName": name, "pool": {"name": name},
        "devices": [{"name": f"gpu-{i}", "attributes": {"uuid": {"string": _uuid(name, i)}}}
                    for i in range(8)],
    }}  # fmt: skip


def _raw_node(name: str) -> dict[str, object]:
    return kube_nodes.trim_node({
        "metadata": {"name": name, "resourceVersion": "1", "labels": {}, "annotations": {}},
        "spec": {}, "status": {"conditions": []},
    })  # fmt: skip


def _median_ms(run: Callable[[], object], repeats: int) -> float:
    took = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        took.append(time.perf_counter() - start)
    return 1e3 * statistics.median(took)


SINCE = T0 - dt.timedelta(hours=1)
NOW = T0 + dt.timedelta(seconds=1)


def _names(count: int) -> list[str]:
    return [f"gpu-{n:06d}" for n in range(count)]


def _reported(names: list[str], faulty: int, *fleets: state.FleetState) -> devices.Inventory:
    """Every node's heartbeat ingested by each of `fleets` (the first `faulty` with a fault);
    the fleet's parsed slices."""
    for index, name in enumerate(names):
        hb = heartbeat.decode(_body(name, fault=index < faulty))
        for fleet in fleets:
            fleet.ingest(hb, T0)
    return devices.inventory(_slice(name) for name in names)


def measure(count: int, faulty: int, *, repeats: int) -> tuple[float, float, int]:
    """(ms judging what `faulty` names, ms judging every node, devices to fence)."""
    names = _names(count)
    fleet = state.FleetState(leader_since=SINCE)
    reference = EveryNode(frozenset(names), leader_since=SINCE)
    inventory = _reported(names, faulty, fleet, reference)
    views = {name: nodes.parse(_raw_node(name)) for name in names}

    def decide(fleet_state: state.FleetState) -> actions.DeviceDecision:
        return devicepolicy.decide(fleet_state, views, SETTINGS, actions.BreakerState(), NOW,
                                   inventory=inventory, rules=[], dry_run=False)  # fmt: skip

    ours, everyone = decide(fleet), decide(reference)
    assert ours == everyone, "judging the faulty nodes decided otherwise than judging all"
    fences = sum(1 for a in ours.actions if isinstance(a, actions.FenceDevice))
    assert fences == faulty, f"{fences} fences for {faulty} faulty nodes"
    return (_median_ms(lambda: decide(fleet), repeats),
            _median_ms(lambda: decide(reference), repeats), fences)  # fmt: skip


def measure_gate(count: int, faulty: int, *, repeats: int) -> tuple[float, float, float]:
    """What the admission gate is told of the fleet's GPUs (`devicepolicy.usable`), in ms:
    with the memo kept from the pass before, with an empty memo (the first pass after the
    slices or the rules changed), and judging every node and GPU afresh (before)."""
    names = _names(count)
    fleet = state.FleetState(leader_since=SINCE)
    inventory = _reported(names, faulty, fleet)
    memo: dict[str, tuple[devicepolicy.Usable, ...]] = {}

    def ours(kept: dict[str, tuple[devicepolicy.Usable, ...]]) -> object:
        return devicepolicy.usable(fleet, names, SETTINGS, NOW, inventory=inventory, rules=[],
                                   memo=kept)  # fmt: skip

    def before() -> object:
        return fakes.every_gpu_judged(fleet, names, SETTINGS, NOW, inventory=inventory, rules=[])

    assert ours(memo) == before(), "the gate's listing differs from judging every GPU"
    assert ours(memo) == before(), "and so does it from the memo"
    return (_median_ms(lambda: ours(memo), repeats), _median_ms(lambda: ours({}), repeats),
            _median_ms(before, repeats))  # fmt: skip


def main() -> None:
    """Print one row per fleet size and number of faulty nodes, for the pass, then the gate."""
    counts = [int(a) for a in sys.argv[1:] if a.isdigit()] or [1000, 10000, 100000]

    def pass_row(count: int, faulty: int, repeats: int) -> str:
        ours, everyone, _ = measure(count, faulty, repeats=repeats)
        return f"{ours:.2f} ms | {everyone:.1f} ms | {ours / everyone:.3f}×"

    def gate_row(count: int, faulty: int, repeats: int) -> str:
        kept, empty, before = measure_gate(count, faulty, repeats=repeats)
        return (f"{kept:.1f} ms | {empty:.1f} ms | {before:.1f} ms | {kept / before:.3f}× | "
                f"{empty / before:.3f}×")  # fmt: skip

    tables = [
        ("pass, faulty and fenced judged | pass, every node judged (before) | ratio", pass_row),
        (("gate's listing, memo kept | memo empty | every GPU judged (before) | ratio, kept | "
          "ratio, empty"), gate_row),
    ]  # fmt: skip
    for header, row in tables:
        print(f"\nDRA nodes | faulty nodes | {header}")
        for count in counts:
            for faulty in FAULTY_COUNTS:
                cells = row(count, faulty, 3 if count > 20000 else 7)
                print(f"{count:,} | {faulty} | {cells}", flush=True)


if __name__ == "__main__":
    main()
