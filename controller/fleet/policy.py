"""The quarantine policy (DESIGN.md section 6) as one pure, level-triggered function.

`decide` reads every node's health (from `controller.fleet`) and every Node's TauGrid marks
(from `controller.nodes`) and returns the actions that bring the nodes to where the policy
wants them, plus the next time something time-based falls due. It never looks at which event
caused the pass; running it twice on the same inputs gives the same answer, and an action
already carried out shows up in the Node and is not returned again.

The actuator turns each node action into a minimal patch with `controller.conditions`.

"A new fault", which ends a manual release: a fault key (GPU UUID, reason code, the agent's
`since`; for a silence, the moment it turned stale) that is not in the set released by hand.
The released set is forgotten once the node reports fully healthy, so the same finding coming
back after a healthy spell is new again. A new boot ID alone is deliberately *not* a new fault:
a latched Inspect fault survives reboots with its original `since`, and treating every reboot
as new would undo the on-call engineer's decision each time the node restarts.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from collections.abc import Iterable, Mapping

import pydantic
from pydantic import alias_generators

from controller import errors, marks, timestamps
from controller.fleet import actions, nodes, state
from controller.settings import ControllerSettings


class Settings(pydantic.BaseModel):
    """Every limit of the quarantine policy, as the pure core takes it.

    No field has a default: the process settings (`ControllerSettings`, documented in
    docs/quarantine.md and the chart) are the one source of truth, translated once by
    `settings_from`; tests size every limit to their fleet explicitly.
    """

    model_config = pydantic.ConfigDict(
        frozen=True, extra="forbid", alias_generator=alias_generators.to_camel,
        populate_by_name=True,
    )  # fmt: skip

    stale_multiplier: float = pydantic.Field(gt=0)
    """staleAfter = this × the agent's `intervalS`."""
    default_interval_s: float = pydantic.Field(gt=0)
    """Seconds; the agent interval assumed for a node that never reported to this leader."""
    stale_quarantine_after_s: float = pydantic.Field(ge=0)
    """Seconds a node stays stale (Unknown) before it is quarantined."""
    evict_grace_s: float = pydantic.Field(ge=0)
    """Seconds between quarantining a Failed node and evicting its GPU pods."""
    degraded_drain_after_s: float = pydantic.Field(ge=0)
    """Seconds running work may continue on a Degraded node before its GPU pods are evicted."""
    release_after_s: float = pydantic.Field(ge=0)
    """Seconds of fresh healthy reports, after the clearing condition, before release."""
    max_quarantined: int | None = pydantic.Field(ge=1)
    """Absolute cap on nodes quarantined automatically at once; None uses the fraction."""
    max_quarantined_fraction: float = pydantic.Field(gt=0, le=1)
    """Cap as a share of managed GPU nodes (at least 1 node)."""
    breaker_percent: float = pydantic.Field(gt=0, le=100)
    """The breaker opens when more than this share of managed GPU nodes turned bad or stale
    inside the window."""
    breaker_window_s: float = pydantic.Field(gt=0)
    """Seconds of the breaker's sliding window."""
    breaker_min_nodes: int = pydantic.Field(ge=1)
    """The breaker never opens for fewer nodes than this: one node is a fault, not a storm."""
    breaker_healthy_close_s: float = pydantic.Field(gt=0)
    """Seconds the fleet must stay healthy (every bad node contained, none silent) before an
    open breaker closes by itself."""
    dry_run: bool
    """Decide and report, but write nothing to any node (settable at runtime)."""

    def limit_for(self, gpu_nodes: int) -> int:
        """Return maxQuarantined for a fleet of `gpu_nodes` managed GPU nodes."""
        if self.max_quarantined is not None:
            return self.max_quarantined
        return max(1, math.floor(gpu_nodes * self.max_quarantined_fraction))


def settings_from(process: ControllerSettings) -> Settings:
    """The policy's settings from the process settings, field for field."""
    return Settings(
        stale_multiplier=process.stale_multiplier,
        default_interval_s=process.default_interval_s,
        stale_quarantine_after_s=process.stale_quarantine_after_s,
        evict_grace_s=process.evict_grace_s,
        degraded_drain_after_s=process.degraded_drain_after_s,
        release_after_s=process.release_after_s,
        max_quarantined=process.max_quarantined,
        max_quarantined_fraction=process.max_quarantined_fraction,
        breaker_percent=process.breaker_percent,
        breaker_window_s=process.breaker_window_s,
        breaker_min_nodes=process.breaker_min_nodes,
        breaker_healthy_close_s=process.breaker_healthy_close_s,
        dry_run=process.dry_run,
    )


_QUARANTINE_PRIORITY = {
    state.NodeState.FAILED: 0,
    state.NodeState.DEGRADED: 1,
    state.NodeState.STALE: 2,
    state.NodeState.MISSING: 2,
}
_SILENT = (state.NodeState.STALE, state.NodeState.MISSING)


def decide(
    fleet_state: state.FleetState,
    node_views: Iterable[nodes.NodeView],
    settings: Settings,
    breaker: actions.BreakerState,
    now: dt.datetime,
    *,
    device_scope: frozenset[str] = frozenset(),
    device_nodes: frozenset[str] = frozenset(),
) -> actions.Decision:
    """Return what to do to every node now, and when to look again.

    `device_nodes` are the DRA nodes (GPU nodes without `nvidia.com/gpu` capacity);
    `device_scope` those whose faults device quarantine fences GPU by GPU
    (`controller.fleet.devicepolicy`): their condition is kept, but they are neither
    quarantined nor counted by the node breaker.
    """
    views = sorted(
        (
            v
            for v in node_views
            if v.managed and (v.is_gpu_node or v.name in fleet_state or v.name in device_nodes)
        ),
        key=lambda v: v.name,
    )
    healths = {
        v.name: fleet_state.assess(v.name, now, default_interval_s=settings.default_interval_s)
        for v in views
    }
    deadlines: list[dt.datetime] = []
    decided: list[actions.Action] = []

    breaker = _judge_breaker(
        views, healths, settings, breaker, now=now, decided=decided, deadlines=deadlines,
        device_scope=device_scope,
    )  # fmt: skip

    quarantined = sum(
        1
        for v in views
        if v.quarantine is not None and v.quarantine.mode is nodes.QuarantineMode.AUTOMATIC
    )
    limit = settings.limit_for(len(views))
    candidates: list[tuple[tuple[int, dt.datetime, str], actions.Quarantine]] = []

    for view in views:
        h = healths[view.name]
        if h.stale_at is not None and h.stale_at > now:
            deadlines.append(h.stale_at)
        wanted = _desired_condition(h, view)
        if wanted is not None and not wanted.same_as(view.condition):
            decided.append(actions.SetCondition(view.name, wanted))
        if view.quarantine is not None:
            decided.extend(
                _keep_quarantine(
                    view,
                    view.quarantine,
                    h,
                    settings,
                    breaker=breaker,
                    now=now,
                    deadlines=deadlines,
                )
            )
            continue
        if view.name in device_scope:
            continue  # fenced device by device; its other GPUs keep working
        candidate = _candidate(view, h, settings, now=now, decided=decided, deadlines=deadlines)
        if candidate is None:
            continue
        if breaker.open:
            decided.append(actions.Skipped(view.name, candidate, actions.SkipReason.BREAKER_OPEN))
            continue
        onset = h.bad_since or now
        candidates.append(((_QUARANTINE_PRIORITY[h.state], onset, view.name), candidate))

    candidates.sort(key=lambda item: item[0])
    budget = max(0, limit - quarantined)
    for index, (_, candidate) in enumerate(candidates):
        if index < budget:
            decided.append(candidate)
        else:
            decided.append(
                actions.Skipped(candidate.node, candidate, actions.SkipReason.MAX_QUARANTINED)
            )

    if settings.dry_run:
        decided = [_dry(action) for action in decided]
    future = [d for d in deadlines if d > now]
    return actions.Decision(
        actions=tuple(decided),
        breaker=breaker,
        next_deadline=min(future) if future else None,
        health=healths,
        quarantined=quarantined,
        max_quarantined=limit,
    )


def reset_breaker(
    breaker: actions.BreakerState, *, by: str, now: dt.datetime
) -> actions.BreakerState:
    """Close the breaker on an operator's request; earlier onsets will not open it again."""
    if not by.strip():
        msg = "by: the operator resetting the breaker must be named"
        raise errors.Invalid(msg, field="by", code="Refused")
    return actions.BreakerState(open=False, reset_at=now, reset_by=by)


def manual_quarantine(
    view: nodes.NodeView,
    node_health: state.NodeHealth | None,
    *,
    by: str,
    reason: str,
    now: dt.datetime,
) -> actions.Quarantine:
    """Quarantine a node on an on-call engineer's order; only a manual release ends it.

    Not subject to dry run, the breaker or maxQuarantined: those limit automation, not people.
    """
    _require_text("by", by)
    _require_text("reason", reason)
    if not view.managed:
        msg = f"node: {view.name} is labelled {marks.MANAGED_LABEL}=false"
        raise errors.Conflict(msg, field="node", code="Refused")
    record = nodes.QuarantineRecord(
        mode=nodes.QuarantineMode.MANUAL,
        by=by,
        at=now,
        reason=reason.strip(),
        clears_with=nodes.Clearing.MANUAL_RELEASE,
        boot_id=node_health.boot_id if node_health else None,
        faults=node_health.fault_keys if node_health else frozenset(),
        evict_after=None,
    )
    return actions.Quarantine(
        view.name, record, message=reason.strip(), cordon=not view.unschedulable
    )


def manual_release(
    view: nodes.NodeView,
    node_health: state.NodeHealth | None,
    *,
    by: str,
    reason: str,
    devices_fenced: bool = False,
) -> actions.ManualRelease:
    """Release a quarantined node on an on-call engineer's order, whatever cleared or not.

    The node's current faults are remembered as released: it is not quarantined again until a
    new fault (see the module docstring). A node with GPUs under device quarantine
    (`devices_fenced`) can be released too: device quarantine then deletes the rules of the
    released faults.
    """
    _require_text("by", by)
    _require_text("reason", reason)
    if view.quarantine is None and not view.tainted and not devices_fenced:
        msg = f"node: {view.name} is not quarantined by TauGrid"
        raise errors.Conflict(msg, field="node", code="Refused")
    released = node_health.fault_keys if node_health else frozenset()
    if view.quarantine is not None:
        released |= view.quarantine.faults
    return actions.ManualRelease(
        view.name,
        by=by,
        reason=reason.strip(),
        released_faults=released,
        uncordon=view.cordoned_by_us and view.unschedulable,
    )


def _judge_breaker(
    views: list[nodes.NodeView],
    healths: Mapping[str, state.NodeHealth],
    settings: Settings,
    breaker: actions.BreakerState,
    *,
    now: dt.datetime,
    decided: list[actions.Action],
    deadlines: list[dt.datetime],
    device_scope: frozenset[str] = frozenset(),
) -> actions.BreakerState:
    """The node breaker; nodes in device scope count in the device breaker instead."""
    if breaker.open:
        if not all(_contained(v, healths[v.name]) for v in views if v.name not in device_scope):
            return breaker.model_copy(update={"fleet_healthy_since": None})
        healthy_since = breaker.fleet_healthy_since or now
        closes_at = healthy_since + dt.timedelta(seconds=settings.breaker_healthy_close_s)
        if now >= closes_at:
            decided.append(
                actions.CloseBreaker(reason="FleetHealthy", by=marks.CONTROLLER_IDENTITY)
            )
            return actions.BreakerState(
                open=False, reset_at=now, reset_by=marks.CONTROLLER_IDENTITY
            )
        deadlines.append(closes_at)
        return breaker.model_copy(update={"fleet_healthy_since": healthy_since})
    window = dt.timedelta(seconds=settings.breaker_window_s)
    counted_after = now - window
    if breaker.reset_at is not None and breaker.reset_at > counted_after:
        counted_after = breaker.reset_at
    turned = sorted(
        name
        for name, h in healths.items()
        if h.state in state.BAD_STATES
        and h.bad_since is not None
        and h.bad_since > counted_after
        and name not in device_scope
    )
    share = 100 * len(turned) / len(views) if views else 0.0
    if share > settings.breaker_percent and len(turned) >= settings.breaker_min_nodes:
        shown = ", ".join(turned[:10]) + (", …" if len(turned) > 10 else "")
        message = (
            f"{len(turned)} of {len(views)} GPU nodes ({share:.0f}%) turned bad or stale within "
            f"{settings.breaker_window_s:g}s (limit {settings.breaker_percent:g}%): {shown}"
        )
        decided.append(actions.OpenBreaker(message=message, nodes=tuple(turned)))
        return actions.BreakerState(
            open=True,
            opened_at=now,
            message=message,
            reset_at=breaker.reset_at,
            reset_by=breaker.reset_by,
        )
    return breaker


def _contained(view: nodes.NodeView, h: state.NodeHealth) -> bool:
    """Return True when the node gives the breaker no reason to stay open."""
    if h.state in _SILENT:
        return False
    if h.state not in state.BAD_STATES:
        return True
    if view.quarantine is not None:
        return True
    return view.released_faults is not None and h.fault_keys <= view.released_faults


def _desired_condition(h: state.NodeHealth, view: nodes.NodeView) -> nodes.Condition | None:
    node_state = h.state
    if node_state is state.NodeState.WARMING_UP:
        return None
    if node_state is state.NodeState.MISSING and view.condition is None:
        return None  # never reported to any leader: not ours yet (no agent installed)
    if node_state is state.NodeState.HEALTHY:
        status = nodes.ConditionStatus.TRUE
    elif node_state in (state.NodeState.FAILED, state.NodeState.DEGRADED):
        status = nodes.ConditionStatus.FALSE
    else:
        status = nodes.ConditionStatus.UNKNOWN
    return nodes.Condition(status=status, reason=h.reason, message=h.message)


def _clearing(h: state.NodeHealth) -> nodes.Clearing:
    clearing = nodes.Clearing.HEALTHY_REPORTS
    for fault in h.faults:
        if fault.latched:
            candidate = nodes.clearing_for(fault.action)
            if nodes.CLEARING_STRICTNESS[candidate] > nodes.CLEARING_STRICTNESS[clearing]:
                clearing = candidate
    return clearing


def _evict_after(h: state.NodeHealth, settings: Settings, now: dt.datetime) -> dt.datetime | None:
    if h.state is state.NodeState.FAILED:
        return now + dt.timedelta(seconds=settings.evict_grace_s)
    if h.state is state.NodeState.DEGRADED:
        return now + dt.timedelta(seconds=settings.degraded_drain_after_s)
    return None


def _candidate(
    view: nodes.NodeView,
    h: state.NodeHealth,
    settings: Settings,
    *,
    now: dt.datetime,
    decided: list[actions.Action],
    deadlines: list[dt.datetime],
) -> actions.Quarantine | None:
    """Return the quarantine a node not yet in quarantine should get, if any."""
    released = view.released_faults
    if released is not None:
        if h.state is state.NodeState.HEALTHY:
            decided.append(actions.ForgetManualRelease(view.name))
            return None
        if h.fault_keys <= released:
            return None
    if h.state in _SILENT:
        if h.state is state.NodeState.MISSING and view.condition is None:
            return None
        if h.stale_at is None:  # a silent node always has its onset; be safe regardless
            return None
        due = h.stale_at + dt.timedelta(seconds=settings.stale_quarantine_after_s)
        if now < due:
            deadlines.append(due)
            return None
    elif h.state not in (state.NodeState.FAILED, state.NodeState.DEGRADED):
        return None
    record = nodes.QuarantineRecord(
        mode=nodes.QuarantineMode.AUTOMATIC,
        by=marks.CONTROLLER_IDENTITY,
        at=now,
        reason=h.reason,
        clears_with=_clearing(h),
        boot_id=h.boot_id,
        faults=h.fault_keys,
        evict_after=_evict_after(h, settings, now),
        failed=h.state is state.NodeState.FAILED,
    )
    return actions.Quarantine(view.name, record, message=h.message, cordon=not view.unschedulable)


def _keep_quarantine(
    view: nodes.NodeView,
    record: nodes.QuarantineRecord,
    h: state.NodeHealth,
    settings: Settings,
    *,
    breaker: actions.BreakerState,
    now: dt.datetime,
    deadlines: list[dt.datetime],
) -> list[actions.NodeAction | actions.Skipped]:
    """Return what a node already in quarantine needs: release, escalation, eviction, repair."""
    if not view.unschedulable:
        # Our patch sets the cordon together with the annotations, so a quarantined node that
        # is schedulable was uncordoned by a person: a manual release (DESIGN.md section 2).
        return [
            actions.ManualRelease(
                view.name,
                by="kubectl uncordon",
                reason="node uncordoned by a person",
                released_faults=h.fault_keys | record.faults,
                uncordon=False,
            )
        ]
    out: list[actions.NodeAction | actions.Skipped] = []
    if not view.tainted:
        out.append(actions.RestoreTaint(view.name))
    if record.mode is nodes.QuarantineMode.MANUAL:
        return out
    if h.state is state.NodeState.HEALTHY:
        release_at = _release_at(record, h, settings)
        if release_at is not None:
            if now >= release_at:
                return [
                    actions.Release(
                        view.name,
                        reason="FaultCleared",
                        message=f"healthy since {_when(h.healthy_since)}: {h.message}",
                        uncordon=view.cordoned_by_us,
                    )
                ]
            deadlines.append(release_at)
    elif h.state is not state.NodeState.WARMING_UP:
        escalated = _escalate(record, h, settings, now)
        if escalated != record:
            out.append(actions.UpdateQuarantine(view.name, escalated))
            record = escalated
    if record.evict_after is not None:
        if now < record.evict_after:
            deadlines.append(record.evict_after)
        else:
            evict = actions.EvictGpuPods(
                view.name,
                deadline=record.evict_after,
                reason=record.reason,
                first=record.evicted_at is None,
            )
            out.append(
                actions.Skipped(view.name, evict, actions.SkipReason.BREAKER_OPEN)
                if breaker.open
                else evict
            )
    return out


def _release_at(
    record: nodes.QuarantineRecord, h: state.NodeHealth, settings: Settings
) -> dt.datetime | None:
    """Return when a healthy node may be released, or None while its fault has not cleared."""
    start = h.healthy_since or h.received_at
    if start is None:  # a Healthy node always has its streak start; be safe regardless
        return None
    if record.clears_with is nodes.Clearing.MANUAL_RELEASE:
        return None
    if record.clears_with is nodes.Clearing.NEW_BOOT_ID:
        if record.boot_id is not None and h.boot_id == record.boot_id:
            return None
        if h.boot_changed_at is not None and h.boot_changed_at > start:
            start = h.boot_changed_at
    return start + dt.timedelta(seconds=settings.release_after_s)


def _escalate(
    record: nodes.QuarantineRecord, h: state.NodeHealth, settings: Settings, now: dt.datetime
) -> nodes.QuarantineRecord:
    """Return the record made at least as strict as the node's current faults demand."""
    clears_with = record.clears_with
    boot_id = record.boot_id
    current = _clearing(h)
    if nodes.CLEARING_STRICTNESS[current] > nodes.CLEARING_STRICTNESS[clears_with]:
        clears_with = current
        boot_id = h.boot_id  # the fault arrived in this boot: only a later boot clears it
    evict_after = record.evict_after
    candidate = _evict_after(h, settings, now)
    if candidate is not None and (evict_after is None or candidate < evict_after):
        evict_after = candidate
    faults = record.faults | {f.key for f in h.faults}
    return dataclasses.replace(
        record, clears_with=clears_with, boot_id=boot_id, evict_after=evict_after, faults=faults,
        failed=record.failed or h.state is state.NodeState.FAILED,
    )  # fmt: skip


def _when(at: dt.datetime | None) -> str:
    return timestamps.rfc3339_exact(at) or ""


def _dry(action: actions.Action) -> actions.Action:
    if isinstance(action, actions.Skipped | actions.OpenBreaker | actions.CloseBreaker):
        return action
    return actions.Skipped(action.node, action, actions.SkipReason.DRY_RUN)


def _require_text(field: str, value: str) -> None:
    if not value.strip():
        msg = f"{field}: required, and must not be blank"
        raise errors.Invalid(msg, field=field, code="Refused")
