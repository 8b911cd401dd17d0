"""The chart's ValidatingAdmissionPolicy on the real API server (review H4, DESIGN.md §10).

A test release of the chart is installed (its runs namespace is `default`); each case is a
request made as that release's controller ServiceAccount (impersonated by the dev cluster's
admin, with `dryRun=All`, so nothing is kept) and answered three ways: allowed, refused by
RBAC, or refused by the policy. The writes the controller must not make are refused; the
writes its code makes go through, so the policy is not simply closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import pathlib
import ssl
import urllib.parse
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from kubernetes_asyncio import client

from controller.runs import objects, rendering
from devcluster import cluster
from shared import spec as specs
from tests import releasekit, support

pytestmark = pytest.mark.cluster

RUNS = "default"
"""The release's runs namespace (the chart's default `controller.runNamespaces`)."""
OWNER = {"apiVersion": "taugrid.dev/v1alpha1", "kind": "TauRun", "name": "r",
         "uid": "00000000-0000-0000-0000-000000000001", "controller": True}  # fmt: skip
OURS = {"labels": {"taugrid.dev/run": "r"}, "ownerReferences": [OWNER]}
PLAIN_POD: dict[str, Any] = {
    "restartPolicy": "Never", "automountServiceAccountToken": False,
    "containers": [{"name": "main", "image": "registry.example/x@sha256:" + "1" * 64}],
    "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory"}},
                {"name": "ckpt", "configMap": {"name": "r-checkpoint", "optional": True}},
                {"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
}  # fmt: skip


def job(meta: dict[str, Any], **pod: Any) -> dict[str, Any]:
    """A suspended Job with the plain pod template, changed by `pod`."""
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "r-a1", **meta},
            "spec": {"suspend": True, "template": {"spec": {**PLAIN_POD, **pod}}}}  # fmt: skip


def main(name: str = "main", **container: Any) -> dict[str, Any]:
    """A run container, changed by `container`."""
    return {"name": name, "image": "registry.example/x@sha256:" + "1" * 64, **container}


def indexed(obj: dict[str, Any]) -> dict[str, Any]:
    """The Job as an Indexed Job (a pytorch run's kind)."""
    return {**obj, "spec": {**obj["spec"], "completionMode": "Indexed", "completions": 1}}


def annotated(obj: dict[str, Any], annotations: dict[str, str]) -> dict[str, Any]:
    """The Job with `annotations` on its pod template."""
    template = {**obj["spec"]["template"], "metadata": {"annotations": annotations}}
    return {**obj, "spec": {**obj["spec"], "template": template}}


ESCAPED_POD: dict[str, Any] = {
    "restartPolicy": "Never", "serviceAccountName": "builder", "hostNetwork": True,
    "containers": [main(securityContext={"privileged": True},
                        volumeMounts=[{"name": "root", "mountPath": "/host"}])],
    "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
}  # fmt: skip
"""A pod that is privileged, host-networked, mounts the node's root and runs as another
ServiceAccount with its token (review 3, finding 2's RayJob submitter)."""


def rayjob(
    meta: dict[str, Any], *, cluster: bool = True, submitter: dict[str, Any] | None = None,
    autoscaler: dict[str, Any] | None = None, worker: dict[str, Any] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """A suspended RayJob: its own RayCluster of plain pods (or a clusterSelector onto
    someone's), optionally a submitter template and an autoscaler sidecar."""
    spec: dict[str, Any] = {"suspend": True, "entrypoint": "python x.py",
                            "shutdownAfterJobFinishes": True,
                            "submissionMode": "K8sJobMode"}  # fmt: skip
    if cluster:
        spec["rayClusterSpec"] = {
            "headGroupSpec": {"rayStartParams": {}, "template": {"spec": PLAIN_POD}},
            "workerGroupSpecs": [{"groupName": "w", "replicas": 1, "minReplicas": 1,
                                  "maxReplicas": 1, "rayStartParams": {},
                                  "template": {"spec": worker or PLAIN_POD}}],
        }  # fmt: skip
        if autoscaler is not None:
            spec["rayClusterSpec"]["autoscalerOptions"] = autoscaler
    else:
        spec["clusterSelector"] = {"ray.io/cluster": "theirs"}
    if submitter is not None:
        spec["submitterPodTemplate"] = {"spec": submitter}
    return {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "r-a1", **meta},
            "spec": spec}  # fmt: skip


def runlog(meta: dict[str, Any]) -> dict[str, Any]:
    spec = {"run": "r", "attempt": 1, "worker": 0, "pod": "r-a1-x", "container": "main",
            "capturedAt": "2026-01-01T00:00:00Z", "complete": True, "truncated": False,
            "bytes": 3, "log": "ok\n"}  # fmt: skip
    return {"apiVersion": "taugrid.dev/v1alpha1", "kind": "TauRunLog",
            "metadata": {"name": "r-a1-w0", **meta}, "spec": spec}  # fmt: skip


def configmap(meta: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "r-checkpoint", **meta}}


class Impersonated:
    """Requests to the API server as the release's controller ServiceAccount."""

    def __init__(
        self, dev: cluster.Cluster, user: str, http: aiohttp.ClientSession,
        groups: tuple[str, ...] | None = None,
    ) -> None:  # fmt: skip
        self.dev = dev
        self.user = user
        self.http = http
        self.groups = groups

    async def send(
        self, method: str, path: str, body: dict[str, Any], *, pod: str = "",
        content_type: str = "application/json",
    ) -> str:  # fmt: skip
        """'allowed', 'rbac' (RBAC refused) or 'policy' (the admission policy refused: 403
        naming it; a policy that fails to evaluate answers 422 and fails the test)."""
        groups: tuple[str, ...]
        if self.groups is None:
            namespace = self.user.split(":")[2]
            groups = ("system:serviceaccounts", f"system:serviceaccounts:{namespace}",
                      "system:authenticated")  # fmt: skip
        else:
            groups = self.groups
        headers = [("Impersonate-User", self.user), ("Content-Type", content_type)]
        headers += [("Impersonate-Group", g) for g in groups]
        if pod:
            key = urllib.parse.quote("authentication.kubernetes.io/pod-name", safe="")
            headers.append((f"Impersonate-Extra-{key}", pod))
        sep = "&" if "?" in path else "?"
        async with self.http.request(
            method, f"{self.dev.server}{path}{sep}dryRun=All", data=json.dumps(body),
            headers=headers,
        ) as resp:  # fmt: skip
            text = await resp.text()
        if resp.status < 300:
            return "allowed"
        assert resp.status == 403, (resp.status, text)
        return "policy" if "ValidatingAdmissionPolicy" in text else "rbac"


@pytest_asyncio.fixture(scope="module")
async def release(
    dev_cluster: cluster.Cluster, bin_dir: pathlib.Path, k8s: client.ApiClient
) -> AsyncIterator[releasekit.Release]:
    """One test release for the whole module (installing one per case would take minutes)."""
    core = client.CoreV1Api(k8s)
    name = support.unique_name("t-admission-policy", max_len=40)
    await core.create_namespace(
        {"metadata": {"name": name, "labels": {"taugrid.dev/test": "true"}}}
    )
    try:
        async with releasekit.installed(dev_cluster, bin_dir, name) as rel:
            yield rel
    finally:
        await core.delete_namespace(name, propagation_policy="Background")


@pytest_asyncio.fixture(scope="module")
async def controller(
    dev_cluster: cluster.Cluster, release: releasekit.Release
) -> AsyncIterator[Impersonated]:
    """The release's controller, impersonated; its policy is in force once this yields."""
    pki = dev_cluster.pki
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as http:
        me = Impersonated(dev_cluster, release.service_account("controller"), http)

        async def enforced() -> None:
            assert await me.send("POST", f"/apis/batch/v1/namespaces/{RUNS}/jobs", job({})) == (
                "policy"
            )

        await support.eventually(enforced, what="the release's policy in force")
        yield me


JOBS = f"/apis/batch/v1/namespaces/{RUNS}/jobs"
RUNLOGS = f"/apis/taugrid.dev/v1alpha1/namespaces/{RUNS}/taurunlogs"
CONFIGMAPS = f"/api/v1/namespaces/{RUNS}/configmaps"
SECRETS = f"/api/v1/namespaces/{RUNS}/secrets"
RAYJOBS = f"/apis/ray.io/v1/namespaces/{RUNS}/rayjobs"


@pytest.mark.parametrize(
    ("method", "path", "body", "expected"),
    [
        pytest.param("POST", JOBS, job(OURS), "allowed",
                     id="a run's Job as the controller renders it is allowed"),
        pytest.param("POST", JOBS, job({}), "policy", id="a Job without our labels is refused"),
        pytest.param("POST", JOBS, job({"labels": {"taugrid.dev/run": "r"}}), "policy",
                     id="a labelled Job no TauRun controls is refused"),
        pytest.param("POST", JOBS, job({"labels": {"taugrid.dev/run": "other"},
                                        "ownerReferences": [OWNER]}), "policy",
                     id="a Job labelled for another run than its owner is refused"),
        pytest.param("POST", JOBS, job(OURS, serviceAccountName="builder"), "policy",
                     id="a pod with another ServiceAccount is refused"),
        pytest.param("POST", JOBS, job(OURS, automountServiceAccountToken=True), "policy",
                     id="a pod that mounts its token is refused"),
        pytest.param("POST", JOBS, job(OURS, volumes=[{"name": "root",
                                                       "hostPath": {"path": "/"}}]), "policy",
                     id="a hostPath volume is refused"),
        pytest.param("POST", JOBS, job(OURS, volumes=[{"name": "s",
                                                       "secret": {"secretName": "x"}}]), "policy",
                     id="a Secret volume is refused"),
        pytest.param("POST", JOBS, job(OURS, hostNetwork=True), "policy",
                     id="the node's network is refused"),
        pytest.param("POST", JOBS, job(OURS, containers=[{
            "name": "main", "image": "x", "securityContext": {"privileged": True}}]), "policy",
                     id="a privileged container is refused"),
        pytest.param("POST", JOBS, job(OURS, containers=[main(env=[{"name": "K", "valueFrom": {
            "secretKeyRef": {"name": "db", "key": "password"}}}])]), "policy",
                     id="env secretKeyRef of a Secret the namespace does not list is refused"),
        pytest.param("POST", JOBS, job(OURS, containers=[main(envFrom=[{
            "secretRef": {"name": "db"}}])]), "policy",
                     id="envFrom secretRef of a Secret the namespace does not list is refused"),
        pytest.param("POST", JOBS, job(OURS, volumes=[{"name": "p", "projected": {"sources": [
            {"secret": {"name": "db"}}]}}]), "policy", id="a projected Secret is refused"),
        pytest.param("POST", JOBS, job(OURS, containers=[main(securityContext={
            "capabilities": {"add": ["NET_ADMIN"]}})]), "policy",
                     id="an added capability is refused"),
        pytest.param("POST", JOBS, job(OURS, containers=[main(securityContext={
            "capabilities": {"drop": ["ALL"]}})]), "allowed",
                     id="dropping capabilities is allowed"),
        pytest.param("POST", JOBS, job(OURS, containers=[main(ports=[{
            "containerPort": 80, "hostPort": 80}])]), "policy", id="a hostPort is refused"),
        pytest.param("POST", JOBS, job(OURS, securityContext={"runAsUser": 0}), "policy",
                     id="a pod-level runAsUser 0 is refused"),
        pytest.param("POST", JOBS, job(OURS, containers=[main(securityContext={
            "runAsUser": 0})]), "policy", id="a container-level runAsUser 0 is refused"),
        pytest.param("POST", JOBS, job(OURS, securityContext={"runAsUser": 1000}), "allowed",
                     id="a non-root runAsUser is allowed"),
        pytest.param("POST", JOBS, job(OURS, securityContext={
            "seccompProfile": {"type": "Unconfined"}}), "policy",
                     id="an Unconfined seccomp profile is refused"),
        pytest.param("POST", JOBS, job(OURS, containers=[main(securityContext={
            "appArmorProfile": {"type": "Unconfined"}})]), "policy",
                     id="an Unconfined AppArmor profile is refused"),
        pytest.param("POST", JOBS, job(OURS, containers=[main(securityContext={
            "allowPrivilegeEscalation": True})]), "policy",
                     id="allowPrivilegeEscalation true is refused"),
        pytest.param("POST", JOBS, job(OURS, hostUsers=False, containers=[main(securityContext={
            "procMount": "Unmasked"})]), "policy", id="an Unmasked procMount is refused"),
        pytest.param("POST", JOBS, job(OURS, securityContext={"sysctls": [
            {"name": "net.ipv4.ip_local_port_range", "value": "1024 65000"}]}), "policy",
                     id="a sysctl is refused"),
        pytest.param("POST", JOBS, job(OURS, initContainers=[main(name="init", securityContext={
            "privileged": True})]), "policy", id="a privileged init container is refused"),
        pytest.param("POST", JOBS, job(OURS, initContainers=[main(name="init", envFrom=[{
            "secretRef": {"name": "db"}}])]), "policy",
                     id="an init container's envFrom secretRef is refused"),
        pytest.param("POST", JOBS, indexed(job(OURS, hostPID=True)), "policy",
                     id="an Indexed Job sharing the node's PID namespace is refused"),
        pytest.param("POST", JOBS, annotated(job(OURS), {
            "container.apparmor.security.beta.kubernetes.io/main": "unconfined"}), "policy",
                     id="an AppArmor annotation on the pod template is refused"),
        pytest.param("POST", RAYJOBS, rayjob(OURS, submitter=PLAIN_POD), "allowed",
                     id="a run's RayJob with its own cluster and a plain submitter is allowed"),
        pytest.param("POST", RAYJOBS, rayjob(OURS, cluster=False, submitter=ESCAPED_POD), "policy",
                     id="a RayJob without rayClusterSpec whose submitter escapes is refused"),
        pytest.param("POST", RAYJOBS, rayjob(OURS, cluster=False), "policy",
                     id="a RayJob without rayClusterSpec (onto somebody's cluster) is refused"),
        pytest.param("POST", RAYJOBS, rayjob(OURS, submitter=ESCAPED_POD), "policy",
                     id="a RayJob whose submitter template escapes is refused"),
        pytest.param("POST", RAYJOBS, rayjob(OURS, submitter={
            **PLAIN_POD, "serviceAccountName": "builder"}), "policy",
                     id="a RayJob submitter with another ServiceAccount is refused"),
        pytest.param("POST", RAYJOBS, rayjob(OURS, autoscaler={
            "image": "x", "securityContext": {"privileged": True}}), "policy",
                     id="a RayJob with an autoscaler sidecar is refused"),
        pytest.param("POST", RAYJOBS, rayjob(OURS, worker={**PLAIN_POD, "containers": [main(
            env=[{"name": "K", "valueFrom": {"secretKeyRef": {"name": "db", "key": "k"}}}])]}),
                     "policy", id="a RayJob worker reading an unlisted Secret is refused"),
        pytest.param("POST", CONFIGMAPS, configmap(OURS), "allowed",
                     id="a run's checkpoint ConfigMap is allowed"),
        pytest.param("POST", CONFIGMAPS, configmap({}), "policy",
                     id="a ConfigMap of nobody's run is refused"),
        pytest.param("POST", SECRETS, {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                                       "metadata": {"name": "r-token", **OURS}}, "rbac",
                     id="even a run's own Opaque Secret is refused: no Secret right remains"),
        pytest.param("POST", SECRETS, {
            "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/service-account-token",
            "metadata": {"name": "r-token", **OURS,
                         "annotations": {"kubernetes.io/service-account.name": "default"}}},
                     "rbac", id="a ServiceAccount token Secret is refused"),
        pytest.param("POST", RUNLOGS, runlog(OURS), "allowed",
                     id="a run's kept log (TauRunLog) is allowed"),
        pytest.param("POST", RUNLOGS, runlog({}), "policy",
                     id="a TauRunLog of nobody's run is refused"),
        pytest.param("POST", "/api/v1/namespaces/kube-system/secrets",
                     {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "x", **OURS}},
                     "rbac", id="a Secret in kube-system is refused by RBAC"),
        pytest.param("POST", "/apis/batch/v1/namespaces/kube-system/jobs", job(OURS), "rbac",
                     id="a Job in kube-system is refused by RBAC"),
    ],
)  # fmt: skip
async def test_the_controller_may_write_only_its_runs_plain_objects(
    controller: Impersonated, method: str, path: str, body: dict[str, Any], expected: str
) -> None:
    """Each write, as the controller, is allowed or refused as DESIGN.md section 10 says."""
    assert expected == await controller.send(method, path, body)


async def test_the_controller_may_not_change_an_object_that_is_not_its_runs(
    k8s: client.ApiClient, controller: Impersonated
) -> None:
    """A ConfigMap named like a run's checkpoint but made by someone else (the confused
    deputy, review M4) may not be patched by the controller, even into looking like ours."""
    core = client.CoreV1Api(k8s)
    name = support.unique_name("theirs-checkpoint", max_len=50)
    await core.create_namespaced_config_map(RUNS, {"metadata": {"name": name},
                                                   "data": {"token": "theirs"}})  # fmt: skip
    try:
        patch = {"metadata": OURS, "data": {"latest": "/ckpt/1"}}
        answer = await controller.send(
            "PATCH", f"{CONFIGMAPS}/{name}", patch, content_type="application/merge-patch+json"
        )
    finally:
        await core.delete_namespaced_config_map(name, RUNS)
    assert answer == "policy"


@contextlib.asynccontextmanager
async def replica_pod(
    k8s: client.ApiClient, release: releasekit.Release, name: str
) -> AsyncIterator[None]:
    """A pod of the release's controller ServiceAccount in its namespace (not run: no node)."""
    core = client.CoreV1Api(k8s)
    await core.create_namespaced_pod(release.namespace, {
        "metadata": {"name": name, "labels": {"app": "x"}},
        "spec": {"serviceAccountName": f"{release.name}-controller",
                 "containers": [{"name": "c", "image": "x@sha256:" + "2" * 64}]},
    })  # fmt: skip
    try:
        yield
    finally:
        await core.delete_namespaced_pod(name, release.namespace, grace_period_seconds=0)


async def test_the_controller_may_set_only_the_leader_label_and_only_on_its_own_pod(
    k8s: client.ApiClient, release: releasekit.Release, controller: Impersonated
) -> None:
    """Bound to pod `own`: setting and removing taugrid.dev/leader=true there is allowed; the
    same label on another pod, another label, or another value on its own pod is refused."""
    pods = f"/api/v1/namespaces/{release.namespace}/pods"
    merge = "application/merge-patch+json"

    def label(value: str | None, key: str = "taugrid.dev/leader") -> dict[str, Any]:
        return {"metadata": {"labels": {key: value}}}

    async with replica_pod(k8s, release, "own"), replica_pod(k8s, release, "other"):
        answers = [
            await controller.send("PATCH", f"{pods}/own", label("true"), pod="own",
                                  content_type=merge),
            await controller.send("PATCH", f"{pods}/own", label(None), pod="own",
                                  content_type=merge),
            await controller.send("PATCH", f"{pods}/other", label("true"), pod="own",
                                  content_type=merge),
            await controller.send("PATCH", f"{pods}/own", label("yes"), pod="own",
                                  content_type=merge),
            await controller.send("PATCH", f"{pods}/own", label("y", "app"), pod="own",
                                  content_type=merge),
        ]  # fmt: skip
    expected = ["allowed", "allowed", "policy", "policy", "policy"]
    assert expected == answers


@contextlib.asynccontextmanager
async def fake_node(
    k8s: client.ApiClient, dev_cluster: cluster.Cluster, bin_dir: pathlib.Path, prefix: str,
    labels: dict[str, str],
) -> AsyncIterator[str]:  # fmt: skip
    """A fake node with `labels`, carrying somebody else's taint."""
    (name,) = await asyncio.to_thread(
        dev_cluster.ensure_nodes, bin_dir, 1, prefix=prefix[:50].rstrip("-") + "-",
        labels=labels,
    )  # fmt: skip
    core = client.CoreV1Api(k8s)
    await core.patch_node(name, {"spec": {"taints": [
        {"key": "example.com/maintenance", "effect": "NoSchedule"}]}})  # fmt: skip
    try:
        yield name
    finally:
        await core.delete_node(name)


@pytest_asyncio.fixture
async def node(
    k8s: client.ApiClient, dev_cluster: cluster.Cluster, bin_dir: pathlib.Path, namespace: str,
    release: releasekit.Release,
) -> AsyncIterator[str]:  # fmt: skip
    """A fake node the release manages (its managedNodeSelector selects it)."""
    labels = {"taugrid.dev/test-fleet": release.namespace}
    async with fake_node(k8s, dev_cluster, bin_dir, f"p-{namespace}", labels) as name:
        yield name


OUR_TAINT = {"key": "taugrid.dev/gpu-unhealthy", "effect": "NoSchedule"}
THEIR_TAINT = {"key": "example.com/maintenance", "effect": "NoSchedule"}


async def test_on_a_node_the_controller_may_change_only_its_own_marks(
    node: str, controller: Impersonated
) -> None:
    """Our taint beside theirs, our annotation, the cordon and GPUHealthy are allowed;
    dropping their taint, a label, another annotation, another condition are refused."""
    path, merge = f"/api/v1/nodes/{node}", "application/merge-patch+json"
    strategic = "application/strategic-merge-patch+json"

    def condition(kind: str) -> dict[str, Any]:
        return {"status": {"conditions": [{"type": kind, "status": "False", "reason": "Test",
                                           "message": "m"}]}}  # fmt: skip

    cases: list[tuple[str, dict[str, Any], str]] = [
        (path, {"spec": {"taints": [THEIR_TAINT, OUR_TAINT], "unschedulable": True}}, merge),
        (path, {"metadata": {"annotations": {"taugrid.dev/cordoned": "true"}}}, merge),
        (f"{path}/status", condition("GPUHealthy"), strategic),
        (path, {"spec": {"taints": [OUR_TAINT]}}, merge),
        (path, {"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}}}, merge),
        (path, {"metadata": {"annotations": {"example.com/owner": "us"}}}, merge),
        (f"{path}/status", condition("Ready"), strategic),
    ]
    answers = [await controller.send("PATCH", p, b, content_type=t) for p, b, t in cases]
    expected = ["allowed"] * 3 + ["policy"] * 4
    assert expected == answers


async def test_the_controller_never_puts_a_noexecute_taint_on_a_node(
    node: str, controller: Impersonated
) -> None:
    """Even on a node it manages, a NoExecute taint of ours (which would evict every pod
    without a toleration, past PDBs) is refused; our NoSchedule taint is allowed."""
    path, merge = f"/api/v1/nodes/{node}", "application/merge-patch+json"
    evict = {"key": "taugrid.dev/gpu-unhealthy", "effect": "NoExecute"}
    answers = [
        await controller.send("PATCH", path, {"spec": {"taints": [THEIR_TAINT, evict]}},
                              content_type=merge),
        await controller.send("PATCH", path, {"spec": {"taints": [THEIR_TAINT, OUR_TAINT]}},
                              content_type=merge),
    ]  # fmt: skip
    expected = ["policy", "allowed"]
    assert expected == answers


@pytest.mark.parametrize(
    "labels",
    [
        pytest.param({"taugrid.dev/managed": "false"}, id="a node labelled managed=false"),
        pytest.param({"taugrid.dev/managed": "False"}, id="a node labelled managed=False"),
        pytest.param({}, id="a node outside the release's managedNodeSelector"),
    ],
)
async def test_the_controller_may_not_taint_or_cordon_a_node_it_does_not_manage(  # noqa: PLR0917  (pytest fixtures)
    k8s: client.ApiClient, dev_cluster: cluster.Cluster, bin_dir: pathlib.Path, namespace: str,
    release: releasekit.Release, controller: Impersonated, labels: dict[str, str],
) -> None:  # fmt: skip
    """Our taint and the cordon are refused on a node the release does not manage (as the
    fleet decides: the selector, then the opt-out label); our annotation alone is not a
    taint and stays allowed, as does its removal of nothing."""
    selected = {"taugrid.dev/test-fleet": release.namespace} if labels else {}
    async with fake_node(k8s, dev_cluster, bin_dir, f"u-{namespace}",
                         {**selected, **labels}) as name:  # fmt: skip
        path, merge = f"/api/v1/nodes/{name}", "application/merge-patch+json"
        answers = [
            await controller.send("PATCH", path, {"spec": {"taints": [THEIR_TAINT, OUR_TAINT]}},
                                  content_type=merge),
            await controller.send("PATCH", path, {"spec": {"unschedulable": True}},
                                  content_type=merge),
            await controller.send("PATCH", path, {"metadata": {"annotations": {
                "taugrid.dev/history": "[]"}}}, content_type=merge),
        ]  # fmt: skip
    expected = ["policy", "policy", "allowed"]
    assert expected == answers


@pytest_asyncio.fixture
async def may_taint_devices(
    k8s: client.ApiClient, release: releasekit.Release
) -> AsyncIterator[None]:
    """Grant the release's controller DeviceTaintRule writes for this test alone (the code
    makes none yet), so the policy, not RBAC, decides."""
    rbac = client.RbacAuthorizationV1Api(k8s)
    name = f"{release.name}-test-dtr"
    await rbac.create_cluster_role({"metadata": {"name": name}, "rules": [{
        "apiGroups": ["resource.k8s.io"], "resources": ["devicetaintrules"],
        "verbs": ["create"]}]})  # fmt: skip
    await rbac.create_cluster_role_binding({
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": f"{release.name}-controller",
                      "namespace": release.namespace}],
    })  # fmt: skip
    try:
        yield
    finally:
        await rbac.delete_cluster_role_binding(name)
        await rbac.delete_cluster_role(name)


def rule(name: str, driver: str, device: str = "gpu-3") -> dict[str, Any]:
    selector = {"driver": driver, "pool": "node-a", "device": device}
    taint = {"key": "taugrid.dev/gpu-unhealthy", "effect": "NoSchedule"}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule",
            "metadata": {"name": name},
            "spec": {"deviceSelector": {k: v for k, v in selector.items() if v},
                     "taint": taint}}  # fmt: skip


async def test_device_taint_rules_only_for_one_nvidia_gpu_under_our_name(
    may_taint_devices: None, controller: Impersonated
) -> None:
    """With the right granted: one gpu.nvidia.com device under a taugrid- name is allowed;
    another driver, another name, or no device (every device of the pool) is refused."""
    path = "/apis/resource.k8s.io/v1/devicetaintrules"

    async def answers() -> list[str]:
        got = [
            await controller.send("POST", path, rule("taugrid-node-a-gpu-3", "gpu.nvidia.com")),
            await controller.send("POST", path, rule("taugrid-node-a-nic", "rdma.example.com")),
            await controller.send("POST", path, rule("evict-gpu-3", "gpu.nvidia.com")),
            await controller.send("POST", path, rule("taugrid-node-a", "gpu.nvidia.com", "")),
        ]
        assert got[0] == "allowed", got  # the grant has reached the authorizer
        return got

    got = await support.eventually(answers, what="the DeviceTaintRule grant in force")
    expected = ["allowed", "policy", "policy", "policy"]
    assert expected == got


# ---------------------------------------------------------------- records and secrets


@pytest_asyncio.fixture(scope="module")
async def researcher(
    dev_cluster: cluster.Cluster, k8s: client.ApiClient, controller: Impersonated
) -> AsyncIterator[Impersonated]:
    """A person who may create TauRuns and TauRunLogs in the runs namespace (a too-wide Role
    a platform might grant) and get one Secret, `readable`, but not `hidden`."""
    rbac = client.RbacAuthorizationV1Api(k8s)
    name = support.unique_name("t-researcher")
    await rbac.create_namespaced_role(RUNS, {"metadata": {"name": name}, "rules": [
        {"apiGroups": ["taugrid.dev"], "resources": ["tauruns", "taurunlogs"],
         "verbs": ["create", "update", "get"]},
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["readable"],
         "verbs": ["get"]},
    ]})  # fmt: skip
    await rbac.create_namespaced_role_binding(RUNS, {
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": name}],
    })  # fmt: skip
    try:
        yield Impersonated(dev_cluster, name, controller.http, ("system:authenticated",))
    finally:
        await rbac.delete_namespaced_role_binding(name, RUNS)
        await rbac.delete_namespaced_role(name, RUNS)


def taurun(secret_env: dict[str, dict[str, str]]) -> dict[str, Any]:
    """A TauRun as `kubectl apply` would send it, with `secretEnv`."""
    spec = {"name": "r", "image": "registry.example/x@sha256:" + "1" * 64, "command": ["x"],
            "secretEnv": secret_env}  # fmt: skip
    return {"apiVersion": "taugrid.dev/v1alpha1", "kind": "TauRun",
            "metadata": {"name": "r"}, "spec": spec}  # fmt: skip


TAURUNS = f"/apis/taugrid.dev/v1alpha1/namespaces/{RUNS}/tauruns"


async def test_only_the_controller_writes_kept_logs(
    researcher: Impersonated, controller: Impersonated
) -> None:
    """Review 3, finding 9: a TauRunLog owned by the run, made by a person who may create
    TauRunLogs but not write run status, is refused; the controller's is allowed."""

    async def answers() -> list[str]:
        got = [await researcher.send("POST", RUNLOGS, runlog(OURS)),
               await controller.send("POST", RUNLOGS, runlog(OURS))]  # fmt: skip
        assert got[0] != "rbac", got  # the researcher's Role has reached the authorizer
        return got

    expected = ["policy", "allowed"]
    assert expected == await support.eventually(answers, what="the researcher's Role in force")


@pytest.mark.parametrize(
    ("who", "secret", "expected"),
    [
        pytest.param("researcher", "hidden", "policy",
                     id="a person naming a Secret they may not get is refused"),
        pytest.param("researcher", "readable", "allowed",
                     id="a person naming a Secret they may get is allowed"),
        pytest.param("controller", "hidden", "allowed",
                     id="the controller, which asked the caller's review itself, is allowed"),
    ],
)  # fmt: skip
async def test_a_taurun_names_only_secrets_its_maker_may_read(
    researcher: Impersonated, controller: Impersonated, who: str, secret: str, expected: str
) -> None:
    """From issue 30: a kubectl-made TauRun's secretEnv is held to what its maker may
    `get`, as the HTTP API's SubjectAccessReview holds a submission."""
    me = researcher if who == "researcher" else controller
    body = taurun({"TOKEN": {"secret": secret, "key": "k"}})

    async def answer() -> str:
        got = await me.send("POST", TAURUNS, body)
        assert got != "rbac", got
        return got

    assert expected == await support.eventually(answer, what="the researcher's Role in force")


@contextlib.asynccontextmanager
async def run_secrets(
    k8s: client.ApiClient, controller: Impersonated, value: str | None
) -> AsyncIterator[None]:
    """The runs namespace's taugrid.dev/run-secrets annotation set to `value` (None: none),
    each change awaited until the policy reads it: the API server gives a policy the
    namespace from its informer's cache, which may lag a patch just made."""
    core = client.CoreV1Api(k8s)
    key = "taugrid.dev/run-secrets"

    async def annotate(to: str | None) -> None:
        await core.patch_namespace(RUNS, {"metadata": {"annotations": {key: to}}})
        first = (to or "").split(",")[0].strip()
        ref = {"name": "K", "valueFrom": {"secretKeyRef": {"name": first or "db", "key": "k"}}}
        probe = job(OURS, containers=[main(env=[ref])])

        async def seen() -> None:
            answer = await controller.send("POST", JOBS, probe)
            assert answer == ("allowed" if first else "policy"), answer

        await support.eventually(seen, what=f"the policy reading {key}={to!r}")

    await annotate(value)
    try:
        yield
    finally:
        await annotate(None)


def rendered(kind: str, *, dra: bool = False) -> list[dict[str, Any]]:
    """What the controller renders for attempt 2 of a run of `kind` with secretEnv, a
    checkpoint claim and a dataset (its real code, not a hand-made copy)."""
    spec = specs.validate_spec({
        "name": "r", "kind": kind, "image": "registry.example/x@sha256:" + "1" * 64,
        "command": ["python", "train.py"], "workers": 2, "resources": {"gpus": 1},
        "env": {"LR": "0.1"}, "secretEnv": {"HF_TOKEN": {"secret": "hf", "key": "token"}},
        "volumes": [{"claim": "data", "mountPath": "/data", "readOnly": True}],
        "checkpoint": {"dir": "/ckpt", "volume": "ckpt"}, "imagePullSecrets": ["pull"],
    }).spec  # fmt: skip
    ref = objects.RunRef(name="r", namespace=RUNS, uid=str(OWNER["uid"]))
    ctx = rendering.AttemptContext(run=ref, attempt=2, checkpoint_configmap="r-checkpoint",
                                   resume_from="/ckpt/1", failure_reason="NodeFailure")  # fmt: skip
    settings = rendering.RenderSettings(controller_url="https://taugrid:8080", dra=dra,
                                        ray_token_auth=False, ca_pem="pem")  # fmt: skip
    return rendering.render_attempt(spec, ctx, settings)


PATHS = {
    "Job": JOBS, "RayJob": RAYJOBS, "Service": f"/api/v1/namespaces/{RUNS}/services",
    "NetworkPolicy": f"/apis/networking.k8s.io/v1/namespaces/{RUNS}/networkpolicies",
    "ResourceClaimTemplate": f"/apis/resource.k8s.io/v1/namespaces/{RUNS}/resourceclaimtemplates",
}  # fmt: skip


@pytest.mark.parametrize(
    ("kind", "dra"),
    [
        pytest.param("job", False, id="a job run"),
        pytest.param("pytorch", False, id="a pytorch run (Indexed Job, Service, NetworkPolicy)"),
        pytest.param("ray", False, id="a ray run (RayJob, NetworkPolicy)"),
        pytest.param("job", True, id="a job run on DRA (ResourceClaimTemplate)"),
    ],
)  # fmt: skip
async def test_the_controllers_own_renders_pass_the_policy(
    k8s: client.ApiClient, controller: Impersonated, kind: str, dra: bool
) -> None:
    """Every object the controller renders for a run that reads a Secret the namespace lists
    is allowed; with the Secret unlisted, the pod-carrying object is refused."""
    objs = rendered(kind, dra=dra)
    async with run_secrets(k8s, controller, "other, hf"):
        listed = [await controller.send("POST", PATHS[o["kind"]], o) for o in objs]
    async with run_secrets(k8s, controller, None):
        unlisted = [await controller.send("POST", PATHS[o["kind"]], o) for o in objs]
    carrying = [o["kind"] in {"Job", "RayJob"} for o in objs]
    expected = (["allowed"] * len(objs), ["policy" if c else "allowed" for c in carrying])
    assert expected == (listed, unlisted)


async def test_a_listed_secret_reaches_a_pod_only_through_secret_key_ref(
    k8s: client.ApiClient, controller: Impersonated
) -> None:
    """With `db` listed for runs: one key of it as env is allowed; all of it through
    envFrom (keys that would become variables nobody validated, NVIDIA_* among them) and a
    Secret volume of it are refused."""
    key_ref = {"name": "K", "valueFrom": {"secretKeyRef": {"name": "db", "key": "k"}}}
    bodies = [
        job(OURS, containers=[main(env=[key_ref])]),
        job(OURS, containers=[main(envFrom=[{"secretRef": {"name": "db"}}])]),
        job(OURS, volumes=[{"name": "s", "secret": {"secretName": "db"}}]),
    ]
    async with run_secrets(k8s, controller, "db"):
        answers = [await controller.send("POST", JOBS, b) for b in bodies]
    expected = ["allowed", "policy", "policy"]
    assert expected == answers
