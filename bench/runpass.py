"""The run reconciler's pass: its cost and its API requests, with lists (`--before`) and
with this checkout's watch-fed caches, side by side in one run.

Run on a dev cluster that is up (`taugrid dev up --no-taugrid`):
`.venv/bin/python -m bench.runpass [--runs 200] [--finished 0] [--passes 30]
[--before /work/main]`.

Setup (this checkout, in this process): a namespace of its own with a queue whose quota
admits every run, `--runs` TauRuns submitted through `POST /v1/runs` to a controller that
runs here (CPU-only runs of one worker, whose pods KWOK keeps Running for 10 minutes), and
that controller stopped once every run's pod runs; `--finished` more runs are cancelled as
soon as they are submitted, a cluster's history of finished runs. Then, for each checkout
(`--before` and this one, alternating, `--rounds` times), a worker process with that
checkout's `controller` on its PYTHONPATH builds a `RunStore` and a `Reconciler` managing
those runs, starts the store's caches where the checkout has them (and waits for them to
sync), runs one warm-up pass and then `--passes` passes back to back, and reports per pass:
wall time, the worker's CPU time, and the requests its API client sent (counted in
`ApiClient.request`; the caches' long-lived watches are counted apart). Every run is steady
(Running or Cancelled, nothing to write), so a pass's requests are its reads. A checkout
whose reconciler keeps steady runs (`full_pass_interval_s`) then times its full pass, every
run decided again, apart; each pass's decided and kept runs are counted from
`taugrid_run_decisions`. Last, this
checkout's worker runs the reconciler's loop (poked by its caches) for `--churn-s` while it
annotates the run pods as fast as one client can, and reports the pokes and passes that
storm cost (a wake storm would be a pass per poke). Each worker's peak RSS (`ru_maxrss`) is
reported too: the caches' resident copies against the lists' transient ones.

The worker runs one checkout's code in its own process: it is this file run by path, and it
imports nothing but `controller` (the checkout's) and kubernetes_asyncio.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import pathlib
import resource
import secrets
import statistics
import subprocess
import sys
import time
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------------- the worker
class _Elector:
    """The lease, held for the whole bench (the worker writes nothing in steady state)."""

    identity = "bench"

    def is_leader(self) -> bool:
        return True

    def ensure_leader(self) -> None:
        return None


async def _worker(kubeconfig: str, manager: str, passes: int, churn_s: float) -> dict[str, Any]:
    # Imported here: the checkout under test's `controller`, from the worker's PYTHONPATH.
    from controller import metrics
    from controller.kube import client as kube_client
    from controller.kube import runs as kube_runs
    from controller.runs import reconciling, rendering

    api = await kube_client.make_client(kubeconfig, pool=64, timeout_s=30.0)
    counts: collections.Counter[str] = collections.Counter()
    sent = api.request

    async def counted(method: str, url: str, query_params: Any = None, *args: Any,
                      **kwargs: Any) -> Any:  # fmt: skip
        watch = any(k == "watch" and str(v).lower() == "true" for k, v in query_params or ())
        counts["watch" if watch else method] += 1
        return await sent(method, url, query_params, *args, **kwargs)

    api.request = counted
    store = kube_runs.RunStore(api)
    reconciler = reconciling.Reconciler(
        store, _Elector(), metrics.make_metrics(),  # type: ignore[arg-type]
        rendering.RenderSettings(controller_url="http://127.0.0.1:1"),
        pass_interval_s=2.0, ttl_after_finished_s=3600.0, manager=manager,
        pod_annotations={"kwok.taugrid.dev/run-for": "600s"},
    )  # fmt: skip
    caches = None
    sync_s = 0.0
    pokes = [0]

    def poke() -> None:
        pokes[0] += 1
        reconciler.poke()

    run_caches = getattr(store, "run_caches", None)
    if run_caches is not None:
        started = time.perf_counter()
        caches = asyncio.create_task(run_caches(on_change=poke))
        while not store.synced:
            await asyncio.sleep(0.01)
        sync_s = time.perf_counter() - started
    at_sync = dict(counts)
    await reconciler.pass_once()  # warm-up

    keeps = hasattr(reconciler, "full_pass_interval_s")

    def decisions() -> dict[str, float]:
        if not keeps:  # a checkout without the counter decides every run
            return {}
        registry = reconciler.metrics.registry
        return {kind: registry.get_sample_value("taugrid_run_decisions_total", {"kind": kind})
                or 0.0 for kind in ("decided", "kept")}  # fmt: skip

    async def timed(n: int) -> list[dict[str, Any]]:
        out = []
        for _ in range(n):
            before, told = counts.copy(), decisions()
            wall, cpu = time.perf_counter(), time.process_time()
            await reconciler.pass_once()
            out.append({
                "wall_s": time.perf_counter() - wall,
                "cpu_s": time.process_time() - cpu,
                "requests": {k: v - before.get(k, 0) for k, v in counts.items()
                             if v != before.get(k)},
                **({"decisions": {k: v - told[k] for k, v in decisions().items()}}
                   if keeps else {}),
            })  # fmt: skip
        return out

    profile = os.environ.get("RUNPASS_PROFILE")
    if profile:  # where the time of the timed passes goes (cProfile), for this checkout
        import cProfile

        with cProfile.Profile() as prof:
            rows = await timed(passes)
        prof.dump_stats(profile)
    else:
        rows = await timed(passes)
    full: list[dict[str, Any]] = []
    if keeps:
        # The safety net's pass, every `full_pass_interval_s`: every run decided again.
        reconciler.full_pass_interval_s = 0.0
        if profile:
            import cProfile

            with cProfile.Profile() as prof:
                full = await timed(max(1, passes // 3))
            prof.dump_stats(f"{profile}.full")
        else:
            full = await timed(max(1, passes // 3))
    runs = len([r for r in await store.list_runs() if reconciler.manages(r)])
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    churn = None
    if caches is not None and churn_s:
        churn = await _churn(store, reconciler, kubeconfig, churn_s, pokes)
    if caches is not None:
        caches.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await caches
    await api.close()
    return {"runs": runs, "sync_s": sync_s, "at_sync": at_sync, "passes": rows, "churn": churn,
            "rss_mb": rss_mb, "full": full}  # fmt: skip


async def _churn(
    store: Any, reconciler: Any, kubeconfig: str, seconds: float, pokes: list[int]
) -> dict[str, Any]:
    """The reconciler's loop (`run`, poked by its caches) for `seconds` while the run pods
    are annotated as fast as one client can: how many passes the storm costs."""
    ns_prefix = "bench-runpass-"
    from kubernetes_asyncio import client

    from controller.kube import client as kube_client

    pokes_before = pokes[0]
    passes = 0
    pass_once = reconciler.pass_once

    async def counted_pass() -> Any:
        nonlocal passes
        passes += 1
        return await pass_once()

    reconciler.pass_once = counted_pass
    loop = asyncio.create_task(reconciler.run())
    writer = await kube_client.make_client(kubeconfig, pool=16, timeout_s=30.0)
    core = client.CoreV1Api(writer)
    pods = [key.split("/") for key in store.labelled["Pod"].items if key.startswith(ns_prefix)]
    patches = 0
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        batch = pods[patches % len(pods) :][:16]
        await asyncio.gather(*(
            core.patch_namespaced_pod(name, ns, {"metadata": {"annotations": {
                "bench.example/churn": str(patches + i)}}})
            for i, (ns, name) in enumerate(batch)
        ))  # fmt: skip
        patches += len(batch)
    elapsed = time.monotonic() - started
    loop.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await loop
    await writer.close()
    return {"seconds": elapsed, "patches": patches, "pokes": pokes[0] - pokes_before,
            "passes": passes}  # fmt: skip


# ---------------------------------------------------------------------- the setup
async def _setup(ns: str, runs: int, finished: int = 0) -> tuple[Any, Any]:
    import aiohttp
    from kubernetes_asyncio import client, config

    from devcluster import cluster
    from tests import controllerkit, kueue
    from tests import runskit as kit

    dev = cluster.Cluster()
    if not dev.is_up():
        sys.exit("the dev cluster is not up: run `taugrid dev up --no-taugrid` first")
    cfg = client.Configuration()
    await config.load_kube_config(config_file=str(dev.kubeconfig), client_configuration=cfg)
    api = client.ApiClient(configuration=cfg)
    await client.CoreV1Api(api).create_namespace({"metadata": {"name": ns}})
    await kueue.create_queues(api, ns, gpus=8, cpu=(runs + finished) * 2)
    token = await kit.make_token(api, ns, "researcher", kit.RESEARCHER_RULES)
    ctl = await controllerkit.start_controller(
        dev.kubeconfig, ns, run_pass_interval_s=2.0, run_manager=f"bench/{ns}",
        run_pod_annotations={"kwok.taugrid.dev/run-for": "600s"},
    )  # fmt: skip
    try:
        await controllerkit.wait_leader(ctl)
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        async with aiohttp.ClientSession() as http:
            for i in range(runs + finished):
                spec = {"name": f"r{i}", "image": "registry.example/train@sha256:" + "0" * 64,
                        "command": ["python", "train.py"], "queue": "q",
                        "resources": {"gpus": 0, "cpu": "1"}}  # fmt: skip
                async with http.post(f"{ctl.url}/v1/runs", params={"namespace": ns},
                                     data=json.dumps(spec), headers=headers) as resp:  # fmt: skip
                    if resp.status != 201:
                        sys.exit(f"POST answered {resp.status}: {await resp.text()}")
                if i < runs:
                    continue
                # A finished run: cancelled at once (the cluster's history, which a pass
                # reads as well).
                async with http.delete(f"{ctl.url}/v1/runs/{ns}/r{i}", headers=headers) as resp:
                    if resp.status != 200:
                        sys.exit(f"DELETE answered {resp.status}: {await resp.text()}")
        core = client.CoreV1Api(api)
        deadline = time.monotonic() + 300
        while True:
            pods = await core.list_namespaced_pod(ns, field_selector="status.phase=Running")
            if len(pods.items) >= runs:
                break
            if time.monotonic() > deadline:
                sys.exit(f"only {len(pods.items)} of {runs} run pods Running after 300 s")
            await asyncio.sleep(2)
        # The controller's own passes settle the statuses (Running) before it stops.
        await asyncio.sleep(6)
    finally:
        await ctl.stop()
    return api, dev


def _measure(
    checkout: pathlib.Path, kubeconfig: str, manager: str, passes: int, churn_s: float = 0.0
) -> Any:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    out = subprocess.run(
        [sys.executable, str(HERE / "bench" / "runpass.py"), "--worker", kubeconfig, manager,
         str(passes), str(churn_s)],
        env=env, cwd=checkout, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if out.returncode != 0:
        sys.exit(f"the worker of {checkout} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _row(
    label: str, results: list[dict[str, Any]], which: str = "passes"
) -> tuple[str, float, float]:
    rows = [p for r in results for p in r[which]]
    wall = statistics.median(p["wall_s"] for p in rows) * 1000
    cpu = statistics.median(p["cpu_s"] for p in rows) * 1000
    p90 = sorted(p["wall_s"] for p in rows)[int(0.9 * (len(rows) - 1))] * 1000
    reqs = sum(sum(p["requests"].values()) for p in rows) / len(rows)
    kinds: collections.Counter[str] = collections.Counter()
    for p in rows:
        kinds.update(p["requests"])
    per = ", ".join(f"{k} {v / len(rows):.1f}" for k, v in sorted(kinds.items())) or "none"
    sync = statistics.median(r["sync_s"] for r in results) * 1000
    start = results[0]["at_sync"]
    start_txt = ", ".join(f"{k} {v}" for k, v in sorted(start.items())) or "none"
    rss = max(r["rss_mb"] for r in results)
    told = [p["decisions"] for p in rows if "decisions" in p]
    if told:
        decided = sum(t["decided"] for t in told) / len(told)
        kept = sum(t["kept"] for t in told) / len(told)
        says = f"{decided:.1f} / {kept:.1f}"
    else:
        says = "every run decided"
    print(f"| {label} | {results[0]['runs']} | {len(rows)} | {wall:.1f} | {p90:.1f} | {cpu:.1f}"
          f" | {says} | {reqs:.1f} ({per}) | {sync:.0f} ms; {start_txt} | {rss:.0f} |")  # fmt: skip
    return label, wall, reqs


async def _main(args: argparse.Namespace) -> None:
    from kubernetes_asyncio import client

    from tests import kueue

    ns = f"bench-runpass-{secrets.token_hex(3)}"
    api, dev = await _setup(ns, args.runs, args.finished)
    manager = f"bench/{ns}"
    results: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    try:
        for i in range(args.rounds):
            if args.before is not None:
                results["before"].append(
                    _measure(args.before, str(dev.kubeconfig), manager, args.passes)
                )
            churn_s = args.churn_s if i == args.rounds - 1 else 0.0
            results["after"].append(
                _measure(HERE, str(dev.kubeconfig), manager, args.passes, churn_s)
            )
    finally:
        await kueue.delete_queues(api, ns)
        await client.CoreV1Api(api).delete_namespace(ns, propagation_policy="Background")
        await api.close()
    print(f"load average before the measurements' end: {os.getloadavg()}")
    print(
        "| reconciler | runs | passes | pass p50 ms | pass p90 ms | CPU p50 ms"
        " | decided / kept per pass | requests per pass (by kind)"
        " | cache sync; requests to sync | max RSS MB |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    after = _row("this checkout", results["after"])
    if all(r.get("full") for r in results["after"]):
        _row("this checkout, its full pass (every `full_pass_interval_s`)", results["after"],
             "full")  # fmt: skip
    if results["before"]:
        before = _row(f"before ({args.before})", results["before"])
        print(
            f"\npass time: this checkout / before = {after[1] / before[1]:.3f}; requests per pass:"
            f" {before[2]:.1f} → {after[2]:.1f}"
        )
    churn = results["after"][-1]["churn"]
    if churn:
        took = churn["seconds"]
        print(f"\nchurn: {churn['patches']} run-pod patches in {took:.1f} s"
              f" ({churn['patches'] / took:.0f}/s): {churn['pokes']} pokes,"
              f" {churn['passes']} passes ({churn['passes'] / took:.2f}/s)")  # fmt: skip


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        sys.path.pop(0)  # bench/ itself: its modules must not shadow anything
        kubeconfig, manager, passes = sys.argv[2], sys.argv[3], int(sys.argv[4])
        print(json.dumps(asyncio.run(_worker(kubeconfig, manager, passes, float(sys.argv[5])))))
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--finished", type=int, default=0,
                        help="and this many runs cancelled at once (finished ones)")  # fmt: skip
    parser.add_argument("--passes", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--churn-s", type=float, default=10.0,
                        help="then annotate run pods this long (this checkout only)")  # fmt: skip
    parser.add_argument("--before", type=pathlib.Path, default=None,
                        help="a checkout (/work/main) whose reconciler lists")  # fmt: skip
    asyncio.run(_main(parser.parse_args()))
