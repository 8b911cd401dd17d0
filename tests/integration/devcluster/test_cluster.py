"""The local control plane is real: Kueue admits, the scheduler binds, KWOK runs and evicts,
KubeRay reconciles, the API server reviews tokens, and container logs stream."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import pathlib
import subprocess
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from kubernetes_asyncio import client, watch

from devcluster import cluster
from tests import kueue, support

pytestmark = pytest.mark.cluster


@pytest_asyncio.fixture
async def queue(k8s: client.ApiClient, namespace: str) -> AsyncIterator[str]:
    """A LocalQueue in the test namespace backed by a private 8-GPU ClusterQueue."""
    name = await kueue.create_queues(k8s, namespace, gpus=8)
    try:
        yield name
    finally:
        await kueue.delete_queues(k8s, namespace)


@pytest_asyncio.fixture
async def own_node(
    k8s: client.ApiClient, dev_cluster: cluster.Cluster, bin_dir: pathlib.Path, namespace: str
) -> AsyncIterator[str]:
    """A fake GPU node of this test's own, removed afterwards."""
    name = f"n-{namespace}"[:63].rstrip("-")
    await asyncio.to_thread(dev_cluster.ensure_nodes, bin_dir, 1, prefix=name)
    try:
        yield f"{name}0"
    finally:
        await client.CoreV1Api(k8s).delete_node(f"{name}0")


async def test_kueue_admits_a_suspended_job_which_runs_and_finishes_on_a_fake_gpu_node(
    k8s: client.ApiClient, namespace: str, queue: str
) -> None:
    """(a) Kueue admits a queued Job; the pod lands on a fake GPU node, runs and completes."""
    batch = client.BatchV1Api(k8s)
    core = client.CoreV1Api(k8s)
    await batch.create_namespaced_job(namespace, kueue.gpu_job("train", queue, gpus=2))

    async def finished() -> dict[str, Any]:
        wl = await kueue.workload_of(k8s, namespace, "train")
        cond = support.condition(wl, "Finished")
        assert cond is not None, f"Workload conditions: {wl.get('status', {}).get('conditions')}"
        assert cond["status"] == "True"
        return wl

    wl = await support.eventually(finished, what="the Workload to finish")
    admitted = support.condition(wl, "Admitted")
    assert admitted is not None
    assert admitted["status"] == "True"
    assert wl["status"]["admission"]["clusterQueue"] == f"cq-{namespace}"[:63]
    job = await batch.read_namespaced_job("train", namespace)
    assert job.status.succeeded == 1
    pods = await core.list_namespaced_pod(namespace, label_selector="job-name=train")
    assert len(pods.items) == 1
    node = await core.read_node(pods.items[0].spec.node_name)
    assert node.metadata.annotations[cluster.FAKE_NODE_ANNOTATION] == "fake"
    assert node.status.capacity["nvidia.com/gpu"] == "8"
    assert pods.items[0].status.phase == "Succeeded"


async def test_a_job_over_quota_stays_pending_and_kueue_says_why(
    k8s: client.ApiClient, namespace: str, queue: str
) -> None:
    """(b) A Job asking for more GPUs than the quota stays suspended with Kueue's reason."""
    batch = client.BatchV1Api(k8s)
    await batch.create_namespaced_job(namespace, kueue.gpu_job("big", queue, gpus=4, parallelism=4))

    async def pending_with_reason() -> str:
        wl = await kueue.workload_of(k8s, namespace, "big")
        cond = support.condition(wl, "QuotaReserved")
        assert cond is not None, "no QuotaReserved condition yet"
        assert cond["status"] == "False"
        assert "insufficient quota" in cond["message"], cond["message"]
        return str(cond["message"])

    message = await support.eventually(pending_with_reason, what="Kueue's pending reason")
    assert "nvidia.com/gpu" in message
    job = await batch.read_namespaced_job("big", namespace)
    assert job.spec.suspend is True
    assert not job.status.active


async def test_a_rayjob_is_admitted_and_kuberay_creates_its_raycluster(
    k8s: client.ApiClient, namespace: str, queue: str
) -> None:
    """(c) A queued RayJob is admitted by Kueue and KubeRay creates its RayCluster."""
    custom = client.CustomObjectsApi(k8s)
    image = "rayproject/ray@sha256:" + "1" * 64
    container = {"name": "ray", "image": image, "resources": {"requests": {"cpu": "1"}}}
    worker = {
        "name": "ray",
        "image": image,
        "resources": {"requests": {"cpu": "1"}, "limits": {"nvidia.com/gpu": "2"}},
    }
    rayjob = {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": "rj", "labels": {"kueue.x-k8s.io/queue-name": queue}},
        "spec": {
            "suspend": True,
            "entrypoint": "python train.py",
            "shutdownAfterJobFinishes": True,
            "rayClusterSpec": {
                "headGroupSpec": {
                    "rayStartParams": {},
                    "template": {"spec": {"containers": [container]}},
                },
                "workerGroupSpecs": [
                    {
                        "groupName": "gpu",
                        "replicas": 1,
                        "minReplicas": 1,
                        "maxReplicas": 1,
                        "rayStartParams": {},
                        "template": {"spec": {"containers": [worker]}},
                    }
                ],
            },
        },
    }
    await custom.create_namespaced_custom_object("ray.io", "v1", namespace, "rayjobs", rayjob)

    async def raycluster() -> dict[str, Any]:
        rcs = await custom.list_namespaced_custom_object("ray.io", "v1", namespace, "rayclusters")
        owned = [
            rc
            for rc in rcs["items"]
            if any(o["name"] == "rj" for o in rc["metadata"].get("ownerReferences") or [])
        ]
        assert owned, "no RayCluster owned by the RayJob yet"
        return dict(owned[0])

    rc = await support.eventually(raycluster, what="KubeRay to create the RayCluster")
    groups = rc["spec"]["workerGroupSpecs"]
    assert groups[0]["template"]["spec"]["containers"][0]["resources"]["limits"] == {
        "nvidia.com/gpu": "2"
    }
    wl = await kueue.workload_of(k8s, namespace, "rj")
    admitted = support.condition(wl, "Admitted")
    assert admitted is not None
    assert admitted["status"] == "True"


def _pod(name: str, node_selector: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "containers": [{"name": "main", "image": "busybox@sha256:" + "2" * 64}],
            **({"nodeSelector": node_selector} if node_selector else {}),
            **spec,
        },
    }


async def _phase(core: client.CoreV1Api, ns: str, name: str, phase: str) -> Any:
    pod = await core.read_namespaced_pod(name, ns)
    assert pod.status.phase == phase, f"{name} is {pod.status.phase}"
    return pod


async def test_a_cordoned_node_gets_no_new_pods_and_the_eviction_api_evicts_from_it(
    k8s: client.ApiClient, namespace: str, own_node: str
) -> None:
    """(d) Cordoning stops scheduling; eviction honours a PodDisruptionBudget, then evicts."""
    core = client.CoreV1Api(k8s)
    on_node = {"kubernetes.io/hostname": own_node}
    await core.create_namespaced_pod(namespace, _pod("victim", on_node))
    await core.create_namespaced_pod(namespace, _pod("guarded", on_node))
    for name in ("victim", "guarded"):
        await support.eventually(functools.partial(_phase, core, namespace, name, "Running"))
    policy = client.PolicyV1Api(k8s)
    await policy.create_namespaced_pod_disruption_budget(
        namespace,
        {
            "metadata": {"name": "guard"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}},
        },
    )

    await core.patch_node(own_node, {"spec": {"unschedulable": True}})
    await core.create_namespaced_pod(namespace, _pod("late", on_node))

    async def unschedulable() -> None:
        pod = await core.read_namespaced_pod("late", namespace)
        conds = {c.type: c for c in pod.status.conditions or []}
        assert "PodScheduled" in conds, "not yet considered by the scheduler"
        assert conds["PodScheduled"].status == "False"
        assert conds["PodScheduled"].reason == "Unschedulable"

    await support.eventually(unschedulable, what="the scheduler to refuse the cordoned node")
    assert (await core.read_namespaced_pod("late", namespace)).spec.node_name is None

    async def budget_computed() -> None:
        pdb = await policy.read_namespaced_pod_disruption_budget_status("guard", namespace)
        assert pdb.status.current_healthy == 1, pdb.status

    await support.eventually(budget_computed, what="the disruption controller")
    eviction = {"metadata": {"name": "guarded", "namespace": namespace}}
    with pytest.raises(client.ApiException) as refused:
        await core.create_namespaced_pod_eviction("guarded", namespace, eviction)
    assert refused.value.status == 429

    seen: list[tuple[str, str, tuple[str, ...]]] = []

    async def watch_victim() -> None:
        w = watch.Watch()
        async with w.stream(
            core.list_namespaced_pod, namespace, field_selector="metadata.name=victim"
        ) as stream:
            async for event in stream:
                pod = event["object"]
                conds = tuple(sorted(c.type for c in pod.status.conditions or []))
                seen.append((event["type"], pod.status.phase, conds))
                if event["type"] == "DELETED":
                    return

    watcher = asyncio.create_task(watch_victim())
    await asyncio.sleep(0.5)  # the watch is established
    eviction = {"metadata": {"name": "victim", "namespace": namespace}}
    await core.create_namespaced_pod_eviction("victim", namespace, eviction)
    await asyncio.wait_for(watcher, support.DEADLINE_S)
    seen_failed = any(phase == "Failed" and "DisruptionTarget" in conds for _, phase, conds in seen)
    assert seen_failed, f"the evicted pod vanished without passing through Failed: {seen}"
    assert (await core.read_namespaced_pod("guarded", namespace)).status.phase == "Running"


async def test_token_and_access_reviews_answer_and_pod_bound_tokens_carry_the_node_name(
    k8s: client.ApiClient, namespace: str
) -> None:
    """(e) TokenReview authenticates a pod-bound token (with its node), SAR follows RBAC."""
    core = client.CoreV1Api(k8s)
    rbac = client.RbacAuthorizationV1Api(k8s)
    await core.create_namespaced_service_account(namespace, {"metadata": {"name": "agent"}})
    await core.create_namespaced_pod(
        namespace, _pod("agent-pod", nodeName="gpu-node-1", serviceAccountName="agent")
    )
    pod = await support.eventually(lambda: _phase(core, namespace, "agent-pod", "Running"))
    await rbac.create_namespaced_role(
        namespace,
        {
            "metadata": {"name": "read-pods"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}],
        },
    )
    await rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "agent-reads-pods"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "read-pods",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "agent", "namespace": namespace}],
        },
    )
    tr = await core.create_namespaced_service_account_token(
        "agent",
        namespace,
        {
            "spec": {
                "audiences": ["taugrid"],
                "expirationSeconds": 600,
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": "agent-pod",
                    "uid": pod.metadata.uid,
                },
            }
        },
    )
    authn = client.AuthenticationV1Api(k8s)
    review = await authn.create_token_review(
        {"spec": {"token": tr.status.token, "audiences": ["taugrid"]}}
    )
    user = review.status.user
    assert review.status.authenticated is True
    assert user.username == f"system:serviceaccount:{namespace}:agent"
    assert user.extra["authentication.kubernetes.io/node-name"] == ["gpu-node-1"]
    assert user.extra["authentication.kubernetes.io/pod-name"] == ["agent-pod"]

    wrong_audience = await authn.create_token_review(
        {"spec": {"token": tr.status.token, "audiences": ["someone-else"]}}
    )
    assert not wrong_audience.status.authenticated

    authz = client.AuthorizationV1Api(k8s)

    async def allowed(verb: str, resource: str, ns: str | None) -> bool:
        sar = await authz.create_subject_access_review(
            {
                "spec": {
                    "user": user.username,
                    "groups": user.groups,
                    "resourceAttributes": {"verb": verb, "resource": resource, "namespace": ns},
                }
            }
        )
        return bool(sar.status.allowed)

    assert await allowed("get", "pods", namespace) is True
    assert await allowed("patch", "nodes", None) is False
    assert await allowed("get", "pods", "default") is False


async def test_kubectl_logs_follow_streams_the_lines_of_a_fake_pods_log_file(
    k8s: client.ApiClient,
    namespace: str,
    dev_cluster: cluster.Cluster,
    bin_dir: pathlib.Path,
) -> None:
    """(f) `kubectl logs -f` of a KWOK pod streams what is appended to its log file."""
    core = client.CoreV1Api(k8s)
    await core.create_namespaced_pod(namespace, _pod("talker", nodeName="gpu-node-2"))
    await support.eventually(lambda: _phase(core, namespace, "talker", "Running"))
    with cluster.pod_log_file(dev_cluster, namespace, "talker", "main") as log:
        cluster.append_log(log, "step 1 loss 2.31")
        await client.CustomObjectsApi(k8s).create_namespaced_custom_object(
            "kwok.x-k8s.io",
            "v1alpha1",
            namespace,
            "logs",
            cluster.kwok_logs_object(namespace, "talker", "main", log),
        )
        proc = await asyncio.create_subprocess_exec(
            str(bin_dir / "kubectl"),
            f"--kubeconfig={dev_cluster.kubeconfig}",
            "-n",
            namespace,
            "logs",
            "-f",
            "talker",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            assert proc.stdout is not None
            stdout = proc.stdout
            lines: list[str] = []

            async def read_until(text: str) -> None:
                while not any(text in line for line in lines):
                    raw = await asyncio.wait_for(stdout.readline(), support.DEADLINE_S)
                    if not raw:
                        err = await proc.stderr.read() if proc.stderr else b""
                        msg = f"kubectl logs ended early: {err.decode()!r}, got {lines}"
                        raise AssertionError(msg)
                    lines.append(raw.decode())

            await read_until("step 1 loss 2.31")
            cluster.append_log(log, "step 2 loss 1.97")
            await read_until("step 2 loss 1.97")
            assert proc.returncode is None, "kubectl logs -f should still be following"
        finally:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()


NODE_COLUMNS = (
    "jsonpath={range .items[*]}{.metadata.name} {.status.allocatable.nvidia\\.com/gpu} "
    "{.status.conditions[?(@.type=='Ready')].status}{'\\n'}{end}"
)


def test_the_printed_kubeconfig_lists_the_fake_gpu_nodes_ready_with_8_gpus(
    dev_cluster: cluster.Cluster, bin_dir: pathlib.Path
) -> None:
    """`kubectl get nodes` with the written kubeconfig shows the fake GPU nodes Ready."""
    out = subprocess.run(
        [str(bin_dir / "kubectl"), f"--kubeconfig={dev_cluster.kubeconfig}", "get", "nodes",
         "-l", "type=kwok", "-o", NODE_COLUMNS],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    rows = {
        line.split()[0]: line.split()[1:]
        for line in out.splitlines()
        if line.startswith("gpu-node-")
    }
    assert {f"gpu-node-{i}" for i in range(4)} <= set(rows)
    assert all(v == ["8", "True"] for v in rows.values()), rows
    cq = subprocess.run(
        [str(bin_dir / "kubectl"), f"--kubeconfig={dev_cluster.kubeconfig}", "get",
         "clusterqueues.kueue.x-k8s.io", cluster.CLUSTER_QUEUE, "-o", "name"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert cq == f"clusterqueue.kueue.x-k8s.io/{cluster.CLUSTER_QUEUE}"
