"""TLS as the chart deploys it, against the local control plane: controller replicas serve
HTTPS with a certificate a private CA issued (made here with openssl), a follower reaches the
leader over HTTPS only when the leader's certificate comes from the CA it is given
(`tls_ca_file`, trusted alone), and run pods (the `tau` client) reach the controller only with
the CA that the run's ConfigMap carries (TAU_CA_FILE).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pathlib
import ssl
import sys
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from kubernetes_asyncio import client

from controller import serving
from devcluster import cluster, pki
from tests import controllerkit as kit
from tests import kueue, leaderservice

TAU = pathlib.Path(__file__).parents[3] / "controller/assets/tau.py"
IMAGE = "registry.example/train@sha256:" + "0" * 64
PEER_SA = "taugrid-controller"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A CA and a serving certificate it issued for 127.0.0.1 and localhost."""
    return pki.ensure(tmp_path_factory.mktemp("pki"))


def serving_context(certs: pathlib.Path) -> ssl.SSLContext:
    """The server side, built as `controller.main` builds it from the same two files."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certs / "serving.crt", certs / "serving.key")
    return context


def tls_settings(certs: pathlib.Path, *, trust: bool) -> dict[str, Any]:
    """Controller settings of an HTTPS replica; `trust` adds the CA for calls to the leader."""
    values = {"tls_cert_file": str(certs / "serving.crt"),
              "tls_key_file": str(certs / "serving.key")}  # fmt: skip
    if trust:
        values["tls_ca_file"] = str(certs / "ca.crt")
    return values


@contextlib.asynccontextmanager
async def replicas(
    dev: cluster.Cluster, namespace: str, certs: pathlib.Path, count: int, **overrides: Any
) -> AsyncIterator[list[kit.RunningController]]:
    """`count` HTTPS replicas sharing one Lease; all stop on exit."""
    started: list[kit.RunningController] = []
    try:
        while len(started) < count:  # one by one, so a failed start stops those before it
            started.append(
                await kit.start_controller(
                    dev.kubeconfig, namespace, ssl_context=serving_context(certs), **overrides
                )
            )
        yield started
    finally:
        for r in started:
            await r.stop()


@pytest_asyncio.fixture
async def oncall(k8s: client.ApiClient, namespace: str) -> AsyncIterator[str]:
    """A token allowed to get and patch nodes; its cluster-scoped RBAC is removed after."""
    try:
        yield await kit.admin_token(k8s, namespace)
    finally:
        await kit.delete_test_rbac(k8s, namespace)


def test_a_replica_advertises_its_ip_by_its_name_under_the_headless_service() -> None:
    """The chart's advertised host: the pod IP with dashes, under the headless Service, which
    the certificate's `*.<domain>` covers (IPv4 and IPv6)."""
    domain = "taugrid-controller-pods.taugrid-system.svc.cluster.local"
    expected = (f"10-244-1-7.{domain}", f"fd00-10--7.{domain}")
    actual = (serving.pod_dns_name("10.244.1.7", domain),
              serving.pod_dns_name("fd00:10::7", domain))  # fmt: skip
    assert expected == actual


async def _peer_token(api: client.ApiClient, namespace: str, path: pathlib.Path) -> None:
    """A peer-audience token of the replicas' ServiceAccount, bound to a pod the follower
    stands in for (an unbound one is refused: security review 3, finding 8), written where
    a replica reads it."""
    pod = await leaderservice.replica_pod(api, namespace, "ctl-follower", "gpu-node-0")
    await leaderservice.peer_token(api, namespace, pod, path, service_account=PEER_SA)


@pytest.mark.cluster
@pytest.mark.parametrize("trusted", [True, False], ids=["the chart's CA", "another CA"])
async def test_a_follower_reaches_the_leader_over_https_verified_by_its_ca_alone(  # noqa: PLR0917 - fixtures
    dev_cluster: cluster.Cluster,
    k8s: client.ApiClient,
    namespace: str,
    certs: pathlib.Path,
    oncall: str,
    tmp_path: pathlib.Path,
    trusted: bool,
) -> None:
    """A leader-only write sent to the follower lands on the leader over HTTPS verified by
    `tls_ca_file` (the leader's address stands in for the leader-only Service); a follower
    given another CA refuses the leader's certificate, answers 503 LeaderUnreachable, and
    nothing changes."""
    other_ca = pki.ensure(tmp_path / "other")
    await _peer_token(k8s, namespace, tmp_path / "peer.token")
    async with (
        replicas(dev_cluster, namespace, certs, 1, **tls_settings(certs, trust=True)) as (leader,),
        aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(
                ssl=ssl.create_default_context(cafile=str(certs / "ca.crt"))
            )
        ) as http,
    ):
        await kit.wait_leader(leader)
        ca = certs / "ca.crt" if trusted else other_ca / "ca.crt"
        async with replicas(
            dev_cluster, namespace, certs, 1, **tls_settings(certs, trust=False),
            tls_ca_file=str(ca), leader_url=leader.url, controller_service_account=PEER_SA,
            peer_token_file=str(tmp_path / "peer.token"),
        ) as (follower,):  # fmt: skip
            assert leader.url.startswith("https://")
            async with http.put(
                f"{follower.url}/v1/fleet/mode",
                json={"dryRun": True},
                headers={"Authorization": f"Bearer {oncall}"},
            ) as resp:
                body = await resp.json()
                status = resp.status
    if trusted:
        expected: tuple[Any, ...] = (200, True, leader.serving.elector.identity)
        actual: tuple[Any, ...] = (
            status, leader.fleet.quarantiner.settings.dry_run, body["leader"]
        )  # fmt: skip
    else:
        expected = (503, "LeaderUnreachable", True, False)
        actual = (
            status, body["error"]["code"],
            "CERTIFICATE_VERIFY_FAILED" in body["error"]["message"],
            leader.fleet.quarantiner.settings.dry_run,
        )  # fmt: skip
    assert expected == actual, body


async def _researcher_token(api: client.ApiClient, namespace: str) -> str:
    """A ServiceAccount token allowed to create, get and list TauRuns in `namespace`."""
    core = client.CoreV1Api(api)
    rbac = client.RbacAuthorizationV1Api(api)
    name = "researcher"
    rules = [{"apiGroups": ["taugrid.dev"], "resources": ["tauruns"],
              "verbs": ["create", "get", "list"]}]  # fmt: skip
    await core.create_namespaced_service_account(namespace, {"metadata": {"name": name}})
    await rbac.create_namespaced_role(namespace, {"metadata": {"name": name}, "rules": rules})
    await rbac.create_namespaced_role_binding(
        namespace,
        {"metadata": {"name": name},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]},
    )  # fmt: skip
    tr = await core.create_namespaced_service_account_token(
        name, namespace, {"spec": {"expirationSeconds": 3600}}
    )
    return str(tr.status.token)


async def tau(env: dict[str, str], *argv: str) -> tuple[int, str]:
    """Run the `tau` client with only these environment variables (and PATH)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(TAU), *argv,
        env={**env, "PATH": os.environ["PATH"]},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await proc.communicate()
    return int(proc.returncode or 0), out.decode()


@pytest.mark.cluster
async def test_run_pods_get_the_ca_and_the_tau_client_needs_it(
    dev_cluster: cluster.Cluster, k8s: client.ApiClient, namespace: str, certs: pathlib.Path
) -> None:
    """A run's ConfigMap carries the controller's CA as `ca.crt` and its Job names it in
    TAU_CA_FILE; `tau` with that file reaches the HTTPS controller, without it fails (exit 7)
    on the certificate."""
    token = await _researcher_token(k8s, namespace)
    queue = await kueue.create_queues(k8s, namespace, gpus=1)  # a submission needs its queue
    try:
        async with replicas(
            dev_cluster, namespace, certs, 1, run_manager=f"test/{namespace}",
            **tls_settings(certs, trust=True),
        ) as (ctl,):  # fmt: skip
            await kit.wait_leader(ctl)
            env = {"TAU_URL": ctl.url, "TAU_TOKEN": token, "TAU_NAMESPACE": namespace}
            ca_file = str(certs / "ca.crt")
            submitted = await tau({**env, "TAU_CA_FILE": ca_file}, "run", "--name", "tls",
                                  "--queue", queue, "--image", IMAGE, "--", "python",
                                  "train.py")  # fmt: skip
            listed = await tau({**env, "TAU_CA_FILE": ca_file}, "list")
            refused = await tau(env, "list")
            core, batch = client.CoreV1Api(k8s), client.BatchV1Api(k8s)
            config = await core.read_namespaced_config_map("tls-checkpoint", namespace)
            job = await batch.read_namespaced_job("tls-a1", namespace)
            job_env = {e.name: e.value for e in job.spec.template.spec.containers[0].env}
    finally:
        await kueue.delete_queues(k8s, namespace)
    assert submitted[0] == 0, submitted[1]
    assert (listed[0], "tls" in listed[1]) == (0, True), listed[1]
    assert (refused[0], "CERTIFICATE_VERIFY_FAILED" in refused[1]) == (7, True), refused[1]
    expected = ((certs / "ca.crt").read_text(), "/var/run/taugrid/checkpoint/ca.crt")
    assert expected == (config.data["ca.crt"], job_env["TAU_CA_FILE"])
