"""Builders for heartbeats and raw Nodes, and a tiny in-memory actuator, for policy tests."""

from __future__ import annotations

import copy
import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any

from controller import marks
from controller.fleet import actions, conditions, devicepolicy, devices, nodes, policy, state
from shared import health, heartbeat

T0 = dt.datetime(2025, 3, 1, 12, 0, 0, tzinfo=dt.UTC)


def at(seconds: float) -> dt.datetime:
    """Return T0 plus `seconds`."""
    return T0 + dt.timedelta(seconds=seconds)


def reason(
    code: str,
    verdict: health.Verdict,
    action: health.Action,
    *,
    latched: bool = False,
    since: dt.datetime | None = None,
) -> heartbeat.Reason:
    """Return one finding."""
    return heartbeat.Reason(code=code, verdict=verdict, action=action, latched=latched, since=since)


def xid79(since: dt.datetime = T0) -> heartbeat.Reason:
    """Return a latched Xid 79 (Failed, RebootNode)."""
    return reason(
        "XidFallenOffBus",
        health.Verdict.FAILED,
        health.Action.REBOOT_NODE,
        latched=True,
        since=since,
    )


def row_remap_failure(since: dt.datetime = T0) -> heartbeat.Reason:
    """Return a latched row-remap failure (Failed, Inspect)."""
    return reason(
        "RowRemapFailure", health.Verdict.FAILED, health.Action.INSPECT, latched=True, since=since
    )


def ecc_rising(since: dt.datetime = T0) -> heartbeat.Reason:
    """Return a latched rising uncorrected ECC count (Degraded, ResetGPU)."""
    return reason(
        "EccUncorrectedRising",
        health.Verdict.DEGRADED,
        health.Action.RESET_GPU,
        latched=True,
        since=since,
    )


def gpu_uuid(node: str, index: int) -> str:
    """Return a stable fake GPU UUID."""
    return f"GPU-{node}-{index}"


def hb(
    node: str,
    *,
    faults: Mapping[int, Iterable[heartbeat.Reason]] | None = None,
    boot: str = "boot-1",
    seq: int = 1,
    interval_s: float = 10.0,
    gpus: int = 8,
    sent_at: dt.datetime | None = None,
) -> heartbeat.Heartbeat:
    """Return a heartbeat of `gpus` GPUs, those in `faults` carrying the given findings."""
    reports = []
    for index in range(gpus):
        found = list((faults or {}).get(index, ()))
        verdict = health.worst_verdict([r.verdict for r in found])
        action = health.worst_action([r.action for r in found])
        reports.append(
            heartbeat.GpuReport(
                index=index,
                uuid=gpu_uuid(node, index),
                verdict=verdict,
                action=action,
                reasons=found,
            )
        )
    return heartbeat.Heartbeat(
        schema_version=1,
        node_name=node,
        boot_id=boot,
        interval_s=interval_s,
        sequence=seq,
        sent_at=sent_at or at(seq),
        gpus=reports,
    )


def raw_node(
    name: str,
    *,
    gpus: int = 8,
    unschedulable: bool = False,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
    conditions_: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    """Return a Node as the API server serves it, with only the fields we read."""
    node: dict[str, Any] = {
        "metadata": {
            "name": name,
            "resourceVersion": "1",
            "labels": dict(labels or {}),
            "annotations": dict(annotations or {}),
        },
        "spec": {},
        "status": {
            "capacity": {"cpu": "64", **({marks.GPU_RESOURCE: str(gpus)} if gpus else {})},
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": ""},
                *(conditions_ or []),
            ],
        },
    }
    if unschedulable:
        node["spec"]["unschedulable"] = True
    if taints:
        node["spec"]["taints"] = list(taints)
    return node


def apply(node: Mapping[str, Any], patch: conditions.NodePatch) -> dict[str, Any]:
    """Apply a patch the way the API server would, bumping the resourceVersion."""
    result = copy.deepcopy(dict(node))
    if patch.subresource == "status":
        assert patch.content_type == conditions.STRATEGIC_MERGE_PATCH
        existing = result.setdefault("status", {}).setdefault("conditions", [])
        for wanted in patch.body["status"]["conditions"]:
            for index, entry in enumerate(existing):
                if entry.get("type") == wanted["type"]:
                    existing[index] = {**entry, **wanted}
                    break
            else:
                existing.append(dict(wanted))
    else:
        assert patch.content_type == conditions.MERGE_PATCH
        body = copy.deepcopy(patch.body)
        version = body["metadata"].pop("resourceVersion", None)
        if version is not None and version != result["metadata"]["resourceVersion"]:
            msg = "409 Conflict"
            raise AssertionError(msg)
        _merge(result, body)
    result["metadata"]["resourceVersion"] = str(int(result["metadata"]["resourceVersion"]) + 1)
    return result


def _merge(target: dict[str, Any], patch: Mapping[str, Any]) -> None:
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


class World:
    """A fleet, its Nodes and a breaker, run pass by pass through decide and a fake actuator."""

    def __init__(
        self,
        names: Iterable[str],
        settings: policy.Settings,
        *,
        leader_since: dt.datetime = T0,
        raw: Mapping[str, dict[str, Any]] | None = None,
    ) -> None:
        self.settings = settings
        self.fleet = state.FleetState(
            leader_since=leader_since, stale_multiplier=settings.stale_multiplier
        )
        self.nodes: dict[str, dict[str, Any]] = {name: raw_node(name) for name in names}
        self.nodes.update(copy.deepcopy(dict(raw or {})))
        self.breaker = actions.BreakerState()
        self.evictions: list[tuple[str, dt.datetime]] = []
        self.seq = 0

    def report(
        self,
        now: dt.datetime,
        names: Iterable[str],
        *,
        faults: Mapping[int, Iterable[heartbeat.Reason]] | None = None,
        boot: str = "boot-1",
    ) -> None:
        """Deliver one heartbeat from each named node at `now`."""
        for name in names:
            self.seq += 1
            self.fleet.ingest(hb(name, faults=faults, boot=boot, seq=self.seq, sent_at=now), now)

    def step(self, now: dt.datetime) -> actions.Decision:
        """Run one pass and carry out its node actions."""
        views = [nodes.parse(raw) for raw in self.nodes.values()]
        decision = policy.decide(self.fleet, views, self.settings, self.breaker, now)
        self.breaker = decision.breaker
        for action in decision.actions:
            if isinstance(action, actions.Skipped | actions.OpenBreaker | actions.CloseBreaker):
                continue
            self.carry_out(action, now)
        return decision

    def carry_out(self, action: actions.NodeAction, now: dt.datetime) -> None:
        """Apply one node action as the actuator would."""
        if isinstance(action, actions.EvictGpuPods):
            self.evictions.append((action.node, now))
        patch = conditions.patch_for(action, self.nodes[action.node], now)
        if patch is not None:
            self.nodes[action.node] = apply(self.nodes[action.node], patch)

    def view(self, name: str) -> nodes.NodeView:
        """Return the parsed view of one node."""
        return nodes.parse(self.nodes[name])

    def marks(self, name: str) -> tuple[str | None, bool, bool, bool]:
        """Return (condition status, tainted, unschedulable, cordoned by us) of a node."""
        view = self.view(name)
        status = view.condition.status.value if view.condition else None
        return (status, view.tainted, view.unschedulable, view.cordoned_by_us)


def kinds(decision: actions.Decision) -> list[tuple[str, str]]:
    """Return (action kind, node or skip reason) pairs, for compact assertions."""
    out = []
    for action in decision.actions:
        if isinstance(action, actions.Skipped):
            out.append((f"Skipped{action.wanted.kind.value}", f"{action.node}:{action.why}"))
        elif isinstance(action, actions.OpenBreaker | actions.CloseBreaker):
            out.append((action.kind.value, ""))
        else:
            out.append((action.kind.value, action.node))
    return out


def every_gpu_judged(
    fleet_state: state.FleetState,
    managed: Iterable[str],
    settings: devicepolicy.Settings,
    now: dt.datetime,
    *,
    inventory: Mapping[str, devices.NodeDevices],
    rules: Iterable[devices.TaintRule],
) -> dict[str, tuple[bool, tuple[devicepolicy.Usable, ...]]]:
    """The reference for `devicepolicy.usable`: every node assessed and every GPU listed
    afresh, as the gate was told before only the faulty nodes were assessed."""
    out: dict[str, tuple[bool, tuple[devicepolicy.Usable, ...]]] = {}
    if settings.mode == devicepolicy.GpuMode.DEVICE_PLUGIN:
        return out
    hard = [r for r in rules if r.effect in devices.HARD_EFFECTS]
    for node in sorted(set(managed)):
        found = inventory.get(node)
        if found is None or not found.devices:
            continue
        h = fleet_state.assess(node, now, default_interval_s=settings.default_interval_s)
        faulty = {f.gpu_uuid for f in h.faults}
        listed = []
        for device in found.devices:
            taints = [r.key for r in hard if r.selects(device)]
            taints += [k for k, e in device.taints if e in devices.HARD_EFFECTS]
            why = "tainted" if taints else ("faulty" if device.uuid in faulty else "")
            listed.append(devicepolicy.Usable(device.pool, device.name, device.uuid, not why, why))
        fresh = h.state in {state.NodeState.HEALTHY, state.NodeState.DEGRADED,
                            state.NodeState.FAILED, state.NodeState.UNKNOWN}  # fmt: skip
        out[node] = (fresh, tuple(listed))
    return out
