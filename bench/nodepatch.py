"""The API server's own ceiling for the writes a burst makes: node patches per second.

Needs the dev cluster. Makes N GPU Node objects (`fleetkit.make_fleet`, no KWOK), then sends
each one taint-and-cordon patch, as the controller's quarantine patch does (a JSON patch of
spec.taints, spec.unschedulable and four annotations), at several concurrencies one after
another on fresh nodes, through one kubernetes_asyncio client with a pool as large as the
concurrency. What it prints is the rate the API server (and etcd) sustain on this machine
with nothing else of ours running: no controller's burst can be quarantined faster than
`N / rate`, whatever the controller does.

Run: `.venv/bin/python -m bench.nodepatch --nodes 200 [--concurrency 1 16 64]`
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import time

from kubernetes_asyncio import client

from bench import fleetkit
from controller.kube import client as kube_client


def _patch(i: int) -> list[dict[str, object]]:
    return [
        {"op": "add", "path": "/spec/taints", "value": [
            {"key": "taugrid.dev/gpu-unhealthy", "value": "true", "effect": "NoSchedule"}]},
        {"op": "add", "path": "/spec/unschedulable", "value": True},
        {"op": "add", "path": "/metadata/annotations", "value": {
            "taugrid.dev/quarantined-by": "bench", "taugrid.dev/quarantined-at": str(i),
            "taugrid.dev/quarantine-reason": "Xid79", "taugrid.dev/quarantine": "{}"}},
    ]  # fmt: skip


async def _wave(kubeconfig: str, names: list[str], concurrency: int) -> tuple[float, float]:
    """All of `names` patched `concurrency` at a time: seconds in all, and p99 per patch."""
    api = await kube_client.make_client(kubeconfig, timeout_s=30, pool=concurrency)
    core = client.CoreV1Api(api)
    sem = asyncio.Semaphore(concurrency)
    each: list[float] = []

    async def one(i: int, name: str) -> None:
        async with sem:
            t = time.perf_counter()
            await core.patch_node(name, _patch(i), _content_type="application/json-patch+json")
            each.append(time.perf_counter() - t)

    try:
        t0 = time.perf_counter()
        await asyncio.gather(*(one(i, n) for i, n in enumerate(names)))
        return time.perf_counter() - t0, fleetkit.pct(each, 99)
    finally:
        await api.close()


async def run(nodes: int, concurrencies: list[int]) -> None:
    dev, api = await fleetkit.dev_api()
    ns = f"bench-np-{secrets.token_hex(2)}"
    try:
        tokens = await fleetkit.make_fleet(api, dev, ns, nodes * len(concurrencies), prefix=ns)
        names = list(tokens)
        print(f"{nodes} taint-and-cordon node patches per row, fresh nodes each row:")
        for k, c in enumerate(concurrencies):
            took, p99 = await _wave(str(dev.kubeconfig), names[k * nodes : (k + 1) * nodes], c)
            print(f"  concurrency {c:3}: {took:6.2f} s  {nodes / took:6.0f} patches/s  "
                  f"p99 {p99:6.0f} ms")  # fmt: skip
    finally:
        await fleetkit.delete_fleet(api, dev, ns)
        await api.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    args = parser.parse_args()
    asyncio.run(run(args.nodes, args.concurrency))


if __name__ == "__main__":
    main()
