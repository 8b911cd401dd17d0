"""A flood of access reviews on the real control plane (security review 3, finding 1).

Several researchers each send many calls at once, every one naming a namespace never named
before, so none is answered from the cache. The controller under test talks to the API server
through a counting proxy that holds every SubjectAccessReview until the test lets them go, so
what is in flight is what the caps allow, and counts (not clocks) tell the story.
"""

from __future__ import annotations

import asyncio
import pathlib
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client
from prometheus_client import parser

from devcluster import cluster
from tests import apiproxy, runskit, support
from tests import controllerkit as kit

pytestmark = pytest.mark.cluster

SAR = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
TOKEN_REVIEW = "/apis/authentication.k8s.io/v1/tokenreviews"
PER_IDENTITY = 40
IN_FLIGHT_MAX = 100
CALLERS = 3
CALLS_EACH = 60


async def _list(http: aiohttp.ClientSession, url: str, token: str, namespace: str) -> Any:
    """GET /v1/runs in `namespace`: (status, Retry-After, error message)."""
    async with http.get(
        f"{url}/v1/runs", params={"namespace": namespace},
        headers={"Authorization": f"Bearer {token}"},
    ) as resp:  # fmt: skip
        body = await resp.json() if resp.content_type == "application/json" else {}
        message = body.get("error", {}).get("message", "") if isinstance(body, dict) else ""
        return resp.status, resp.headers.get("Retry-After"), message


def _reviews(text: str, kind: str, cached: str, outcome: str) -> float:
    """One sample of `taugrid_auth_reviews_total` from the controller's /metrics, 0 when absent."""
    for family in parser.text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "taugrid_auth_reviews_total" and sample.labels == {
                "kind": kind, "cached": cached, "outcome": outcome,
            }:  # fmt: skip
                return float(sample.value)
    return 0.0


async def test_new_namespaces_per_call_cost_at_most_the_caps_and_the_lease_keeps_renewing(
    dev_cluster: cluster.Cluster, k8s: client.ApiClient, namespace: str, tmp_path: pathlib.Path
) -> None:
    """Three researchers send sixty calls each at once, each naming a new namespace, to a
    replica with caps of 40 access reviews per identity and 100 in all, whose write budget
    is small (10/s, burst 5) and whose reviews have their own (1/s). Exactly 80 calls are
    429 at once, with Retry-After and the limit named; no more than 100 reviews are ever in
    flight, nor reach the API server in the end; while they are held, the Lease's renewTime keeps
    advancing and the replica never stops leading; afterwards every slot is free again, and
    `taugrid_auth_reviews_total` counts the 80 shed."""
    tokens = [
        await runskit.make_token(k8s, namespace, f"flooder-{i}", runskit.RESEARCHER_RULES)
        for i in range(CALLERS)
    ]
    proxy = apiproxy.HoldingProxy(
        dev_cluster, tmp_path, lambda method, path: method == "POST" and path == SAR
    )
    await proxy.start()
    ctl = await kit.start_controller(
        proxy.kubeconfig, namespace,
        access_reviews_per_identity=PER_IDENTITY, access_reviews_in_flight_max=IN_FLIGHT_MAX,
        api_writes_per_s=10.0, api_write_burst=5, api_reviews_per_s=1.0, api_review_burst=1,
    )  # fmt: skip
    try:
        await kit.wait_leader(ctl)
        elector = ctl.serving.elector
        transitions = elector.transitions
        authn = ctl.serving.authn
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            # Each token reviewed (and its own namespace allowed) before the flood.
            warm = [await _list(http, ctl.url, t, namespace) for t in tokens]
            assert [s for s, _, _ in warm] == [200] * CALLERS, warm
            before = proxy.count("POST", SAR)
            proxy.released.clear()
            calls = [
                asyncio.create_task(_list(http, ctl.url, t, f"flood-{i}-{k}"))
                for k in range(CALLS_EACH)
                for i, t in enumerate(tokens)
            ]

            async def refused() -> list[Any]:
                done = [c.result() for c in calls if c.done()]
                assert len(done) >= CALLERS * CALLS_EACH - IN_FLIGHT_MAX, len(done)
                return done

            shed = await support.eventually(refused, what="the calls past the caps answered")
            in_flight = authn.access_reviews.in_flight
            lease = client.CoordinationV1Api(k8s)
            seen: set[Any] = set()

            async def renewing() -> None:
                got = await lease.read_namespaced_lease(ctl.settings.lease_name, namespace)
                seen.add(got.spec.renew_time)
                assert len(seen) >= 6, seen

            await support.eventually(renewing, what="the Lease renewed under the flood")
            proxy.released.set()
            answers = await asyncio.gather(*calls)
            reached = proxy.count("POST", SAR) - before
            leading = (elector.is_leader(), elector.transitions - transitions)
            again = await _list(http, ctl.url, tokens[0], namespace)
            async with http.get(f"{ctl.url}/metrics") as resp:
                shed_metric = _reviews(await resp.text(), "access", "false", "shed")
    finally:
        await ctl.stop()
        await proxy.close()
    too_many = [a for a in answers if a[0] == 429]
    named = all(
        r == "1" and ("access_reviews_per_identity" in m or "access_reviews_in_flight_max" in m)
        for _, r, m in too_many
    )
    held = CALLERS * CALLS_EACH - IN_FLIGHT_MAX
    expected = (held, held, True, IN_FLIGHT_MAX, True, (True, 0), 200, 0, held)
    assert expected == (
        len(shed), len(too_many), named, in_flight, reached <= IN_FLIGHT_MAX, leading,
        again[0], authn.access_reviews.in_flight, shed_metric,
    )  # fmt: skip


async def test_a_fault_is_quarantined_while_access_and_token_reviews_flood_the_replica(
    dev_cluster: cluster.Cluster,
    k8s: client.ApiClient,
    namespace: str,
    tmp_path: pathlib.Path,
    bin_dir: pathlib.Path,
) -> None:
    """The issue's proof, in counts: a replica whose reviews have their own small budget
    (1/s) is flooded by three researchers naming a new namespace per call (their access
    reviews held at the API server until the end) and by 150 never-seen tokens (each a
    TokenReview: the per-address bucket is opened wide so all of them reach the review
    budget). Meanwhile one of its nodes reports Xid 79. The node is quarantined (condition,
    taint, cordon), the Lease keeps renewing and the replica never stops leading, and the
    caps shed the access reviews past them, and the never-seen tokens are shed (503) with few
    TokenReviews sent. Were reviews spending the write budget, the
    quarantine's writes and the renewals would wait behind 150 TokenReviews at 1/s."""
    tokens = [
        await runskit.make_token(k8s, namespace, f"flooder-{i}", runskit.RESEARCHER_RULES)
        for i in range(CALLERS)
    ]
    proxy = apiproxy.HoldingProxy(
        dev_cluster, tmp_path, lambda method, path: method == "POST" and path == SAR
    )
    await proxy.start()
    async with kit.own_fleet(k8s, dev_cluster, bin_dir, namespace, 2, tag="rf") as nodes:
        agents = [kit.Agent(n, await kit.agent_token(k8s, namespace, n)) for n in nodes]
        ctl = await kit.start_controller(
            proxy.kubeconfig, namespace,
            access_reviews_per_identity=PER_IDENTITY, access_reviews_in_flight_max=IN_FLIGHT_MAX,
            api_writes_per_s=10.0, api_write_burst=5, api_reviews_per_s=1.0, api_review_burst=1,
            review_rate_per_source=10_000.0, auth_cache_ttl_s=600.0,
        )  # fmt: skip
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as http:
            beats = [
                asyncio.create_task(kit.heartbeat_loop([a], http, [ctl.url], 0.5)) for a in agents
            ]
            flood: list[asyncio.Task[Any]] = []
            try:
                await kit.wait_leader(ctl)
                elector = ctl.serving.elector
                transitions = elector.transitions
                bad = nodes[0]

                async def healthy() -> None:
                    cond = kit.gpu_condition(await kit.read_node(k8s, bad))
                    assert cond is not None
                    assert cond["status"] == "True", cond

                await support.eventually(healthy, what="GPUHealthy=True from heartbeats")
                warm = [await _list(http, ctl.url, t, namespace) for t in tokens]
                assert [s for s, _, _ in warm] == [200] * CALLERS, warm
                proxy.released.clear()
                flood = [
                    asyncio.create_task(_list(http, ctl.url, t, f"flood-{i}-{k}"))
                    for k in range(CALLS_EACH)
                    for i, t in enumerate(tokens)
                ] + [
                    asyncio.create_task(_list(http, ctl.url, f"never-seen-{k}", namespace))
                    for k in range(150)
                ]  # fmt: skip
                agents[0].fail(3)

                leases = client.CoordinationV1Api(k8s)
                seen: set[Any] = set()

                async def quarantined_and_renewing() -> None:
                    got = await leases.read_namespaced_lease(ctl.settings.lease_name, namespace)
                    seen.add(got.spec.renew_time)
                    node = await kit.read_node(k8s, bad)
                    cond = kit.gpu_condition(node)
                    assert cond is not None
                    assert cond["status"] == "False", cond
                    assert "taugrid.dev/gpu-unhealthy:NoSchedule" in kit.taints(node)
                    assert node["spec"].get("unschedulable") is True
                    assert len(seen) >= 6, f"{len(seen)} renewals seen"

                await support.eventually(
                    quarantined_and_renewing, what="the node quarantined and the Lease renewing"
                )
                in_flight = ctl.serving.authn.access_reviews.in_flight
                leading = (elector.is_leader(), elector.transitions - transitions)
                async with http.get(f"{ctl.url}/metrics") as resp:
                    shed = _reviews(await resp.text(), "access", "false", "shed")
                unknown = await asyncio.gather(*flood[CALLERS * CALLS_EACH :])
                token_reviews = proxy.count("POST", TOKEN_REVIEW)
            finally:
                proxy.released.set()
                for t in (*flood, *beats):
                    t.cancel()
                await asyncio.gather(*flood, *beats, return_exceptions=True)
                await ctl.stop()
                await proxy.close()
    held = CALLERS * CALLS_EACH - IN_FLIGHT_MAX
    statuses = {status for status, _, _ in unknown}
    # The never-seen tokens were shed (503: the review budget had no room within the call's
    # wait; 504: the handler's own timeout) or refused; none got in, none was a 500; fewer
    # TokenReviews reached the API server than there were tokens.
    assert (in_flight, leading, shed, statuses <= {401, 429, 503, 504}, 503 in statuses) == (
        IN_FLIGHT_MAX, (True, 0), held, True, True,
    ), statuses  # fmt: skip
    assert token_reviews < len(unknown), token_reviews
