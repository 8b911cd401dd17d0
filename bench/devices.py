"""Device quarantine on a DRA fleet: GPUs kept, fault → DeviceTaintRule, fault → eviction.

Needs the dev cluster. A fleet of KWOK DRA nodes (default 100 × 8 GPUs, each with the
ResourceSlice our publisher writes, and a pod-bound agent token) reports to one controller
process every second. One run measures, side by side:

1. **fault → rules**: one trial per node. A reset-class fault (ECC rising, ResetGPU) on one
   GPU; the time from sending that heartbeat to both DeviceTaintRules of that device being
   seen on a watch of the API server (our clock). p50/p99/max.
2. **fault → eviction, net of the toleration**: one pod per node holding one GPU through a
   claim that tolerates `taugrid.dev/gpu-evict` for `--grace` seconds; the GPU fails; the time
   from the heartbeat to the pod's deletion (seen on a pod watch) minus the grace.
3. **GPUs kept**: 10 GPUs fail on 10 different nodes; then the fleet is filled with one
   1-GPU pod per GPU (800 for 100 nodes) and, once placement has settled, the pods that
   landed and run are counted: first under device quarantine (`gpuMode: dra`), then, with
   the same faults, under node quarantine (`gpuMode: device-plugin`: the same DRA nodes are
   tainted and cordoned as a whole). Arithmetic says 790 vs 720 for 100 nodes.

Run: `.venv/bin/python -m bench.devices --nodes 100 [--grace 3] [--evictions 20]`
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
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
from kubernetes_asyncio import client

from bench import fleetkit
from devcluster import cluster, stack
from tests import controllerkit as kit
from tests import dra

LABEL = "taugrid.dev/bench"
SETTLE_S = 15.0
"""Placement has settled when no pod was bound for this long (the scheduler retries pods it
could not place on every cluster change; 15 s covers several of its backoffs)."""


def _env(dev: cluster.Cluster, port: int, ns: str, mode: str) -> dict[str, str]:
    env = stack.controller_env(dev, port=port, namespace=ns, identity=f"bench-{ns}-{mode}",
                               node_selector=f"{LABEL}={ns}")  # fmt: skip
    env.update({
        "TAUGRID_CONTROLLER_GPU_MODE": mode,
        "TAUGRID_CONTROLLER_ADMISSION_CHECK": f"bench-{ns}",
        "TAUGRID_CONTROLLER_MAX_QUARANTINED": "100000",
        "TAUGRID_CONTROLLER_BREAKER_PERCENT": "100",
        "TAUGRID_CONTROLLER_MAX_QUARANTINED_DEVICES": "100000",
        "TAUGRID_CONTROLLER_DEVICE_BREAKER_PERCENT": "100",
        "TAUGRID_CONTROLLER_RELEASE_AFTER_S": "1",
        "TAUGRID_CONTROLLER_EVICT_GRACE_S": "3600",
        "TAUGRID_CONTROLLER_LOG_LEVEL": "WARNING",
    })  # fmt: skip
    return env


class Controller:
    """One controller process for the bench fleet."""

    def __init__(self, dev: cluster.Cluster, ns: str, mode: str) -> None:
        self.port = kit.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "controller"], env=_env(dev, self.port, ns, mode),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip

    async def leading(self, http: aiohttp.ClientSession) -> None:
        await fleetkit.leading(http, self.url)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=15)


@contextlib.asynccontextmanager
async def reporting(
    dev: cluster.Cluster,
    ns: str,
    mode: str,
    agents: dict[str, kit.Agent],
    http: aiohttp.ClientSession,
) -> AsyncIterator[Controller]:
    """A leading controller process in `mode` with every agent heartbeating to it."""
    ctl = Controller(dev, ns, mode)
    loop: asyncio.Task[None] | None = None
    try:
        await ctl.leading(http)
        loop = asyncio.create_task(kit.heartbeat_loop(list(agents.values()), http, [ctl.url], 1.0))
        yield ctl
    finally:
        if loop is not None:
            loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loop
        ctl.stop()


async def _watch(
    api: client.ApiClient,
    path: tuple[str, ...],
    on_event: Callable[[str, dict[str, Any]], None],
    stop: asyncio.Event,
    **params: Any,
) -> None:
    """Call `on_event(type, object)` for every event of a raw watch until `stop`."""
    custom = client.CustomObjectsApi(api)
    core = client.CoreV1Api(api)
    while not stop.is_set():
        if path[0] == "pods":
            resp = await core.list_namespaced_pod(path[1], watch=True, timeout_seconds=60,
                                                  _preload_content=False, **params)  # fmt: skip
        else:
            resp = await custom.list_cluster_custom_object(
                *dra.RESOURCE, path[0], watch=True, timeout_seconds=60, _preload_content=False,
                **params,
            )  # fmt: skip
        try:
            while not stop.is_set():
                line = await resp.content.readline()
                if not line:
                    break
                event = json.loads(line)
                on_event(str(event.get("type")), event.get("object") or {})
        finally:
            resp.release()


async def _agents(
    api: client.ApiClient, dev: cluster.Cluster, ns: str, nodes: list[str]
) -> dict[str, kit.Agent]:
    """An agent pod on each node and a pod-bound token for it (DRA UUIDs)."""
    docs: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": stack.AGENT_SA, "namespace": ns}},
    ]  # fmt: skip
    docs += [{**stack.agent_pod(n, ns), "metadata": {"name": f"a-{n}", "namespace": ns}}
             for n in nodes]  # fmt: skip
    await asyncio.to_thread(dev.apply, fleetkit.bin_dir(), docs)
    core = client.CoreV1Api(api)
    sem = asyncio.Semaphore(16)

    async def token(name: str) -> tuple[str, kit.Agent]:
        async with sem:
            pod = await core.read_namespaced_pod(f"a-{name}", ns)
            tr = await core.create_namespaced_service_account_token(
                stack.AGENT_SA, ns,
                {"spec": {"audiences": ["taugrid"], "expirationSeconds": 3600,
                          "boundObjectRef": {"apiVersion": "v1", "kind": "Pod",
                                             "name": f"a-{name}", "uid": pod.metadata.uid}}},
            )  # fmt: skip
            return name, kit.Agent(name, str(tr.status.token), dra=True)

    return dict(await asyncio.gather(*(token(n) for n in nodes)))


async def _until(probe: Callable[[], Awaitable[bool]], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await probe():
            return
        await asyncio.sleep(0.2)
    msg = f"timed out waiting for {what}"
    raise RuntimeError(msg)


TRIAL_GAP_S = 0.3
"""Between two fault trials, so each fault meets a controller that finished the passes the
previous one caused (its rules' and history's watch events each wake one): faults on
different nodes a fraction of a second apart, not a storm (bench/quarantine.py has those)."""


async def fault_to_rules(
    api: client.ApiClient, agents: dict[str, kit.Agent], http: aiohttp.ClientSession, url: str
) -> tuple[list[float], list[float]]:
    """One trial per node: a ResetGPU fault on GPU 1; heartbeat sent → the first rule
    (NoSchedule, created first) and both rules seen."""
    nodes = set(agents)
    seen: dict[str, set[str]] = {}
    first: dict[str, float] = {}
    done: dict[str, float] = {}

    def on_rule(kind: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        node = (meta.get("annotations") or {}).get("taugrid.dev/node", "")
        if kind == "ADDED" and node in nodes:
            seen.setdefault(node, set()).add(meta.get("name", ""))
            first.setdefault(node, time.perf_counter())
            if len(seen[node]) >= 2 and node not in done:
                done[node] = time.perf_counter()

    stop = asyncio.Event()
    watcher = asyncio.create_task(_watch(api, ("devicetaintrules",), on_rule, stop,
                                         label_selector=dra.OURS))  # fmt: skip
    await asyncio.sleep(1.0)
    sent: dict[str, float] = {}
    try:
        for node, agent in agents.items():
            agent.fail(1, kit.ECC_RISING)
            sent[node] = time.perf_counter()
            await agent.send(http, url)
            deadline = time.perf_counter() + 30
            while node not in done and time.perf_counter() < deadline:
                await asyncio.sleep(0.002)
            await asyncio.sleep(TRIAL_GAP_S)
    finally:
        stop.set()
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    return (
        [first[n] - sent[n] if n in first else float("inf") for n in sent],
        [done[n] - sent[n] if n in done else float("inf") for n in sent],
    )


async def controller_share(http: aiohttp.ClientSession, url: str) -> str:
    """The controller's own histogram of first bad report → rules created, as bucket counts
    (`taugrid_fault_to_device_rule_seconds`)."""
    async with http.get(f"{url}/metrics") as resp:
        text = await resp.text()
    buckets = []
    for line in text.splitlines():
        if line.startswith("taugrid_fault_to_device_rule_seconds_bucket"):
            le = line.split('le="')[1].split('"')[0]
            buckets.append(f"<={le}s: {int(float(line.rsplit(' ', 1)[1]))}")
    return ", ".join(buckets[:6])


def _pod(name: str, template: str, node: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": template}],
        "containers": [{"name": "main", "image": "train@sha256:" + "4" * 64,
                        "resources": {"claims": [{"name": "gpus"}]}}],
    }  # fmt: skip
    if node is not None:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {"metadata": {"name": name, "annotations": {"kwok.taugrid.dev/run-for": "1h"}},
            "spec": spec}  # fmt: skip


async def _create_pods(api: client.ApiClient, ns: str, pods: list[dict[str, Any]]) -> None:
    core = client.CoreV1Api(api)
    sem = asyncio.Semaphore(16)

    async def one(body: dict[str, Any]) -> None:
        async with sem:
            await core.create_namespaced_pod(ns, body)

    await asyncio.gather(*(one(p) for p in pods))


async def _delete_pods(api: client.ApiClient, ns: str, selector: str) -> None:
    core = client.CoreV1Api(api)
    # Deleting 800 KWOK pods takes minutes (each goes through the terminate stage).
    await core.delete_collection_namespaced_pod(ns, label_selector=selector,
                                                grace_period_seconds=0,
                                                _request_timeout=900)  # fmt: skip

    async def gone() -> bool:
        return not (await core.list_namespaced_pod(ns, label_selector=selector)).items

    await _until(gone, 900, "the pods to go")


async def fault_to_eviction(
    api: client.ApiClient,
    ns: str,
    agents: dict[str, kit.Agent],
    http: aiohttp.ClientSession,
    url: str,
    *,
    grace_s: int,
    trials: int,
) -> list[float]:
    """One pod per node holding a GPU with a `grace_s` toleration; its GPU fails; heartbeat
    sent → pod deletion seen, minus the grace."""
    template = dra.claim_template("grace", tolerate=("taugrid.dev/gpu-evict", grace_s))
    await dra.create(api, ns, "resourceclaimtemplates", template)
    nodes = list(agents)[:trials]
    pods = [_pod(f"e-{i}", "grace", n) for i, n in enumerate(nodes)]
    for p in pods:
        p["metadata"]["labels"] = {"bench": "evict"}
    await _create_pods(api, ns, pods)

    async def allocated() -> bool:
        return len(await dra.devices_of(api, ns)) >= len(nodes)

    await _until(allocated, 300, "the eviction pods' claims allocated")
    held = await dra.devices_of(api, ns)
    deleted: dict[str, float] = {}

    def on_pod(kind: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        name = meta.get("name", "")
        if (meta.get("deletionTimestamp") or kind == "DELETED") and name not in deleted:
            deleted[name] = time.perf_counter()

    stop = asyncio.Event()
    watcher = asyncio.create_task(_watch(api, ("pods", ns), on_pod, stop,
                                         label_selector="bench=evict"))  # fmt: skip
    await asyncio.sleep(1.0)
    out: list[float] = []
    try:
        for i, node in enumerate(nodes):
            pod = f"e-{i}"
            [(_, device)] = list(held[pod])
            agents[node].fail(int(device.removeprefix("gpu-")), kit.ECC_RISING)
            t0 = time.perf_counter()
            await agents[node].send(http, url)
            deadline = t0 + grace_s + 60
            while pod not in deleted and time.perf_counter() < deadline:
                await asyncio.sleep(0.01)
            out.append(deleted[pod] - t0 - grace_s if pod in deleted else float("inf"))
    finally:
        stop.set()
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    await _delete_pods(api, ns, "bench=evict")
    return out


async def fill(api: client.ApiClient, ns: str, gpus: int) -> tuple[int, int, set[tuple[str, str]]]:
    """Create `gpus` 1-GPU pods; once no pod was bound for SETTLE_S, return (running,
    pending, devices held)."""
    existing = await client.CustomObjectsApi(api).list_namespaced_custom_object(
        *dra.RESOURCE, ns, "resourceclaimtemplates"
    )
    if not any(t["metadata"]["name"] == "one" for t in existing["items"]):
        await dra.create(api, ns, "resourceclaimtemplates", dra.claim_template("one"))
    pods = [_pod(f"f-{secrets.token_hex(3)}-{i}", "one") for i in range(gpus)]
    for p in pods:
        p["metadata"]["labels"] = {"bench": "fill"}
    await _create_pods(api, ns, pods)
    core = client.CoreV1Api(api)
    last_count, last_change = -1, time.monotonic()
    while True:
        items = (await core.list_namespaced_pod(ns, label_selector="bench=fill")).items
        running = sum(1 for p in items if p.status.phase == "Running")
        if running != last_count:
            last_count, last_change = running, time.monotonic()
        elif time.monotonic() - last_change > SETTLE_S:
            break
        await asyncio.sleep(1.0)
    held = {d for devs in (await dra.devices_of(api, ns)).values() for d in devs}
    return running, len(items) - running, held


async def run(nodes: int, grace_s: int, evictions: int, *, rules_only: bool = False) -> None:
    dev, api = await fleetkit.dev_api()
    ns = f"bench-d-{secrets.token_hex(2)}"
    names = await asyncio.to_thread(
        dev.ensure_nodes, fleetkit.bin_dir(), nodes, prefix=f"{ns}-n", labels={LABEL: ns},
        gpu_driver="dra",
    )  # fmt: skip
    agents = await _agents(api, dev, ns, names)
    faulty = {n: i % 8 for i, n in enumerate(names[:10])}
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as http:
            async with reporting(dev, ns, "dra", agents, http) as ctl:
                await asyncio.sleep(5)  # every node reported healthy at least once
                firsts, times = await fault_to_rules(api, agents, http, ctl.url)
                _print_rules(nodes, "the NoSchedule rule", firsts)
                _print_rules(nodes, "both rules", times)
                print(f"  controller's own share (report received -> rules created, cumulative "
                      f"buckets): {await controller_share(http, ctl.url)}", flush=True)  # fmt: skip
                if rules_only:
                    return
                for a in agents.values():
                    a.heal()

                async def released() -> bool:
                    return not await dra.ours_on(api, names)

                await _until(released, 120, "every rule released")
                evicted = await fault_to_eviction(
                    api, ns, agents, http, ctl.url, grace_s=grace_s, trials=evictions
                )
                _print_evictions(grace_s, evicted)
                for a in agents.values():
                    a.heal()
                await _until(released, 120, "every rule released")
                for node, index in faulty.items():
                    agents[node].fail(index, kit.ECC_RISING)

                async def fenced() -> bool:
                    return len(await dra.ours_on(api, names)) == 2 * len(faulty)

                await _until(fenced, 60, "the 10 faulty GPUs fenced")
                kept = await fill(api, ns, nodes * 8)
                _print_fill("device quarantine", kept, faulty)
                await _delete_pods(api, ns, "bench=fill")
            await dra.delete_ours_on(api, names)
            async with reporting(dev, ns, "device-plugin", agents, http):
                core = client.CoreV1Api(api)

                async def cordoned() -> bool:
                    found = await core.list_node(label_selector=f"{LABEL}={ns}")
                    return sum(1 for n in found.items if n.spec.unschedulable) == len(faulty)

                await _until(cordoned, 120, "the 10 nodes quarantined")
                whole = await fill(api, ns, nodes * 8)
                _print_fill("node quarantine", whole, faulty)
                await _delete_pods(api, ns, "bench=fill")
    finally:
        with contextlib.suppress(Exception):
            await dra.delete_ours_on(api, names)
        await asyncio.to_thread(dev.kubectl, fleetkit.bin_dir(), "delete", "nodes", "-l",
                                f"{LABEL}={ns}", "--wait=false")  # fmt: skip
        await client.CoreV1Api(api).delete_namespace(ns)
        await api.close()

    print(f"GPUs kept in service by device quarantine ({nodes} nodes x 8 GPUs, "
          f"{len(faulty)} faulty GPUs on {len(faulty)} nodes, {nodes * 8} 1-GPU pods): "
          f"{kept[0] - whole[0]}")  # fmt: skip


def _print_rules(nodes: int, what: str, times: list[float]) -> None:
    ok = [t for t in times if t != float("inf")]
    print(f"fault heartbeat -> {what} seen, {nodes} DRA nodes, {len(times)} "
          f"trials: p50 {fleetkit.pct(ok, 50):.1f} ms  p99 {fleetkit.pct(ok, 99):.1f} ms  "
          f"max {max(ok) * 1000:.1f} ms  missed {len(times) - len(ok)}", flush=True)  # fmt: skip


def _print_evictions(grace_s: int, evicted: list[float]) -> None:
    ok = [t for t in evicted if t != float("inf")]
    print(f"fault heartbeat -> pod deleted by kube-controller-manager, net of a {grace_s} s "
          f"toleration, {len(evicted)} trials: p50 {fleetkit.pct(ok, 50):.0f} ms  "
          f"p99 {fleetkit.pct(ok, 99):.0f} ms  max {max(ok) * 1000:.0f} ms  "
          f"missed {len(evicted) - len(ok)}", flush=True)  # fmt: skip


def _print_fill(
    what: str, found: tuple[int, int, set[tuple[str, str]]], faulty: dict[str, int]
) -> None:
    bad = {(n, f"gpu-{i}") for n, i in faulty.items()}
    print(f"{what}: {found[0]} of the 1-GPU pods running, {found[1]} pending; "
          f"pods on a faulty GPU: {len(found[2] & bad)}", flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--grace", type=int, default=3, help="toleration seconds (eviction)")
    parser.add_argument("--evictions", type=int, default=20, help="eviction trials")
    parser.add_argument("--rules-only", action="store_true", help="only fault -> rules")
    args = parser.parse_args()
    asyncio.run(run(args.nodes, args.grace, args.evictions, rules_only=args.rules_only))


if __name__ == "__main__":
    main()
