"""Micro-benchmark of one heartbeat's parse: pydantic-core against msgspec, side by side.

Run: `.venv/bin/python -m bench.heartbeat_parse`. The body is an 8-GPU report as the agent
writes it (every reading present, PCI bus IDs, the driver version; one GPU with a latched
Xid), ~3.7 KB. Each decoder runs in short batches, interleaved, many times; the best batch of
each is reported (a shared machine only ever adds time), and ratios are taken within the run.

- `pydantic lax`: what the controller ran before issue 17 (`model_validate_json`, coercing;
  here with `strict=False` over today's model, whose timestamp check is one Python call);
- `pydantic strict`: `heartbeat.validate_json`, the slow path that now explains refusals;
- `msgspec`: `fastheartbeat.decode`, the hot path (the controller keeps the struct);
- `msgspec + to_model`: the same and the pydantic model built from it, to show why the
  controller does not build one;
- `json.loads`: the bare handler's work in `bench/heartbeats.py`.
"""

from __future__ import annotations

import datetime as dt
import json
import timeit
from collections.abc import Callable

from shared import fastheartbeat, health, heartbeat

BATCH = 200
ROUNDS = 40


def body() -> bytes:
    """An 8-GPU heartbeat as the agent sends it."""
    now = dt.datetime(2026, 12, 1, 12, 0, 0, 123456, tzinfo=dt.UTC)
    xid = heartbeat.Reason(
        code="XidFallenOffBus", verdict=health.Verdict.FAILED, action=health.Action.REBOOT_NODE,
        message="Xid 79 on GPU 3: GPU has fallen off the bus", xid=79, latched=True,
        clears_when="new bootId", since=now,
    )  # fmt: skip
    gpus = [
        heartbeat.GpuReport(
            index=i, uuid=f"GPU-{i:08x}-1a2b-3c4d-5e6f-0123456789ab",
            name="NVIDIA H100 80GB HBM3", pci_bus_id=f"00000000:{0x18 + i:02X}:00.0",
            verdict=health.Verdict.FAILED if i == 3 else health.Verdict.HEALTHY,
            action=health.Action.REBOOT_NODE if i == 3 else health.Action.NONE,
            reasons=[xid] if i == 3 else [],
            readings=heartbeat.GpuReadings(
                temperature_c=41.0 + i, power_w=312.5, utilization_pct=97.0,
                memory_used_mib=70123.0, ecc_uncorrected_volatile=0, ecc_corrected_volatile=3,
                remapped_rows_pending=False, remapped_rows_failure=False, pcie_replay_count=0,
                nvlinks_down=0,
            ),
        )
        for i in range(8)
    ]  # fmt: skip
    hb = heartbeat.Heartbeat(
        schema_version=1, node_name="gpu-node-0001", boot_id="5c1e2f8a-0b7e-4f0e-9a3c",
        interval_s=10.0, sequence=42, sent_at=now, driver_version="580.65.06",
        dcgm_available=True, gpus=gpus,
    )  # fmt: skip
    return hb.model_dump_json(by_alias=True, exclude_none=True).encode()


def main() -> None:
    raw = body()
    decoded = fastheartbeat.decode(raw)
    if fastheartbeat.to_model(decoded) != heartbeat.validate_json(raw):
        msg = "the decoders disagree on the benchmark body"
        raise SystemExit(msg)
    cases: dict[str, Callable[[], object]] = {
        "pydantic lax (before)": lambda: heartbeat.Heartbeat.model_validate_json(raw, strict=False),
        "pydantic strict (slow path)": lambda: heartbeat.validate_json(raw),
        "msgspec (hot path)": lambda: fastheartbeat.decode(raw),
        "msgspec + to_model": lambda: fastheartbeat.to_model(fastheartbeat.decode(raw)),
        "json.loads (bare handler)": lambda: json.loads(raw),
    }
    best = dict.fromkeys(cases, float("inf"))
    for _ in range(ROUNDS):
        for name, case in cases.items():
            best[name] = min(best[name], timeit.timeit(case, number=BATCH) / BATCH)
    before = best["pydantic lax (before)"]
    print(f"heartbeat body: {len(raw)} bytes, 8 GPUs; best of {ROUNDS} batches of {BATCH}")
    print(f"{'decoder':<30} {'µs':>8} {'× before':>9}")
    for name, seconds in best.items():
        print(f"{name:<30} {seconds * 1e6:8.1f} {seconds / before:9.2f}")


if __name__ == "__main__":
    main()
