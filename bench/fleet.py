"""A whole fleet on one leader: 10,000 nodes reporting, faults while it reports, and bursts.

Needs the dev cluster. `fleetkit.make_fleet` makes N GPU Node objects with an agent pod bound
to each and that pod's token. KWOK does not manage these nodes: no node lease and no status
updates at all (the limit of "leases off or slow"), so the API server's cost is what the
controller makes it do. One controller process leads (the chart's settings; the write budget
the chart ships unless `--rate/--burst` raise it), and an open-loop generator posts one
heartbeat per node per `--interval` (the chart's agent interval is 5 s), each node at its own
phase, at most 64 in flight (a send that finds none free waits and is counted late).

Measured while the fleet reports, side by side in one run:
- the offered and the achieved heartbeat rate, refusals, late sends;
- the leader's CPU (utime + stime from /proc, as a share of one core and per heartbeat) and
  RSS (VmRSS, and per node);
- the quarantine pass cost (`taugrid_quarantine_pass_seconds`, mean, and per judged node);
- fault → taint and cordon visible on a watch, one node at a time (`--trials`), p50/p99;
- a burst: `--burst` nodes fail at once; when the last is quarantined, p50/p99.

`--before CHECKOUT` measures that checkout's controller too, on the same fleet right after
this one's (each on its own slice of nodes for the faults), and prints the two side by side.

Run: `.venv/bin/python -m bench.fleet --nodes 10000 [--interval 5] [--trials 100]
      [--burst 1000] [--rate 100 --write-burst 300] [--settle 30] [--before /path/to/main]`
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import pathlib
import re
import secrets
import subprocess
import sys
import time
from typing import Any

import aiohttp

from bench import fleetkit
from bench import heartbeats as hbench
from bench import quarantine as qbench
from shared import heartbeat
from tests import controllerkit as kit

MAX_IN_FLIGHT = 64
CLK_TCK = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()  # noqa: PTH123, SIM115
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _rss_mb(pid: int) -> float:
    """Resident set size of a process, MB."""
    for line in open(f"/proc/{pid}/status").read().splitlines():  # noqa: PTH123, SIM115
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Generator:
    """One heartbeat per agent per interval, each at its own phase, open loop."""

    def __init__(self, agents: dict[str, kit.Agent], url: str, interval_s: float) -> None:
        self.agents = agents
        self.url = url
        self.interval_s = interval_s
        self.sent = 0
        self.refused = 0
        self.late = 0
        self._slots = asyncio.Semaphore(MAX_IN_FLIGHT)
        self._templates: dict[str, str] = {}

    def _body(self, agent: kit.Agent) -> bytes:
        # The report is rebuilt only when the agent's GPUs change (a fault); the sequence
        # and send time are filled into a cached body, as cheap as a real agent's.
        key = agent.node
        gpus = repr([g.verdict for g in agent.gpus])
        cached = self._templates.get(key)
        if cached is None or not cached.startswith(gpus):
            doc = heartbeat.encode(agent.report(self.interval_s)).decode()
            doc = re.sub(r'"sequence":\d+', '"sequence":@SEQ@', doc)
            doc = re.sub(r'"sentAt":"[^"]+"', '"sentAt":"@SENT@"', doc)
            cached = gpus + "\0" + doc
            self._templates[key] = cached
        agent.sequence += 1
        sent = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + "Z"
        body = cached.split("\0", 1)[1]
        return body.replace("@SEQ@", str(agent.sequence)).replace("@SENT@", sent).encode()

    async def _post(self, http: aiohttp.ClientSession, agent: kit.Agent) -> None:
        try:
            async with http.post(
                f"{self.url}/v1/heartbeats", data=self._body(agent),
                headers={"Authorization": f"Bearer {agent.token}",
                         "Content-Type": "application/json"},
            ) as resp:  # fmt: skip
                await resp.read()
                if resp.status >= 300:
                    self.refused += 1
                else:
                    self.sent += 1
        except aiohttp.ClientError:
            self.refused += 1
        finally:
            self._slots.release()

    async def run(self, http: aiohttp.ClientSession) -> None:
        names = list(self.agents)
        step = self.interval_s / len(names)
        start = time.perf_counter()
        tasks: set[asyncio.Task[None]] = set()
        k = 0
        while True:
            for n, name in enumerate(names):
                due = start + (k * len(names) + n) * step
                delay = due - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                if self._slots.locked():
                    self.late += 1
                await self._slots.acquire()
                t = asyncio.create_task(self._post(http, self.agents[name]))
                tasks.add(t)
                t.add_done_callback(tasks.discard)
            k += 1


async def _wait_seen(seen: dict[str, float], names: list[str], deadline_s: float) -> None:
    deadline = time.perf_counter() + deadline_s
    while any(n not in seen for n in names) and time.perf_counter() < deadline:
        await asyncio.sleep(0.005)


def _start(args: argparse.Namespace, env: dict[str, str], which: str) -> subprocess.Popen[bytes]:
    """This checkout's controller, or (`which == "before"`) the one of `--before`."""
    log_to: Any = subprocess.DEVNULL
    if args.log:
        env = {**env, "TAUGRID_CONTROLLER_LOG_LEVEL": "INFO"}
        log_to = open(f"{args.log}.{which}", "w")  # noqa: PTH123, SIM115
    if which == "before":
        return hbench._start_before(args.before, env, int(env["TAUGRID_CONTROLLER_PORT"]), log_to)
    return subprocess.Popen([sys.executable, "-m", "controller"], env=env,
                            stdout=log_to, stderr=subprocess.STDOUT)  # fmt: skip


async def _warm(http: aiohttp.ClientSession, url: str, nodes: int) -> dict[str, Any]:
    """Wait until a controller has written every node's first GPUHealthy condition (with its
    Event, 45 s for 1,500 nodes at the chart's budget): each measured controller then starts
    on a fleet in its steady state, the first as much as the second."""
    start = time.perf_counter()
    while time.perf_counter() - start < 900:
        with contextlib.suppress(aiohttp.ClientError):
            async with http.get(f"{url}/metrics") as r:
                text = await r.text()
            healthy = fleetkit.metric(text, "taugrid_nodes", 'state="Healthy"')
            written = fleetkit.metric(text, "taugrid_api_writes_total", 'class="node"')
            waiting = fleetkit.metric(text, "taugrid_api_writes_waiting")
            if healthy >= nodes and written >= nodes and waiting == 0:
                return {"warm_up_s": time.perf_counter() - start}
        await asyncio.sleep(0.5)
    return {"warm_up_s": None}


async def _measure(
    args: argparse.Namespace, ctl: subprocess.Popen[bytes], http: aiohttp.ClientSession,
    gen: Generator, *, url: str, agents: dict[str, kit.Agent], names: list[str],
    seen: dict[str, float],
) -> dict[str, Any]:  # fmt: skip
    """One controller's figures: the fleet reporting, then faults one at a time on the first
    `--trials` of `names`, then the next `--burst` of them at once. Refused and late sends
    count from the settled fleet on (not while a controller starts)."""
    out: dict[str, Any] = {}
    await fleetkit.leading(http, url)
    await asyncio.sleep(args.interval + args.settle)  # every node reported, warm
    # ... and the fleet's first writes (a review, a condition and its Event per node: 4,500
    # for 1,500 nodes, 45 s at the chart's budget) are done: the bursts are of a fleet in
    # its steady state, not of one still being written for the first time.
    out["settled_s"] = await qbench._settled(http, url, args.nodes, timeout_s=600)
    refused, late = gen.refused, gen.late
    cpu0, w0 = _cpu_s(ctl.pid), time.perf_counter()
    async with http.get(f"{url}/metrics") as r:
        m0 = await r.text()
    await asyncio.sleep(args.window)
    cpu1, w1 = _cpu_s(ctl.pid), time.perf_counter()
    async with http.get(f"{url}/metrics") as r:
        m1 = await r.text()

    def delta(name: str, labels: str = "") -> float:
        return fleetkit.metric(m1, name, labels) - fleetkit.metric(m0, name, labels)

    beats = delta("taugrid_heartbeats_total", 'outcome="accepted"')
    passes = delta("taugrid_quarantine_pass_seconds_count")
    out.update({
        "offered_per_s": args.nodes / args.interval,
        "achieved_per_s": beats / (w1 - w0),
        "leader_cpu_share": (cpu1 - cpu0) / (w1 - w0),
        "leader_cpu_us_per_heartbeat": 1e6 * (cpu1 - cpu0) / max(beats, 1),
        "leader_rss_mb": _rss_mb(ctl.pid),
        "leader_rss_kb_per_node": 1024 * _rss_mb(ctl.pid) / args.nodes,
        "reviews_per_s": delta("taugrid_api_writes_total", 'class="review"') / (w1 - w0),
        "passes_per_s": passes / (w1 - w0),
        "pass_mean_ms": 1000 * delta("taugrid_quarantine_pass_seconds_sum") / max(passes, 1),
        "pass_us_per_judged_node": 1e6 * delta("taugrid_quarantine_pass_seconds_sum")
        / max(delta("taugrid_quarantine_pass_nodes_sum"), 1),
    })  # fmt: skip
    trials = names[: args.trials]
    lat: list[float] = []
    for v in trials:
        agents[v].fail(0)
        t = time.perf_counter()
        await agents[v].send(http, url, args.interval)
        await _wait_seen(seen, [v], 30)
        if v in seen:
            lat.append(seen[v] - t)
    out["fault_p50_ms"] = fleetkit.pct(lat, 50)
    out["fault_p99_ms"] = fleetkit.pct(lat, 99)
    out["fault_missed"] = len(trials) - len(lat)
    victims = names[args.trials : args.trials + args.burst]
    if victims:
        await qbench._settled(http, url, 0)  # the trials' writes are done, and the budget's
        await asyncio.sleep(args.write_burst / args.rate)  # bucket full again, as in a fleet
        async with http.get(f"{url}/metrics") as r:  # that has been reporting for a while
            m0 = await r.text()
        for v in victims:
            agents[v].fail(0)
        t = time.perf_counter()
        await asyncio.gather(*(agents[v].send(http, url, args.interval) for v in victims))
        await _wait_seen(seen, victims, 120)
        got = sorted(seen[v] - t for v in victims if v in seen)
        out["burst"] = len(victims)
        out["burst_all_s"] = max(got) if len(got) == len(victims) else float("inf")
        out["burst_p50_ms"] = fleetkit.pct(got, 50)
        out["burst_p99_ms"] = fleetkit.pct(got, 99)
        out["burst_missed"] = len(victims) - len(got)
        async with http.get(f"{url}/metrics") as r:
            m1 = await r.text()
        waited = delta("taugrid_api_write_wait_seconds_sum", 'class="node"')
        out["burst_node_writes_budget_wait_mean_ms"] = (
            1000 * waited / max(delta("taugrid_api_write_wait_seconds_count", 'class="node"'), 1)
        )
    out["refused"] = gen.refused - refused
    out["late"] = gen.late - late
    async with http.get(f"{url}/metrics") as r:
        qbench._say_costs(await r.text())
    return out


async def run(args: argparse.Namespace) -> None:
    dev, api = await fleetkit.dev_api()
    ns = f"bench-fleet-{secrets.token_hex(2)}"
    t0 = time.perf_counter()
    tokens = await fleetkit.make_fleet(api, dev, ns, args.nodes, prefix=f"f{secrets.token_hex(2)}")
    made_s = time.perf_counter() - t0
    agents = {n: kit.Agent(n, t) for n, t in tokens.items()}
    port = kit.free_port()
    env = qbench._env(dev, port, ns)
    env.update({
        "TAUGRID_CONTROLLER_API_WRITES_PER_S": str(args.rate),
        "TAUGRID_CONTROLLER_API_WRITE_BURST": str(args.write_burst),
        "TAUGRID_CONTROLLER_HEARTBEAT_MIN_INTERVAL_S": "0.5",
    })  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    seen: dict[str, float] = {}
    stop = asyncio.Event()
    which = ["this", *(["before"] if args.before else [])]
    per = args.trials + args.burst
    if per * len(which) > args.nodes:
        raise SystemExit(f"--nodes must be at least {per * len(which)} for these trials")
    names = list(agents)
    results: dict[str, dict[str, Any]] = {}
    try:
        conn = aiohttp.TCPConnector(limit=MAX_IN_FLIGHT + 8)
        async with aiohttp.ClientSession(connector=conn) as http:
            gen = Generator(agents, url, args.interval)
            loop = asyncio.create_task(gen.run(http))
            watcher = asyncio.create_task(qbench._watch_taints(api, ns, seen, stop))
            warm = _start(args, env, "warm-up")
            try:  # the fleet's first conditions, by a controller not measured
                out = await _warm(http, url, args.nodes)
            finally:
                warm.terminate()
                warm.wait(timeout=30)
            for k, label in enumerate(which):
                ctl = _start(args, env, label)
                try:
                    results[label] = out | await _measure(
                        args, ctl, http, gen, url=url, agents=agents,
                        names=names[k * per : (k + 1) * per], seen=seen,
                    )  # fmt: skip
                finally:
                    ctl.terminate()
                    ctl.wait(timeout=30)
            stop.set()
            for task in (loop, watcher):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
    finally:
        await fleetkit.delete_fleet(api, dev, ns)
        await api.close()
    print(f"fleet of {args.nodes} nodes at a {args.interval:g} s interval, made in {made_s:.1f} s; "
          f"API write budget {args.rate:g}/s burst {args.write_burst}; limits raised for the "
          f"storm; controllers: {', '.join(which)}")  # fmt: skip
    for key in results[which[0]]:
        cells = [results[w].get(key) for w in which]
        text = [f"{v:12.3f}" if isinstance(v, float) else f"{v!s:>12}" for v in cells]
        print(f"  {key:32} {' '.join(text)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument("--settle", type=float, default=20.0)
    parser.add_argument("--window", type=float, default=30.0)
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--burst", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--write-burst", type=int, default=300)
    parser.add_argument("--log", default="", help="controllers' logs to LOG.this, .before")
    parser.add_argument(
        "--before",
        type=pathlib.Path,
        default=None,
        help="also measure the controller of this checkout, on the same fleet",
    )
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
