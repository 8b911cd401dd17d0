"""Run the agent's probe against a real NVIDIA driver; print the snapshot and per-tier cost.

Only for a machine with a GPU: `python -m bench.gpu_check [--rounds 20]`. Tests never import it.
It uses the same `agent.probing.nvml.Probe` the agent runs, so field names, units and NOT_SUPPORTED
readings are exactly what the agent would see.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import time

from agent.probing import nvml


def main(rounds: int) -> None:
    """Probe every GPU `rounds` times per tier and print the results."""
    probe = nvml.Probe()
    probe.start()
    print(f"driver {probe.driver_version}, {len(probe.devices)} GPUs")
    for index, err in probe.enumeration_errors.items():
        print(f"  GPU {index} could not be enumerated: {err}")
    now = dt.datetime.now(dt.UTC)
    for device in probe.devices:
        snap, _ = probe.snapshot(device, now, counters=None, counters_at=None)
        print(json.dumps(snap.model_dump(mode="json", exclude_none=False), indent=1))
        print(f"  NVLinks discovered: {list(device.nvlinks)}")
    for tier, fn in (("gauges", probe.gauges), ("counters", probe.counters)):
        per_pass: list[float] = []
        for _ in range(rounds):
            start = time.perf_counter()
            for device in probe.devices:
                fn(device)
            per_pass.append(time.perf_counter() - start)
        print(
            f"tier {tier}: one pass over {len(probe.devices)} GPUs p50 "
            f"{1000 * statistics.median(per_pass):.2f} ms, max {1000 * max(per_pass):.2f} ms"
        )
    print(f"probe errors by tier:error: {probe.errors}")
    watcher = nvml.EventWatcher(probe.devices, lambda e: print("event", e), wait_ms=200)
    watcher.start()
    time.sleep(1.0)
    print(f"event masks registered: { {i: hex(m) for i, m in watcher.registered.items()} }")
    watcher.stop()
    probe.shutdown()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=20)
    main(parser.parse_args().rounds)
