"""Stale heartbeats, the circuit breaker, dry run and the on-call API, on the real control plane."""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from kubernetes_asyncio import client

from devcluster import cluster
from shared import health, heartbeat
from tests import controllerkit as kit
from tests import support

pytestmark = pytest.mark.cluster

TAINT = "taugrid.dev/gpu-unhealthy:NoSchedule"

ROW_REMAP_FAILURE = heartbeat.Reason(
    code="RowRemapFailure",
    verdict=health.Verdict.FAILED,
    action=health.Action.INSPECT,
    message="row remapping failed: the GPU needs service",
    latched=True,
    clears_when="manual release",
)


@pytest_asyncio.fixture
async def fleet(
    k8s: client.ApiClient, dev_cluster: cluster.Cluster, bin_dir: pathlib.Path, namespace: str
) -> AsyncIterator[list[str]]:
    """Three fake GPU nodes that only this test's controller manages."""
    async with kit.own_fleet(k8s, dev_cluster, bin_dir, namespace, 3, tag="o") as names:
        yield names


async def _condition(api: client.ApiClient, node: str) -> dict[str, Any]:
    cond = kit.gpu_condition(await kit.read_node(api, node))
    assert cond is not None, f"{node}: no GPUHealthy condition"
    return cond


async def test_a_silent_node_turns_unknown_then_is_quarantined_after_the_set_time(
    k8s: client.ApiClient, dev_cluster: cluster.Cluster, namespace: str, fleet: list[str]
) -> None:
    """Stale heartbeats: condition Unknown first, quarantine only after staleQuarantineAfter."""
    agents = [kit.Agent(n, await kit.agent_token(k8s, namespace, n)) for n in fleet]
    async with kit.running(dev_cluster, namespace, agents, stale_quarantine_after_s=3.0) as (
        _ctl, _http, loops,
    ):  # fmt: skip

        async def all_healthy() -> None:
            for n in fleet:
                assert (await _condition(k8s, n))["status"] == "True"

        await support.eventually(all_healthy, what="every node healthy")
        loops[fleet[0]].cancel()

        async def unknown() -> dict[str, Any]:
            node = await kit.read_node(k8s, fleet[0])
            cond = kit.gpu_condition(node)
            assert cond is not None
            assert cond["status"] == "Unknown", cond
            return node

        node = await support.eventually(unknown, interval_s=0.05, what="GPUHealthy=Unknown")
        assert kit.gpu_condition(node)["reason"] == "HeartbeatStale"  # type: ignore[index]

        async def quarantined() -> None:
            assert TAINT in kit.taints(await kit.read_node(k8s, fleet[0]))

        await support.eventually(quarantined, what="the silent node to be quarantined")
        for n in fleet[1:]:
            assert TAINT not in kit.taints(await kit.read_node(k8s, n))


async def test_most_of_the_fleet_going_silent_opens_the_breaker_until_an_operator_resets_it(
    k8s: client.ApiClient, dev_cluster: cluster.Cluster, namespace: str, fleet: list[str]
) -> None:
    """More than half the fleet stale at once: nothing is quarantined, an Event and a metric
    say why, and the reset call closes the breaker."""
    agents = [kit.Agent(n, await kit.agent_token(k8s, namespace, n)) for n in fleet]
    token = await kit.admin_token(k8s, namespace)
    auth = {"Authorization": f"Bearer {token}"}
    async with kit.running(dev_cluster, namespace, agents, stale_quarantine_after_s=1.0) as (
        ctl, http, loops,
    ):  # fmt: skip

        async def all_healthy() -> None:
            for n in fleet:
                assert (await _condition(k8s, n))["status"] == "True"

        await support.eventually(all_healthy, what="every node healthy")
        loops[fleet[0]].cancel()
        loops[fleet[1]].cancel()

        async def breaker_open() -> dict[str, Any]:
            async with http.get(f"{ctl.url}/v1/fleet", headers=auth) as resp:
                body = await resp.json()
                assert resp.status == 200, body
                assert body["breaker"]["open"] is True, body
                return dict(body)

        body = await support.eventually(breaker_open, what="the breaker to open")
        assert "2" in body["breaker"]["message"], body

        async def metric_says_open() -> None:
            async with http.get(f"{ctl.url}/metrics") as resp:
                assert "taugrid_quarantine_breaker_open 1.0" in await resp.text()

        await support.eventually(metric_says_open, what="the breaker metric")

        async def event_recorded() -> None:
            events = await client.EventsV1Api(k8s).list_namespaced_event(namespace)
            assert any(e.reason == "OpenBreaker" for e in events.items), "no breaker Event"

        await support.eventually(event_recorded, what="the breaker Event")
        await asyncio.sleep(2.0)  # well past staleQuarantineAfter: still nothing quarantined
        for n in fleet[:2]:
            assert TAINT not in kit.taints(await kit.read_node(k8s, n)), n

        async with http.post(f"{ctl.url}/v1/fleet/breaker/reset", headers=auth) as resp:
            body = await resp.json()
            assert resp.status == 200, body
            assert body["breaker"]["open"] is False
        # A body must carry a reason, as a release's does (no body at all: as above).
        for sent in ({}, {"reason": ""}, {"reason": "x" * 1025}):
            async with http.post(f"{ctl.url}/v1/fleet/breaker/reset", headers=auth,
                                 json=sent) as resp:  # fmt: skip
                body = await resp.json()
                assert (resp.status, body["error"]["field"]) == (422, "reason"), (sent, body)
        async with http.post(f"{ctl.url}/v1/fleet/breaker/reset", headers=auth,
                             json={"reason": "the switch is back: ticket 9"}) as resp:  # fmt: skip
            assert resp.status == 200, await resp.text()

        async def reason_recorded() -> None:
            events = await client.EventsV1Api(k8s).list_namespaced_event(namespace)
            notes = [e.note or "" for e in events.items if e.reason == "CloseBreaker"]
            assert any("the switch is back: ticket 9" in n for n in notes), notes

        await support.eventually(reason_recorded, what="the reset's reason in its Event")


async def test_on_call_quarantine_and_release_by_hand_and_dry_run_need_rbac(
    k8s: client.ApiClient, dev_cluster: cluster.Cluster, namespace: str, fleet: list[str]
) -> None:
    """An Inspect fault is released only by a person; dry run writes nothing; no RBAC → 403."""
    agents = [kit.Agent(n, await kit.agent_token(k8s, namespace, n)) for n in fleet]
    token = await kit.admin_token(k8s, namespace)
    auth = {"Authorization": f"Bearer {token}"}
    core = client.CoreV1Api(k8s)
    await core.create_namespaced_service_account(namespace, {"metadata": {"name": "nobody"}})
    nobody = await core.create_namespaced_service_account_token("nobody", namespace, {"spec": {}})
    no_rbac = {"Authorization": f"Bearer {nobody.status.token}"}
    async with kit.running(dev_cluster, namespace, agents, max_quarantined=3) as (
        ctl,
        http,
        _loops,
    ):
        for method, path in (("GET", "/v1/nodes"), ("GET", "/v1/fleet"),
                             ("POST", f"/v1/nodes/{fleet[2]}/quarantine")):  # fmt: skip
            async with http.request(method, ctl.url + path, headers=no_rbac,
                                    json={"reason": "x"}) as resp:  # fmt: skip
                assert resp.status == 403, (path, await resp.text())

        agents[0].fail(1, ROW_REMAP_FAILURE)

        async def quarantined() -> None:
            assert TAINT in kit.taints(await kit.read_node(k8s, fleet[0]))

        await support.eventually(quarantined, what="the Inspect fault's quarantine")
        agents[0].heal()
        await asyncio.sleep(3 * ctl.settings.release_after_s)
        assert TAINT in kit.taints(await kit.read_node(k8s, fleet[0])), "Inspect needs a person"

        async with http.delete(f"{ctl.url}/v1/nodes/{fleet[0]}/quarantine", headers=auth,
                               json={}) as resp:  # fmt: skip
            body = await resp.json()
            assert resp.status == 422, body
            assert body["error"]["field"] == "reason"
        async with http.delete(f"{ctl.url}/v1/nodes/{fleet[0]}/quarantine", headers=auth,
                               json={"reason": "GPU replaced, ticket 42"}) as resp:  # fmt: skip
            assert resp.status == 200, await resp.text()

        async def released() -> None:
            node = await kit.read_node(k8s, fleet[0])
            assert TAINT not in kit.taints(node)
            assert not node["spec"].get("unschedulable")

        await support.eventually(released, what="the manual release")

        async with http.put(f"{ctl.url}/v1/fleet/mode", headers=auth, json={"dryRun": True}) as r:
            assert (await r.json())["dryRun"] is True
        agents[1].fail(0)

        async def reported_failed() -> None:
            async with http.get(f"{ctl.url}/v1/nodes/{fleet[1]}", headers=auth) as resp:
                body = await resp.json()
                assert body["state"] == "Failed", body

        await support.eventually(reported_failed, what="the controller to see the fault")
        await asyncio.sleep(2 * ctl.settings.pass_interval_s)
        node = await kit.read_node(k8s, fleet[1])
        assert TAINT not in kit.taints(node), "dry run must not write"
        async with http.put(f"{ctl.url}/v1/fleet/mode", headers=auth, json={"dryRun": False}) as r:
            assert (await r.json())["dryRun"] is False

        async def quarantined_now() -> None:
            assert TAINT in kit.taints(await kit.read_node(k8s, fleet[1]))

        await support.eventually(quarantined_now, what="quarantine once dry run is off")
        async with http.get(f"{ctl.url}/v1/nodes", headers=auth) as resp:
            items = {i["name"]: i for i in (await resp.json())["items"]}
        assert items[fleet[1]]["quarantine"]["clearsWith"], items[fleet[1]]
        assert set(fleet) <= set(items)


async def test_an_open_breaker_and_dry_run_survive_a_failover(
    k8s: client.ApiClient, dev_cluster: cluster.Cluster, namespace: str, fleet: list[str]
) -> None:
    """The new leader takes over the breaker and the runtime dry-run switch from the Lease."""
    agents = [kit.Agent(n, await kit.agent_token(k8s, namespace, n)) for n in fleet]
    token = await kit.admin_token(k8s, namespace)
    auth = {"Authorization": f"Bearer {token}"}
    first = await kit.start_controller(dev_cluster.kubeconfig, namespace)
    await kit.wait_leader(first)
    second = await kit.start_controller(dev_cluster.kubeconfig, namespace)
    urls = [first.url, second.url]
    async with aiohttp.ClientSession() as http:
        loops = {
            a.node: asyncio.create_task(kit.heartbeat_loop([a], http, urls, 0.5)) for a in agents
        }
        try:

            async def all_healthy() -> None:
                for n in fleet:
                    assert (await _condition(k8s, n))["status"] == "True"

            await support.eventually(all_healthy, what="every node healthy")
            async with http.put(f"{first.url}/v1/fleet/mode", headers=auth,
                                json={"dryRun": True}) as resp:  # fmt: skip
                assert resp.status == 200, await resp.text()
            loops[fleet[0]].cancel()
            loops[fleet[1]].cancel()

            async def open_on(url: str) -> None:
                async with http.get(f"{url}/v1/fleet", headers=auth) as resp:
                    body = await resp.json()
                    assert resp.status == 200, body
                    assert body["breaker"]["open"] is True, body
                    assert body["dryRun"] is True, body

            await support.eventually(lambda: open_on(first.url), what="the breaker to open")

            async def saved_on_lease() -> None:
                lease = await client.CoordinationV1Api(k8s).read_namespaced_lease(
                    "taugrid-controller", namespace
                )
                annotations = lease.metadata.annotations or {}
                assert '"open":true' in annotations.get("taugrid.dev/breaker", ""), annotations

            await support.eventually(saved_on_lease, what="the breaker saved on the Lease")
            await first.stop()
            await kit.wait_leader(second)
            await support.eventually(lambda: open_on(second.url), what="the new leader's state")
        finally:
            for t in loops.values():
                t.cancel()
            for t in loops.values():
                with contextlib.suppress(asyncio.CancelledError):
                    await t
            await second.stop()
            with contextlib.suppress(Exception):
                await first.stop()
