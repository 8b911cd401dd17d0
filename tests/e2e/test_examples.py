"""Every tau.yaml in examples/ runs on the dev cluster as shipped: submitted with `tau run` by
the researcher of the welcome text, to the dev controller, in `default` (where the dev cluster
has the queue and the claims the examples name), it reaches the phase its own
`# On the dev cluster: PHASE` line documents.

The examples have fixed names, so a run of that name left by an earlier session is deleted
first (the TauRun and, through its owner references, everything it made).
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import re
import sys
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client

from devcluster import cluster, node, stack
from shared import spec as specs
from tests import support

pytestmark = pytest.mark.cluster

REPO = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
TAU = REPO / "controller" / "assets" / "tau.py"
OUTCOME = re.compile(r"^# On the dev cluster: (\w+)", re.MULTILINE)


def documented(path: pathlib.Path) -> tuple[str, str]:
    """The run name of an example and the phase it says it reaches on the dev cluster."""
    text = path.read_text()
    found = OUTCOME.findall(text)
    assert len(found) == 1, f"{path.name} must say once what it reaches on the dev cluster"
    return specs.parse_spec(text.encode()).spec.name, str(found[0])


async def forget(k8s: client.ApiClient, name: str) -> None:
    """Delete an earlier run of this name in `default` and wait until it is gone."""
    custom = client.CustomObjectsApi(k8s)
    try:
        await custom.delete_namespaced_custom_object(
            "taugrid.dev", "v1alpha1", "default", "tauruns", name, propagation_policy="Foreground"
        )
    except client.ApiException as err:
        if err.status != 404:
            raise
        return

    async def gone() -> None:
        try:
            await custom.get_namespaced_custom_object(
                "taugrid.dev", "v1alpha1", "default", "tauruns", name
            )
        except client.ApiException as err:
            if err.status == 404:
                return
            raise
        raise support.NotYetError(f"run {name} still there")

    await support.eventually(gone, what=f"the earlier run {name} gone")


def documented_queue(path: pathlib.Path) -> str:
    """The queue the example names (`default` when it names none)."""
    found = re.search(r"^queue: (\S+)", path.read_text(), re.MULTILINE)
    return found.group(1) if found else "default"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
async def test_the_example_reaches_its_documented_phase(
    path: pathlib.Path, dev_cluster: cluster.Cluster, bin_dir: pathlib.Path,
    k8s: client.ApiClient,
) -> None:  # fmt: skip
    """`tau run examples/X.yaml` is accepted without a refusal and the run reaches the phase
    the file documents (a run still going then is cancelled)."""
    name, expected = documented(path)
    queue_name = documented_queue(path)
    if queue_name == stack.REAL_NODE_QUEUE and not node.recorded(dev_cluster):
        pytest.skip("this dev cluster has no real node (`up --no-real-node`, or it cannot)")
    await forget(k8s, name)
    token = stack.researcher_token(dev_cluster, bin_dir)
    env = {**os.environ, "TAU_URL": stack.controller_url(), "TAU_TOKEN": token,
           "TAU_NAMESPACE": "default"}  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(TAU), "run", str(path), env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    assert f"run {name} submitted to queue {queue_name}" in out.decode()
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession() as http:

        async def reached() -> dict[str, Any]:
            async with http.get(f"{stack.controller_url()}/v1/runs/default/{name}",
                                headers=headers) as resp:  # fmt: skip
                run = await resp.json()
            assert resp.status == 200, run
            if run["phase"] != expected and run["phase"] in {"Succeeded", "Failed", "Cancelled"}:
                pytest.fail(f"{name} ended {run['phase']}, not {expected}: {run['message']}")
            assert run["phase"] == expected, (run["phase"], run["message"])
            return dict(run)

        await support.eventually(reached, timeout_s=180, what=f"{name} {expected}")
        if expected not in {"Succeeded", "Failed"}:
            async with http.delete(f"{stack.controller_url()}/v1/runs/default/{name}",
                                   headers=headers) as resp:  # fmt: skip
                assert resp.status == 200, await resp.text()
