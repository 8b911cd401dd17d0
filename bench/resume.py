"""Node failure to next attempt: from a node's quarantine to the creation of the next attempt
of a run that was on it (DESIGN.md section 9: under 2 s).

Needs the dev cluster. Makes a fleet of KWOK GPU nodes with scripted agents heartbeating to
one controller process (a private queue without admission checks: the gate decides when the
next attempt is admitted, not when it is created). Each trial submits a one-node run, waits
until its pod runs, turns one GPU of that pod's node to Xid 79, and times two events on
watches of the API server, on one clock: the node carrying our taint (the quarantine) and the
Job `<run>-a2` appearing (the next attempt). Then it cancels the run and reboots the node's
agent (a new boot ID releases it) for the next trial. Trials run a few at a time.

Both paths run side by side in one run, on the same fleet, one controller process after the
other: the urgent path (the quarantiner hands the node to the reconciler, which reconciles the
runs on it from their own snapshot) and, for comparison, the full reconcile pass it replaced
(`TAUGRID_CONTROLLER_RUN_URGENT_RESUME=false`: the quarantine only pokes the pass).

Run: `.venv/bin/python -m bench.resume --trials 100 [--nodes 10]` (trials per path)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import secrets
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from kubernetes_asyncio import client

from bench import fleetkit
from devcluster import cluster, stack
from tests import controllerkit as kit
from tests import kueue
from tests.runskit import IMAGE, RESEARCHER_RULES, make_token

TAINT_KEY = "taugrid.dev/gpu-unhealthy"
LABEL = "taugrid.dev/bench"


def _env(dev: cluster.Cluster, port: int, ns: str) -> dict[str, str]:
    env = stack.controller_env(dev, port=port, namespace=ns, identity=f"bench-{ns}",
                               node_selector=f"{LABEL}={ns}")  # fmt: skip
    env.update({
        "TAUGRID_CONTROLLER_MAX_QUARANTINED": "100000",
        "TAUGRID_CONTROLLER_BREAKER_PERCENT": "100",
        "TAUGRID_CONTROLLER_FAILED_EVICT_GRACE_S": "3600",
        "TAUGRID_CONTROLLER_RELEASE_AFTER_S": "0.5",
        "TAUGRID_CONTROLLER_RUN_MANAGER": f"bench/{ns}",
        "TAUGRID_CONTROLLER_RUN_POD_ANNOTATIONS": json.dumps({"kwok.taugrid.dev/run-for": "1h"}),
        "TAUGRID_CONTROLLER_ADMISSION_CHECK": f"bench-{ns}",
        "TAUGRID_CONTROLLER_LOG_LEVEL": "WARNING",
    })  # fmt: skip
    return env


async def _watch(
    api: client.ApiClient,
    list_call: Callable[..., Awaitable[Any]],
    seen: Callable[[dict[str, Any]], None],
    stop: asyncio.Event,
    **kwargs: Any,
) -> None:
    """Feed every object of a raw watch to `seen`, reconnecting until stopped."""
    while not stop.is_set():
        resp = await list_call(watch=True, timeout_seconds=60, _preload_content=False, **kwargs)
        try:
            while not stop.is_set():
                line = await resp.content.readline()
                if not line:
                    break
                seen(json.loads(line).get("object") or {})
        finally:
            resp.release()


class Clock:
    """First-seen times of quarantines (by node) and of Jobs (by name), from the watches."""

    def __init__(self) -> None:
        self.tainted: dict[str, float] = {}
        self.jobs: dict[str, float] = {}

    def node(self, obj: dict[str, Any]) -> None:
        name = obj.get("metadata", {}).get("name", "")
        taints = (obj.get("spec") or {}).get("taints") or []
        if any(t.get("key") == TAINT_KEY for t in taints):
            self.tainted.setdefault(name, time.perf_counter())
        else:
            self.tainted.pop(name, None)

    def job(self, obj: dict[str, Any]) -> None:
        self.jobs.setdefault(obj.get("metadata", {}).get("name", ""), time.perf_counter())


async def _until(probe: Callable[[], Awaitable[Any]], timeout_s: float = 120) -> Any:
    deadline = time.perf_counter() + timeout_s
    while True:
        with contextlib.suppress(AssertionError, KeyError, aiohttp.ClientError):
            return await probe()
        if time.perf_counter() > deadline:
            raise TimeoutError
        await asyncio.sleep(0.05)


class Bench:
    """One fleet, one controller, and the trials."""

    def __init__(self, api: client.ApiClient, dev: cluster.Cluster, ns: str) -> None:
        self.api = api
        self.dev = dev
        self.ns = ns
        self.clock = Clock()
        self.agents: dict[str, kit.Agent] = {}
        self.samples: list[float] = []
        self.missed = 0
        self.url = ""
        self.token = ""
        self.http: aiohttp.ClientSession | None = None

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        assert self.http is not None
        async with self.http.request(
            method, self.url + path, json=body, headers={"Authorization": f"Bearer {self.token}"}
        ) as r:
            return r.status, await r.json()  # fmt: skip

    async def trial(self, i: int) -> None:
        """Submit, wait for the pod, fail its node, time the next attempt, clean up."""
        name = f"t{i}-{secrets.token_hex(2)}"
        spec = {"name": name, "image": IMAGE, "command": ["python", "train.py"], "queue": "q",
                "resources": {"gpus": 8, "cpu": "1", "memory": "1Gi"}}  # fmt: skip
        status, body = await self.call("POST", f"/v1/runs?namespace={self.ns}", spec)
        assert status == 201, body

        async def running() -> str:
            _, run = await self.call("GET", f"/v1/runs/{self.ns}/{name}")
            assert run["phase"] == "Running"
            return str(run["attempts"][0]["nodes"][0])

        node = await _until(running)
        self.agents[node].fail(0)
        try:
            await _until(lambda: _present(self.clock.jobs, f"{name}-a2"), timeout_s=60)
            quarantined = self.clock.tainted[node]
            self.samples.append(self.clock.jobs[f"{name}-a2"] - quarantined)
        except (TimeoutError, KeyError):
            self.missed += 1
        await self.call("DELETE", f"/v1/runs/{self.ns}/{name}")
        agent = self.agents[node]
        agent.heal()
        agent.boot_id = f"boot-{secrets.token_hex(4)}"  # a reboot clears the latched Xid 79
        await _until(lambda: _absent(self.clock.tainted, node), timeout_s=120)

    async def run(self, trials: int, parallel: int) -> None:
        sem = asyncio.Semaphore(parallel)

        async def one(i: int) -> None:
            async with sem:
                try:
                    await self.trial(i)
                except (AssertionError, TimeoutError, KeyError, aiohttp.ClientError) as err:
                    self.missed += 1  # counted and said, never hidden in the percentiles
                    print(f"trial {i} failed: {err!r}", file=sys.stderr)

        await asyncio.gather(*(one(i) for i in range(trials)))


async def _present(seen: dict[str, float], key: str) -> float:
    return seen[key]


async def _absent(seen: dict[str, float], key: str) -> None:
    assert key not in seen


async def _setup(api: client.ApiClient, dev: cluster.Cluster, ns: str, nodes: int) -> list[str]:
    core = client.CoreV1Api(api)
    await core.create_namespace({"metadata": {"name": ns}})
    names = await asyncio.to_thread(
        dev.ensure_nodes, fleetkit.bin_dir(), nodes, prefix=f"{ns}-n", labels={LABEL: ns}
    )
    await kueue.create_queues(api, ns, gpus=8 * nodes, cpu=8 * nodes, node_labels={LABEL: ns})
    return names


async def _teardown(api: client.ApiClient, dev: cluster.Cluster, ns: str) -> None:
    await kueue.delete_queues(api, ns)
    await asyncio.to_thread(
        dev.kubectl, fleetkit.bin_dir(), "delete", "nodes", "-l", f"{LABEL}={ns}", "--wait=false"
    )
    await client.CoreV1Api(api).delete_namespace(ns)


async def _phase(
    api: client.ApiClient, dev: cluster.Cluster, ns: str, fleet: Fleet, *, urgent: bool,
    trials: int, parallel: int,
) -> Bench:  # fmt: skip
    """Run `trials` against a fresh controller process, its urgent path on or off."""
    bench = Bench(api, dev, ns)
    bench.token, bench.agents = fleet.token, fleet.agents
    port = kit.free_port()
    env = {**_env(dev, port, ns), "TAUGRID_CONTROLLER_RUN_URGENT_RESUME": str(urgent).lower()}
    log = dev.state / "logs" / f"{ns}-controller-{'urgent' if urgent else 'pass'}.log"
    with log.open("wb") as out:  # the bench's controller logs beside the dev cluster's
        ctl = subprocess.Popen([sys.executable, "-m", "controller"], env=env, stdout=out,
                               stderr=out)  # fmt: skip
    bench.url = f"http://127.0.0.1:{port}"
    core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    try:
        async with aiohttp.ClientSession() as http:
            bench.http = http
            await _until(lambda: _leader(http, bench.url))
            tasks = [
                asyncio.create_task(kit.heartbeat_loop(list(bench.agents.values()), http,
                                                       [bench.url], 0.5)),
                asyncio.create_task(_watch(api, core.list_node, bench.clock.node, stop,
                                           label_selector=f"{LABEL}={ns}")),
                asyncio.create_task(_watch(api, batch.list_namespaced_job, bench.clock.job, stop,
                                           namespace=ns)),
            ]  # fmt: skip
            await asyncio.sleep(3)  # every node has reported healthy
            await bench.run(trials, parallel)
    finally:
        ctl.terminate()  # it gives its Lease up, so the next phase's controller leads at once
        ctl.wait(timeout=15)
        stop.set()
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, RuntimeError):
                await t
    return bench


@dataclasses.dataclass
class Fleet:
    """What both phases share: the researcher token and one scripted agent per node."""

    token: str
    agents: dict[str, kit.Agent]


def _summary(label: str, bench: Bench) -> str:
    ok = bench.samples
    return (
        f"  {label:<44} n={len(ok):<3} p50 {fleetkit.pct(ok, 50):5.0f} ms  "
        f"p99 {fleetkit.pct(ok, 99):5.0f} ms  max {max(ok, default=float('nan')) * 1000:5.0f} ms"
        f"  missed {bench.missed}"
    )


async def run(trials: int, nodes: int, parallel: int) -> None:
    dev, api = await fleetkit.dev_api()
    ns = f"bench-resume-{secrets.token_hex(2)}"
    results: dict[bool, Bench] = {}
    try:
        names = await _setup(api, dev, ns, nodes)
        token = await make_token(api, ns, "researcher", RESEARCHER_RULES)
        fleet = Fleet(token, {n: kit.Agent(n, await kit.agent_token(api, ns, n)) for n in names})
        for urgent in (True, False):
            results[urgent] = await _phase(api, dev, ns, fleet, urgent=urgent, trials=trials,
                                           parallel=parallel)  # fmt: skip
            # Each phase starts from an empty namespace: the runs a pass walks are its own.
            await client.CustomObjectsApi(api).delete_collection_namespaced_custom_object(
                "taugrid.dev", "v1alpha1", ns, "tauruns"
            )
    finally:
        await _teardown(api, dev, ns)
        await api.close()
    print(f"quarantine -> next attempt created, {trials} trials per path on {nodes} nodes "
          f"({parallel} at a time), side by side:")  # fmt: skip
    print(_summary("the runs on that node, from their own snapshot", results[True]))
    print(_summary("the full reconcile pass, poked (urgent off)", results[False]))
    fast, slow = results[True].samples, results[False].samples
    for q in (50, 99):
        ratio = fleetkit.pct(slow, q) / fleetkit.pct(fast, q)
        print(f"  p{q} ratio, full pass / urgent path: {ratio:.2f} (above 1: urgent is faster)")


async def _leader(http: aiohttp.ClientSession, url: str) -> None:
    async with http.get(f"{url}/readyz") as r:
        assert (await r.json()).get("leader")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--parallel", type=int, default=4)
    args = parser.parse_args()
    asyncio.run(run(args.trials, args.nodes, args.parallel))


if __name__ == "__main__":
    main()
