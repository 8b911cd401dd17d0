"""Heartbeat ingestion: the controller process against a bare aiohttp handler, side by side.

Needs the dev cluster (`scripts/up` or `taugrid dev up --no-taugrid`). For each fleet size it
creates that many Node objects (not managed by KWOK, so they cost the API server nothing
after creation), one agent pod bound to each and one pod-bound token per node, so every
heartbeat is authenticated exactly as in production (TokenReview once per token, then
cached). It then starts one controller process and one baseline process (a bare aiohttp
handler that only does `json.loads` of the same body), drives both with the same load
generator, and prints throughput, p50/p99 latency, their ratio, and the controller's RSS with
its node watch holding every node.

Two loads, each run against both servers one after the other:

- closed loop (wrk, 64 connections): each connection sends its next request when the last
  is answered, so it measures throughput; its latency is mostly its own queue (Little's law);
- open loop (vegeta, `--rate` requests per second, whatever the answers take): the latency
  a fleet of that size sees at that offered rate (1,000/s is 10,000 nodes at a 10 s interval).
  vegeta is built from the Go proxy into a cache outside the checkout:
  `GOBIN=~/.cache/taugrid/tools GOFLAGS=-mod=mod go install github.com/tsenart/vegeta/v12@v12.13.0`
  (or point `--vegeta` at one).

Run: `.venv/bin/python -m bench.heartbeats --nodes 1000 5000 --seconds 15 --rate 1000`
(`--profile PATH`: this checkout's controller runs under cProfile, its stats written to
PATH.N, N the fleet size, when it stops; its figures are then the profiler's, not a
comparison.)
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import dataclasses
import datetime as dt
import json
import os
import pathlib
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from http import HTTPStatus
from typing import IO

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
    return heartbeat.encode(hb)


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


def _drive_vegeta(
    vegeta: str, url: str, requests: list[tuple[str, bytes]], seconds: float, rate: int
) -> Result:
    """Drive at a constant offered rate with vegeta (open loop): requests start on schedule
    whether or not earlier ones were answered, so the latency is what a fleet sees."""
    with tempfile.TemporaryDirectory() as tmp:
        targets = pathlib.Path(tmp) / "targets.jsonl"
        with targets.open("w") as out:
            for token, body in requests:
                target = {
                    "method": "POST", "url": f"{url}/v1/heartbeats",
                    "header": {"Authorization": [f"Bearer {token}"],
                               "Content-Type": ["application/json"]},
                    "body": base64.b64encode(body).decode(),
                }  # fmt: skip
                out.write(json.dumps(target) + "\n")
        attack = subprocess.run(
            [vegeta, "attack", "-format=json", f"-targets={targets}", f"-rate={rate}/1s",
             f"-duration={int(seconds)}s", "-timeout=10s"],
            capture_output=True, check=True,
        )  # fmt: skip
        report = subprocess.run(
            [vegeta, "report", "-type=json"], input=attack.stdout, capture_output=True, check=True
        )
    data = json.loads(report.stdout)
    ok = data["status_codes"].get("202", 0)
    if ok < data["requests"]:
        print(f"  {url}: answers {data['status_codes']}; errors {(data['errors'] or [])[:3]}")
        encoded = subprocess.run([vegeta, "encode", "--to", "json"], input=attack.stdout,
                                 capture_output=True, check=True).stdout  # fmt: skip
        for line in encoded.splitlines():
            answer = json.loads(line)
            if answer["code"] != HTTPStatus.ACCEPTED:
                body = base64.b64decode(answer.get("body") or "")[:300]
                print(f"  first refusal: {answer['code']} {answer.get('error')!r} {body!r}")
                break
    return (
        data["throughput"],
        data["latencies"]["50th"] / 1e6,
        data["latencies"]["99th"] / 1e6,
        data["requests"] - ok,
    )


def _vegeta(given: str) -> str | None:
    for candidate in (given, shutil.which("vegeta"),
                      str(pathlib.Path.home() / ".cache/taugrid/tools/vegeta")):  # fmt: skip
        if candidate and pathlib.Path(candidate).is_file():
            return candidate
    return None


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


REPORT_EVERY_S = 5.0
"""How often `_ready` has every node report while it waits (the bodies say 10 s)."""
MEASURED_SEQ = 1_000_000
"""The sequence the measured bodies start from: after every one `_ready` sent."""


async def _ready(url: str, tokens: dict[str, str], concurrency: int, limit_s: float = 300.0
                 ) -> float:  # fmt: skip
    """Have every node report once (each token is reviewed then, before any timing), and
    keep the fleet reporting every `REPORT_EVERY_S` as a fleet does, until the controller's
    writes for it are done (the first report of each node writes its condition and an
    Event, a few dozen nodes a pass): `taugrid_api_writes_total` (the lease's aside)
    unchanged and nothing waiting, three looks running. Every node reports once more at the
    end. Return the seconds it took. Its steady ingestion is what is measured, not its
    start, and no node has gone silent meanwhile."""
    started = time.monotonic()
    seq = 1
    await _warm(url, _bodies(tokens, 1, seq), concurrency)
    reported = time.monotonic()
    last, quiet = -1.0, 0
    async with aiohttp.ClientSession() as http:
        while time.monotonic() - started < limit_s:
            if time.monotonic() - reported >= REPORT_EVERY_S:
                seq += 1
                await _warm(url, _bodies(tokens, 1, seq), concurrency)
                reported = time.monotonic()
            async with http.get(f"{url}/metrics") as resp:
                text = await resp.text()
            writes = waiting = 0.0
            for line in text.splitlines():
                if line.startswith("taugrid_api_writes_total") and 'class="lease"' not in line:
                    writes += float(line.rsplit(" ", 1)[1])  # the lease's renewals go on
                elif line.startswith("taugrid_api_writes_waiting"):
                    waiting += float(line.rsplit(" ", 1)[1])
            quiet = quiet + 1 if writes == last and not waiting else 0
            if quiet >= 3:
                break
            last = writes
            await asyncio.sleep(1.0)
    await _warm(url, _bodies(tokens, 1, seq + 1), concurrency)
    return time.monotonic() - started


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


@dataclasses.dataclass(frozen=True)
class _Plan:
    """What every server gets: the same fleet, bodies and loads."""

    tokens: dict[str, str]
    requests: list[tuple[str, bytes]]
    seconds: float
    concurrency: int
    generator: str
    rate: int
    vegeta: str | None


async def _measure(plan: _Plan, port: int, load: str, name: str) -> Result:
    """One load against one server."""
    url = f"http://127.0.0.1:{port}"
    if name != "baseline":
        # the cached reviews last 60 s (authCacheTtlS) and every node posts from one address
        # here: review them all again first
        await _warm(url, _bodies(plan.tokens, 1, 1), plan.concurrency)
    if load.startswith("open") and plan.vegeta:
        return await asyncio.to_thread(
            _drive_vegeta, plan.vegeta, url, plan.requests, plan.seconds, plan.rate
        )
    if plan.generator == "wrk":
        return await asyncio.to_thread(
            _drive_wrk, url, plan.requests, plan.seconds, plan.concurrency
        )
    return await _drive(url, plan.requests, plan.seconds, plan.concurrency)


def _start_before(
    checkout: pathlib.Path, env: dict[str, str], port: int, log: IO[str]
) -> subprocess.Popen[bytes]:
    """The controller of another checkout (its own `.venv`), on the same port and fleet, under
    a lease of its own (the one just stopped may still hold the first)."""
    lease = env.get("TAUGRID_CONTROLLER_LEASE_NAME", "taugrid-controller")
    env = {**env, "TAUGRID_CONTROLLER_LEASE_NAME": f"{lease}-before"}
    env["PYTHONPATH"] = str(checkout)
    python = str(checkout / ".venv/bin/python")
    return subprocess.Popen([python, "-m", "controller"], env=env, cwd=checkout, stdout=log,
                            stderr=subprocess.STDOUT)  # fmt: skip


async def run(
    sizes: list[int], seconds: float, concurrency: int, generator: str, *, rate: int,
    vegeta: str | None, before: pathlib.Path | None, profile: str = "",
) -> None:  # fmt: skip
    dev, api = await fleetkit.dev_api()
    header = ("nodes", "load", "server", "hb/s", "p50 ms", "p99 ms", "errors", "RSS MB")
    print("{:>6} {:<12} {:<11} {:>8} {:>8} {:>8} {:>7} {:>7}".format(*header))
    try:
        for n in sizes:
            ns = f"bench-hb-{n}-{secrets.token_hex(2)}"
            tokens = await fleetkit.make_fleet(api, dev, ns, n, prefix=f"hb-{n}")
            port, base_port = kit.free_port(), kit.free_port()
            env = stack.controller_env(dev, port=port, namespace=ns, identity=f"bench-{n}",
                                       node_selector=f"taugrid.dev/bench={ns}")  # fmt: skip
            env["TAUGRID_CONTROLLER_LOG_LEVEL"] = "WARNING"
            # Every stand-in agent posts from 127.0.0.1 here, where a fleet's agents each have
            # their own pod IP: the per-address budget of reviews of unseen tokens (5/s) would
            # answer most of the fleet 429 each time its 60 s cached reviews run out.
            env["TAUGRID_CONTROLLER_REVIEW_RATE_PER_SOURCE"] = str(max(1000, n))
            env["TAUGRID_CONTROLLER_REVIEW_BURST_PER_SOURCE"] = str(max(1000, n))
            with tempfile.TemporaryDirectory() as tmp:
                ctl_log = pathlib.Path(tmp) / "controller.log"
                log = ctl_log.open("w")
                profiled = ["-m", "cProfile", "-o", f"{profile}.{n}"] if profile else []
                ctl = subprocess.Popen([sys.executable, *profiled, "-m", "controller"], env=env,
                                       stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
                base = subprocess.Popen([sys.executable, "-c", BASELINE, str(base_port)])
                try:
                    await _wait(f"http://127.0.0.1:{port}")
                    await _wait(f"http://127.0.0.1:{base_port}")
                    await asyncio.sleep(3)  # the lease is acquired and the node cache synced
                    # warm-up: the token cache filled (one TokenReview each), the writes of
                    # the fleet's first reports done, the fleet reporting meanwhile
                    took = await _ready(f"http://127.0.0.1:{port}", tokens, concurrency)
                    print(f"# controller: its first reports' writes done in {took:.0f} s")
                    rounds = max(1, 40_000 // n)
                    requests = _bodies(tokens, rounds, MEASURED_SEQ)
                    closed = f"closed {generator}"
                    loads: list[str] = [closed]
                    if rate and vegeta:
                        loads.append(f"open {rate}/s")
                    results: dict[tuple[str, str], Result] = {}

                    plan = _Plan(tokens, requests, seconds, concurrency, generator, rate,
                                 vegeta)  # fmt: skip
                    for load in loads:
                        # The controller first, right after its fleet's first writes are
                        # done: a baseline run first would leave its nodes silent for longer.
                        for name, at in (("controller", port), ("baseline", base_port)):
                            results[load, name] = await _measure(plan, at, load, name)
                    rss = {"controller": _rss_mb(ctl.pid)}
                    if before:
                        # the same fleet, the same loads, the controller of another checkout
                        ctl.terminate()
                        ctl.wait(timeout=15)
                        ctl = _start_before(before, env, port, log)
                        await _wait(f"http://127.0.0.1:{port}")
                        await asyncio.sleep(3)
                        took = await _ready(f"http://127.0.0.1:{port}", tokens, concurrency)
                        print(f"# before: its first reports' writes done in {took:.0f} s")
                        # the same bodies, sent now (their sentAt within the skew window)
                        plan = dataclasses.replace(
                            plan, requests=_bodies(tokens, rounds, MEASURED_SEQ)
                        )
                        for load in loads:
                            results[load, "before"] = await _measure(plan, port, load, "before")
                        rss["before"] = _rss_mb(ctl.pid)
                    servers = ["baseline", "controller", *(["before"] if before else [])]
                    for load in loads:
                        for name in servers:
                            hbs, p50, p99, errs = results[load, name]
                            shown = f"{rss[name]:7.0f}" if name in rss else f"{'':>7}"
                            row = f"{n:>6} {load:<12} {name:<11} {hbs:8.0f} {p50:8.2f} {p99:8.2f}"
                            print(f"{row} {errs:>7} {shown}")
                        b = results[load, "baseline"]
                        for name in servers[1:]:
                            c = results[load, name]
                            if load == closed:
                                print(f"{n:>6} {load:<12} {name + '/bare':<11} {c[0] / b[0]:8.2f}"
                                      "   (throughput over the bare handler's)")  # fmt: skip
                            else:
                                lat = f"{c[1] / b[1]:8.2f} {c[2] / b[2]:8.2f}"
                                print(f"{n:>6} {load:<12} {name + '/bare':<11} {'':>8} {lat}"
                                      "   (latency over the bare handler's)")  # fmt: skip
                finally:
                    for p in (ctl, base):
                        p.terminate()
                        p.wait(timeout=15)
                    log.close()
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
    parser.add_argument(
        "--rate",
        type=int,
        default=1000,
        help="open loop: offered heartbeats per second (vegeta); 0 skips it",
    )
    parser.add_argument("--vegeta", default="", help="the vegeta binary (default: PATH, then"
                        " ~/.cache/taugrid/tools/vegeta)")  # fmt: skip
    parser.add_argument(
        "--profile",
        default="",
        help="run this checkout's controller under cProfile, stats to PATH.N",
    )
    parser.add_argument("--before", type=pathlib.Path, default=None,
                        help="also measure the controller of this checkout (e.g. main), after"
                        " this one, on the same fleet and loads")  # fmt: skip
    args = parser.parse_args()
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    vegeta = _vegeta(args.vegeta)
    print(
        f"closed loop: {args.generator}, {args.concurrency} connections; open loop: "
        + (f"vegeta {vegeta} at {args.rate}/s" if vegeta and args.rate else "skipped")
    )
    asyncio.run(run(args.nodes, args.seconds, args.concurrency, args.generator,
                    rate=args.rate, vegeta=vegeta, before=args.before,
                    profile=args.profile))  # fmt: skip


if __name__ == "__main__":
    main()
