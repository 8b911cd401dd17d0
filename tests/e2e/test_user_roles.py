"""The chart's researcher and on-call roles (rbac.userRoles.create) on the real API server:
bound as docs/platform.md says (a RoleBinding per team namespace, a ClusterRoleBinding and a
RoleBinding in the release namespace for on-call), the API server's own authorizer grants what
the controller checks and refuses what security review 3 forbids (findings 6 and 9)."""

from __future__ import annotations

import asyncio
import pathlib
from typing import Any

import pytest
from kubernetes_asyncio import client

from devcluster import chart, cluster
from tests import releasekit, support

pytestmark = pytest.mark.cluster

RESEARCHER = ("alice", "--as-group=team-x")
ONCALL = ("bob", "--as-group=h30b-oncall-x")

ROWS = [
    (RESEARCHER, ("create", "tauruns.taugrid.dev"), True),
    (RESEARCHER, ("patch", "tauruns.taugrid.dev"), True),
    (RESEARCHER, ("delete", "tauruns.taugrid.dev"), True),
    (RESEARCHER, ("get", "pods", "--subresource=log"), True),
    (RESEARCHER, ("update", "tauruns.taugrid.dev", "--subresource=status"), False),
    (RESEARCHER, ("patch", "tauruns.taugrid.dev", "--subresource=status"), False),
    (RESEARCHER, ("create", "taurunlogs.taugrid.dev"), False),
    (RESEARCHER, ("get", "secrets"), False),
    (RESEARCHER, ("create", "jobs.batch"), False),
    (ONCALL, ("get", "nodes"), True),
    (ONCALL, ("patch", "nodes"), True),
    (ONCALL, ("delete", "nodes"), False),
    (ONCALL, ("get", "secrets"), False),
    (ONCALL, ("create", "tauruns.taugrid.dev"), False),
]  # fmt: skip
"""(who, `kubectl auth can-i` arguments in the team namespace, expected answer)."""


def bindings(rel: releasekit.Release, team: str) -> list[dict[str, Any]]:
    """The bindings docs/platform.md gives, for this release's roles."""
    rbac = "rbac.authorization.k8s.io"
    return [
        {"apiVersion": f"{rbac}/v1", "kind": "RoleBinding",
         "metadata": {"name": f"{rel.name}-researcher", "namespace": team},
         "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": f"{rel.name}-researcher"},
         "subjects": [{"apiGroup": rbac, "kind": "Group", "name": "team-x"}]},
        {"apiVersion": f"{rbac}/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": f"{rel.name}-oncall"},
         "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": f"{rel.name}-oncall"},
         "subjects": [{"apiGroup": rbac, "kind": "Group", "name": "h30b-oncall-x"}]},
        {"apiVersion": f"{rbac}/v1", "kind": "RoleBinding",
         "metadata": {"name": f"{rel.name}-oncall", "namespace": rel.namespace},
         "roleRef": {"apiGroup": rbac, "kind": "Role", "name": f"{rel.name}-oncall"},
         "subjects": [{"apiGroup": rbac, "kind": "Group", "name": "h30b-oncall-x"}]},
    ]  # fmt: skip


async def test_the_chart_roles_grant_what_the_docs_say_and_nothing_forbidden(
    dev_cluster: cluster.Cluster, bin_dir: pathlib.Path, namespace: str, k8s: client.ApiClient
) -> None:
    """Researcher alice (group team-x) may submit, cancel and read logs in the team namespace
    and may not write a run's status or a TauRunLog; on-call bob may read and patch nodes,
    port-forward in the release namespace only, and nothing of the runs."""
    rel = releasekit.Release(support.unique_name("taugrid-roles", max_len=30), namespace)
    values = {**rel.values(), "rbac": {"userRoles": {"create": True}}}
    await asyncio.to_thread(
        chart.install, dev_cluster.kubeconfig, rel.name, namespace, values,
        skip_crds=True, bin_dir=bin_dir,
    )  # fmt: skip
    objs = bindings(rel, namespace)
    try:
        await asyncio.to_thread(dev_cluster.apply, bin_dir, objs)

        async def answered() -> None:
            wrong = []
            for (user, group), args, allowed in ROWS:
                got = await asyncio.to_thread(
                    releasekit.can_i, dev_cluster, bin_dir, user, *args, "-n", namespace, group
                )
                if got is not allowed:
                    wrong.append(f"{user} can-i {' '.join(args)} should be {allowed}")
            forward = ("create", "pods", "--subresource=portforward")
            for ns, allowed in ((rel.namespace, True), ("default", False)):
                got = await asyncio.to_thread(
                    releasekit.can_i, dev_cluster, bin_dir, ONCALL[0], *forward, "-n", ns,
                    ONCALL[1],
                )  # fmt: skip
                if got is not allowed:
                    wrong.append(f"bob port-forward in {ns} should be {allowed}")
            assert wrong == []

        await support.eventually(answered, what="the user roles answer as documented")
    finally:
        rbac = client.RbacAuthorizationV1Api(k8s)
        try:
            await rbac.delete_cluster_role_binding(f"{rel.name}-oncall")
        except client.ApiException as err:
            if err.status != 404:
                raise
        await asyncio.to_thread(
            chart.uninstall, dev_cluster.kubeconfig, rel.name, namespace, wait=True,
            bin_dir=bin_dir,
        )  # fmt: skip
