"""Fault to quarantine: from a fatal heartbeat to the taint being visible in the API server.

Needs the dev cluster. A fleet of 100 GPU nodes (Node objects with pod-bound agent tokens, as
`bench/heartbeats.py` makes them) reports healthy to one controller process every second.
Each trial turns one node's GPU to Xid 79 and times, on a watch of the API server, the moment
the node carries the taint and is cordoned. Every node is one trial (limits are raised so a
100-node storm is allowed: maxQuarantined 100, breaker at 100 %). It also runs the 150-of-1,500
burst: 150 nodes fail at once and the time until all are quarantined is reported.

The agent's own share (Xid injected into NVML until the heartbeat leaves) is measured by
`bench/agent.py`; add the two for the end-to-end figure (docs/benchmarks.md does).

Run: `.venv/bin/python -m bench.quarantine --nodes 100 [--burst 1500:150]`
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import secrets
import subprocess
import sys
import time

import aiohttp
from kubernetes_asyncio import client

from bench import fleetkit
from devcluster import cluster, stack
from tests import controllerkit as kit

TAINT_KEY = "taugrid.dev/gpu-unhealthy"


def _env(dev: cluster.Cluster, port: int, ns: str) -> dict[str, str]:
    env = stack.controller_env(dev, port=port, namespace=ns, identity=f"bench-{ns}",
                               node_selector=f"taugrid.dev/bench={ns}")  # fmt: skip
    env.update(
        {
            "TAUGRID_CONTROLLER_MAX_QUARANTINED": "100000",
            "TAUGRID_CONTROLLER_BREAKER_PERCENT": "100",
            "TAUGRID_CONTROLLER_EVICT_GRACE_S": "3600",
            "TAUGRID_CONTROLLER_LOG_LEVEL": "WARNING",
            # Every bench agent posts from 127.0.0.1; in a cluster each has its own pod IP.
            # The per-address review bucket (5/s) would take 300 s to let 1,500 in.
            "TAUGRID_CONTROLLER_REVIEW_RATE_PER_SOURCE": "100000",
            "TAUGRID_CONTROLLER_REVIEW_BURST_PER_SOURCE": "100000",
        }
    )
    return env


async def _watch_taints(
    api: client.ApiClient, ns: str, seen: dict[str, float], stop: asyncio.Event
) -> None:
    """Record when each node is first seen tainted and cordoned (raw watch, our clock)."""
    core = client.CoreV1Api(api)
    while not stop.is_set():
        resp = await core.list_node(
            watch=True,
            label_selector=f"taugrid.dev/bench={ns}",
            timeout_seconds=60,
            _preload_content=False,
        )
        try:
            while not stop.is_set():
                line = await resp.content.readline()
                if not line:
                    break
                obj = json.loads(line).get("object") or {}
                spec = obj.get("spec") or {}
                tainted = any(t.get("key") == TAINT_KEY for t in spec.get("taints") or [])
                name = obj.get("metadata", {}).get("name", "")
                if tainted and spec.get("unschedulable") and name not in seen:
                    seen[name] = time.perf_counter()
        finally:
            resp.release()


async def _settled(
    http: aiohttp.ClientSession, url: str, total: int, timeout_s: float = 240.0
) -> float:
    """Wait until the fleet's first minutes are over: every node's token reviewed (one
    TokenReview each), then no write waiting for the budget and no node write or Event made
    for three seconds in a row (the conditions and their Events of the join are written);
    the seconds that took. Without it the storm would queue behind the fleet's own first
    writes, whichever budget they spend, and the figure would say how far the join had got.
    Fails the bench when that does not happen in time."""
    start = time.perf_counter()
    quiet, last = 0, -1.0
    while time.perf_counter() - start < timeout_s:
        async with http.get(f"{url}/metrics") as r:
            text = await r.text()
        reviewed = fleetkit.metric(text, "taugrid_api_writes_total", 'class="review"')
        written = sum(
            fleetkit.metric(text, "taugrid_api_writes_total", f'class="{cls}"')
            for cls in ("node", "event")
        )
        waiting = fleetkit.metric(text, "taugrid_api_writes_waiting")
        still = reviewed >= total and waiting == 0 and written == last
        quiet, last = (quiet + 1 if still else 0), written
        if quiet >= 3:
            return time.perf_counter() - start
        await asyncio.sleep(1.0)
    msg = f"the fleet of {total} was not in within {timeout_s:.0f} s"
    raise SystemExit(msg)


def _say_costs(metrics: str) -> None:
    """Where the controller's time went: passes, the fault-to-action time it measured, and
    the writes that waited for the API write budget."""

    def total(name: str, labels: str = "") -> float:
        return fleetkit.metric(metrics, name, labels)

    passes = total("taugrid_quarantine_pass_seconds_count")
    pass_ms = 1000 * total("taugrid_quarantine_pass_seconds_sum") / max(passes, 1)
    acted = total("taugrid_fault_to_quarantine_seconds_count")
    action_ms = 1000 * total("taugrid_fault_to_quarantine_seconds_sum") / max(acted, 1)
    print(f"  controller: {passes:.0f} passes, mean {pass_ms:.0f} ms; fault->action mean "
          f"{action_ms:.0f} ms; budget waits {total('taugrid_api_write_wait_seconds_sum'):.1f} s"
          f" over {total('taugrid_api_writes_total'):.0f} writes")  # fmt: skip
    for cls in ("lease", "review", "node", "run", "event", "eviction"):
        if n := total("taugrid_api_writes_total", f'class="{cls}"'):
            waited = total("taugrid_api_write_wait_seconds_sum", f'class="{cls}"')
            print(f"    {cls}: {n:.0f} writes, waited {waited:.1f} s for the budget")


async def _trial_run(
    api: client.ApiClient, dev: cluster.Cluster, total: int, failing: int, burst: bool
) -> list[float]:
    ns = f"bench-q-{total}-{secrets.token_hex(2)}"
    tokens = await fleetkit.make_fleet(api, dev, ns, total, prefix=f"q{total}")
    agents = {n: kit.Agent(n, t) for n, t in tokens.items()}
    port = kit.free_port()
    ctl = subprocess.Popen([sys.executable, "-m", "controller"], env=_env(dev, port, ns),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    seen: dict[str, float] = {}
    stop = asyncio.Event()
    sent: dict[str, float] = {}
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as http:
            await fleetkit.leading(http, url, timeout_s=30)
            loop = asyncio.create_task(kit.heartbeat_loop(list(agents.values()), http, [url], 1.0))
            watcher = asyncio.create_task(_watch_taints(api, ns, seen, stop))
            took = await _settled(http, url, total)  # every node reviewed, no write waiting
            print(f"  fleet of {total} in and settled {took:.1f} s after the controller led")
            victims = list(agents)[:failing]
            if burst:
                for v in victims:
                    agents[v].fail(0)
                t0 = time.perf_counter()
                await asyncio.gather(*(agents[v].send(http, url) for v in victims))
                sent = dict.fromkeys(victims, t0)
            else:
                for v in victims:
                    agents[v].fail(0)
                    sent[v] = time.perf_counter()
                    await agents[v].send(http, url)
                    deadline = time.perf_counter() + 30
                    while v not in seen and time.perf_counter() < deadline:
                        await asyncio.sleep(0.005)
            deadline = time.perf_counter() + 120
            while len(seen) < len(victims) and time.perf_counter() < deadline:
                await asyncio.sleep(0.05)
            async with http.get(f"{url}/metrics") as r:
                _say_costs(await r.text())
            stop.set()
            loop.cancel()
            watcher.cancel()
            for t in (loop, watcher):
                with contextlib.suppress(asyncio.CancelledError):
                    await t
    finally:
        ctl.terminate()
        ctl.wait(timeout=15)
        await fleetkit.delete_fleet(api, dev, ns)
    return [seen[v] - sent[v] for v in sent if v in seen] + [float("inf")] * (
        len(sent) - len([v for v in sent if v in seen])
    )


async def run(nodes: int, burst: tuple[int, int] | None) -> None:
    dev, api = await fleetkit.dev_api()
    try:
        times = await _trial_run(api, dev, nodes, nodes, burst=False)
        ok = [t for t in times if t != float("inf")]
        print(f"fatal heartbeat -> taint+cordon visible, {nodes} nodes, {len(times)} trials:")
        print(f"  p50 {fleetkit.pct(ok, 50):.1f} ms  p99 {fleetkit.pct(ok, 99):.1f} ms  "
              f"max {max(ok) * 1000:.1f} ms  missed {len(times) - len(ok)}")  # fmt: skip
        if burst is not None:
            total, failing = burst
            times = await _trial_run(api, dev, total, failing, burst=True)
            ok = sorted(t for t in times if t != float("inf"))
            print(f"burst: {failing} of {total} nodes failing at once:")
            p90 = fleetkit.pct(ok, 90) / 1000
            print(f"  all quarantined within {max(ok):.2f} s (p90 {p90:.2f} s), "
                  f"missed {len(times) - len(ok)}")  # fmt: skip
    finally:
        await api.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--burst", default="", help="TOTAL:FAILING, e.g. 1500:200")
    args = parser.parse_args()
    burst = tuple(int(x) for x in args.burst.split(":")) if args.burst else None
    asyncio.run(run(args.nodes, burst))  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
