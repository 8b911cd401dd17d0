"""The API write budget under a storm: the lease first, node writes next, nothing starved.

Needs the dev cluster. 200 Node objects (not KWOK-managed: they cost the API server nothing
until written) take a storm like the one 200 failing nodes cause, and more: per node two
node patches (the condition and the taint/cordon), one Event and three run writes
(ConfigMaps, standing in for a run's objects) — 1,200 writes issued at once through the
controller's own client (`controller.kube.client` with its `ratelimit.Limiter`), while a
lease renewal is due every 0.2 s. Three modes, side by side in one run:

- `unlimited`: no budget, as before this change (the pool of 64 connections is the only
  bound): what the storm does to the lease renewal when nothing paces us;
- `fifo`: the budget the chart ships (`controller.apiWrites`) with every write in arrival
  order (aging 0): paced, but the lease and the node writes queue behind the rest;
- `priority`: the same budget served by class with aging (what ships).

Printed per mode: lease renewal latency (p50, p99, max), when the last node write finished
(the storm's quarantine done), when the last write finished (drained), and the longest any
class waited for the budget.

Run: `.venv/bin/python -m bench.apibudget [--nodes 200] [--rate 100 --burst 300]`
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import secrets
import statistics
import time
from typing import Any

from kubernetes_asyncio import client

from bench import fleetkit
from controller import budget
from controller.budget import WriteClass
from controller.kube import client as kube_client
from controller.kube import ratelimit


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else 0.0


async def _storm(
    api: client.ApiClient, ns: str, nodes: list[str], round_id: str
) -> tuple[float, float]:
    """Issue the storm at once; return (last node write done, last write done), seconds."""
    core = client.CoreV1Api(api)
    started = time.perf_counter()
    node_done: list[float] = []
    all_done: list[float] = []

    async def node_write(name: str, n: int) -> None:
        body = {"metadata": {"annotations": {f"bench.taugrid.dev/w{n}": round_id}}}
        await core.patch_node(name, body)
        node_done.append(time.perf_counter() - started)

    events = client.EventsV1Api(api)

    async def event(name: str) -> None:
        # A cluster-scoped object's Events live in `default`, as the controller's do.
        await events.create_namespaced_event("default", {
            "metadata": {"name": f"{name}.{secrets.token_hex(8)}", "namespace": "default"},
            "eventTime": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "reportingController": "taugrid.dev/bench", "reportingInstance": "bench",
            "action": "Bench", "reason": "Bench", "note": round_id, "type": "Normal",
            "regarding": {"apiVersion": "v1", "kind": "Node", "name": name},
        })  # fmt: skip

    async def run_write(name: str, n: int) -> None:
        await core.create_namespaced_config_map(ns, {
            "metadata": {"name": f"{name}-{round_id}-{n}"}, "data": {"x": round_id},
        })  # fmt: skip

    async def timed(coro: Any) -> None:
        await coro
        all_done.append(time.perf_counter() - started)

    work = []
    for name in nodes:
        work += [run_write(name, 0), event(name), run_write(name, 1)]
        work += [node_write(name, 0), run_write(name, 2), node_write(name, 1)]
    await asyncio.gather(*(timed(w) for w in work))
    return max(node_done), max(all_done)


async def _renewals(api: client.ApiClient, ns: str, stop: asyncio.Event) -> list[float]:
    """Renew a Lease every 0.2 s until `stop`; return each renewal's latency."""
    coord = client.CoordinationV1Api(api)
    name = "bench-lease"
    lease = await coord.read_namespaced_lease(name, ns)
    out: list[float] = []
    while not stop.is_set():
        t0 = time.perf_counter()
        lease.spec.renew_time = dt.datetime.now(dt.UTC)
        lease = await coord.replace_namespaced_lease(name, ns, lease)
        out.append(time.perf_counter() - t0)
        await asyncio.sleep(0.2)
    return out


async def _mode(
    kubeconfig: str, ns: str, nodes: list[str], rates: budget.Rates | None
) -> dict[str, float]:
    waits: dict[WriteClass, float] = {}

    def seen(cls: WriteClass, waited: float) -> None:
        waits[cls] = max(waits.get(cls, 0.0), waited)

    limiter = ratelimit.Limiter(rates, observe=seen) if rates is not None else None
    api = await kube_client.make_client(kubeconfig, pool=64, timeout_s=120, limiter=limiter)
    try:
        stop = asyncio.Event()
        renewer = asyncio.create_task(_renewals(api, ns, stop))
        try:
            await asyncio.sleep(1.0)  # a few quiet renewals first
            nodes_done, drained = await _storm(api, ns, nodes, secrets.token_hex(3))
        finally:
            stop.set()
            lat = await renewer
    finally:
        await api.close()
    storm = lat[5:] or lat
    return {
        "lease_renewals_n": float(len(storm)),
        "lease_p50_ms": 1000 * statistics.median(storm),
        "lease_p99_ms": 1000 * _pct(storm, 0.99),
        "lease_max_ms": 1000 * max(storm),
        "nodes_done_s": nodes_done,
        "drained_s": drained,
        **{f"wait_{c.label}_s": w for c, w in sorted(waits.items())},
    }


async def run(n_nodes: int, rate: float, burst: int) -> None:
    dev, admin = await fleetkit.dev_api()
    ns = f"bench-budget-{secrets.token_hex(3)}"
    prefix = f"bb-{secrets.token_hex(2)}"
    nodes = [f"{prefix}-{i}" for i in range(n_nodes)]
    docs: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
         "metadata": {"name": "bench-lease", "namespace": ns},
         "spec": {"holderIdentity": "bench", "leaseDurationSeconds": 10}},
    ]  # fmt: skip
    docs += [
        {"apiVersion": "v1", "kind": "Node",
         "metadata": {"name": n, "labels": {"taugrid.dev/bench": ns}}}
        for n in nodes
    ]  # fmt: skip
    await asyncio.to_thread(dev.apply, fleetkit.bin_dir(), docs)
    shipped = budget.Rates(rate_per_s=rate, burst=burst)
    modes = {
        "unlimited": None,
        "fifo": budget.Rates(rate_per_s=rate, burst=burst, aging_s=0.0),
        "priority": shipped,
    }
    results: dict[str, dict[str, float]] = {}
    try:
        for name, rates in modes.items():
            results[name] = await _mode(str(dev.kubeconfig), ns, nodes, rates)
    finally:
        core = client.CoreV1Api(admin)
        for n in nodes:
            await core.delete_node(n)
        await core.delete_namespace(ns)
        await admin.close()
    writes = 6 * n_nodes
    print(f"storm: {writes} writes at once ({n_nodes} nodes x 2 node writes, 1 Event, 3 run "
          f"writes); budget {rate:g}/s burst {burst}; a lease renewal every 0.2 s")  # fmt: skip
    keys = sorted({k for r in results.values() for k in r})
    print(f"{'':22}" + "".join(f"{m:>12}" for m in results))
    for k in keys:
        print(f"{k:22}" + "".join(f"{results[m].get(k, 0.0):12.3f}" for m in results))
    u, p = results["unlimited"], results["priority"]
    f = results["fifo"]
    print(f"lease p99 under the storm: priority {p['lease_p99_ms']:.1f} ms, fifo "
          f"{f['lease_p99_ms']:.1f} ms, unlimited {u['lease_p99_ms']:.1f} ms")  # fmt: skip
    print(
        f"node writes done: priority {p['nodes_done_s']:.2f} s vs fifo {f['nodes_done_s']:.2f}"
        f" s ({f['nodes_done_s'] / max(p['nodes_done_s'], 1e-9):.1f}x later in arrival order)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--burst", type=int, default=300)
    args = parser.parse_args()
    asyncio.run(run(args.nodes, args.rate, args.burst))


if __name__ == "__main__":
    main()
