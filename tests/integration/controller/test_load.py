"""Load as tests, on the real control plane (DESIGN.md section 10, review findings H2, M10).

Bounded and loopback only; they assert counts, not clocks. The controller under test talks to
the API server through a counting proxy (tests/apiproxy.py), so "the API server's request
count for them stops growing" is read at the proxy, and the Lease renewals it relays are the
measure of time passing.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import pathlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client

from devcluster import cluster
from tests import apiproxy, kueue, runskit, support
from tests import controllerkit as kit

pytestmark = pytest.mark.cluster

KWOK_LOGS = ("kwok.x-k8s.io", "v1alpha1")


@dataclasses.dataclass
class Load:
    """A controller behind the counting proxy, a researcher and a session for them."""

    ctl: kit.RunningController
    proxy: apiproxy.ApiProxy
    namespace: str
    token: str
    http: aiohttp.ClientSession
    api: client.ApiClient

    def headers(self, token: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {token or self.token}"}

    @property
    def lease_path(self) -> str:
        return (f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases/"
                f"{self.ctl.settings.lease_name}")  # fmt: skip

    async def renewals(self, n: int) -> None:
        """Wait until the controller has renewed its Lease `n` more times (time passing)."""
        start = self.proxy.count("PUT", self.lease_path)

        async def renewed() -> None:
            assert self.proxy.count("PUT", self.lease_path) >= start + n

        await support.eventually(renewed, what=f"{n} Lease renewals")

    async def submit(self, name: str, gpus: int) -> None:
        async with self.http.post(
            f"{self.ctl.url}/v1/runs", params={"namespace": self.namespace},
            json=runskit.job_spec(name, gpus=gpus), headers=self.headers(),
        ) as resp:  # fmt: skip
            assert resp.status == 201, await resp.text()


@contextlib.asynccontextmanager
async def load(
    dev: cluster.Cluster, k8s: client.ApiClient, namespace: str, tmp_path: pathlib.Path,
    **overrides: Any,
) -> AsyncIterator[Load]:  # fmt: skip
    """A controller whose every API call goes through a counting proxy."""
    await kueue.create_queues(k8s, namespace, gpus=8)
    token = await runskit.make_token(k8s, namespace, "researcher", runskit.RESEARCHER_RULES)
    proxy = await apiproxy.ApiProxy(dev, tmp_path).start()
    ctl = await kit.start_controller(
        proxy.kubeconfig, namespace, run_manager=f"test/{namespace}",
        run_pod_annotations={"kwok.taugrid.dev/run-for": "600s"}, **overrides,
    )  # fmt: skip
    try:
        await kit.wait_leader(ctl)
        async with aiohttp.ClientSession() as http:
            yield Load(ctl, proxy, namespace, token, http, k8s)
    finally:
        await ctl.stop()
        await proxy.close()
        await kueue.delete_queues(k8s, namespace)


async def test_a_client_that_hangs_up_stops_costing_the_api_server(
    dev_cluster: cluster.Cluster, k8s: client.ApiClient, namespace: str, tmp_path: pathlib.Path
) -> None:
    """Six researchers' clients follow the logs of a run whose pod never starts (the handler
    polls the run and its pods while it waits), then hang up. From then on the API server
    sees no more of those reads, over ten Lease renewals: the handlers and their polls ended
    with the connections (review H2's polling variant kept ~4 reads/s per client for 120 s)."""
    async with load(dev_cluster, k8s, namespace, tmp_path, logs_wait_s=300.0,
                    log_streams_per_identity=10) as env:  # fmt: skip
        await env.submit("stuck", gpus=64)  # more than the queue's quota: never admitted
        run_path = f"/apis/taugrid.dev/v1alpha1/namespaces/{namespace}/tauruns/stuck"
        pods_path = f"/api/v1/namespaces/{namespace}/pods"
        sessions = [aiohttp.ClientSession() for _ in range(6)]
        follows = [
            asyncio.create_task(s.get(f"{env.ctl.url}/v1/runs/{namespace}/stuck/logs",
                                      params={"follow": "true"}, headers=env.headers()))
            for s in sessions
        ]  # fmt: skip

        async def polling() -> None:
            assert env.proxy.count("GET", run_path) >= 3 * len(follows)

        await support.eventually(polling, what="every follow polling the run")
        for task in follows:
            task.cancel()
        for s in sessions:
            await s.close()  # the connections close: the clients have hung up
        await asyncio.gather(*follows, return_exceptions=True)
        await env.renewals(3)  # reads in flight at the hang-up land
        after = (env.proxy.count("GET", run_path), env.proxy.count("GET", pods_path))
        await env.renewals(10)
        later = (env.proxy.count("GET", run_path), env.proxy.count("GET", pods_path))
    assert after == later


async def _open_follow(
    env: Load, session: aiohttp.ClientSession, token: str
) -> tuple[int, aiohttp.ClientResponse]:
    """Start following worker 0's log; return the status and the open response."""
    resp = await session.get(
        f"{env.ctl.url}/v1/runs/{env.namespace}/quiet/logs",
        params={"follow": "true"}, headers=env.headers(token),
    )  # fmt: skip
    if resp.status == 200:
        await resp.content.readline()  # the line written before: the stream is open
    return resp.status, resp


async def test_log_follows_beyond_the_caps_get_429_and_the_lease_keeps_renewing(
    dev_cluster: cluster.Cluster, k8s: client.ApiClient, namespace: str, tmp_path: pathlib.Path
) -> None:
    """A quiet running pod; per identity 2 streams, per replica 3. The researcher's third
    and fourth follows are 429, a colleague gets one stream and then 429 (the replica is
    full). While the three streams stay open the Lease's renewTime keeps advancing, the
    leader keeps leading, and once they close the researcher may follow again."""
    async with load(dev_cluster, k8s, namespace, tmp_path, log_streams_per_identity=2,
                    log_streams_max=3) as env:  # fmt: skip
        colleague = await runskit.make_token(k8s, namespace, "colleague", runskit.RESEARCHER_RULES)
        await env.submit("quiet", gpus=1)

        async def running_pod() -> str:
            pods = await client.CoreV1Api(k8s).list_namespaced_pod(
                namespace, label_selector="taugrid.dev/run=quiet"
            )
            assert [p.status.phase for p in pods.items] == ["Running"]
            return str(pods.items[0].metadata.name)

        pod = await support.eventually(running_pod, what="the run's pod running")
        with cluster.pod_log_file(dev_cluster, namespace, pod, "main") as path:
            cluster.append_log(path, "started")
            logs = cluster.kwok_logs_object(namespace, pod, "main", path)
            await client.CustomObjectsApi(k8s).create_namespaced_custom_object(
                *KWOK_LOGS, namespace, "logs", logs
            )
            async with contextlib.AsyncExitStack() as stack:
                session = await stack.enter_async_context(aiohttp.ClientSession())
                opened: list[int] = []
                for token in (env.token, env.token, env.token, env.token, colleague, colleague):
                    status, resp = await _open_follow(env, session, token)
                    stack.callback(resp.close)
                    opened.append(status)
                lease = client.CoordinationV1Api(k8s)
                seen: set[Any] = set()

                async def renewing() -> None:
                    got = await lease.read_namespaced_lease(env.ctl.settings.lease_name, namespace)
                    seen.add(got.spec.renew_time)
                    assert len(seen) >= 4, seen

                await support.eventually(renewing, what="the Lease renewed under the flood")
                leading = env.ctl.serving.elector.is_leader()
            again, resp = await _open_follow(env, env.http, env.token)
            resp.close()
    expected = ([200, 200, 429, 429, 200, 429], True, 200)
    assert expected == (opened, leading, again)


async def test_unknown_tokens_from_one_address_cost_at_most_its_burst_of_reviews(
    dev_cluster: cluster.Cluster, k8s: client.ApiClient, namespace: str, tmp_path: pathlib.Path
) -> None:
    """Eight garbage tokens from loopback with a burst of 3: three are reviewed (401), five
    are refused before any review (429, Retry-After); the API server saw three TokenReviews.
    A token already refused is answered from the cache (401), costing nothing."""
    async with load(dev_cluster, k8s, namespace, tmp_path, review_burst_per_source=3,
                    review_rate_per_source=0.001) as env:  # fmt: skip
        reviews = "/apis/authentication.k8s.io/v1/tokenreviews"
        before = env.proxy.count("POST", reviews)
        answers = []
        for i in [*range(8), 0]:
            async with env.http.get(
                f"{env.ctl.url}/v1/runs", headers=env.headers(f"garbage-{i}")
            ) as resp:
                answers.append((resp.status, resp.headers.get("Retry-After")))
        made = env.proxy.count("POST", reviews) - before
    expected = ([(401, None)] * 3 + [(429, "1")] * 5 + [(401, None)], 3)
    assert expected == (answers, made)


async def test_a_body_from_an_identity_that_may_not_make_the_call_is_never_read(
    dev_cluster: cluster.Cluster, k8s: client.ApiClient, namespace: str, tmp_path: pathlib.Path
) -> None:
    """Bodies that would be 400 if parsed are 403 first: a heartbeat from a ServiceAccount
    that is not the agent's, a dry-run switch and a resume from a researcher without the
    right. Authorisation comes before the body is even read."""
    async with load(dev_cluster, k8s, namespace, tmp_path) as env:
        nobody = await runskit.make_token(k8s, namespace, "nobody", None)
        heartbeat_token = await client.CoreV1Api(k8s).create_namespaced_service_account_token(
            "nobody", namespace, {"spec": {"audiences": ["taugrid"]}}
        )
        calls = [
            ("POST", "/v1/heartbeats", str(heartbeat_token.status.token)),
            ("PUT", "/v1/fleet/mode", nobody),
            ("POST", f"/v1/runs/{namespace}/any/resume", nobody),
        ]
        answers = []
        for method, path, token in calls:
            async with env.http.request(
                method, f"{env.ctl.url}{path}", data=b"{not json", headers=env.headers(token)
            ) as resp:
                answers.append(resp.status)
    expected = [403, 403, 403]
    assert expected == answers
