"""Micro-benchmark of the controller's pure core: `FleetState.ingest` and `policy.decide`.

Run: `.venv/bin/python -m bench.fleet_ingest [nodes]` (default 5,000 nodes × 8 GPUs).
Heartbeats are parsed before timing starts, so the figures are the fleet-state cost alone,
to set beside the HTTP handler's JSON parse and validation in `bench/heartbeats`.
"""

from __future__ import annotations

import datetime as dt
import random
import statistics
import sys
import time

import msgspec

from controller import marks
from controller.fleet import actions, nodes, policy, relays, reports
from controller.fleet import state as fleet
from controller.settings import ControllerSettings
from shared import fastheartbeat, health, heartbeat

T0 = dt.datetime(2025, 3, 1, tzinfo=dt.UTC)
ROUNDS = 4
PASSES = 5


def _heartbeats(count: int, round_: int, rng: random.Random) -> list[heartbeat.Heartbeat]:
    out = []
    for n in range(count):
        gpus = []
        for index in range(8):
            bad = rng.random() < 0.002
            reasons = (
                [
                    heartbeat.Reason(
                        code="XidFallenOffBus",
                        verdict=health.Verdict.FAILED,
                        action=health.Action.REBOOT_NODE,
                        latched=True,
                        since=T0,
                    )
                ]
                if bad
                else []
            )
            gpus.append(
                heartbeat.GpuReport(
                    index=index,
                    uuid=f"GPU-{n:05d}-{index}",
                    verdict=health.Verdict.FAILED if bad else health.Verdict.HEALTHY,
                    action=health.Action.REBOOT_NODE if bad else health.Action.NONE,
                    reasons=reasons,
                    readings=heartbeat.GpuReadings(temperature_c=55.0, power_w=300.0),
                )
            )
        out.append(
            heartbeat.Heartbeat(
                schema_version=1,
                node_name=f"gpu-{n:05d}",
                boot_id="boot-1",
                interval_s=10.0,
                sequence=round_ + 1,
                sent_at=T0 + dt.timedelta(seconds=10 * round_),
                gpus=gpus,
            )
        )
    return out


def _deliver(relay: relays.Relay, now: float) -> None:
    while batch := relay.take(now):
        relay.settle(batch, [relays.Answer(reports.Relayed.ACCEPTED)] * len(batch), now)


def _relay_costs(rounds: list[list[heartbeat.Heartbeat]], count: int) -> None:
    """The leader's cost of a relayed liveness entry beside a full ingest of the same report,
    and the follower's of deciding it (change key and queueing), side by side."""
    structs = [[fastheartbeat.decode(fastheartbeat.wire(hb)) for hb in beats] for beats in rounds]
    keys = [reports.change_key(hb, "pod") for hb in structs[0]]
    full = fleet.FleetState(leader_since=T0 - dt.timedelta(hours=1))
    live = fleet.FleetState(leader_since=T0 - dt.timedelta(hours=1))
    for hb, key in zip(structs[0], keys, strict=True):
        full.ingest(hb, T0, pod_uid="pod")
        live.ingest(hb, T0, pod_uid="pod", key=key)
    costs: dict[str, list[float]] = {"full": [], "liveness": [], "follower": []}
    relay = relays.Relay(relays.Limits())
    for hb, key in zip(structs[0], keys, strict=True):
        relay.offer(hb, "pod", key, 0.0)
    _deliver(relay, 0.0)
    for r, beats in enumerate(structs[1:], start=1):
        now = T0 + dt.timedelta(seconds=10 * r)
        start = time.perf_counter()
        for hb in beats:
            full.ingest(hb, now, pod_uid="pod")
        costs["full"].append((time.perf_counter() - start) / count)
        start = time.perf_counter()
        for hb, key in zip(beats, keys, strict=True):
            live.ingest_liveness(hb.node_name, key=key, boot_id=hb.boot_id, sequence=hb.sequence,
                                 sent_at=hb.sent_at, first_at=now, last_at=now)  # fmt: skip
        costs["liveness"].append((time.perf_counter() - start) / count)
        start = time.perf_counter()
        for hb in beats:
            relay.offer(hb, "pod", reports.change_key(hb, "pod"), 10.0 * r)
        costs["follower"].append((time.perf_counter() - start) / count)
        _deliver(relay, 10.0 * r)
    f, lv, fo = (statistics.median(costs[k]) * 1e6 for k in ("full", "liveness", "follower"))
    print(
        f"leader, full report ingested: {f:.1f} µs; liveness entry applied: {lv:.1f} µs"
        f" ({lv / f:.2f}× a full ingest, parse not counted); follower, change key + queue:"
        f" {fo:.1f} µs/heartbeat"
    )


def main() -> None:
    """Time ingest per heartbeat and decide per pass, and print per-op costs."""
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
    rng = random.Random(4)
    built = time.perf_counter()
    first = _heartbeats(count, 0, rng)
    rounds = [first] + [
        [
            msgspec.structs.replace(hb, sequence=r + 1, sent_at=T0 + dt.timedelta(seconds=10 * r))
            for hb in first
        ]
        for r in range(1, ROUNDS)
    ]
    print(f"built {count * ROUNDS} heartbeats in {time.perf_counter() - built:.1f} s (untimed)")

    state = fleet.FleetState(leader_since=T0 - dt.timedelta(hours=1))
    per_round = []
    for r, beats in enumerate(rounds):
        now = T0 + dt.timedelta(seconds=10 * r)
        start = time.perf_counter()
        for hb in beats:
            state.ingest(hb, now)
        per_round.append((time.perf_counter() - start) / len(beats))
    ingest = statistics.median(per_round)
    print(
        f"ingest: {ingest * 1e6:.1f} µs/heartbeat median over {ROUNDS} rounds "
        f"({1 / ingest:,.0f}/s on one core)"
    )

    _relay_costs(rounds, count)

    views = [
        nodes.parse(
            {
                "metadata": {"name": f"gpu-{n:05d}", "resourceVersion": "1"},
                "status": {"capacity": {marks.GPU_RESOURCE: "8"}},
            }
        )
        for n in range(count)
    ]
    settings = policy.settings_from(ControllerSettings())
    now = T0 + dt.timedelta(seconds=10 * (ROUNDS - 1) + 1)
    timings = []
    decision = None
    for _ in range(PASSES):
        start = time.perf_counter()
        decision = policy.decide(state, views, settings, actions.BreakerState(), now)
        timings.append(time.perf_counter() - start)
    assert decision is not None
    best = min(timings)
    print(
        f"decide: {statistics.median(timings) * 1e3:.1f} ms/pass median, {best * 1e3:.1f} ms best "
        f"over {count} nodes ({best / count * 1e6:.2f} µs/node); "
        f"{len(decision.actions)} actions"
    )


if __name__ == "__main__":
    main()
