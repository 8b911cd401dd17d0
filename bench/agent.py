"""Agent cost at 8 fake GPUs, `/metrics` latency, and Xid-injection-to-heartbeat latency.

Run: `python -m bench.agent [--duration 60] [--injections 100]`. It starts `python -m agent` on
the fake NVML library (LD_LIBRARY_PATH), with the 1 s gauge tier, posting heartbeats to a
receiver in this process. Against the fake the CPU figure is indicative; the one that counts is on
a real GPU machine (DESIGN.md section 9).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import aiohttp
from aiohttp import web

from devcluster import fakenvml


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


def _start_agent(env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "agent"], env=env, stdout=subprocess.DEVNULL)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main(duration_s: float, injections: int) -> None:
    """Run the three measurements and print them."""
    lib = fakenvml.build()
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="bench-agent-"))
    arrivals: list[tuple[float, dict[str, Any]]] = []
    got = asyncio.Event()

    async def heartbeats(request: web.Request) -> web.Response:
        arrivals.append((time.perf_counter(), await request.json()))
        got.set()
        return web.json_response({})

    rapp = web.Application()
    rapp.router.add_post("/v1/heartbeats", heartbeats)
    runner = web.AppRunner(rapp)
    await runner.setup()
    rport = _free_port()
    await web.TCPSite(runner, "127.0.0.1", rport).start()

    port = _free_port()
    (tmp / "boot").write_text("bench\n")
    (tmp / "kmsg").write_text("")
    env = {
        **os.environ,
        **fakenvml.agent_env(lib, tmp / "fake.sock"),
        "TAUGRID_AGENT_NODE_NAME": "bench-node",
        "TAUGRID_AGENT_LISTEN_HOST": "127.0.0.1",
        "TAUGRID_AGENT_PORT": str(port),
        "TAUGRID_AGENT_CONTROLLER_URL": f"http://127.0.0.1:{rport}",
        "TAUGRID_AGENT_TOKEN_PATH": str(tmp / "token"),
        "TAUGRID_AGENT_BOOT_ID_PATH": str(tmp / "boot"),
        "TAUGRID_AGENT_STATE_PATH": str(tmp / "state.json"),
        "TAUGRID_AGENT_KMSG_PATH": str(tmp / "kmsg"),
        "TAUGRID_AGENT_DCGM_ENABLED": "false",
        "TAUGRID_AGENT_AUTH_ENABLED": "false",
        "TAUGRID_AGENT_SHUTDOWN_GRACE_S": "0",
        "TAUGRID_AGENT_LOG_LEVEL": "WARNING",
        "TAUGRID_AGENT_APP_XID_DISPLAY_S": "5",
    }
    proc = _start_agent(env)
    control = fakenvml.SocketControl(tmp / "fake.sock")
    try:
        async with aiohttp.ClientSession() as session:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    async with session.get(f"http://127.0.0.1:{port}/v1/gpus") as resp:
                        if (
                            resp.status == 200
                            and (await resp.json())["nvml"]["eventsRegistered"] == 8
                        ):
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.2)
            # 1. Cost over the duration, steady state.
            cpu0, _ = _proc_stat(proc.pid)
            t0 = time.monotonic()
            await asyncio.sleep(duration_s)
            cpu1, rss = _proc_stat(proc.pid)
            cpu_pct = 100 * (cpu1 - cpu0) / (time.monotonic() - t0)
            # 2. /metrics latency.
            lat: list[float] = []
            for _ in range(200):
                s = time.perf_counter()
                async with session.get(f"http://127.0.0.1:{port}/metrics") as resp:
                    await resp.read()
                lat.append(time.perf_counter() - s)
            # 3. Xid injection -> heartbeat sent with the new verdict. Xid 13 turns the GPU's action
            #    to RestartApp for the 5 s display window; injecting round-robin over 8 GPUs every
            #    1.2 s makes every injection a change that triggers an immediate heartbeat.
            xid_lat: list[float] = []
            for i in range(injections):
                await asyncio.sleep(1.2)
                got.clear()
                mark = len(arrivals)
                s = time.perf_counter()
                await asyncio.to_thread(control.xid, i % 8, 13)
                while True:
                    await asyncio.wait_for(got.wait(), 30)
                    got.clear()
                    hit = [
                        t
                        for t, b in arrivals[mark:]
                        if any(
                            g["index"] == i % 8 and g["action"] == "RestartApp" for g in b["gpus"]
                        )
                    ]
                    if hit:
                        xid_lat.append(hit[0] - s)
                        break
        print(f"agent at 8 fake GPUs, 1 s tier, {duration_s:g} s:")
        print(f"  CPU {cpu_pct:.2f} % of one core, RSS {rss:.1f} MiB")
        print(
            f"  /metrics latency over {len(lat)}: p50 {1000 * statistics.median(lat):.2f} ms, "
            f"p99 {1000 * _pct(lat, 0.99):.2f} ms"
        )
        print(
            f"  Xid injection -> heartbeat sent over {len(xid_lat)}: "
            f"p50 {1000 * statistics.median(xid_lat):.1f} ms, "
            f"p99 {1000 * _pct(xid_lat, 0.99):.1f} ms"
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        await runner.cleanup()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of steady state")
    parser.add_argument("--injections", type=int, default=100, help="Xid injections (>= 100)")
    args = parser.parse_args()
    asyncio.run(main(args.duration, args.injections))
