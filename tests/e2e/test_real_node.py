"""The dev cluster's real node: a training process that really checkpoints, is really
SIGTERMed when its node is quarantined, and really resumes.

A one-worker run in the `real-node` queue (its flavor tolerates the node's taint; its GPU comes
from the fake device plugin) runs `examples/train_with_checkpoints.py` in the run image built
from the image spec. The test injects an uncorrected-ECC fault into the real node's fake NVML
(through the agent pod's control socket, as `taugrid dev inject real-node` does), so the chart's
controller pod quarantines the node as Degraded and, after a shortened `degradedDrainAfter`,
evicts the run's pod: the kubelet sends SIGTERM, the process saves and reports a checkpoint
within its grace and exits 143. Attempt 2 waits while the node is quarantined; a GPU reset
clears the fault, the node is released, and attempt 2 starts there and resumes from that
checkpoint, which the test reads in the real log, streamed by `tau logs -f`.

The dev controller's drain and release windows are shortened for the test by upgrading the
chart with the values `up` installed (and restored afterwards). Where the machine cannot run
the real node (`devcluster.node.preflight` lists why), the test skips with that reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pathlib
import re
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import yaml

from devcluster import chart, cluster, node, stack, tokens
from tests import support

pytestmark = pytest.mark.cluster

TAU = pathlib.Path(__file__).resolve().parents[2] / "controller" / "assets" / "tau.py"
GPU = 0
FAST = {"degradedDrainAfterS": 3, "releaseAfterS": 5, "evictGraceS": 3}
STEP_S = 0.5
SHOW_DEVICES = (
    "import os, time; print(os.environ['NVIDIA_VISIBLE_DEVICES'], flush=True); time.sleep(120)"
)
CHART_DRAIN_S = yaml.safe_load((chart.CHART_DIR / "values.yaml").read_text())["controller"][
    "degradedDrainAfterS"
]
SAVE_EVERY = 4


def _real_node(dev: cluster.Cluster, bin_dir: pathlib.Path) -> dict[str, str]:
    problems = node.preflight(bin_dir)
    if problems:
        pytest.skip("the real node cannot run here: " + "; ".join(problems))
    assert node.running(dev), (
        "the dev cluster runs no real node: start it with `taugrid dev up` (real node on)"
    )
    return dict(json.loads(node.Paths.of(dev.state).images.read_text()))


def _upgrade(dev: cluster.Cluster, bin_dir: pathlib.Path, values: dict[str, Any]) -> None:
    """Install changed values and point the relay at the controller pod they make."""
    chart.install(dev.kubeconfig, stack.RELEASE, stack.NAMESPACE, values, bin_dir=bin_dir)
    deadline = time.monotonic() + 120
    while True:
        pods = tokens.running_pods(dev, bin_dir, stack.NAMESPACE, stack.RELEASE, "controller")
        want = str(values["controller"].get("degradedDrainAfterS", CHART_DRAIN_S))
        fresh = [p for p in pods
                 if _env_value(p, "TAUGRID_CONTROLLER_DEGRADED_DRAIN_AFTER_S") == want]  # fmt: skip
        ready = [p for p in fresh if (support.condition(p, "Ready") or {}).get("status") == "True"]
        if ready and len(pods) == 1:
            addr = tokens.write_controller_addr(
                dev, bin_dir, stack.NAMESPACE, stack.RELEASE,
                node.Paths.of(dev.state).controller_addr,
            )  # fmt: skip
            lease = dev.kubectl(
                bin_dir, "-n", stack.NAMESPACE, "get", "lease", f"{stack.RELEASE}-controller",
                "-o", "jsonpath={.spec.holderIdentity}",
            )  # fmt: skip
            leading = lease.startswith(ready[0]["metadata"]["name"] + "-")
            if leading and dev.probe(f"{stack.controller_url()}/readyz")[0]:
                print(f"controller pod at {addr} with {values['controller']}")
                # The controller's token is bound to its pod: issue the dev stack's tokens
                # anew now, as the renewer would within 20 minutes.
                agents = sorted(p.name for p in (dev.state / "agents").iterdir()
                                if (p / "token").exists() and p.name != node.NODE_NAME)  # fmt: skip
                tokens.issue(dev, bin_dir, stack.NAMESPACE, stack.RELEASE, agents)
                return
        assert time.monotonic() < deadline, "the upgraded controller pod did not become ready"
        time.sleep(0.5)


def _env_value(pod: dict[str, Any], name: str) -> str | None:
    for c in pod["spec"]["containers"]:
        for e in c.get("env") or []:
            if e["name"] == name:
                return str(e.get("value"))
    return None


@contextlib.asynccontextmanager
async def _fast_controller(dev: cluster.Cluster, bin_dir: pathlib.Path) -> AsyncIterator[None]:
    original = yaml.safe_load(stack.values_file(dev).read_text())
    fast = {**original, "controller": {**original["controller"], **FAST}}
    await asyncio.to_thread(_upgrade, dev, bin_dir, fast)
    try:
        yield
    finally:
        await asyncio.to_thread(_upgrade, dev, bin_dir, original)


@contextlib.asynccontextmanager
async def _cleared(dev: cluster.Cluster) -> AsyncIterator[None]:
    """Whatever happens, the real node's GPU ends reset and back to its scenario."""
    try:
        yield
    finally:
        stack.inject(dev, node.NODE_NAME, GPU, "reset")
        stack.inject(dev, node.NODE_NAME, GPU, "clear")


def _volume(dev: cluster.Cluster, name: str) -> list[dict[str, Any]]:
    """A hostPath PersistentVolume on the real node, bound to a claim of that name: the
    checkpoints outlive the attempt's pod."""
    path = node.Paths.of(dev.state).root / "volumes" / name
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o777)  # the run image's user (65532) writes here
    return [
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
         "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                  "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                  "hostPath": {"path": str(path), "type": "Directory"},
                  "claimRef": {"namespace": "default", "name": name},
                  "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                      {"key": "kubernetes.io/hostname", "operator": "In",
                       "values": [node.NODE_NAME]}]}]}}}},
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
         "metadata": {"name": name, "namespace": "default"},
         "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "", "volumeName": name,
                  "resources": {"requests": {"storage": "1Gi"}}}},
    ]  # fmt: skip


class Timeline:
    """Seconds since the fault was injected, of each thing the test saw (printed at the end)."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.marks: dict[str, float] = {}

    def mark(self, what: str) -> None:
        self.marks.setdefault(what, round(time.monotonic() - self.start, 2))


async def test_a_real_run_is_sigtermed_on_quarantine_checkpoints_and_resumes(
    dev_cluster: cluster.Cluster, bin_dir: pathlib.Path
) -> None:
    """Fault → Degraded quarantine → eviction → SIGTERM → checkpoint saved and reported within
    the grace → attempt 2 after the node's release resumes from exactly that step (its real
    log says so), and `tau logs -f` streamed the real output of attempt 1."""
    images = _real_node(dev_cluster, bin_dir)
    name = support.unique_name("real", max_len=30)
    dev_cluster.apply(bin_dir, _volume(dev_cluster, name))
    token = stack.researcher_token(dev_cluster, bin_dir)
    headers = {"Authorization": f"Bearer {token}"}
    url = stack.controller_url()
    spec = {
        "name": name,
        "image": images["run"],
        "command": ["python3", "/opt/taugrid/train_with_checkpoints.py", "--steps", "100000",
                    "--save-every", str(SAVE_EVERY), "--step-seconds", str(STEP_S)],
        "resources": {"gpus": 1, "cpu": "100m", "memory": "128Mi"},
        "queue": stack.REAL_NODE_QUEUE,
        "checkpoint": {"dir": "/ckpt", "volume": name},
        "retry": {"maxAttempts": 3, "when": ["NodeFailure", "Evicted"]},
    }  # fmt: skip
    tau_env = {**os.environ, "TAU_URL": url, "TAU_TOKEN": token, "TAU_NAMESPACE": "default"}
    async with (
        _cleared(dev_cluster),
        _fast_controller(dev_cluster, bin_dir),
        aiohttp.ClientSession() as http,
    ):

        async def run() -> dict[str, Any]:
            async with http.get(f"{url}/v1/runs/default/{name}", headers=headers) as resp:
                assert resp.status == 200, await resp.text()
                return dict(await resp.json())

        async with http.post(f"{url}/v1/runs", json=spec, headers=headers) as resp:
            assert resp.status == 201, await resp.text()
        follow = await asyncio.create_subprocess_exec(
            sys.executable, str(TAU), "logs", "-f", name,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=tau_env,
        )  # fmt: skip
        assert follow.stdout is not None
        streamed: list[str] = []

        async def reader() -> None:
            assert follow.stdout is not None
            while line := await follow.stdout.readline():
                streamed.append(line.decode(errors="replace"))

        reading = asyncio.create_task(reader())
        try:

            async def checkpointed() -> dict[str, Any]:
                r = await run()
                assert r["phase"] == "Running", (r["phase"], r.get("message"))
                assert any("checkpoint at step" in line for line in streamed), streamed[-5:]
                assert [c for c in r.get("checkpoints") or [] if c["attempt"] == 1], r
                return r

            first = await support.eventually(
                checkpointed, timeout_s=180, interval_s=0.5, what="attempt 1 checkpoints"
            )
            assert first["attempts"][0]["nodes"] == [node.NODE_NAME], first["attempts"]
            assert any("attempt 1: fresh start" in line for line in streamed), streamed[:5]

            # The dev fleet is shared with the tests before this one: a chart upgrade's
            # rollout leaves its agents' heartbeats unanswered for a while (a follower pod
            # cannot reach the leader-only Service here: no cluster DNS on the real node),
            # which may have opened the breaker. Close it as on-call would, then fault.
            oncall = dev_cluster.kubectl(bin_dir, "-n", stack.NAMESPACE, "create", "token",
                                         stack.ONCALL_SA, "--duration=1h").strip()  # fmt: skip
            reset = f"{url}/v1/fleet/breaker/reset"
            async with http.post(reset, headers={"Authorization": f"Bearer {oncall}"}) as resp:
                assert resp.status == 200, await resp.text()
            t = Timeline()
            stack.inject(dev_cluster, node.NODE_NAME, GPU, "ecc_uncorrected", "2")

            async def sigtermed() -> dict[str, Any]:
                r = await run()
                assert any("got signal 15" in line for line in streamed), streamed[-5:]
                t.mark("SIGTERM seen in the log")
                stopped = [x for x in streamed if "stopped at step" in x]
                assert stopped, streamed[-5:]
                t.mark("checkpoint saved after SIGTERM")
                step = int(re.search(r"stopped at step (\d+)", stopped[-1]).group(1))  # type: ignore[union-attr]
                mine = [c for c in r.get("checkpoints") or [] if c["attempt"] == 1]
                assert max(c["step"] for c in mine) == step, (step, mine)
                t.mark("checkpoint reported after SIGTERM")
                assert len(r["attempts"]) >= 2, r["attempts"]
                t.mark("attempt 2 created")
                return r

            hit = await support.eventually(
                sigtermed, timeout_s=120, interval_s=0.25, what="SIGTERM, checkpoint, attempt 2"
            )
            saved = max(c["step"] for c in hit["checkpoints"] if c["attempt"] == 1)
            assert hit["attempts"][0]["failureClass"] in {"NodeFailure", "Evicted"}, hit["attempts"]
        finally:
            with contextlib.suppress(ProcessLookupError):  # it ends with attempt 1's pod
                follow.kill()
            await follow.wait()
            reading.cancel()

        stack.inject(dev_cluster, node.NODE_NAME, GPU, "reset")
        t.mark("GPU reset injected")

        async def resumed() -> str:
            r = await run()
            assert len(r["attempts"]) == 2, r["attempts"]
            assert r["phase"] == "Running", (r["phase"], r["message"])
            t.mark("attempt 2 running")
            log = dev_cluster.kubectl(
                bin_dir, "-n", "default", "logs", "-l", f"job-name={r['attempts'][1]['objectName']}"
            )
            assert f"attempt 2: resuming at step {saved}" in log, log
            t.mark("attempt 2 resumed (its log)")
            return log

        await support.eventually(resumed, timeout_s=180, interval_s=1, what="attempt 2 resumes")
        async with http.delete(f"{url}/v1/runs/default/{name}", headers=headers) as resp:
            assert resp.status in {200, 202}, await resp.text()
    print("timeline (s after the fault):", json.dumps(t.marks))
    attempt1 = [line for line in streamed if "[train]" in line]
    assert attempt1, "tau logs -f streamed nothing of the real process"


async def test_the_real_kubelet_reports_the_fake_plugins_gpus_to_the_agent(
    dev_cluster: cluster.Cluster, bin_dir: pathlib.Path
) -> None:
    """A pod asking for two GPUs gets two of the fake device plugin's devices: its
    NVIDIA_VISIBLE_DEVICES names them (Allocate), and the real node's agent pod attributes
    exactly those GPUs to it through the kubelet's PodResources API (shown to the on-call
    role: pod names are not for anyone who can reach the node, security review 3, finding 3)."""
    images = _real_node(dev_cluster, bin_dir)
    name = support.unique_name("gpus", max_len=30)
    dev_cluster.apply(bin_dir, [{
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "restartPolicy": "Never", "nodeSelector": {node.NODE_LABEL: "true"},
            "tolerations": [{"key": node.TAINT_KEY, "operator": "Exists"}],
            "containers": [{
                "name": "main", "image": images["run"], "imagePullPolicy": "Never",
                "command": ["python3", "-c", SHOW_DEVICES],
                "resources": {"limits": {"nvidia.com/gpu": 2}},
            }],
        },
    }])  # fmt: skip
    agent = tokens.wait_ready_pod(
        dev_cluster, bin_dir, stack.NAMESPACE, stack.RELEASE, component="agent",
        node=node.NODE_NAME,
    )  # fmt: skip
    url = f"http://{agent['status']['podIP']}:9400/v1/gpus"
    oncall = dev_cluster.kubectl(bin_dir, "-n", stack.NAMESPACE, "create", "token",
                                 stack.ONCALL_SA, "--duration=1h").strip()  # fmt: skip
    try:
        async with aiohttp.ClientSession() as http:

            async def attributed() -> tuple[set[str], set[str]]:
                try:
                    log = dev_cluster.kubectl(bin_dir, "-n", "default", "logs", name).strip()
                except cluster.ClusterError as err:  # not started yet
                    raise AssertionError(str(err)) from err
                assert log, "the pod has not printed its devices yet"
                async with http.get(url, headers={"Authorization": f"Bearer {oncall}"}) as resp:
                    body = await resp.json()
                mine = {g["uuid"] for g in body["gpus"]
                        if any(p.get("pod") == name for p in g.get("pods") or [])}  # fmt: skip
                assert mine, body["podAttribution"]
                return set(log.split(",")), mine

            visible, attributed_uuids = await support.eventually(
                attributed, timeout_s=90, interval_s=1, what="the agent to attribute the GPUs"
            )
    finally:
        dev_cluster.kubectl(bin_dir, "-n", "default", "delete", "pod", name, "--wait=false")
    assert len(visible) == 2
    assert visible == attributed_uuids


async def test_on_call_reads_the_real_nodes_agent_through_the_controller(
    dev_cluster: cluster.Cluster, bin_dir: pathlib.Path
) -> None:
    """The agent proxy as deployed: the controller pod calls the real node's agent pod with
    its own `taugrid-agent` token, and on-call's token gets the agent's GPU view (with pod
    names); a researcher's gets 403 and an unknown node 404. KWOK nodes' agents are host
    processes at no pod IP, so only the real node's agent is reachable this way."""
    _real_node(dev_cluster, bin_dir)
    oncall = dev_cluster.kubectl(bin_dir, "-n", stack.NAMESPACE, "create", "token",
                                 stack.ONCALL_SA, "--duration=1h").strip()  # fmt: skip
    researcher = stack.researcher_token(dev_cluster, bin_dir)
    base = f"{stack.controller_url()}/v1/nodes"
    async with aiohttp.ClientSession() as http:

        async def answered() -> dict[str, Any]:
            async with http.get(
                f"{base}/{node.NODE_NAME}/gpus", headers={"Authorization": f"Bearer {oncall}"}
            ) as resp:
                body = await resp.json()
                assert resp.status == 200, body
                return dict(body)

        body = await support.eventually(
            answered, timeout_s=60, interval_s=1, what="the agent's view through the controller"
        )
        statuses = []
        for path, token in (
            (f"{base}/{node.NODE_NAME}/gpus", researcher),
            (f"{base}/no-such-node/gpus", oncall),
        ):
            async with http.get(path, headers={"Authorization": f"Bearer {token}"}) as resp:
                statuses.append(resp.status)
    assert len(body["gpus"]) == 8, body
    assert all("verdict" in g for g in body["gpus"]), body
    assert statuses == [403, 404]
