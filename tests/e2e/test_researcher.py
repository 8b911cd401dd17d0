"""The researcher's path end to end: the `tau` script and kubectl against a controller on the
local control plane, with real Kueue, the Job controller, KWOK pods and KubeRay."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import pathlib
import sys
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from kubernetes_asyncio import client

from devcluster import cluster
from tests import controllerkit, kueue, netpolicy, support
from tests import runskit as kit

pytestmark = pytest.mark.cluster

TAU = pathlib.Path(__file__).resolve().parents[2] / "controller" / "assets" / "tau.py"
KWOK_LOGS = ("kwok.x-k8s.io", "v1alpha1")
NODE = "gpu-node-1"


@pytest_asyncio.fixture
async def env(
    dev_cluster: cluster.Cluster, k8s: client.ApiClient, namespace: str
) -> AsyncIterator[kit.Env]:
    """A controller whose pods run for 10 s, 8 GPUs of quota on one dev node, a token.

    The queue's own ResourceFlavor pins its pods to `gpu-node-1`: other tests make and
    delete fake GPU nodes of their own, and a pod on one of those would lose its log.
    """
    await kueue.create_queues(k8s, namespace, gpus=8, node_labels={"kubernetes.io/hostname": NODE})
    token = await kit.make_token(k8s, namespace, "researcher", kit.RESEARCHER_RULES)
    ctl = await controllerkit.start_controller(
        dev_cluster.kubeconfig, namespace,
        run_pass_interval_s=0.5,
        run_pod_annotations={"kwok.taugrid.dev/run-for": "10s"},
        run_manager=f"test/{namespace}",
    )  # fmt: skip
    await controllerkit.wait_leader(ctl)
    http = aiohttp.ClientSession()
    try:
        yield kit.Env(ctl.url, namespace, token, http, k8s, ctl)
    finally:
        await http.close()
        await ctl.stop()
        await kueue.delete_queues(k8s, namespace)


async def tau(env: kit.Env, *args: str) -> tuple[int, str, str]:
    """Run the tau script as a researcher would (environment, not flags)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(TAU), *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "TAU_URL": env.url, "TAU_TOKEN": env.token,
             "TAU_NAMESPACE": env.namespace},
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return int(proc.returncode or 0), out.decode(), err.decode()


async def run_pods(env: kit.Env, run: str, count: int = 1) -> list[dict[str, Any]]:
    """Wait for the run's pods to exist and be bound to a node."""

    async def probe() -> list[dict[str, Any]]:
        resp = await client.CoreV1Api(env.api).list_namespaced_pod(
            env.namespace, label_selector=f"taugrid.dev/run={run}", _preload_content=False
        )
        pods = [p for p in (await resp.json())["items"] if p["spec"].get("nodeName")]
        assert len(pods) >= count, f"{len(pods)} scheduled pods"
        return list(pods)

    return await support.eventually(probe, what=f"pods of {run}")


async def stored_policy(env: kit.Env, run: str) -> dict[str, Any]:
    """The attempt's NetworkPolicy as the API server stored it (defaults applied), after
    checking it is owned by the run's TauRun."""
    resp = await client.NetworkingV1Api(env.api).read_namespaced_network_policy(
        f"{run}-a1", env.namespace, _preload_content=False
    )
    policy = dict(await resp.json())
    (owner,) = policy["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("TauRun", run, True)
    return policy


def pod_view(pod: dict[str, Any]) -> netpolicy.Pod:
    """A stored pod as the policy evaluator sees it."""
    meta = pod["metadata"]
    return netpolicy.Pod(meta["namespace"], meta.get("labels") or {})


async def test_single_gpu_run_from_queue_to_success(
    env: kit.Env, dev_cluster: cluster.Cluster, bin_dir: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    """Queued → Admitted → Running → Succeeded; tau status, kubectl get tr, evidence and
    tau logs -f all show it."""
    spec = tmp_path / "tau.yaml"
    spec.write_text(
        f"name: mnist\nimage: {kit.IMAGE}\ncommand: python train.py\n"
        "resources: {gpus: 1, cpu: 1, memory: 1Gi}\nqueue: q\n"
    )
    code, out, err = await tau(env, "run", str(spec))
    assert code == 0, err
    assert "run mnist submitted to queue q" in out

    (pod,) = await run_pods(env, "mnist")
    name = pod["metadata"]["name"]
    with cluster.pod_log_file(dev_cluster, env.namespace, name, "main") as path:
        cluster.append_log(path, "epoch 1 loss 0.9")
        cluster.append_log(path, "epoch 2 loss 0.5")
        await client.CustomObjectsApi(env.api).create_namespaced_custom_object(
            *KWOK_LOGS, env.namespace, "logs",
            cluster.kwok_logs_object(env.namespace, name, "main", path),
        )  # fmt: skip

        async def logs() -> str:
            code, out, err = await tau(env, "logs", "mnist", "--tail", "10")
            assert code == 0, err
            assert "epoch 2 loss 0.5" in out, out
            return out

        await support.eventually(logs, what="tau logs to show the log file", interval_s=1)
        follow = await asyncio.create_subprocess_exec(
            sys.executable, str(TAU), "logs", "-f", "mnist",
            stdout=asyncio.subprocess.PIPE,
            env={**os.environ, "TAU_URL": env.url, "TAU_TOKEN": env.token,
                 "TAU_NAMESPACE": env.namespace},
        )  # fmt: skip
        assert follow.stdout is not None
        seen: list[str] = []
        try:
            async with asyncio.timeout(60):
                while "epoch 2 loss 0.5" not in "".join(seen):
                    seen.append((await follow.stdout.readline()).decode())
        finally:
            follow.kill()
            await follow.wait()

    run = await env.wait_phase("mnist", "Succeeded")
    reached = [c["type"] for c in run["conditions"] if c["status"] == "True"]
    assert reached == ["Queued", "Admitted", "Running", "Succeeded"]
    code, out, _ = await tau(env, "status", "mnist")
    assert code == 0
    assert "Succeeded" in out
    kubectl = await asyncio.create_subprocess_exec(
        str(bin_dir / "kubectl"), f"--kubeconfig={dev_cluster.kubeconfig}",
        "-n", env.namespace, "get", "tr",
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    table = (await kubectl.communicate())[0].decode()
    assert "mnist" in table
    assert "Succeeded" in table

    status, ev = await env.get(f"/v1/runs/{env.namespace}/mnist/evidence")
    assert status == 200
    assert ev["nodes"] == [NODE]
    assert ev["kueue"]["clusterQueue"] == f"cq-{env.namespace}"[:63]
    assert ev["kueue"]["flavors"]["nvidia.com/gpu"] == kueue.flavor_name(env.namespace)
    assert ev["image"] == kit.IMAGE
    assert ev["specHash"].startswith("sha256:")


async def test_two_node_pytorch_run(env: kit.Env) -> None:
    """One Workload with a pod set of 2, pods with completion indexes 0 and 1, and
    rendezvous env pointing at pod 0 through the headless Service."""
    spec = kit.job_spec("ddp", gpus=4, kind="pytorch", workers=2)
    assert (await env.submit(spec))[0] == 201
    wl = await support.eventually(
        lambda: kueue.workload_of(env.api, env.namespace, "ddp-a1"), what="the Workload"
    )
    assert [p["count"] for p in wl["spec"]["podSets"]] == [2]
    pods = await run_pods(env, "ddp", count=2)
    index = "batch.kubernetes.io/job-completion-index"
    assert sorted(p["metadata"]["annotations"][index] for p in pods) == ["0", "1"]
    service = await client.CoreV1Api(env.api).read_namespaced_service("ddp-a1", env.namespace)
    assert service.spec.cluster_ip == "None"
    for pod in pods:
        env_vars = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        assert env_vars["MASTER_ADDR"] == "ddp-a1-0.ddp-a1"
        assert env_vars["NNODES"] == "2"
        assert pod["spec"]["subdomain"] == "ddp-a1"
    # The attempt's pods reach each other on any port (torchrun's rendezvous, NCCL); a pod
    # of the same namespace that is not the attempt's reaches none of them.
    policy = await stored_policy(env, "ddp")
    worker, peer = (pod_view(p) for p in pods)
    stranger = netpolicy.Pod(env.namespace, {"app": "curious"})
    namespaces = {env.namespace: {"kubernetes.io/metadata.name": env.namespace}}
    assert netpolicy.allowed([policy], namespaces, netpolicy.Connection(worker, peer, 29500))
    assert netpolicy.allowed([policy], namespaces, netpolicy.Connection(peer, worker, 41000))
    for port in (29500, 22, 8080):
        conn = netpolicy.Connection(stranger, worker, port)
        assert not netpolicy.allowed([policy], namespaces, conn), port
    await env.wait_phase("ddp", "Running", "Succeeded")


async def test_ray_run_becomes_an_admitted_ray_cluster(env: kit.Env) -> None:
    """A ray run makes a RayJob that Kueue admits and KubeRay turns into a RayCluster with
    the GPUs per worker; a RayJob marked succeeded (no dashboard here) ends the run."""
    spec = kit.job_spec("rl", gpus=2, kind="ray", workers=2)
    assert (await env.submit(spec))[0] == 201
    custom = client.CustomObjectsApi(env.api)

    async def admitted() -> None:
        wl = await kueue.workload_of(env.api, env.namespace, "rl-a1")
        assert support.condition(wl, "Admitted") is not None, wl.get("status")
        assert support.condition(wl, "Admitted")["status"] == "True"  # type: ignore[index]

    await support.eventually(admitted, what="the RayJob's Workload admitted")

    async def ray_cluster() -> dict[str, Any]:
        items = await custom.list_namespaced_custom_object(
            "ray.io", "v1", env.namespace, "rayclusters"
        )
        assert items["items"], "no RayCluster yet"
        return dict(items["items"][0])

    rc = await support.eventually(ray_cluster, what="the RayCluster")
    (group,) = rc["spec"]["workerGroupSpecs"]
    assert group["replicas"] == 2
    limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "2"
    # The head's dashboard (the Jobs API, no auth of its own) takes KubeRay's operator and
    # this attempt's submitter Job only; a stranger of the run's namespace reaches nothing.
    policy = await stored_policy(env, "rl")
    labels = rc["spec"]["headGroupSpec"]["template"]["metadata"]["labels"]
    head = netpolicy.Pod(env.namespace, labels)
    submitter = netpolicy.Pod(env.namespace, {"batch.kubernetes.io/job-name": "rl-a1"})
    operator = netpolicy.Pod("kuberay-system", {"app.kubernetes.io/name": "kuberay"})
    stranger = netpolicy.Pod(env.namespace, {"app": "curious"})
    namespaces = {
        ns: {"kubernetes.io/metadata.name": ns} for ns in (env.namespace, "kuberay-system")
    }
    for source, port, ok in [
        (submitter, 8265, True), (operator, 8265, True), (stranger, 8265, False),
        (submitter, 6379, False), (stranger, 10001, False),
    ]:  # fmt: skip
        conn = netpolicy.Connection(source, head, port)
        assert netpolicy.allowed([policy], namespaces, conn) is ok, (source, port)

    async def mark_succeeded() -> None:
        await custom.patch_namespaced_custom_object_status(
            "ray.io", "v1", env.namespace, "rayjobs", "rl-a1",
            {"status": {"jobStatus": "SUCCEEDED", "jobDeploymentStatus": "Complete"}},
            _content_type="application/merge-patch+json",
        )  # fmt: skip
        run = await env.run("rl")
        assert run["phase"] == "Succeeded", run["phase"]

    await support.eventually(mark_succeeded, what="the ray run to succeed", interval_s=1)


async def test_tau_logs_of_a_pod_on_a_kwok_node_says_so_and_exits_not_found(
    env: kit.Env, tmp_path: pathlib.Path
) -> None:
    """A new user's first `tau logs`: the run's pod is on a KWOK node, which runs no process
    and keeps no log. tau says so in a sentence (no Status body) and exits 5, not found."""
    spec = tmp_path / "tau.yaml"
    spec.write_text(
        f"name: hello\nimage: {kit.IMAGE}\ncommand: echo hi\n"
        "resources: {gpus: 1, cpu: 1, memory: 1Gi}\nqueue: q\n"
    )
    code, _, err = await tau(env, "run", str(spec))
    assert code == 0, err
    await run_pods(env, "hello")

    async def refused() -> tuple[int, str]:
        code, out, err = await tau(env, "logs", "hello")
        assert code != 0, out
        return code, err

    code, err = await support.eventually(refused, what="tau logs to answer")
    assert code == 5, err
    assert "a node KWOK simulates" in err
    assert '"kind"' not in err


async def test_tau_follows_the_specs_namespace_and_reads_every_workers_recent_lines(
    env: kit.Env, dev_cluster: cluster.Cluster, tmp_path: pathlib.Path
) -> None:
    """A tau.yaml that names its namespace goes there even with TAU_NAMESPACE set elsewhere,
    and the printed follow-up carries `-n`; `tau logs --all-workers --since 1h` prints each
    worker's lines prefixed, without the lines older than an hour (the API server's
    sinceSeconds, through the controller, on KWOK's kubelet log endpoint)."""
    spec = tmp_path / "tau.yaml"
    spec.write_text(
        f"name: two\nnamespace: {env.namespace}\nimage: {kit.IMAGE}\ncommand: python t.py\n"
        "workers: 2\nresources: {gpus: 1, cpu: 1, memory: 1Gi}\nqueue: q\n"
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(TAU), "run", str(spec),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "TAU_URL": env.url, "TAU_TOKEN": env.token,
             "TAU_NAMESPACE": "elsewhere", "XDG_CONFIG_HOME": str(tmp_path)},
    )  # fmt: skip
    submitted, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    assert f"tau status two -n {env.namespace}" in submitted.decode()

    pods = sorted(p["metadata"]["name"] for p in await run_pods(env, "two", count=2))
    old = dt.datetime.now(dt.UTC) - dt.timedelta(hours=2)
    for index, pod in enumerate(pods):
        with cluster.pod_log_file(dev_cluster, env.namespace, pod, "main") as path:
            path.write_text(cluster.cri_log_line(f"old {index}", now=old))
            cluster.append_log(path, f"new {index}")
            await client.CustomObjectsApi(env.api).create_namespaced_custom_object(
                *KWOK_LOGS, env.namespace, "logs",
                cluster.kwok_logs_object(env.namespace, pod, "main", path),
            )  # fmt: skip

    async def logs() -> str:
        code, out, err = await tau(env, "logs", "two", "--all-workers", "--since", "1h")
        assert code == 0, err
        assert "new 0" in out, out
        assert "new 1" in out, out
        return out

    printed = await support.eventually(logs, what="tau logs of both workers", interval_s=1)
    lines = sorted(line for line in printed.splitlines() if line)
    assert lines in (["[w0] new 0", "[w1] new 1"], ["[w0] new 1", "[w1] new 0"]), printed
