"""One test release of the Helm chart on the dev cluster, and `kubectl auth can-i` as its
ServiceAccounts (tests/e2e: the chart as deployed)."""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import subprocess
from collections.abc import AsyncIterator
from typing import Any

import pytest_asyncio

from devcluster import chart, cluster, stack
from tests import support

_KEY, _VALUE = stack.DEV_FLEET_SELECTOR.split("=", 1)
DEV_FLEET = {_KEY: _VALUE}
"""The label of the nodes `taugrid dev up` made; other tests' fake nodes come and go."""


class Release:
    """One test release of the chart: its name, namespace and the names it was given."""

    def __init__(self, name: str, namespace: str) -> None:
        self.name = name
        self.namespace = namespace
        self.check = f"{name}-gpu-health"
        self.priority = f"{name}-resume"

    def values(self) -> dict[str, Any]:
        """Unique cluster-scoped names, no queues, pods only on the dev fleet's nodes (KWOK
        pulls no image: `pullPolicy: Never` lets the chart's default images through)."""
        local = {"pullPolicy": "Never"}
        return {
            "admissionCheck": {"name": self.check},
            "resumePriorityClass": {"name": self.priority},
            "queues": {"enabled": False},
            "agent": {
                "nodeSelector": DEV_FLEET,
                "stateHostPath": f"/var/lib/taugrid/{self.name}",
                "image": local,
            },
            "controller": {
                "nodeSelector": DEV_FLEET,
                "image": local,
                # Were it to run, it would manage no node of anyone else's.
                "managedNodeSelector": f"taugrid.dev/test-fleet={self.namespace}",
            },
        }

    def service_account(self, component: str) -> str:
        """`system:serviceaccount:…` user of a component's ServiceAccount."""
        return f"system:serviceaccount:{self.namespace}:{self.name}-{component}"


@contextlib.asynccontextmanager
async def installed(
    dev_cluster: cluster.Cluster, bin_dir: pathlib.Path, namespace: str
) -> AsyncIterator[Release]:
    """The chart installed into `namespace` (CRDs skipped: the cluster has them), uninstalled
    afterwards even when the test fails."""
    rel = Release(support.unique_name("taugrid-e2e", max_len=30), namespace)
    await asyncio.to_thread(
        chart.install, dev_cluster.kubeconfig, rel.name, namespace, rel.values(),
        skip_crds=True, bin_dir=bin_dir,
    )  # fmt: skip
    try:
        yield rel
    finally:
        await asyncio.to_thread(
            chart.uninstall, dev_cluster.kubeconfig, rel.name, namespace, wait=True,
            bin_dir=bin_dir,
        )  # fmt: skip


@pytest_asyncio.fixture
async def release(
    dev_cluster: cluster.Cluster, bin_dir: pathlib.Path, namespace: str
) -> AsyncIterator[Release]:
    """The chart installed into the test's namespace for one test."""
    async with installed(dev_cluster, bin_dir, namespace) as rel:
        yield rel


def can_i(dev: cluster.Cluster, bin_dir: pathlib.Path, user: str, *args: str) -> bool:
    """`kubectl auth can-i <args> --as=<user>`: True for yes, False for no."""
    proc = subprocess.run(
        [str(bin_dir / "kubectl"), f"--kubeconfig={dev.kubeconfig}", "auth", "can-i", *args,
         f"--as={user}"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    answer = proc.stdout.strip()
    assert answer in ("yes", "no"), f"kubectl auth can-i {' '.join(args)}: {proc.stderr}"
    return answer == "yes"
