"""Fixtures every tier may use; the cluster ones start nothing until a test asks for them."""

from __future__ import annotations

import pathlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio
from kubernetes_asyncio import client, config

from devcluster import build, cluster
from tests import support


@pytest.fixture(scope="session")
def dev_cluster() -> Iterator[cluster.Cluster]:
    """A ready local control plane: reuse one started by `taugrid dev up`, else start one.

    The binaries must already be built (`taugrid dev build`, a step of the test command
    before pytest starts); building here would run under the per-test timeout.
    """
    c = cluster.Cluster()
    if c.is_up() and c.bare:
        bare = "a bare dev cluster is up (`taugrid dev up --bare`, the one install's)"
        pytest.fail(f"{bare}: these tests need the full one, `taugrid dev down && taugrid dev up`")
    if c.is_up():
        yield c
        return
    c.up(nodes=4, out=print)
    try:
        yield c
    finally:
        c.down()


@pytest.fixture(scope="session")
def bin_dir(dev_cluster: cluster.Cluster) -> pathlib.Path:
    """The directory of the built control-plane binaries (kubectl, helm …)."""
    return build.built_dir() / "bin"


@pytest_asyncio.fixture(scope="session")
async def k8s(dev_cluster: cluster.Cluster) -> AsyncIterator[client.ApiClient]:
    """A kubernetes_asyncio client with admin rights on the dev cluster."""
    cfg = client.Configuration()
    await config.load_kube_config(config_file=str(dev_cluster.kubeconfig), client_configuration=cfg)
    api = client.ApiClient(configuration=cfg)
    try:
        yield api
    finally:
        await api.close()


@pytest_asyncio.fixture
async def namespace(k8s: client.ApiClient, request: pytest.FixtureRequest) -> AsyncIterator[str]:
    """A fresh namespace for one test, deleted (in the background) afterwards."""
    name = support.unique_name("t-" + request.node.name, max_len=50)
    core = client.CoreV1Api(k8s)
    await core.create_namespace(
        {"metadata": {"name": name, "labels": {"taugrid.dev/test": "true"}}}
    )

    async def default_sa() -> Any:
        return await core.read_namespaced_service_account("default", name)

    await support.eventually(
        support.not_found_is_not_yet(default_sa), what=f"default ServiceAccount in {name}"
    )
    try:
        yield name
    finally:
        await core.delete_namespace(name, propagation_policy="Background")
