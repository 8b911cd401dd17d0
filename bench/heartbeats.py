"""Heartbeat ingestion: the controller process against a bare aiohttp handler, side by side.

Needs the dev cluster (`scripts/up` or `taugrid dev up --no-taugrid`). For each fleet size it
creates that many Node objects (not managed by KWOK, so they cost the API server nothing
after creation), one agent pod bound to each and one pod-bound token per node, so every
heartbeat is authenticated exactly as in production (TokenReview once per token, then
cached). It then starts one controller process and one baseline process (a bare aiohttp
handler that only does `json.loads` of the same body), drives both with the same load
generator, and prints throughput, p50/p99 latency, their ratio, and the controller's RSS with
its node watch holding every node.

Run: `.venv/bin/python -m bench.heartbeats --nodes 1000 5000 --seconds 15`
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import pathlib
import secrets
import shutil
import subprocess
import sys
import tempfile
import time

import aiohttp

from bench import fleetkit
from devcluster import stack
from shared import heartbeat
from tests import controllerkit as kit

BASELINE = """
import json, sys
from aiohttp import web
async def handle(request):
    json.loads(await request.read())
    return web.json_response({"accepted": True}, status=202)
app = web.Application(client_max_size=1 << 20)
app.router.add_post("/v1/heartbeats", handle)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
"""


def _heartbeat(node: str, seq: int) -> bytes:
    gpus = [kit.gpu(i, node) for i in range(8)]
    hb = heartbeat.Heartbeat(
        schema_version=1,
        node_name=node,
        boot_id="bench-boot",
        interval_s=10.0,
        sequence=seq,
        sent_at=dt.datetime.now(dt.UTC),
        gpus=gpus,
    )
    return hb.model_dump_json(by_alias=True).encode()


def _bodies(tokens: dict[str, str], rounds: int, start_seq: int) -> list[tuple[str, bytes]]:
    """Pre-serialised (token, body) pairs, node after node, round after round."""
    return [
        (tokens[node], _heartbeat(node, start_seq + r)) for r in range(rounds) for node in tokens
    ]


Result = tuple[float, float, float, int]
"""Requests per second, p50 ms, p99 ms, non-2xx answers."""


async def _drive(
    url: str, requests: list[tuple[str, bytes]], seconds: float, concurrency: int
) -> Result:
    """Send the requests in order from aiohttp workers, wrapping around."""
    latencies: list[float] = []
    errors = 0
    counter = 0
    deadline = time.perf_counter() + seconds
    conn = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=conn) as http:

        async def worker() -> None:
            nonlocal counter, errors
            while time.perf_counter() < deadline:
                token, body = requests[counter % len(requests)]
                counter += 1
                t0 = time.perf_counter()
                async with http.post(
                    f"{url}/v1/heartbeats",
                    data=body,
                    headers={
                        "Authorization": f"Bearer {token}",
                        "Content-Type": "application/json",
                    },
                ) as resp:
                    await resp.read()
                    if resp.status != 202:
                        errors += 1
                latencies.append(time.perf_counter() - t0)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    p50, p99 = fleetkit.pct(latencies, 50), fleetkit.pct(latencies, 99)
    return len(latencies) / elapsed, p50, p99, errors


WRK_SCRIPT = """
local reqs, i = {}, 0
init = function(args)
  for line in io.lines(args[1]) do
    local tab = line:find("\\t")
    reqs[#reqs + 1] = wrk.format("POST", "/v1/heartbeats", {
      ["Authorization"] = "Bearer " .. line:sub(1, tab - 1),
      ["Content-Type"] = "application/json"}, line:sub(tab + 1))
  end
end
request = function() i = i % #reqs + 1; return reqs[i] end
"""
"""wrk's request generator: the same pre-serialised (token, body) pairs, in order, wrapping."""

_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def _ms(text: str) -> float:
    """`1.23ms` / `850.00us` / `1.02s` in milliseconds."""
    for unit in ("us", "ms", "s"):
        if text.endswith(unit):
            return float(text[: -len(unit)]) * _UNITS[unit]
    return float("nan")


def _drive_wrk(
    url: str, requests: list[tuple[str, bytes]], seconds: float, concurrency: int
) -> Result:
    """Drive with wrk (C, one thread): the load generator is no longer the bottleneck."""
    with tempfile.TemporaryDirectory() as tmp:
        lines = pathlib.Path(tmp) / "requests.tsv"
        lines.write_bytes(b"".join(t.encode() + b"\t" + b + b"\n" for t, b in requests))
        script = pathlib.Path(tmp) / "heartbeats.lua"
        script.write_text(WRK_SCRIPT)
        out = subprocess.run(
            ["wrk", "-t1", f"-c{concurrency}", f"-d{int(seconds)}s", "--latency",
             "-s", str(script), f"{url}/v1/heartbeats", "--", str(lines)],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
    rate = p50 = p99 = float("nan")
    errors = 0
    for line in out.splitlines():
        words = line.split()
        if line.startswith("Requests/sec:"):
            rate = float(words[1])
        elif words[:1] == ["50%"]:
            p50 = _ms(words[1])
        elif words[:1] == ["99%"]:
            p99 = _ms(words[1])
        elif line.startswith("Non-2xx or 3xx responses:"):
            errors = int(words[-1])
    return rate, p50, p99, errors


async def _warm(url: str, requests: list[tuple[str, bytes]], concurrency: int) -> None:
    """Send every request once: each node's token is reviewed before timing starts."""
    queue = list(reversed(requests))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as http:

        async def worker() -> None:
            while queue:
                token, body = queue.pop()
                async with http.post(
                    f"{url}/v1/heartbeats",
                    data=body,
                    headers={
                        "Authorization": f"Bearer {token}",
                        "Content-Type": "application/json",
                    },
                ) as resp:
                    await resp.read()

        await asyncio.gather(*(worker() for _ in range(concurrency)))


def _rss_mb(pid: int) -> float:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def _wait(url: str) -> None:
    async with aiohttp.ClientSession() as http:
        for _ in range(300):
            try:
                async with http.get(f"{url}/readyz") as resp:
                    if resp.status in (200, 404):
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    msg = f"{url} never became ready"
    raise RuntimeError(msg)


async def run(sizes: list[int], seconds: float, concurrency: int, generator: str) -> None:
    dev, api = await fleetkit.dev_api()
    header = ("nodes", "server", "hb/s", "p50 ms", "p99 ms", "errors", "RSS MB")
    print("{:>6} {:<11} {:>8} {:>8} {:>8} {:>7} {:>7}".format(*header))
    try:
        for n in sizes:
            ns = f"bench-hb-{n}-{secrets.token_hex(2)}"
            tokens = await fleetkit.make_fleet(api, dev, ns, n, prefix=f"hb-{n}")
            port, base_port = kit.free_port(), kit.free_port()
            env = stack.controller_env(dev, port=port, namespace=ns, identity=f"bench-{n}",
                                       node_selector=f"taugrid.dev/bench={ns}")  # fmt: skip
            env["TAUGRID_CONTROLLER_LOG_LEVEL"] = "WARNING"
            with tempfile.TemporaryDirectory() as tmp:
                ctl_log = pathlib.Path(tmp) / "controller.log"
                with ctl_log.open("w") as log:
                    ctl = subprocess.Popen([sys.executable, "-m", "controller"], env=env,
                                           stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
                    base = subprocess.Popen([sys.executable, "-c", BASELINE, str(base_port)])
                try:
                    await _wait(f"http://127.0.0.1:{port}")
                    await _wait(f"http://127.0.0.1:{base_port}")
                    await asyncio.sleep(3)  # the lease is acquired and the node cache synced
                    # warm-up: one heartbeat per node fills the token cache (one TokenReview each)
                    await _warm(f"http://127.0.0.1:{port}", _bodies(tokens, 1, 1), concurrency)
                    requests = _bodies(tokens, max(1, 40_000 // n), 10)
                    results: dict[str, Result] = {}
                    for name, url in (("baseline", f"http://127.0.0.1:{base_port}"),
                                      ("controller", f"http://127.0.0.1:{port}")):  # fmt: skip
                        if generator == "wrk":
                            results[name] = await asyncio.to_thread(
                                _drive_wrk, url, requests, seconds, concurrency
                            )
                        else:
                            results[name] = await _drive(url, requests, seconds, concurrency)
                    rss = _rss_mb(ctl.pid)
                    for name, (rate, p50, p99, errs) in results.items():
                        shown_rss = f"{rss:7.0f}" if name == "controller" else f"{'':>7}"
                        row = f"{n:>6} {name:<11} {rate:8.0f} {p50:8.2f} {p99:8.2f} {errs:>7}"
                        print(f"{row} {shown_rss}")
                    ratio = results["controller"][0] / results["baseline"][0]
                    print(
                        f"{n:>6} ratio       {ratio:8.2f}   (controller throughput / bare handler)"
                    )
                finally:
                    for p in (ctl, base):
                        p.terminate()
                        p.wait(timeout=15)
            await fleetkit.delete_fleet(api, dev, ns)
    finally:
        await api.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument(
        "--generator", choices=["wrk", "aiohttp"], default="wrk" if shutil.which("wrk") else
        "aiohttp", help="load generator: wrk (C; Debian's wrk) or Python aiohttp workers",
    )  # fmt: skip
    args = parser.parse_args()
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    print(f"load generator: {args.generator}")
    asyncio.run(run(args.nodes, args.seconds, args.concurrency, args.generator))


if __name__ == "__main__":
    main()
