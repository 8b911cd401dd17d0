"""Device quarantine on DRA nodes (DESIGN.md sections 2 and 6) as one pure, level-triggered
function, beside the node policy (`controller.fleet.policy`).

`decide` reads the health of every DRA node with a fault or a rule of ours (no other node
can be in scope, and `FleetState.faulty` names them without assessing the fleet), their
devices (the ResourceSlices) and every DeviceTaintRule. It returns the rules to create and
delete, the nodes it takes out of node quarantine's hands (`scope`), and when to look
again. Scope follows the fault:

- a node whose every fault is on a GPU its slices list, with action ResetGPU or Inspect, and
  which would have at most `max_per_node` fenced GPUs, is in **device scope**: each faulty
  GPU gets its rules, and its other GPUs keep working;
- a RebootNode fault (Xid 79, a lost GPU, fabric faults), any other fault, a silent node,
  a GPU the slices do not list, or more than `max_per_node` bad GPUs: **node scope**, i.e.
  node quarantine as on a device-plugin fleet (the node policy decides it);
- a node already in node quarantine stays there until it is released.

The safety limits of node quarantine hold per device: at most `max_quarantined_devices`
devices fenced at once, a device breaker that opens when more than `breaker_percent` of the
fleet's GPUs turned bad inside the window, dry run (a `dry-run` rule of effect None instead of
the real ones), and the opt-out label (a node labelled `taugrid.dev/managed=false` is never
written to, its rules included). A device is released when its fault has cleared and it has
reported healthy for `release_after_s` on its own streak; only our rules are ever deleted,
and only those of nodes this controller manages.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import math
from collections.abc import Iterable, Mapping, Sequence

import pydantic
from pydantic import alias_generators

from controller import marks
from controller.fleet import actions, devices, nodes, policy, state
from controller.settings import DeviceSettings, FleetSettings
from shared import health

DEVICE_ACTIONS = frozenset({health.Action.RESET_GPU, health.Action.INSPECT})
"""Fault remedies scoped to one GPU: those faults fence the device, not the node."""
_FRESH = frozenset({state.NodeState.HEALTHY, state.NodeState.DEGRADED, state.NodeState.FAILED,
                    state.NodeState.UNKNOWN})  # fmt: skip


class GpuMode(enum.StrEnum):
    """How GPUs are advertised, so which quarantine and which request (`gpuMode`)."""

    AUTO = "auto"
    """Per node for quarantine (DRA when its GPUs are in ResourceSlices); for runs, DRA
    when GPUs are published as DRA devices and no managed node advertises nvidia.com/gpu."""
    DRA = "dra"
    DEVICE_PLUGIN = "device-plugin"
    """Node quarantine only; runs ask for the nvidia.com/gpu extended resource."""


class Settings(pydantic.BaseModel):
    """Every limit of device quarantine, as the pure core takes it (no defaults: the process
    settings are the one source, translated by `settings_from` in the loop)."""

    model_config = pydantic.ConfigDict(
        frozen=True, extra="forbid", alias_generator=alias_generators.to_camel,
        populate_by_name=True,
    )  # fmt: skip

    mode: GpuMode
    max_per_node: int = pydantic.Field(ge=0)
    """A node with more bad GPUs than this goes to node quarantine."""
    max_quarantined_devices: int | None = pydantic.Field(ge=1)
    """Absolute cap on devices fenced at once; None uses the fraction."""
    max_quarantined_devices_fraction: float = pydantic.Field(gt=0, le=1)
    """Cap as a share of the DRA fleet's GPUs (at least 1 device)."""
    breaker_percent: float = pydantic.Field(gt=0, le=100)
    breaker_min_devices: int = pydantic.Field(ge=1)
    breaker_window_s: float = pydantic.Field(gt=0)
    breaker_healthy_close_s: float = pydantic.Field(gt=0)
    release_after_s: float = pydantic.Field(ge=0)
    default_interval_s: float = pydantic.Field(gt=0)

    def limit_for(self, total: int) -> int:
        """maxQuarantinedDevices for a DRA fleet of `total` GPUs."""
        if self.max_quarantined_devices is not None:
            return self.max_quarantined_devices
        return max(1, math.floor(total * self.max_quarantined_devices_fraction))


def settings_from(devices: DeviceSettings, fleet: FleetSettings) -> Settings:
    """Device quarantine's settings from the device section, and the fleet section's breaker
    window and release timing, which it shares with node quarantine."""
    return Settings(
        mode=GpuMode(devices.gpu_mode),
        max_per_node=devices.device_quarantine_max_per_node,
        max_quarantined_devices=devices.max_quarantined_devices,
        max_quarantined_devices_fraction=devices.max_quarantined_devices_fraction,
        breaker_percent=devices.device_breaker_percent,
        breaker_min_devices=devices.device_breaker_min_devices,
        breaker_window_s=fleet.breaker_window_s,
        breaker_healthy_close_s=fleet.breaker_healthy_close_s,
        release_after_s=fleet.release_after_s,
        default_interval_s=fleet.default_interval_s,
    )


@dataclasses.dataclass(frozen=True, slots=True)
class _Group:
    """Our rules of one device."""

    node: str
    device: str
    rules: tuple[devices.TaintRule, ...]

    @property
    def kinds(self) -> frozenset[devices.RuleKind]:
        return frozenset(r.kind for r in self.rules if r.kind is not None)

    @property
    def fencing(self) -> bool:
        return bool(self.kinds & devices.FENCING_KINDS)

    @property
    def gpu_uuid(self) -> str:
        return next((r.gpu_uuid for r in self.rules if r.gpu_uuid), "")


def decide(
    fleet_state: state.FleetState,
    views: Mapping[str, nodes.NodeView],
    settings: Settings,
    breaker: actions.BreakerState,
    now: dt.datetime,
    *,
    inventory: devices.Inventory,
    rules: Sequence[devices.TaintRule],
    dry_run: bool,
) -> actions.DeviceDecision:
    """Return the device rules to create and delete now, and when to look again (`views`:
    every node of the cache, by name)."""
    managed = {name for name, v in views.items() if v.managed}
    dra_nodes: frozenset[str] = frozenset()
    total = 0
    if settings.mode != GpuMode.DEVICE_PLUGIN:
        dra_nodes = frozenset(managed & inventory.keys())
        # GPUs of nodes with slices that are not managed (few) are not the fleet's.
        total = inventory.gpus - sum(len(inventory[n].devices) for n in inventory.keys() - managed)
    groups = _groups(r for r in rules if r.ours and r.kind is not None and r.node in managed)
    # Only a node whose last report names a fault can be in scope, and only a node with
    # rules can need a release: the rest of the fleet is not assessed at all, so a pass
    # costs the faulty and fenced nodes, not every DRA node.
    judged = (dra_nodes & fleet_state.faulty()) | {node for node, _ in groups}
    healths = {
        n: fleet_state.assess(n, now, default_interval_s=settings.default_interval_s)
        for n in sorted(judged)
    }
    limit = settings.limit_for(total)
    fenced_now = sum(1 for g in groups.values() if g.fencing)
    deadlines: list[dt.datetime] = []
    decided: list[actions.DeviceAction | actions.SkippedDevice | actions.OpenBreaker
                  | actions.CloseBreaker] = []  # fmt: skip

    scope = frozenset(
        n for n in dra_nodes & judged
        if _scope(views[n], healths[n], inventory[n], groups, settings)
    )  # fmt: skip
    breaker = _judge_breaker(
        fleet_state, settings, breaker, now, scope=scope, healths=healths, groups=groups,
        total=total, decided=decided, deadlines=deadlines,
    )  # fmt: skip
    candidates: list[tuple[tuple[int, dt.datetime, str, str], actions.FenceDevice]] = []
    for node in sorted(scope):
        h = healths[node]
        by_uuid = inventory[node].by_uuid()
        released = views[node].released_faults or frozenset()
        for uuid, faults in _faults_by_gpu(h).items():
            keys = frozenset(f.key for f in faults)
            if keys <= released:
                continue  # released by hand: not fenced again until a new fault
            device = by_uuid[uuid]
            group = groups.get((node, device.name))
            have = group.kinds if group else frozenset()
            wanted = _wanted(faults)
            record = _record(faults, now)
            if dry_run:
                if group is not None and group.fencing:
                    missing = wanted - have
                    if missing:
                        fence = actions.FenceDevice(node, device, frozenset(missing), record, True)
                        decided.append(
                            actions.SkippedDevice(node, fence, actions.SkipReason.DRY_RUN)
                        )
                    continue
                if devices.RuleKind.DRY_RUN in have:
                    continue
                wanted = frozenset({devices.RuleKind.DRY_RUN})
            missing = wanted - have
            if not missing:
                continue
            fence = actions.FenceDevice(node, device, frozenset(missing), record,
                                        escalation=group is not None and group.fencing)  # fmt: skip
            if fence.escalation:
                decided.append(fence)
                continue
            if breaker.open:
                decided.append(actions.SkippedDevice(node, fence, actions.SkipReason.BREAKER_OPEN))
                continue
            severity = max(health.VERDICT_SEVERITY[f.verdict] for f in faults)
            onset = _onset(fleet_state, node, uuid, h) or now
            candidates.append(((-severity, onset, node, device.name), fence))

    taken, held = policy.in_line(candidates, max(0, limit - fenced_now))
    decided.extend(taken)
    over = actions.SkipReason.MAX_QUARANTINED_DEVICES
    decided.extend(actions.SkippedDevice(fence.node, fence, over) for fence in held)

    fenced: dict[str, list[actions.FencedDevice]] = {}
    for (node, _device), group in sorted(groups.items()):
        action, shown = _keep_or_release(
            fleet_state, group, healths.get(node), views[node], settings, now=now,
            deadlines=deadlines, dry_run=dry_run,
        )  # fmt: skip
        if action is not None:
            decided.append(action)
        fenced.setdefault(node, []).append(shown)

    future = [d for d in deadlines if d > now]
    return actions.DeviceDecision(
        actions=tuple(decided),
        breaker=breaker,
        next_deadline=min(future) if future else None,
        scope=scope,
        dra_nodes=dra_nodes,
        fenced={n: tuple(v) for n, v in fenced.items()},
        quarantined_devices=fenced_now,
        max_quarantined_devices=limit,
        devices_total=total,
    )


@dataclasses.dataclass(frozen=True, slots=True)
class Usable:
    """One GPU of a DRA node: may a new claim use it, and if not, why."""

    pool: str
    name: str
    uuid: str
    usable: bool
    why: str = ""


def usable(
    fleet_state: state.FleetState,
    managed: Iterable[str],
    settings: Settings,
    now: dt.datetime,
    *,
    inventory: Mapping[str, devices.NodeDevices],
    rules: Sequence[devices.TaintRule],
    memo: dict[str, tuple[Usable, ...]] | None = None,
) -> dict[str, tuple[bool, tuple[Usable, ...]]]:
    """Per managed DRA node: whether its health data is fresh, and each GPU with whether a
    new claim may use it (no hard taint from any rule or from the driver, and not reported
    faulty by the agent, so a fault not yet fenced, or held back by a limit, counts too).
    What the admission gate counts (the root hands it over).

    Only the nodes `FleetState.faulty` names are assessed; every other node's GPUs depend on
    the inventory and the rules alone, so `memo` keeps their listing from pass to pass. It is
    valid for one inventory and one set of rules: the caller empties it when either changes.
    """
    out: dict[str, tuple[bool, tuple[Usable, ...]]] = {}
    if settings.mode == GpuMode.DEVICE_PLUGIN:
        return out
    hard = [r for r in rules if r.effect in devices.HARD_EFFECTS]
    faulty = fleet_state.faulty()
    memo = {} if memo is None else memo
    for node in sorted(set(managed)):
        found = inventory.get(node)
        if found is None or not found.devices:
            continue
        if node in faulty:
            h = fleet_state.assess(node, now, default_interval_s=settings.default_interval_s)
            out[node] = (h.state in _FRESH, _listing(found, hard, {f.gpu_uuid for f in h.faults}))
            continue
        listed = memo.get(node)
        if listed is None:
            listed = memo[node] = _listing(found, hard, set())
        out[node] = (fleet_state.fresh(node, now), listed)
    return out


def _listing(
    found: devices.NodeDevices, hard: Sequence[devices.TaintRule], faulty: set[str]
) -> tuple[Usable, ...]:
    """A node's GPUs, each usable unless a hard taint selects it or its agent reports it."""
    listed = []
    for device in found.devices:
        tainted = any(r.selects(device) for r in hard) or any(
            effect in devices.HARD_EFFECTS for _, effect in device.taints
        )
        why = "tainted" if tainted else ("faulty" if device.uuid in faulty else "")
        listed.append(Usable(device.pool, device.name, device.uuid, not why, why))
    return tuple(listed)


def render_mode(mode: GpuMode, *, dra_published: bool, plugin_nodes: int) -> bool:
    """Whether runs ask for GPUs through DRA claims (True) or the extended resource."""
    if mode == GpuMode.DRA:
        return True
    if mode == GpuMode.DEVICE_PLUGIN:
        return False
    return dra_published and plugin_nodes == 0


# ---------------------------------------------------------------- pieces


def _groups(rules: Iterable[devices.TaintRule]) -> dict[tuple[str, str], _Group]:
    found: dict[tuple[str, str], list[devices.TaintRule]] = {}
    for rule in rules:
        found.setdefault((rule.node, rule.device), []).append(rule)
    return {
        key: _Group(key[0], key[1], tuple(sorted(found[key], key=lambda r: r.name)))
        for key in found
    }


def _faults_by_gpu(h: state.NodeHealth) -> dict[str, list[state.Fault]]:
    out: dict[str, list[state.Fault]] = {}
    for fault in h.faults:
        out.setdefault(fault.gpu_uuid, []).append(fault)
    return out


def _scope(
    view: nodes.NodeView,
    h: state.NodeHealth,
    node_devices: devices.NodeDevices,
    groups: Mapping[tuple[str, str], _Group],
    settings: Settings,
) -> bool:
    """Whether a DRA node's faults are fenced device by device (see the module)."""
    if view.quarantine is not None or h.state not in _FRESH or not h.faults:
        return False
    if any(f.action not in DEVICE_ACTIONS for f in h.faults):
        return False
    by_uuid = node_devices.by_uuid()
    bad = {f.gpu_uuid for f in h.faults}
    if not bad <= set(by_uuid):
        return False
    fenced = {by_uuid[u].name for u in bad} | {
        device for (node, device), g in groups.items() if node == view.name and g.fencing
    }
    return len(fenced) <= settings.max_per_node


def _wanted(faults: Sequence[state.Fault]) -> frozenset[devices.RuleKind]:
    if any(f.code in devices.UNCONTAINED_CODES for f in faults):
        return frozenset({devices.RuleKind.UNHEALTHY, devices.RuleKind.FAILED})
    return frozenset({devices.RuleKind.UNHEALTHY, devices.RuleKind.EVICT})


def _record(faults: Sequence[state.Fault], now: dt.datetime) -> devices.DeviceRecord:
    worst = max(faults, key=lambda f: (health.VERDICT_SEVERITY[f.verdict],
                                       health.ACTION_SEVERITY[f.action]))  # fmt: skip
    clears = nodes.Clearing.HEALTHY_REPORTS
    if any(f.latched and f.action is health.Action.INSPECT for f in faults):
        clears = nodes.Clearing.MANUAL_RELEASE
    message = "; ".join(f.finding for f in faults)
    return devices.DeviceRecord(
        reason=worst.code, message=f"{worst.gpu_uuid}: {message}", at=now,
        by=marks.CONTROLLER_IDENTITY, clears_with=clears,
        faults=frozenset(f.key for f in faults),
    )  # fmt: skip


def _onset(
    fleet_state: state.FleetState, node: str, uuid: str, h: state.NodeHealth
) -> dt.datetime | None:
    streak = fleet_state.gpu_streak(node, uuid)
    if streak is not None and not streak[0]:
        return streak[1]
    return h.bad_since


def _keep_or_release(
    fleet_state: state.FleetState,
    group: _Group,
    h: state.NodeHealth | None,
    view: nodes.NodeView,
    settings: Settings,
    *,
    now: dt.datetime,
    deadlines: list[dt.datetime],
    dry_run: bool,
) -> tuple[actions.UnfenceDevice | actions.SkippedDevice | None, actions.FencedDevice]:
    """What a fenced device needs (release, or nothing yet), and how to show it."""
    record = next((r.record for r in group.rules if r.record is not None), None)
    uuid = group.gpu_uuid
    streak = fleet_state.gpu_streak(group.node, uuid) if uuid else None
    healthy_since = streak[1] if streak is not None and streak[0] else None
    faulty = h is not None and any(f.gpu_uuid == uuid for f in h.faults)
    released = view.released_faults or frozenset()
    by_hand = record is not None and bool(record.faults) and record.faults <= released
    fresh = h is not None and h.state in _FRESH
    release_at = None
    if fresh and healthy_since is not None and not faulty:
        release_at = healthy_since + dt.timedelta(seconds=settings.release_after_s)
    shown = actions.FencedDevice(
        node=group.node, device=group.device, gpu_uuid=uuid, rules=group.rules, record=record,
        healthy_since=healthy_since if not faulty else None, release_at=release_at,
    )  # fmt: skip
    unfence = actions.UnfenceDevice(
        group.node, group.device, uuid, tuple((r.name, r.uid) for r in group.rules),
        reason="ManualRelease" if by_hand else "FaultCleared",
        message=(f"{uuid}: released by hand on the node" if by_hand else
                 f"{uuid}: healthy since {_when(healthy_since)}"),
    )  # fmt: skip
    if not view.managed:
        return None, shown
    due = by_hand or (release_at is not None and now >= release_at)
    if due:
        if dry_run and group.fencing:
            return actions.SkippedDevice(group.node, unfence, actions.SkipReason.DRY_RUN), shown
        return unfence, shown
    if release_at is not None:
        deadlines.append(release_at)
    if group.fencing and not dry_run and devices.RuleKind.DRY_RUN in group.kinds:
        # The dry run ended and the real rules are in place: its report goes.
        dry = tuple((r.name, r.uid) for r in group.rules if r.kind is devices.RuleKind.DRY_RUN)
        ended = dataclasses.replace(
            unfence, rules=dry, reason="DryRunEnded", message=f"{uuid}: dry run ended"
        )
        return ended, shown
    return None, shown


def _judge_breaker(
    fleet_state: state.FleetState,
    settings: Settings,
    breaker: actions.BreakerState,
    now: dt.datetime,
    *,
    scope: frozenset[str],
    healths: Mapping[str, state.NodeHealth],
    groups: Mapping[tuple[str, str], _Group],
    total: int,
    decided: list[actions.DeviceAction | actions.SkippedDevice | actions.OpenBreaker
                  | actions.CloseBreaker],
    deadlines: list[dt.datetime],
) -> actions.BreakerState:  # fmt: skip
    """The device breaker: like the node breaker, counted in the GPUs of the nodes in
    `scope` that turned bad (of `total`)."""
    bad = [(node, uuid) for node in sorted(scope) for uuid in _faults_by_gpu(healths[node])]
    if breaker.open:
        fenced_uuids = {g.gpu_uuid for g in groups.values() if g.fencing}
        contained = all(uuid in fenced_uuids for _, uuid in bad)
        return policy.keep_open(breaker, contained, settings.breaker_healthy_close_s, now,
                                devices=True, decided=decided, deadlines=deadlines)  # fmt: skip
    counted_after = policy.window_start(breaker, settings.breaker_window_s, now)
    turned = sorted(
        (node, uuid) for node, uuid in bad
        if (onset := _onset(fleet_state, node, uuid, healths[node])) is not None
        and onset > counted_after
    )  # fmt: skip
    share = 100 * len(turned) / total if total else 0.0
    if share > settings.breaker_percent and len(turned) >= settings.breaker_min_devices:
        shown = ", ".join(f"{n}/{u}" for n, u in turned[:10]) + (", …" if len(turned) > 10 else "")
        message = (
            f"{len(turned)} of {total} GPUs ({share:.0f}%) turned bad within "
            f"{settings.breaker_window_s:g}s (limit {settings.breaker_percent:g}%): {shown}"
        )
        decided.append(actions.OpenBreaker(message=message,
                                           nodes=tuple(sorted({n for n, _ in turned})),
                                           devices=True))  # fmt: skip
        return actions.BreakerState(
            open=True, opened_at=now, message=message, reset_at=breaker.reset_at,
            reset_by=breaker.reset_by,
        )  # fmt: skip
    return breaker


def _when(at: dt.datetime | None) -> str:
    return at.isoformat() if at is not None else "?"


def fenced_and_kept(
    decision: actions.DeviceDecision, inventory: devices.Inventory | None
) -> tuple[int, int]:
    """The GPUs fenced now (by a rule of a fencing kind), and the healthy GPUs their nodes
    keep serving (none counted without an inventory)."""
    real = [f for fenced in decision.fenced.values() for f in fenced
            if any(r.kind in devices.FENCING_KINDS for r in f.rules)]  # fmt: skip
    if inventory is None:
        return len(real), 0
    nodes = {f.node for f in real}
    kept = sum(len(inventory[n].devices) for n in nodes if n in inventory)
    kept -= sum(1 for f in real if f.node in inventory)
    return len(real), max(kept, 0)
