"""The Helm chart installed on the real dev cluster, next to the dev cluster's own objects: the
API server validates every object, the DaemonSet puts one agent on each fake GPU node (KWOK
runs them), RBAC answers as designed, and `helm uninstall` takes the cluster-scoped objects
away again."""

from __future__ import annotations

import asyncio
import pathlib

import pytest
from kubernetes_asyncio import client

from devcluster import chart, cluster, node, stack
from tests import releasekit, support

pytestmark = pytest.mark.cluster

DEV_FLEET = releasekit.DEV_FLEET
Release = releasekit.Release
release = releasekit.release
can_i = releasekit.can_i


async def dev_fleet_nodes(k8s: client.ApiClient) -> set[str]:
    """Names of the dev fleet's KWOK nodes (the real node's taint keeps this release's agents
    off it: only the dev release tolerates it)."""
    selector = f"{stack.DEV_FLEET_SELECTOR},!{node.NODE_LABEL}"
    nodes = await client.CoreV1Api(k8s).list_node(label_selector=selector)
    return {n.metadata.name for n in nodes.items}


async def test_the_chart_installs_an_agent_on_every_gpu_node_and_a_two_replica_controller(
    k8s: client.ApiClient, release: Release
) -> None:
    """The release's workloads exist as rendered; each dev-fleet node runs one agent pod."""
    apps = client.AppsV1Api(k8s)
    core = client.CoreV1Api(k8s)
    deploy = await apps.read_namespaced_deployment(f"{release.name}-controller", release.namespace)
    assert deploy.spec.replicas == 2
    await apps.read_namespaced_daemon_set(f"{release.name}-agent", release.namespace)
    nodes = await dev_fleet_nodes(k8s)
    assert nodes, "the dev cluster has no dev-fleet nodes"

    async def one_agent_per_node() -> None:
        pods = await core.list_namespaced_pod(
            release.namespace, label_selector="app.kubernetes.io/component=agent"
        )
        running = [p for p in pods.items if p.status.phase == "Running"]
        placed = sorted(p.spec.node_name for p in running)
        assert sorted(nodes) == placed, f"agents on {placed}, dev fleet {sorted(nodes)}"

    await support.eventually(one_agent_per_node, what="one running agent pod per dev-fleet node")


async def test_the_chart_makes_its_own_cluster_scoped_kueue_objects_and_removes_them(
    k8s: client.ApiClient, dev_cluster: cluster.Cluster, bin_dir: pathlib.Path, release: Release
) -> None:
    """The AdmissionCheck and priority class carry the release's names; uninstall deletes them
    and the ClusterRole again."""
    custom = client.CustomObjectsApi(k8s)
    rbac = client.RbacAuthorizationV1Api(k8s)
    kueue = ("kueue.x-k8s.io", "v1beta2")
    check = await custom.get_cluster_custom_object(*kueue, "admissionchecks", release.check)
    assert check["spec"]["controllerName"] == "taugrid.dev/gpu-health"
    wpc = await custom.get_cluster_custom_object(
        *kueue, "workloadpriorityclasses", release.priority
    )
    assert wpc["value"] == 1
    await rbac.read_cluster_role(f"{release.name}-controller")

    await asyncio.to_thread(
        chart.uninstall, dev_cluster.kubeconfig, release.name, release.namespace, wait=True,
        bin_dir=bin_dir,
    )  # fmt: skip

    async def gone() -> None:
        reads = {
            "AdmissionCheck": custom.get_cluster_custom_object(
                *kueue, "admissionchecks", release.check
            ),
            "WorkloadPriorityClass": custom.get_cluster_custom_object(
                *kueue, "workloadpriorityclasses", release.priority
            ),
            "ClusterRole": rbac.read_cluster_role(f"{release.name}-controller"),
        }
        for kind, read in reads.items():
            try:
                await read
            except client.ApiException as err:
                if err.status != 404:
                    raise
                continue
            msg = f"{kind} still there"
            raise support.NotYetError(msg)

    await support.eventually(gone, what="the release's cluster-scoped objects to go")


RBAC_TABLE = [
    ("agent", ("patch", "nodes"), False),
    ("agent", ("patch", "nodes", "--subresource=status"), False),
    ("agent", ("create", "pods", "--subresource=eviction", "-n", "default"), False),
    ("agent", ("get", "secrets", "-n", "default"), False),
    ("agent", ("create", "tokenreviews.authentication.k8s.io"), True),
    ("controller", ("patch", "nodes"), True),
    ("controller", ("patch", "nodes", "--subresource=status"), True),
    ("controller", ("create", "pods", "--subresource=eviction", "-n", "default"), True),
    ("controller", ("patch", "workloads.kueue.x-k8s.io", "--subresource=status", "-n", "default"),
     True),
    ("controller", ("create", "subjectaccessreviews.authorization.k8s.io"), True),
    ("controller", ("list", "secrets", "-n", "default"), False),
    ("controller", ("delete", "nodes"), False),
    # Least privilege (review H4): run objects only where runs live (runNamespaces: default),
    # nothing in kube-system, no Secret ever read, its own pods patched only in its namespace.
    ("controller", ("create", "jobs.batch", "-n", "default"), True),
    ("controller", ("patch", "configmaps", "-n", "default"), True),
    ("controller", ("create", "services", "-n", "default"), True),
    ("controller", ("get", "pods", "--subresource=log", "-n", "default"), True),
    ("controller", ("create", "secrets", "-n", "kube-system"), False),
    ("controller", ("patch", "secrets", "-n", "kube-system"), False),
    ("controller", ("patch", "configmaps", "-n", "kube-system"), False),
    ("controller", ("create", "jobs.batch", "-n", "kube-system"), False),
    ("controller", ("delete", "services", "-n", "kube-system"), False),
    ("controller", ("create", "jobs.batch", "-n", "kube-public"), False),
    ("controller", ("get", "secrets", "-n", "default"), False),
    ("controller", ("get", "secrets", "-A"), False),
    ("controller", ("create", "pods", "-n", "default"), False),
    ("controller", ("patch", "pods", "-n", "default"), False),
    ("controller", ("create", "serviceaccounts/token", "-n", "kube-system"), False),
    # Device quarantine writes DeviceTaintRules (the admission policy narrows them to one
    # gpu.nvidia.com device under taugrid-*, tests/e2e/test_admission_policy.py).
    ("controller", ("create", "devicetaintrules.resource.k8s.io"), True),
    ("controller", ("update", "devicetaintrules.resource.k8s.io"), False),
]  # fmt: skip
"""(component, `kubectl auth can-i` arguments, expected answer)."""

RUN_NAMESPACE_ROWS = [
    ("create", "jobs.batch"), ("patch", "configmaps"), ("create", "services"),
    ("create", "secrets"), ("patch", "pods"),
]  # fmt: skip
"""Writes the controller may make in `default` (a run namespace) but not in its own."""


async def test_rbac_answers_as_designed(
    dev_cluster: cluster.Cluster, bin_dir: pathlib.Path, release: Release
) -> None:
    """The API server's own authorizer agrees with the chart's least-privilege design: the
    agent may not patch nodes or evict, the controller may; neither reads what it need not."""

    async def answered() -> None:
        wrong = []
        for component, args, allowed in RBAC_TABLE:
            user = release.service_account(component)
            if await asyncio.to_thread(can_i, dev_cluster, bin_dir, user, *args) is not allowed:
                wrong.append(f"{component} can-i {' '.join(args)} should be {allowed}")
        assert wrong == []

    # The authorizer's caches pick up new bindings within moments; poll rather than race.
    await support.eventually(answered, what="RBAC answers as designed")


async def test_the_controller_writes_nothing_in_its_own_namespace_but_its_pods_label(
    dev_cluster: cluster.Cluster, bin_dir: pathlib.Path, release: Release
) -> None:
    """The release namespace is not a run namespace: no Job, ConfigMap, Service or Secret
    there; patching pods there is what its leader label needs."""
    user = release.service_account("controller")

    async def answered() -> None:
        got = [
            await asyncio.to_thread(
                can_i, dev_cluster, bin_dir, user, verb, res, "-n", release.namespace
            )
            for verb, res in RUN_NAMESPACE_ROWS
        ]
        expected = [False, False, False, False, True]
        assert expected == got

    await support.eventually(answered, what="RBAC answers in the release namespace")


CA_PEM = "-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n"


async def test_the_published_ca_is_readable_by_any_user_and_nothing_else_is(
    dev_cluster: cluster.Cluster, bin_dir: pathlib.Path, namespace: str, k8s: client.ApiClient
) -> None:
    """With tls.caBundle the release namespace holds ConfigMap `taugrid-ca`, which a user with
    no role at all may get (researchers and on-call fetch the CA without the TLS Secret),
    while that user still may not read any other ConfigMap or Secret there."""
    rel = releasekit.Release(support.unique_name("taugrid-ca", max_len=30), namespace)
    values = {**rel.values(), "tls": {"caBundle": CA_PEM}}
    await asyncio.to_thread(
        chart.install, dev_cluster.kubeconfig, rel.name, namespace, values,
        skip_crds=True, bin_dir=bin_dir,
    )  # fmt: skip
    try:
        cm = await client.CoreV1Api(k8s).read_namespaced_config_map("taugrid-ca", namespace)
        assert cm.data == {"ca.crt": CA_PEM}

        async def answered() -> None:
            rows = [("get", "configmap/taugrid-ca"), ("get", "configmap/kube-root-ca.crt"),
                    ("list", "configmaps"), ("get", "secrets")]  # fmt: skip
            got = []
            for verb, res in rows:
                args = (verb, res, "-n", namespace)
                got.append(await asyncio.to_thread(can_i, dev_cluster, bin_dir, "someone", *args))
            assert got == [True, False, False, False]

        await support.eventually(answered, what="the CA readable, nothing else")
    finally:
        await asyncio.to_thread(
            chart.uninstall, dev_cluster.kubeconfig, rel.name, namespace, wait=True,
            bin_dir=bin_dir,
        )  # fmt: skip
