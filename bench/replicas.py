"""Ingestion that scales out: the leader's CPU per heartbeat with 1, 2 and 3 replicas.

Needs the dev cluster (`taugrid dev up`). One fleet of Node objects with a pod-bound agent
token each (`bench.fleetkit`, so every heartbeat is authenticated as in production), then
for 1, 2 and 3 replicas in turn: the leader starts alone under a Lease of its own, the
followers start with `leader_url` pointing at it and a peer token of the replicas'
ServiceAccount (audience `taugrid-peer`), and the fleet's agents are spread evenly over the
replicas (node i posts to replica i mod R, as a Service balancing agents' connections
would). An open-loop generator offers the same steady heartbeats at the same rate to each
setup; the leader's CPU seconds (utime + stime from /proc/<pid>/stat) over the window are
divided by the heartbeats the fleet took (202s); "net" first takes off what the leader
spends with nothing reporting (its loops, the node watch), measured just before. With
`--forward` the same runs are made with the relay off (every heartbeat forwarded, as
before), side by side.

Then, with 2 replicas and the fleet reporting, the fault → leader latency: a report that
changes a GPU's verdict, sent to the follower (the agent's 202 comes back once the leader
took it) and to the leader directly, alternating, `--trials` times each.

Run: `.venv/bin/python -m bench.replicas --nodes 600 --rate 300 --seconds 20`
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as dt
import os
import pathlib
import secrets
import subprocess
import sys
import tempfile
import time
from typing import IO

import aiohttp
from kubernetes_asyncio import client

from bench import fleetkit
from devcluster import stack
from shared import heartbeat
from tests import controllerkit as kit

CONTROLLER_SA = "taugrid-controller"
ROUNDS = 40
IDLE_S = 5.0
"""Pre-serialised rounds of the fleet's reports (sequence numbers 10…49): no wrapping."""


def _report(node: str, seq: int, *, fault: bool = False) -> bytes:
    gpus = [kit.gpu(i, node) for i in range(8)]
    if fault:
        gpus[3] = kit.gpu(3, node, kit.XID_79.verdict, (kit.XID_79,))
    hb = heartbeat.Heartbeat(
        schema_version=1, node_name=node, boot_id="bench-boot", interval_s=10.0,
        sequence=seq, sent_at=dt.datetime.now(dt.UTC), gpus=gpus,
    )  # fmt: skip
    return heartbeat.encode(hb)


def _cpu_s(pid: int) -> float:
    """utime + stime of a process, in seconds."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclasses.dataclass
class Replica:
    process: subprocess.Popen[bytes]
    url: str


async def _wait(url: str) -> None:
    async with aiohttp.ClientSession() as http:
        for _ in range(200):
            try:
                async with http.get(f"{url}/readyz") as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    msg = f"{url} never became ready"
    raise RuntimeError(msg)


async def _peer_token(api: client.ApiClient, ns: str) -> str:
    core = client.CoreV1Api(api)
    try:
        await core.create_namespaced_service_account(ns, {"metadata": {"name": CONTROLLER_SA}})
    except client.ApiException as err:
        if err.status != 409:
            raise
    tr = await core.create_namespaced_service_account_token(
        CONTROLLER_SA, ns, {"spec": {"audiences": ["taugrid-peer"], "expirationSeconds": 3600}}
    )
    return str(tr.status.token)


async def _start(
    dev: object, ns: str, count: int, *, relay: bool, peer_file: pathlib.Path, log: IO[str]
) -> list[Replica]:
    """A leader, then `count - 1` followers pointing at it."""
    lease = f"bench-{secrets.token_hex(3)}"
    replicas: list[Replica] = []
    leader_url = ""
    for i in range(count):
        port = kit.free_port()
        env = stack.controller_env(dev, port=port, namespace=ns, identity=f"{lease}-{i}",  # type: ignore[arg-type]
                                   node_selector=f"taugrid.dev/bench={ns}")  # fmt: skip
        env.update({
            "TAUGRID_CONTROLLER_LOG_LEVEL": "WARNING",
            "TAUGRID_CONTROLLER_LEASE_NAME": lease,
            "TAUGRID_CONTROLLER_REVIEW_RATE_PER_SOURCE": "100000",
            "TAUGRID_CONTROLLER_REVIEW_BURST_PER_SOURCE": "100000",
            "TAUGRID_CONTROLLER_CONTROLLER_SERVICE_ACCOUNT": CONTROLLER_SA,
            "TAUGRID_CONTROLLER_PEER_TOKEN_FILE": str(peer_file),
            "TAUGRID_CONTROLLER_HEARTBEAT_RELAY": "true" if relay else "false",
            "TAUGRID_CONTROLLER_LEADER_URL": leader_url,
        })  # fmt: skip
        process = subprocess.Popen([sys.executable, "-m", "controller"], env=env, stdout=log,
                                   stderr=subprocess.STDOUT)  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        replicas.append(Replica(process, url))
        await _wait(url)
        if i == 0:
            await asyncio.sleep(2.5)  # it takes the Lease before any follower starts
            leader_url = url
    await asyncio.sleep(1)
    return replicas


async def _offer(
    targets: list[tuple[str, str, bytes]], rate: float, seconds: float
) -> tuple[int, int, float]:
    """Open loop: request i starts at t0 + i / rate, whatever earlier ones take. Returns the
    202s, the other answers, and the seconds it ran."""
    ok = bad = 0
    conn = aiohttp.TCPConnector(limit=256)
    async with aiohttp.ClientSession(connector=conn) as http:

        async def one(url: str, token: str, body: bytes) -> None:
            nonlocal ok, bad
            try:
                async with http.post(
                    f"{url}/v1/heartbeats", data=body,
                    headers={"Authorization": f"Bearer {token}",
                             "Content-Type": "application/json"},
                ) as resp:  # fmt: skip
                    await resp.read()
                    ok, bad = (ok + 1, bad) if resp.status == 202 else (ok, bad + 1)
            except aiohttp.ClientError:
                bad += 1

        tasks = []
        start = time.perf_counter()
        total = int(rate * seconds)
        for i in range(total):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            url, token, body = targets[i % len(targets)]
            tasks.append(asyncio.create_task(one(url, token, body)))
        await asyncio.gather(*tasks)
        return ok, bad, time.perf_counter() - start


def _targets(tokens: dict[str, str], urls: list[str]) -> list[tuple[str, str, bytes]]:
    """The fleet's steady reports, round after round, node i to replica i mod R."""
    nodes = sorted(tokens)
    return [
        (urls[i % len(urls)], tokens[node], _report(node, 10 + r))
        for r in range(ROUNDS)
        for i, node in enumerate(nodes)
    ]


async def _latency(
    http: aiohttp.ClientSession, url: str, node: str, token: str, seq: int, *, fault: bool
) -> float:
    body = _report(node, seq, fault=fault)
    start = time.perf_counter()
    async with http.post(
        f"{url}/v1/heartbeats", data=body,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    ) as resp:  # fmt: skip
        await resp.read()
        if resp.status != 202:
            msg = f"fault report answered {resp.status}"
            raise RuntimeError(msg)
    return time.perf_counter() - start


async def run(nodes: int, rate: float, seconds: float, trials: int, forward: bool) -> None:
    dev, api = await fleetkit.dev_api()
    ns = f"bench-rep-{secrets.token_hex(2)}"
    try:
        tokens = await fleetkit.make_fleet(api, dev, ns, nodes, prefix=f"rep-{ns[-4:]}")
        peer = await _peer_token(api, ns)
        modes = [("relay", True)] + ([("forward", False)] if forward else [])
        print(f"{nodes} nodes, {rate:g} heartbeats/s offered for {seconds:g} s per setup")
        print(
            f"{'mode':<8} {'replicas':>8} {'taken':>7} {'other':>6} {'leader CPU s':>12} "
            f"{'µs/heartbeat':>13} {'vs 1 replica':>12} {'net µs/hb':>13} {'net vs 1':>8}"
        )
        print("  (net: less the leader's CPU with nothing reporting, measured just before)")
        with tempfile.TemporaryDirectory() as tmp:
            peer_file = pathlib.Path(tmp) / "peer.token"
            peer_file.write_text(peer)
            log = (pathlib.Path(tmp) / "controllers.log").open("w")
            for mode, relay in modes:
                base = net_base = None
                for count in (1, 2, 3):
                    replicas = await _start(dev, ns, count, relay=relay, peer_file=peer_file,
                                            log=log)  # fmt: skip
                    try:
                        urls = [r.url for r in replicas]
                        targets = _targets(tokens, urls)
                        # warm-up: every token reviewed once by the replica it posts to
                        await _offer(targets[:nodes], rate, nodes / rate)
                        await asyncio.sleep(1.5)
                        # the leader's own loops, with nothing reporting (per second)
                        idle_from = _cpu_s(replicas[0].process.pid)
                        await asyncio.sleep(IDLE_S)
                        idle = (_cpu_s(replicas[0].process.pid) - idle_from) / IDLE_S
                        before = _cpu_s(replicas[0].process.pid)
                        ok, bad, _ = await _offer(targets[nodes:], rate, seconds)
                        await asyncio.sleep(1.5)  # the last liveness batch
                        cpu = _cpu_s(replicas[0].process.pid) - before
                        per = cpu / max(ok, 1) * 1e6
                        net = max(cpu - idle * (seconds + 1.5), 0.0) / max(ok, 1) * 1e6
                        base = base or per
                        net_base = net_base or net
                        print(f"{mode:<8} {count:>8} {ok:>7} {bad:>6} {cpu:>12.2f} "
                              f"{per:>13.1f} {per / base:>12.2f} {net:>13.1f} "
                              f"{net / net_base if net_base else float('nan'):>8.2f}")  # fmt: skip
                        if count == 2 and relay and trials:
                            await _fault_latency(replicas, tokens, trials, rate)
                    finally:
                        for r in replicas:
                            r.process.terminate()
                        for r in replicas:
                            r.process.wait(timeout=15)
            log.close()
    finally:
        await fleetkit.delete_fleet(api, dev, ns)
        await api.close()


async def _fault_latency(
    replicas: list[Replica], tokens: dict[str, str], trials: int, rate: float
) -> None:
    """Fault reports through the follower and directly, alternating, while the fleet reports."""
    leader, follower = replicas[0].url, replicas[1].url
    node = min(tokens)
    targets = _targets(tokens, [r.url for r in replicas])
    load = asyncio.create_task(_offer(targets, rate, 3600))
    through: dict[str, list[float]] = {"follower": [], "leader": []}
    seq = 1000
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(trials):
                for name, url in (("follower", follower), ("leader", leader)):
                    for fault in (True, False):  # each a change: fault, then its recovery
                        seq += 1
                        took = await _latency(http, url, node, tokens[node], seq, fault=fault)
                        through[name].append(took)
                    await asyncio.sleep(0.05)
    finally:
        load.cancel()
        with_ = [fleetkit.pct(v, 50) for v in through.values()]
        p99 = [fleetkit.pct(v, 99) for v in through.values()]
        print(f"fault → leader (the agent's 202 once the leader took it), {len(through['leader'])}"
              " changes each, the fleet reporting:")  # fmt: skip
        for (name, _), p50, q99 in zip(through.items(), with_, p99, strict=True):
            way = "through the follower" if name == "follower" else "direct to the leader"
            print(f"  {way:<22} p50 {p50:6.2f} ms  p99 {q99:6.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=600)
    parser.add_argument("--rate", type=float, default=300.0, help="heartbeats/s offered")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--trials", type=int, default=50, help="fault reports each way")
    parser.add_argument("--forward", action="store_true",
                        help="also run with the relay off (every heartbeat forwarded)")  # fmt: skip
    args = parser.parse_args()
    asyncio.run(run(args.nodes, args.rate, args.seconds, args.trials, args.forward))


if __name__ == "__main__":
    main()
