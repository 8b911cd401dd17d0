"""The one install (issue 32, docs/platform.md "One install"): on the dev cluster's bare control
plane (`taugrid dev up --bare`: no Kueue, no KubeRay, none of their CRDs, webhooks or queues),
`helm install` of the chart alone, with kueue.enabled and kuberay.enabled, brings up Kueue,
the KubeRay operator and TauGrid as pods of the real node; a Job and a RayJob go through
Kueue; TauGrid's agent reports the real node's GPUs healthy and a GPU Job on the real node's
queue passes TauGrid's AdmissionCheck and runs there; `helm uninstall` removes the stack and
leaves nothing Terminating.

A tier of its own (marker `oneinstall`, left out of the main run): scripts/test runs it after
the main pytest run, on a bare cluster it brings up in place of the main one:

    taugrid dev up --bare && pytest -m oneinstall tests/oneinstall
"""

from __future__ import annotations

import json
import pathlib
import time
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
import yaml

from controller import marks
from devcluster import build, chart, cluster, node, stack
from tests import kueue

pytestmark = [pytest.mark.oneinstall, pytest.mark.timeout(900)]

T = TypeVar("T")
RELEASE, NAMESPACE = stack.RELEASE, stack.NAMESPACE
QUEUE = cluster.LOCAL_QUEUE
DEADLINE_S = 180.0
STACK_CRD_SUFFIXES = (".kueue.x-k8s.io", ".ray.io")


def until(probe: Callable[[], T], what: str, timeout_s: float = DEADLINE_S) -> T:
    """Call `probe` until it returns without AssertionError (or a failed kubectl, as for an
    object not made yet); fail saying what it last saw."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return probe()
        except (AssertionError, cluster.ClusterError) as err:
            if time.monotonic() > deadline:
                pytest.fail(f"timed out after {timeout_s:.0f}s waiting for {what}: {err}")
        time.sleep(1)


class Kube:
    """kubectl against the bare dev cluster, JSON in and out."""

    def __init__(self, c: cluster.Cluster, bin_dir: pathlib.Path) -> None:
        self.c, self.bin_dir = c, bin_dir

    def __call__(self, *args: str, stdin: str | None = None) -> str:
        return self.c.kubectl(self.bin_dir, *args, stdin=stdin)

    def get(self, *args: str) -> dict[str, Any]:
        return dict(json.loads(self("get", *args, "-o", "json")))

    def items(self, *args: str) -> list[dict[str, Any]]:
        return list(self.get(*args)["items"])

    def create(self, obj: dict[str, Any]) -> None:
        self("create", "-f", "-", stdin=yaml.safe_dump(obj))

    def stack_crds(self) -> list[dict[str, Any]]:
        return [d for d in self.items("crd")
                if d["metadata"]["name"].endswith(STACK_CRD_SUFFIXES)]  # fmt: skip

    def webhooks(self) -> list[str]:
        kinds = "mutatingwebhookconfigurations,validatingwebhookconfigurations"
        return [d["metadata"]["name"] for d in self.items(kinds)]


@pytest.fixture(scope="module")
def bare() -> tuple[Kube, stack.RealNode]:
    """The bare dev cluster with its real node and the operators' images imported there."""
    c = cluster.Cluster()
    if not (c.is_up() and c.bare and node.recorded(c)):
        why = "the one install needs a bare dev cluster with its real node: `taugrid dev up --bare`"
        pytest.fail(f"{why} (scripts/test brings one up for this stage)")
    bin_dir = build.built_dir() / "bin"
    refs = json.loads(node.Paths.of(c.state).images.read_text())
    assert {"controller", "agent", "kueue", "kuberay"} <= set(refs), refs
    return Kube(c, bin_dir), node.RealNode(c, bin_dir).stack_view(refs)


def ray_job(name: str) -> dict[str, Any]:
    """A suspended RayJob for Kueue's queue: a head and one worker (KWOK runs their pods)."""

    def pod(container: str) -> dict[str, Any]:
        return {"spec": {"containers": [{
            "name": container, "image": "registry.example/ray@sha256:" + "0" * 64,
            "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                          "limits": {"cpu": "1", "memory": "1Gi"}}}]}}  # fmt: skip

    return {
        "apiVersion": "ray.io/v1", "kind": "RayJob",
        "metadata": {"name": name, "labels": {"kueue.x-k8s.io/queue-name": QUEUE}},
        "spec": {
            "suspend": True, "entrypoint": "python -c 'print(1)'",
            "shutdownAfterJobFinishes": True,
            "rayClusterSpec": {
                "headGroupSpec": {"rayStartParams": {}, "template": pod("ray-head")},
                "workerGroupSpecs": [{"groupName": "w", "replicas": 1, "minReplicas": 1,
                                      "maxReplicas": 1, "rayStartParams": {},
                                      "template": pod("ray-worker")}],
            },
        },
    }  # fmt: skip


def workload_of(k: Kube, owner: str) -> dict[str, Any]:
    """The Workload Kueue made for a Job or RayJob in `default`, once it is admitted."""
    wl = _workload(k, owner)
    assert wl is not None, f"no Workload for {owner} yet"
    admitted = [c for c in wl.get("status", {}).get("conditions", [])
                if c["type"] == "Admitted" and c["status"] == "True"]  # fmt: skip
    assert admitted, wl.get("status")
    return wl


def _workload(k: Kube, owner: str) -> dict[str, Any] | None:
    """The Workload Kueue made for a Job or RayJob in `default` (None before there is one)."""
    for wl in k.items("-n", "default", "workloads.kueue.x-k8s.io"):
        if any(o.get("name") == owner for o in wl["metadata"].get("ownerReferences") or []):
            return wl
    return None


def job_complete(k: Kube, name: str) -> None:
    """A Job in `default` has completed (a failed one fails at once, with its Workload's
    status, which says whether an admission check held it)."""
    job = k.get("-n", "default", "job", name)
    done = [c for c in job.get("status", {}).get("conditions", [])
            if c["type"] in {"Complete", "Failed"} and c["status"] == "True"]  # fmt: skip
    wl = _workload(k, name) or {}
    assert done, (job.get("status"), wl.get("status"))
    if done[0]["type"] == "Failed":
        pytest.fail(f"Job {name} failed: {job.get('status')}")


def test_helm_installs_and_uninstalls_queues_ray_and_taugrid_together(
    bare: tuple[Kube, stack.RealNode],
) -> None:
    k, real = bare
    # Bare: nothing of Kueue or KubeRay is there before the install.
    assert k.stack_crds() == []
    assert k.webhooks() == []

    started = time.monotonic()
    chart.install(k.c.kubeconfig, RELEASE, NAMESPACE, stack.one_install_values(4, real),
                  wait=True, timeout_s=300, create_namespace=True, bin_dir=k.bin_dir)  # fmt: skip
    print(f"helm install --wait of the stack: {time.monotonic() - started:.1f}s")
    deployments = {d["metadata"]["name"]: d for d in k.items("-n", NAMESPACE, "deployments")}
    assert set(deployments) == {
        "taugrid-controller", "taugrid-kueue-controller-manager", "kuberay-operator",
    }  # fmt: skip
    for name, d in deployments.items():
        assert d["status"].get("readyReplicas") == d["spec"]["replicas"], name
    pods = k.items("-n", NAMESPACE, "pods", "-l", "app.kubernetes.io/instance=taugrid")
    assert {p["spec"].get("nodeName") for p in pods} == {real.name}
    assert {d.get("metadata", {}).get("name") for d in k.stack_crds()} >= {
        "clusterqueues.kueue.x-k8s.io", "workloads.kueue.x-k8s.io", "rayjobs.ray.io",
        "rayclusters.ray.io",
    }  # fmt: skip
    assert k.get("clusterqueue.kueue.x-k8s.io", cluster.CLUSTER_QUEUE)["metadata"]["name"]

    # A Job through Kueue: admitted to the chart's queue, run (by KWOK) to completion.
    k.create(kueue.gpu_job("one-job", QUEUE, gpus=1))
    until(lambda: workload_of(k, "one-job"), "the Job's Workload admitted")

    until(lambda: job_complete(k, "one-job"), "the Job to complete")

    # A RayJob through Kueue: admitted, and KubeRay's operator makes its RayCluster, whose
    # head pod runs, and then its submitter Job.
    k.create(ray_job("one-ray"))
    until(lambda: workload_of(k, "one-ray"), "the RayJob's Workload admitted")

    def head_running() -> str:
        # The RayJob is admitted before KubeRay has made its RayCluster: none yet is a wait.
        clusters = k.items("-n", "default", "rayclusters.ray.io")
        assert len(clusters) == 1, [c["metadata"]["name"] for c in clusters]
        (rc,) = clusters
        selector = f"ray.io/cluster={rc['metadata']['name']},ray.io/node-type=head"
        heads = k.items("-n", "default", "pods", "-l", selector)
        assert heads, "no head pod yet"
        assert heads[0]["status"].get("phase") == "Running", heads[0]["status"]
        return str(rc["metadata"]["name"])

    until(head_running, "the RayJob's RayCluster with its head pod running")

    # With the cluster ready KubeRay submits the job: its submitter Job, named as the RayJob.
    def submitted() -> None:
        jobs = [j["metadata"]["name"] for j in k.items("-n", "default", "jobs")]
        assert "one-ray" in jobs, jobs

    until(submitted, "KubeRay's submitter Job")
    assert k.get("-n", "default", "rayjob", "one-ray")["spec"].get("suspend", False) is False

    # GPU health in the same install: TauGrid's agent on the real node reports its GPUs (the
    # fake NVML) to the controller pod, through the dev relay (the node runs no kube-proxy);
    # the real node's ClusterQueue waits on TauGrid's AdmissionCheck, and a Job asking for a
    # GPU there passes the check, runs for real and completes, its pod carrying the check's
    # pod-set update.
    stack.start_controller_relay(k.c, k.bin_dir, real)

    def reported_healthy() -> None:
        conditions = k.get("node", real.name)["status"].get("conditions") or []
        gpu = [c for c in conditions if c["type"] == marks.NODE_CONDITION]
        assert gpu, "no GPUHealthy condition yet"
        assert gpu[0]["status"] == "True", gpu

    # A node whose agent never reported carries no condition and does not hold admission
    # back (docs/quarantine.md); here the agent has reported, and the gate judges that.
    until(reported_healthy, "GPUHealthy=True on the real node, from its agent's heartbeats")
    real_queues = stack.real_node_queues(real)
    k.c.apply(k.bin_dir, real_queues)
    k.create(real_gpu_job("one-gpu"))

    until(
        lambda: job_complete(k, "one-gpu"),
        "the GPU Job passing TauGrid's check and completing on the real node",
    )
    wl = (_workload(k, "one-gpu") or {}).get("status") or {}
    assert [(c["name"], c["state"]) for c in wl.get("admissionChecks", [])] == [
        (cluster.ADMISSION_CHECK, "Ready")
    ], wl
    (pod,) = k.items("-n", "default", "pods", "-l", "job-name=one-gpu")
    assert pod["spec"]["nodeName"] == real.name
    assert pod["metadata"]["labels"].get(marks.GATE_PASSED_LABEL) == "true", pod["metadata"]

    # The user's objects go first (an admitted Workload keeps its ClusterQueue), then the
    # real node's queues, which are not the chart's.
    k("-n", "default", "delete", "rayjob", "one-ray", "--wait=true", "--timeout=120s")
    for job_name in ("one-job", "one-gpu"):
        k("-n", "default", "delete", "job", job_name, "--wait=true", "--timeout=120s")
    until(lambda: _none(k.items("-n", "default", "workloads.kueue.x-k8s.io")), "Workloads gone")
    k("delete", "--wait=true", "--timeout=120s", "-f", "-",
      stdin=yaml.safe_dump_all(list(reversed(real_queues))))  # fmt: skip

    started = time.monotonic()
    chart.uninstall(k.c.kubeconfig, RELEASE, NAMESPACE, wait=True, timeout_s=300,
                    bin_dir=k.bin_dir)  # fmt: skip
    print(f"helm uninstall --wait of the stack: {time.monotonic() - started:.1f}s")

    def nothing_left() -> None:
        left = [d["metadata"]["name"] for d in k.stack_crds()]
        # KubeRay's CRDs come from its chart's crds/, which Helm installs and never deletes.
        assert sorted(left) == sorted(RAY_CRDS), left
        assert k.items("-n", NAMESPACE, "deployments") == []
        assert k.webhooks() == []
        assert k.items("-n", NAMESPACE, "jobs") == []  # the hook Job, removed once it succeeded

    until(nothing_left, "nothing of the stack left but KubeRay's crds/")
    terminating = [d["metadata"]["name"] for d in k.items("crd")
                   if d["metadata"].get("deletionTimestamp")]  # fmt: skip
    assert terminating == []
    roles = k.items("clusterroles", "-l", "app.kubernetes.io/instance=taugrid")
    assert roles == []


RAY_CRDS = ("rayclusters.ray.io", "rayjobs.ray.io", "rayservices.ray.io")


def real_gpu_job(name: str) -> dict[str, Any]:
    """A Job for the real node's queue: one GPU, a real container in the run image."""
    job = kueue.gpu_job(name, stack.REAL_NODE_QUEUE, gpus=1)
    (container,) = job["spec"]["template"]["spec"]["containers"]
    container.update(
        image=node.RUN_IMAGE_ALIAS, imagePullPolicy="Never",
        command=["python3", "-c", "print('healthy GPU')"],
        resources={"requests": {"cpu": "100m", "memory": "128Mi"},
                   "limits": {"nvidia.com/gpu": "1"}},
    )  # fmt: skip
    return job


def _none(items: list[dict[str, Any]]) -> None:
    assert items == [], [i["metadata"]["name"] for i in items]
