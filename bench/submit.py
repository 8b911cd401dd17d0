"""`POST /v1/runs` until the Job exists, side by side with `kubectl create -f` of the same Job.

Run on a dev cluster that is up (`taugrid dev up`):
`.venv/bin/python -m bench.submit [runs]` (default 50 of each).

Both sides are timed from the start of the request until a GET of the Job answers 200 (polled
every 2 ms): for the API that covers authentication (TokenReview and SubjectAccessReview,
cached after the first call, as they are for a researcher submitting several runs), parsing
and validating the tau.yaml, creating the TauRun, its Secret and ConfigMap, and the Job. For
kubectl it covers starting the process, reading the kubeconfig, discovery and the create.
The controller runs in this process on loopback, as in the tests; its Jobs are real ones that
Kueue sees, in a namespace of their own whose queue has no quota so nothing is admitted.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from kubernetes_asyncio import client, config

from controller.runs import objects, rendering
from devcluster import build, cluster
from shared import spec as specs
from tests import controllerkit, kueue
from tests import runskit as kit

IMAGE = "registry.example/train@sha256:" + "0" * 64


def _spec(name: str) -> dict[str, Any]:
    return {"name": name, "image": IMAGE, "command": ["python", "train.py"],
            "resources": {"gpus": 1}, "queue": "q"}  # fmt: skip


async def _job_exists(batch: client.BatchV1Api, namespace: str, name: str) -> None:
    while True:
        try:
            await batch.read_namespaced_job(name, namespace, _preload_content=False)
        except client.ApiException as err:
            if err.status != 404:
                raise
            await asyncio.sleep(0.002)
            continue
        return


def _manifest(namespace: str, name: str) -> str:
    """The Job the controller would render for the same spec (no owner: kubectl makes it)."""
    spec = specs.validate_spec(_spec(name)).spec
    ctx = rendering.AttemptContext(
        run=objects.RunRef(name=name, namespace=namespace, uid="0"), attempt=1,
        checkpoint_configmap=f"{name}-checkpoint",
    )  # fmt: skip
    (job,) = rendering.render_attempt(spec, ctx, rendering.RenderSettings("http://127.0.0.1"))
    del job["metadata"]["ownerReferences"]
    return yaml.safe_dump(job)


def _summary(label: str, samples: list[float]) -> str:
    ms = sorted(s * 1000 for s in samples)
    p50 = statistics.median(ms)
    p99 = ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]
    return f"| {label} | {len(ms)} | {p50:.1f} | {p99:.1f} | {ms[0]:.1f} | {ms[-1]:.1f} |"


async def main(runs: int) -> None:
    """Measure both paths and print a Markdown table."""
    dev = cluster.Cluster()
    if not dev.is_up():
        sys.exit("the dev cluster is not up: run `taugrid dev up` first")
    kubectl = str(build.built_dir() / "bin" / "kubectl")
    cfg = client.Configuration()
    await config.load_kube_config(config_file=str(dev.kubeconfig), client_configuration=cfg)
    api = client.ApiClient(configuration=cfg)
    core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
    ns = f"bench-submit-{secrets.token_hex(3)}"
    await core.create_namespace({"metadata": {"name": ns}})
    await kueue.create_queues(api, ns, gpus=0)
    token = await kit.make_token(api, ns, "researcher", kit.RESEARCHER_RULES)
    ctl = await controllerkit.start_controller(
        dev.kubeconfig, ns, run_pass_interval_s=5.0, run_manager=f"bench/{ns}"
    )
    http = aiohttp.ClientSession()
    api_times: list[float] = []
    kubectl_times: list[float] = []
    try:
        await controllerkit.wait_leader(ctl)
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(runs):
                name = f"api-{i}"
                started = time.perf_counter()
                async with http.post(
                    f"{ctl.url}/v1/runs",
                    params={"namespace": ns},
                    data=json.dumps(_spec(name)),
                    headers=headers,
                ) as resp:
                    if resp.status != 201:
                        sys.exit(f"POST answered {resp.status}: {await resp.text()}")
                await _job_exists(batch, ns, f"{name}-a1")
                api_times.append(time.perf_counter() - started)

                name = f"kubectl-{i}"
                path = Path(tmp) / f"{name}.yaml"
                path.write_text(_manifest(ns, name))
                started = time.perf_counter()
                proc = await asyncio.create_subprocess_exec(
                    kubectl, f"--kubeconfig={dev.kubeconfig}", "create", "-f", str(path),
                    stdout=asyncio.subprocess.DEVNULL,
                )  # fmt: skip
                if await proc.wait() != 0:
                    sys.exit("kubectl create failed")
                await _job_exists(batch, ns, f"{name}-a1")
                kubectl_times.append(time.perf_counter() - started)
    finally:
        await http.close()
        await ctl.stop()
        await kueue.delete_queues(api, ns)
        await core.delete_namespace(ns, propagation_policy="Background")
        await api.close()
    print("| path | runs | p50 ms | p99 ms | min ms | max ms |")
    print("|---|---|---|---|---|---|")
    print(_summary("`POST /v1/runs` → Job exists", api_times))
    print(_summary("`kubectl create -f` → Job exists", kubectl_times))


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 50))
