"""Agent cost at 8 fake GPUs, `/metrics` latency and Xid-injection-to-heartbeat latency, with a
baseline revision measured side by side in the same run.

Run: `python -m bench.agent [--duration 60] [--injections 100] [--baseline REV]`. It starts
`python -m agent` of this tree on the fake NVML library (LD_LIBRARY_PATH), 1 s gauge tier,
posting heartbeats to a receiver in this process, with and without pod attribution: with it,
a PodResources server of its own (the kubelet's proto over a Unix socket, served by grpcio)
gives each of the agent's 8 GPUs a pod, so every GPU series carries `pod`, `namespace` and
`container`. With `--baseline REV` the agent of that git revision (extracted with `git
archive`, run from the extraction) runs at the same time, also without and with attribution,
each agent on its own fake library instance: all see the same machine load, and the table
prints every column and the ratios of this tree to the baseline, attribution off and on.
`--python` runs this tree's agents on another interpreter (a venv made with `uv sync
--no-dev`, as in the image), `--baseline-python` the baseline's (its own revision's
`uv sync --no-dev`: its dependency set may differ). Against the fake the CPU figure is
indicative; the one that counts is on a real GPU machine (DESIGN.md section 9).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import pathlib
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp import web

from devcluster import fakenvml, podresources

REPO = pathlib.Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _proc_stat(pid: int) -> tuple[float, float]:
    """Return (CPU seconds, RSS MiB) of a process from /proc."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu_s = (int(fields[11]) + int(fields[12])) / ticks
    rss_pages = int(pathlib.Path(f"/proc/{pid}/statm").read_text().split()[1])
    return cpu_s, rss_pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def extract(rev: str, into: pathlib.Path) -> pathlib.Path:
    """Write the agent and shared packages of a git revision into `into`; return it."""
    into.mkdir(parents=True, exist_ok=True)
    archive = into / "tree.tar"
    subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", "-o", str(archive), rev,
         "agent", "shared"],
        check=True,
    )  # fmt: skip
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    archive.unlink()
    return into


@dataclasses.dataclass
class Agent:
    """One agent process under measurement and what it sent."""

    label: str
    node: str
    port: int
    proc: subprocess.Popen[bytes]
    control: fakenvml.SocketControl
    arrivals: list[tuple[float, dict[str, Any]]] = dataclasses.field(default_factory=list)
    got: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    cpu_pct: float = 0.0
    rss_mib: float = 0.0
    metrics_ms: list[float] = dataclasses.field(default_factory=list)
    metrics_bytes: int = 0
    pod_series: int = 0
    xid_ms: list[float] = dataclasses.field(default_factory=list)


def start_agent(  # noqa: PLR0917 - one call site, each argument named there
    label: str,
    tree: pathlib.Path,
    work: pathlib.Path,
    lib: pathlib.Path,
    receiver_port: int,
    pods: tuple[pathlib.Path, pathlib.Path] | None,
    python: str = sys.executable,
) -> Agent:
    """Start `python -m agent` from `tree` on its own fake library and files."""
    work.mkdir(parents=True)
    (work / "boot").write_text("bench\n")
    (work / "kmsg").write_text("")
    port = _free_port()
    node = f"bench-{work.name}"  # a valid node name whatever the label says
    env = {
        **os.environ,
        **fakenvml.agent_env(lib, work / "fake.sock", seed=label),
        "PYTHONPATH": str(tree),
        "TAUGRID_AGENT_NODE_NAME": node,
        "TAUGRID_AGENT_LISTEN_HOST": "127.0.0.1",
        "TAUGRID_AGENT_PORT": str(port),
        "TAUGRID_AGENT_CONTROLLER_URL": f"http://127.0.0.1:{receiver_port}",
        "TAUGRID_AGENT_TOKEN_PATH": str(work / "token"),
        "TAUGRID_AGENT_BOOT_ID_PATH": str(work / "boot"),
        "TAUGRID_AGENT_STATE_PATH": str(work / "state.json"),
        "TAUGRID_AGENT_KMSG_PATH": str(work / "kmsg"),
        "TAUGRID_AGENT_DCGM_ENABLED": "false",
        "TAUGRID_AGENT_AUTH_ENABLED": "false",
        "TAUGRID_AGENT_SHUTDOWN_GRACE_S": "0",
        "TAUGRID_AGENT_LOG_LEVEL": "WARNING",
        "TAUGRID_AGENT_APP_XID_DISPLAY_S": "5",
    }
    if pods is not None:
        client_dir, sock = pods
        env["TAUGRID_AGENT_PODRESOURCES_SOCKET"] = str(sock)
        env["TAUGRID_AGENT_PODRESOURCES_CLIENT_DIR"] = str(client_dir)
    else:
        env["TAUGRID_AGENT_POD_LABELS"] = "false"  # as the chart's agent.podResources.enabled
    proc = subprocess.Popen([python, "-m", "agent"], env=env, cwd=tree, stdout=subprocess.DEVNULL)
    return Agent(label, node, port, proc, fakenvml.SocketControl(work / "fake.sock"))


async def wait_ready(session: aiohttp.ClientSession, agent: Agent, pods: bool) -> None:
    """Until events are registered for 8 GPUs (and, with attribution, pods are mapped)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            async with session.get(f"http://127.0.0.1:{agent.port}/v1/gpus") as resp:
                if resp.status == 200:
                    doc = await resp.json()
                    mapped = sum(1 for g in doc["gpus"] if g.get("pods"))
                    if doc["nvml"]["eventsRegistered"] == 8 and (not pods or mapped == 8):
                        return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.2)
    msg = f"{agent.label} agent did not get ready"
    raise RuntimeError(msg)


async def main(
    duration_s: float,
    injections: int,
    baseline: str | None,
    python: str = sys.executable,
    baseline_python: str | None = None,
) -> None:
    """Run the measurements, side by side when a baseline revision is given."""
    lib = fakenvml.build()
    client_dir = podresources.build()
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="bench-agent-", dir="/tmp"))
    agents: list[Agent] = []
    kubelets: dict[str, podresources.FakeKubelet] = {}

    async def heartbeats(request: web.Request) -> web.Response:
        body = await request.json()
        for agent in agents:
            if body["nodeName"] == agent.node:
                agent.arrivals.append((time.perf_counter(), body))
                agent.got.set()
        return web.json_response({})

    rapp = web.Application()
    rapp.router.add_post("/v1/heartbeats", heartbeats)
    runner = web.AppRunner(rapp)
    await runner.setup()
    rport = _free_port()
    await web.TCPSite(runner, "127.0.0.1", rport).start()
    try:
        # (label, tree, pod attribution on, interpreter): attribution off isolates its cost.
        trees = [("after, no pods", REPO, False, python), ("after", REPO, True, python)]
        if baseline is not None:
            base = extract(baseline, tmp / "baseline")
            base_python = baseline_python or python
            trees[:0] = [
                (f"before ({baseline}), no pods", base, False, base_python),
                (f"before ({baseline})", base, True, base_python),
            ]
        for i, (label, tree, on, interpreter) in enumerate(trees):
            pods = None
            if on:
                kubelet = podresources.FakeKubelet(client_dir, tmp / f"kubelet{i}.sock")
                await kubelet.start()
                kubelets[label] = kubelet
                pods = (client_dir, kubelet.socket)
            agents.append(
                start_agent(label, tree, tmp / f"agent{i}", lib, rport, pods, interpreter)
            )
        async with aiohttp.ClientSession() as session:
            for agent in agents:
                await wait_ready(session, agent, pods=False)
            # Every GPU of an attributing agent's fake gets a pod of its own.
            for label, kubelet in kubelets.items():
                agent = next(a for a in agents if a.label == label)
                async with session.get(f"http://127.0.0.1:{agent.port}/v1/gpus") as resp:
                    uuids = [g["uuid"] for g in (await resp.json())["gpus"]]
                kubelet.pods = [
                    ("team-a", f"train-{i}", [("trainer", [("nvidia.com/gpu", [u])], [])])
                    for i, u in enumerate(uuids)
                ]
                await wait_ready(session, agent, pods=True)
            # 1. Cost over the duration, steady state, all at once.
            start = {a.label: _proc_stat(a.proc.pid)[0] for a in agents}
            t0 = time.monotonic()
            await asyncio.sleep(duration_s)
            elapsed = time.monotonic() - t0
            for agent in agents:
                cpu, agent.rss_mib = _proc_stat(agent.proc.pid)
                agent.cpu_pct = 100 * (cpu - start[agent.label]) / elapsed
            # 2. /metrics latency, requests alternating between the agents.
            for _ in range(200):
                for agent in agents:
                    s = time.perf_counter()
                    async with session.get(f"http://127.0.0.1:{agent.port}/metrics") as resp:
                        body = await resp.read()
                    agent.metrics_ms.append(1000 * (time.perf_counter() - s))
                    agent.metrics_bytes = len(body)
                    agent.pod_series = body.count(b'pod="')
            # 3. Xid injection -> heartbeat sent with the new verdict. Xid 13 turns the GPU's
            #    action to RestartApp for the 5 s display window; round-robin over 8 GPUs every
            #    1.2 s makes every injection a change that triggers an immediate heartbeat.
            for i in range(injections):
                await asyncio.sleep(1.2)
                for agent in agents:
                    await inject(agent, i % 8)
        print(f"agent at 8 fake GPUs, 1 s tier, {duration_s:g} s steady state, side by side,")
        print(
            f"interpreter {python}"
            + (f", baseline's {baseline_python}:" if baseline_python else ":")
        )
        rows: list[tuple[str, Callable[[Agent], float], str]] = [
            ("CPU, % of one core", lambda a: a.cpu_pct, "{:.2f}"),
            ("RSS, MiB", lambda a: a.rss_mib, "{:.1f}"),
            ("/metrics p50, ms", lambda a: statistics.median(a.metrics_ms), "{:.2f}"),
            ("/metrics p99, ms", lambda a: _pct(a.metrics_ms, 0.99), "{:.2f}"),
            ("/metrics body, bytes", lambda a: a.metrics_bytes, "{:.0f}"),
            ("series with pod labels", lambda a: a.pod_series, "{:.0f}"),
            ("Xid -> heartbeat p50, ms", lambda a: statistics.median(a.xid_ms), "{:.1f}"),
            ("Xid -> heartbeat p99, ms", lambda a: _pct(a.xid_ms, 0.99), "{:.1f}"),
        ]
        side = baseline is not None
        header = " | ".join(a.label for a in agents)
        ratios = " after/before, no pods | after/before |" if side else ""
        print(f"| what | {header} |{ratios}")
        for name, read, fmt in rows:
            values = [read(a) for a in agents]
            cells = " | ".join(fmt.format(v) for v in values)
            # Columns: before off, before on, after off, after on.
            pairs = [(values[2], values[0]), (values[3], values[1])] if side else []
            ratio = "".join(f" {a / b:.2f} |" if b else " - |" for a, b in pairs)
            print(f"| {name} | {cells} |{ratio}")
        print(f"(Xid injections: {len(agents[-1].xid_ms)} per agent)")
    finally:
        for agent in agents:
            agent.proc.send_signal(signal.SIGTERM)
        for agent in agents:
            agent.proc.wait(30)
        for kubelet in kubelets.values():
            await kubelet.stop()
        await runner.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)


async def inject(agent: Agent, gpu: int) -> None:
    """Inject Xid 13 on one GPU and time the heartbeat that carries its RestartApp."""
    agent.got.clear()
    mark = len(agent.arrivals)
    s = time.perf_counter()
    await asyncio.to_thread(agent.control.xid, gpu, 13)
    while True:
        await asyncio.wait_for(agent.got.wait(), 30)
        agent.got.clear()
        hit = [
            t
            for t, b in agent.arrivals[mark:]
            if any(g["index"] == gpu and g["action"] == "RestartApp" for g in b["gpus"])
        ]
        if hit:
            agent.xid_ms.append(1000 * (hit[0] - s))
            return


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of steady state")
    parser.add_argument("--injections", type=int, default=100, help="Xid injections (>= 100)")
    parser.add_argument("--baseline", help="git revision to measure side by side (e.g. main)")
    parser.add_argument(
        "--python",
        default=sys.executable,
        help="interpreter of the agents (e.g. a venv made with `uv sync --no-dev`, as the image)",
    )
    parser.add_argument(
        "--baseline-python",
        help="interpreter of the baseline's agents (its own `uv sync --no-dev`; --python if unset)",
    )
    args = parser.parse_args()
    asyncio.run(
        main(args.duration, args.injections, args.baseline, args.python, args.baseline_python)
    )
