"""The heartbeat hot path's per-request pieces, before and now, side by side in one process.

No network and no cluster: each piece is called in a loop, interleaved with its
counterpart (best of several rounds), so the figures are the CPU a request spends in it,
free of the load generator and the API server that share the machine in
`bench/heartbeats.py`:

- the 202's body: aiohttp's `json_response` (before) and msgspec into a `Response`
  (`fleet.api.heartbeat_accepted`, now);
- the outcome counter: `Counter.labels(outcome).inc()` (before) and
  `ControllerMetrics.count_heartbeat` (now).

Run: `.venv/bin/python -m bench.hotpath`
"""

from __future__ import annotations

import time
from collections.abc import Callable

from aiohttp import web

from controller import metrics
from controller.fleet import api as fleet_api

ROUNDS = 7
CALLS = 20_000
BODY = {"accepted": True, "node": "gpu-node-000123", "sequence": 123456}


def _sync_per_call_us(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    for _ in range(CALLS):
        run()
    return 1e6 * (time.perf_counter() - start) / CALLS


def main() -> None:
    """Print each piece before and now, and what a request saves."""
    m = metrics.make_metrics()
    best: dict[str, list[float]] = {}
    for _ in range(ROUNDS):
        for name, value in (
            ("202 body, before", _sync_per_call_us(
                lambda: web.json_response(BODY, status=202))),
            ("202 body, now", _sync_per_call_us(lambda: fleet_api.heartbeat_accepted(BODY))),
            ("counter, before", _sync_per_call_us(
                lambda: m.heartbeats.labels("accepted").inc())),
            ("counter, now", _sync_per_call_us(lambda: m.count_heartbeat("accepted"))),
        ):  # fmt: skip
            best.setdefault(name, []).append(value)
    print("piece | before µs | now µs | saved µs")
    saved = 0.0
    for piece in ("202 body", "counter"):
        b, n = min(best[f"{piece}, before"]), min(best[f"{piece}, now"])
        saved += b - n
        print(f"{piece} | {b:.2f} | {n:.2f} | {b - n:.2f}")
    print(f"per heartbeat | | | {saved:.2f}")


if __name__ == "__main__":
    main()
