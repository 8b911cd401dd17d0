"""The quarantine pass's cost: a full pass against a pass of what changed, side by side.

Pure core only, in one process (no cluster, no HTTP): a fleet of N nodes × 8 GPUs whose
heartbeats are parsed from JSON as the handler parses them, its Nodes as the node cache keeps
them (trimmed raw JSON) and parses them (`NodeView`), every node healthy with its condition
already written. For each N it times, in the same run:

- the full pass: `policy.decide` over every node (what every pass cost before), and
  `passes.decide_changed(everything=True)` (what the loop's full pass every 30 s costs now);
- a pass of what changed: `k` nodes report a fatal Xid, then one pass; its time divided by
  the nodes it judged is the cost per changed node;
- the steady state: every node reports every 10 s (spread evenly), a pass every second, for
  90 simulated seconds: the nodes judged per pass (staleness deadlines fall due a
  staleAfter after each node was last judged), the time per pass (the cyclic collector held
  off during it), and the collector's time per simulated second, which the ingest's garbage
  calls for and a full collection spends walking every live object of the fleet;
- memory per node (tracemalloc, the Python heap): heartbeat records, cached Nodes, views
  and the ledger, divided by N.

The 100,000-node row is a simulation of the leader's pure core on this machine, not a
fleet: no API server, watch or HTTP traffic is involved. Timings are medians of repeated
runs; the machine is shared, so read the ratios, not single figures.

`--gc-freeze`: after building each fleet, move every object to the collector's permanent
generation (`gc.freeze()`, as a server may after start-up), so the timed passes do not pay
for full collections walking the whole fleet's heap.

Run: `.venv/bin/python -m bench.passcost [--gc-freeze] [N ...]` (default 5000 10000 100000).
"""

from __future__ import annotations

import datetime as dt
import gc
import json
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable

from controller import marks
from controller.fleet import actions, nodes, passes, policy, state
from controller.kube import nodes as kube_nodes
from controller.settings import ControllerSettings
from shared import heartbeat

T0 = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)
INTERVAL_S = 10.0
SETTINGS = policy.settings_from(ControllerSettings())
FREEZE = "--gc-freeze" in sys.argv


def _body(name: str, seq: int, sent: dt.datetime, *, fault: bool = False) -> bytes:
    gpus = []
    for index in range(8):
        bad = fault and index == 0
        gpus.append({
            "index": index, "uuid": f"GPU-{name}-{index}",
            "verdict": "Failed" if bad else "Healthy",
            "action": "RebootNode" if bad else "None",
            "reasons": [{"code": "XidFallenOffBus", "verdict": "Failed", "action": "RebootNode",
                         "latched": True, "since": T0.isoformat()}] if bad else [],
            "readings": {"temperatureC": 55.0, "powerW": 300.0},
        })  # fmt: skip
    return json.dumps({
        "schemaVersion": heartbeat.SCHEMA_VERSION, "nodeName": name, "bootId": "boot-1",
        "intervalS": INTERVAL_S, "sequence": seq, "sentAt": sent.isoformat(), "gpus": gpus,
    }).encode()  # fmt: skip


def _raw_node(name: str) -> dict[str, object]:
    return kube_nodes.trim_node({
        "metadata": {"name": name, "resourceVersion": "1", "labels": {}, "annotations": {}},
        "spec": {},
        "status": {
            "capacity": {marks.GPU_RESOURCE: "8"},
            "conditions": [{"type": marks.NODE_CONDITION, "status": "True",
                            "reason": state.REASON_GPUS_HEALTHY,
                            "message": "all 8 GPUs healthy"}],
        },
    })  # fmt: skip


class Fleet:
    """The leader's pure core at N nodes."""

    def __init__(self, count: int) -> None:
        self.names = [f"gpu-{n:06d}" for n in range(count)]
        self.fleet = state.FleetState(leader_since=T0 - dt.timedelta(hours=1))
        self.raw = {name: _raw_node(name) for name in self.names}
        self.views = {name: nodes.parse(raw) for name, raw in self.raw.items()}
        self.seq = 1
        for name in self.names:
            self.ingest(name, T0)
        self.ledger = passes.Ledger()
        if FREEZE:
            gc.collect()
            gc.freeze()

    def ingest(self, name: str, now: dt.datetime, *, fault: bool = False) -> None:
        hb = heartbeat.decode(_body(name, self.seq, now, fault=fault))
        self.fleet.ingest(hb, now)

    def full(self, now: dt.datetime) -> actions.Decision:
        return policy.decide(self.fleet, self.views.values(), SETTINGS, actions.BreakerState(),
                             now)  # fmt: skip

    def changed(self, now: dt.datetime, *, everything: bool = False) -> actions.Decision:
        return passes.decide_changed(
            self.fleet, self.views, SETTINGS, actions.BreakerState(), now, ledger=self.ledger,
            changed=self.fleet.take_changed(), everything=everything,
        )  # fmt: skip


def _timed(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def _memory_per_node(count: int) -> float:
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    fleet = Fleet(count)
    fleet.changed(T0 + dt.timedelta(seconds=1), everything=True)
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del fleet
    return (after - before) / count


def measure(count: int, *, repeats: int) -> dict[str, float]:
    """Every figure for one fleet size."""
    out: dict[str, float] = {}
    fleet = Fleet(count)
    now = T0 + dt.timedelta(seconds=1)
    out["full_decide_ms"] = 1e3 * statistics.median(
        _timed(lambda: fleet.full(now)) for _ in range(repeats)
    )
    out["full_ledger_ms"] = 1e3 * statistics.median(
        _timed(lambda: fleet.changed(now, everything=True)) for _ in range(repeats)
    )
    assert not fleet.full(now).actions, "a healthy fleet with its conditions written: no action"
    out["steady_empty_us"] = 1e6 * statistics.median(
        _timed(lambda: fleet.changed(now)) for _ in range(repeats)
    )
    per_node: list[float] = []
    for round_, k in enumerate([10, 100, 100, 100][:repeats], start=1):
        when = now + dt.timedelta(milliseconds=round_)
        fleet.seq += 1
        for name in fleet.names[round_ * 100 : round_ * 100 + k]:
            fleet.ingest(name, when, fault=True)
        took = _timed(lambda when=when: fleet.changed(when))  # type: ignore[misc]
        per_node.append(took / max(len(fleet.ledger.judged), 1))
    out["per_changed_us"] = 1e6 * statistics.median(per_node)

    # Steady state: every node reports each 10 s, spread evenly; a pass each second.
    steady = Fleet(count)
    steady.changed(T0, everything=True)
    judged: list[int] = []
    took_s: list[float] = []
    gc_s = [0.0, 0.0]

    def collecting(phase: str, _info: dict[str, int]) -> None:
        if phase == "start":
            gc_s[1] = time.perf_counter()
        else:
            gc_s[0] += time.perf_counter() - gc_s[1]

    gc.callbacks.append(collecting)
    slice_ = count // int(INTERVAL_S)
    for second in range(1, 91):
        when = T0 + dt.timedelta(seconds=second)
        steady.seq += 1
        start = (second % int(INTERVAL_S)) * slice_
        for name in steady.names[start : start + slice_]:
            steady.ingest(name, when)
        gc.disable()  # the pass alone; collections the ingest's garbage calls for run after it
        took_s.append(_timed(lambda when=when: steady.changed(when)))  # type: ignore[misc]
        gc.enable()
        judged.append(len(steady.ledger.judged))
        if second == 30:
            gc_s[0] = 0.0
    gc.callbacks.remove(collecting)
    out["steady_judged"] = statistics.mean(judged[30:])
    out["steady_pass_ms"] = 1e3 * statistics.mean(took_s[30:])
    out["steady_gc_ms"] = 1e3 * gc_s[0] / 60
    return out


def main() -> None:
    """Print one row per fleet size."""
    counts = [int(a) for a in sys.argv[1:] if a.isdigit()] or [5000, 10000, 100000]
    if FREEZE:
        print("gc.freeze() after building each fleet")
    print("nodes | full pass, policy.decide | full pass, ledger | pass of nothing | "
          "per changed node | steady: judged/pass, ms/pass, GC ms/s | heap per node")  # fmt: skip
    for count in counts:
        m = measure(count, repeats=3 if count > 20000 else 5)
        gc.collect()
        m["bytes_per_node"] = _memory_per_node(count)  # the timed fleets are gone by now
        print(
            f"{count:,} | {m['full_decide_ms']:.0f} ms | {m['full_ledger_ms']:.0f} ms | "
            f"{m['steady_empty_us']:.0f} µs | {m['per_changed_us']:.1f} µs | "
            f"{m['steady_judged']:.0f}, {m['steady_pass_ms']:.1f} ms, "
            f"{m['steady_gc_ms']:.0f} ms | "
            f"{m['bytes_per_node'] / 1024:.1f} KiB",
            flush=True,
        )


if __name__ == "__main__":
    main()
