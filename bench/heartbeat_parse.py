"""Micro-benchmark of one heartbeat's parse: pydantic-core against msgspec, side by side.

Run: `.venv/bin/python -m bench.heartbeat_parse`. The body is an 8-GPU report as the agent
writes it (every reading present, PCI bus IDs, the driver version; one GPU with a latched
Xid), ~3.7 KB. Each decoder runs in short batches, interleaved, many times; the best batch of
each is reported (a shared machine only ever adds time), and ratios are taken within the run.

- `msgspec`: `heartbeat.decode`, the hot path (the controller keeps the struct; the schema is
  declared once, as these structs, since issue 31);
- `explain a refusal`: `heartbeat.explain` of the same body with one field wrong, the slow
  path only a refused body pays for (it names every problem at its field);
- `json.loads`: the bare handler's work in `bench/heartbeats.py`, the reference.

Before issue 31 (one run, the same 3,719-byte body): pydantic lax 27.3 µs, pydantic strict
27.0 µs, msgspec 9.9 µs, json.loads 25.0 µs.
"""

from __future__ import annotations

import datetime as dt
import json
import timeit
from collections.abc import Callable
from typing import Any

from shared import health, heartbeat

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
    return json.dumps(_without_nulls(heartbeat.to_json(hb)), separators=(",", ":")).encode()


def _without_nulls(value: Any) -> Any:
    """The body as the agent wrote it before issue 31 (absent values left out), so that runs
    before and after compare."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def main() -> None:
    raw = body()
    refused = raw.replace(b'"sequence":42', b'"sequence":"42"')
    if heartbeat.explain(raw) or not heartbeat.explain(refused):
        msg = "the slow path disagrees with the hot path on the benchmark bodies"
        raise SystemExit(msg)
    heartbeat.decode(raw)
    cases: dict[str, Callable[[], object]] = {
        "json.loads (bare handler)": lambda: json.loads(raw),
        "msgspec (hot path)": lambda: heartbeat.decode(raw),
        "explain a refusal (slow path)": lambda: heartbeat.explain(refused),
    }
    best = dict.fromkeys(cases, float("inf"))
    for _ in range(ROUNDS):
        for name, case in cases.items():
            best[name] = min(best[name], timeit.timeit(case, number=BATCH) / BATCH)
    before = best["json.loads (bare handler)"]
    print(f"heartbeat body: {len(raw)} bytes, 8 GPUs; best of {ROUNDS} batches of {BATCH}")
    print(f"{'decoder':<30} {'µs':>8} {'× json':>9}")
    for name, seconds in best.items():
        print(f"{name:<30} {seconds * 1e6:8.1f} {seconds / before:9.2f}")


if __name__ == "__main__":
    main()
