"""A quarantine pass's writes in order, on the real API server: every failed node's fence
goes before any Event of the pass, so a burst's last taint waits behind the other fences
only, not behind their Events too."""

from __future__ import annotations

import datetime as dt
import json
import pathlib
import typing
from typing import Any

from kubernetes_asyncio import client

from controller import leading, metrics
from controller.fleet import nodes, policy, quarantining, state
from controller.kube import nodes as kube_nodes
from controller.settings import ControllerSettings
from devcluster import cluster
from shared import heartbeat
from tests import controllerkit as kit
from tests import support

COUNT = 3


def _failed(name: str, now: dt.datetime) -> heartbeat.Heartbeat:
    """A report of one GPU fallen off the bus (Xid 79: Failed, RebootNode), seven healthy."""
    gpus = []
    for index in range(8):
        bad = index == 0
        reasons = [{"code": "XidFallenOffBus", "verdict": "Failed", "action": "RebootNode",
                    "latched": True, "since": now.isoformat()}] if bad else []  # fmt: skip
        gpus.append({"index": index, "uuid": f"GPU-{name}-{index}",
                     "verdict": "Failed" if bad else "Healthy",
                     "action": "RebootNode" if bad else "None", "reasons": reasons})  # fmt: skip
    return heartbeat.validate_json(json.dumps({
        "schemaVersion": heartbeat.SCHEMA_VERSION, "nodeName": name, "bootId": "boot-1",
        "intervalS": 10.0, "sequence": 1, "sentAt": now.isoformat(), "gpus": gpus,
    }))  # fmt: skip


class Recording(kube_nodes.NodeWriter):
    """The real writer, noting each node patch and Event in the order they are sent."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        super().__init__(api, namespace, component="test-pass-order")
        self.sent: list[tuple[str, str]] = []

    async def patch(self, name: str, patch: kube_nodes.NodePatch) -> dict[str, Any] | None:
        self.sent.append(("patch", name))
        return await super().patch(name, patch)

    async def event(self, node: dict[str, Any], reason: str, note: str, *, warning: bool) -> None:
        self.sent.append((f"event {reason}", str(node["metadata"]["name"])))
        await super().event(node, reason, note, warning=warning)


async def test_a_pass_writes_every_fence_before_any_event(
    k8s: client.ApiClient, dev_cluster: cluster.Cluster, bin_dir: pathlib.Path, namespace: str
) -> None:
    """Three nodes report a failed GPU at once. The pass taints and cordons all three, then
    writes their conditions, and only then the Events; each node still gets its Quarantine
    Event, and each is fenced on the API server."""
    async with kit.own_fleet(k8s, dev_cluster, bin_dir, namespace, COUNT, tag="po") as names:
        now = dt.datetime.now(dt.UTC)
        writer = Recording(k8s, namespace)
        cache = kube_nodes.NodeCache(k8s, on_change=lambda: None)
        for name in names:
            raw = await writer.read(name)
            assert raw is not None
            cache.put(raw)
        fleet = state.FleetState(leader_since=now - dt.timedelta(hours=1))
        for name in names:
            fleet.ingest(_failed(name, now), now)
        settings = ControllerSettings(max_quarantined=100, breaker_percent=100)
        q = quarantining.Quarantiner(
            fleet, cache=cache, settings=policy.settings_from(settings),
            elector=typing.cast("leading.Elector", support.AlwaysLeading("test-pass-order")),
            writer=writer, metrics=metrics.make_metrics(), clock=lambda: now,
        )  # fmt: skip
        await q.run_pass()

        kinds = [kind for kind, _ in writer.sent]
        last_patch = max(i for i, k in enumerate(kinds) if k == "patch")
        first_event = min(i for i, k in enumerate(kinds) if k.startswith("event"))
        fenced = []
        for name in names:
            parsed = nodes.parse(kube_nodes.trim_node(await kit.read_node(k8s, name)))
            fenced.append((parsed.tainted, parsed.unschedulable))
        quarantine_events = sorted(n for k, n in writer.sent if k == "event Quarantine")
        expected = (True, [(True, True)] * COUNT, sorted(names))
        assert expected == (last_patch < first_event, fenced, quarantine_events), writer.sent
