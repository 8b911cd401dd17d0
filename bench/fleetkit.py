"""Shared by the benches: fleets of Node objects with pod-bound agent tokens, and timing."""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import re
import statistics
import sys
import time
from typing import Any

import aiohttp
from kubernetes_asyncio import client, config

from devcluster import build, cluster, stack


def bin_dir() -> pathlib.Path:
    """The built control-plane binaries."""
    return build.built_dir() / "bin"


async def dev_api() -> tuple[cluster.Cluster, client.ApiClient]:
    """The running dev cluster and an admin client for it; exit with a hint when it is down."""
    dev = cluster.Cluster()
    if not dev.is_up():
        sys.exit("the dev cluster is not running: start it with scripts/up")
    cfg = client.Configuration()
    await config.load_kube_config(config_file=str(dev.kubeconfig), client_configuration=cfg)
    return dev, client.ApiClient(cfg)


async def make_fleet(
    api: client.ApiClient, dev: cluster.Cluster, ns: str, n: int, *, prefix: str
) -> dict[str, str]:
    """Create n GPU Node objects, an agent pod bound to each and a token per pod.

    The nodes are not managed by KWOK: after creation they cost the API server nothing, and
    the controller sees them exactly as real nodes. Returns node name -> pod-bound token.
    """
    names = [f"{prefix}-{i}" for i in range(n)]
    docs: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": stack.AGENT_SA, "namespace": ns}},
    ]  # fmt: skip
    for name in names:
        docs.append({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"taugrid.dev/bench": ns}},
            "status": {"capacity": {"nvidia.com/gpu": "8"}, "allocatable": {"nvidia.com/gpu": "8"}},
        })  # fmt: skip
        docs.append(
            {**stack.agent_pod(name, ns), "metadata": {"name": f"a-{name}", "namespace": ns}}
        )
    for i in range(0, len(docs), 500):
        await asyncio.to_thread(dev.apply, bin_dir(), docs[i : i + 500])
    core = client.CoreV1Api(api)
    sem = asyncio.Semaphore(32)

    async def token(name: str) -> tuple[str, str]:
        async with sem:
            pod = await core.read_namespaced_pod(f"a-{name}", ns)
            tr = await core.create_namespaced_service_account_token(
                stack.AGENT_SA,
                ns,
                {"spec": {"audiences": ["taugrid"], "expirationSeconds": 3600,
                          "boundObjectRef": {"apiVersion": "v1", "kind": "Pod",
                                             "name": f"a-{name}", "uid": pod.metadata.uid}}},
            )  # fmt: skip
            return name, str(tr.status.token)

    return dict(await asyncio.gather(*(token(n) for n in names)))


async def delete_fleet(api: client.ApiClient, dev: cluster.Cluster, ns: str) -> None:
    """Remove the nodes and the namespace a fleet was made in."""
    await asyncio.to_thread(
        dev.kubectl, bin_dir(), "delete", "nodes", "-l", f"taugrid.dev/bench={ns}", "--wait=false"
    )
    await client.CoreV1Api(api).delete_namespace(ns)


async def leading(http: aiohttp.ClientSession, url: str, timeout_s: float = 60.0) -> None:
    """Wait until the controller at `url` says it leads (`/readyz`); raise after `timeout_s`."""
    deadline = time.perf_counter() + timeout_s
    while time.perf_counter() < deadline:
        with contextlib.suppress(aiohttp.ClientError):
            async with http.get(f"{url}/readyz") as r:
                if (await r.json()).get("leader"):
                    return
        await asyncio.sleep(0.1)
    msg = f"the bench controller at {url} did not lead within {timeout_s:g} s"
    raise RuntimeError(msg)


def pct(values: list[float], q: int) -> float:
    """The q-th percentile in milliseconds (NaN for fewer than 2 samples)."""
    if len(values) < 2:
        return float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] * 1000


def metric(text: str, name: str, labels: str = "") -> float:
    """A family's samples in a controller's /metrics text, summed over their labels (only the
    sample whose label set is exactly `{labels}` when given); 0 when absent."""
    where = re.escape("{" + labels + "}") if labels else r"(?:\{[^}]*\})?"
    pattern = rf"^{re.escape(name)}{where} (\S+)$"
    return sum(float(v) for v in re.findall(pattern, text, re.MULTILINE))
