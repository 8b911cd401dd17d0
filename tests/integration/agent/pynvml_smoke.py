"""Run by test_pynvml_floor.py in a child process whose `pynvml` is the declared floor version.

It imports the agent's modules, reads every tier of one fake GPU and receives one Xid through
the event thread, then prints what it saw as JSON. Arguments: the fake library's directory.
"""

from __future__ import annotations

import datetime as dt
import json
import pathlib
import sys
import time


def main() -> int:
    """Exercise the agent's NVML paths; print a JSON summary."""
    import pynvml

    from agent import app, metrics, monitoring  # noqa: F401 - the agent imports with this pynvml
    from agent.probing import nvml
    from devcluster import fakenvml

    control = fakenvml.InProcessControl(pathlib.Path(sys.argv[1]))
    probe = nvml.Probe()
    probe.start()
    now = dt.datetime.now(dt.UTC)
    snap, _ = probe.snapshot(probe.devices[0], now, counters=None, counters_at=None)
    events: list[nvml.NvmlEvent] = []
    watcher = nvml.EventWatcher(probe.devices, events.append, wait_ms=50)
    watcher.start()
    deadline = time.monotonic() + 30
    while len(watcher.registered) < len(probe.devices) and time.monotonic() < deadline:
        time.sleep(0.02)
    control.xid(0, 79)
    while not events and time.monotonic() < deadline:
        time.sleep(0.02)
    watcher.stop()
    probe.shutdown()
    print(
        json.dumps(
            {
                "pynvml": getattr(pynvml, "__file__", ""),
                "error": snap.nvml_error,
                "temperature": snap.temperature_c,
                "fb_reserved_mib": snap.fb_reserved_mib,
                "memory_version": probe.memory_version,
                "recovery_action": snap.recovery_action,
                "links": len(snap.nvlink_up or {}),
                "clock_reasons": probe.clock_reasons_call,
                "xid": [e.data for e in events if e.event_type & nvml.EVENT_XID],
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
