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
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import pydantic
from pydantic import alias_generators

from controller import errors, marks, timestamps
from controller.fleet import actions, nodes, state
from controller.settings import FleetSettings


class Settings(pydantic.BaseModel):
    """Every limit of the quarantine policy, as the pure core takes it.

    No field has a default: the process settings (`ControllerSettings.fleet`, documented in
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


def settings_from(section: FleetSettings) -> Settings:
    """The policy's settings from the fleet section of the process settings (the same names;
    the policy's own type names a bad field in camelCase and has no defaults)."""
    return Settings.model_validate({name: getattr(section, name) for name in Settings.model_fields})


_A = TypeVar("_A")

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

    This is the full, level-triggered pass: every node is judged. `controller.fleet.passes`
    judges only the nodes whose inputs changed or whose deadline came, from the same
    per-node steps (`counts`, `node_pass`, `judge_breaker`, `rank`), and decides the same.
    """
    views = sorted(
        (v for v in node_views if counts(v, fleet_state, device_nodes)), key=lambda v: v.name
    )
    healths = {
        v.name: fleet_state.assess(v.name, now, default_interval_s=settings.default_interval_s)
        for v in views
    }
    deadlines: list[dt.datetime] = []
    decided: list[actions.Action] = []

    turned = {n: turned_at(h, in_device_scope=n in device_scope) for n, h in healths.items()}

    def turned_after(after: dt.datetime) -> list[str]:
        return sorted(n for n, at in turned.items() if at is not None and at > after)

    breaker = judge_breaker(
        breaker, settings, now=now, total=len(views), turned_after=turned_after,
        all_contained=all(
            contained(v, healths[v.name], in_device_scope=v.name in device_scope) for v in views
        ),
        decided=decided, deadlines=deadlines,
    )  # fmt: skip

    quarantined = sum(1 for v in views if auto_quarantined(v))
    limit = settings.limit_for(len(views))
    candidates: list[Candidate] = []

    for view in views:
        found, candidate, due = node_pass(
            view, healths[view.name], settings, breaker, now,
            in_device_scope=view.name in device_scope,
        )  # fmt: skip
        decided.extend(found)
        deadlines.extend(due)
        if candidate is not None:
            candidates.append(candidate)

    rank(candidates, budget=max(0, limit - quarantined), decided=decided)
    future = [d for d in deadlines if d > now]
    return actions.Decision(
        actions=tuple(finish(decided, settings)),
        breaker=breaker,
        next_deadline=min(future) if future else None,
        health=healths,
        quarantined=quarantined,
        max_quarantined=limit,
    )


Candidate = tuple[tuple[int, dt.datetime, str], actions.Quarantine]
"""A node that should be quarantined, with its place in line (worst state, earliest onset)."""


def counts(
    view: nodes.NodeView, fleet_state: state.FleetState, device_nodes: frozenset[str]
) -> bool:
    """Whether a node is judged at all (and counts in the fleet-wide limits): managed, and a
    GPU node, a DRA node or one that reports to us."""
    return view.managed and (
        view.is_gpu_node or view.name in fleet_state or view.name in device_nodes
    )


def auto_quarantined(view: nodes.NodeView) -> bool:
    """Whether the node is in a quarantine the controller made (what maxQuarantined counts)."""
    return view.quarantine is not None and view.quarantine.mode is nodes.QuarantineMode.AUTOMATIC


def contained(view: nodes.NodeView, h: state.NodeHealth, *, in_device_scope: bool) -> bool:
    """Whether the node gives an open node breaker no reason to stay open (device-scope
    nodes never do: the device breaker counts them)."""
    if in_device_scope:
        return True
    if h.state in _SILENT:
        return False
    if h.state not in state.BAD_STATES or view.quarantine is not None:
        return True
    return view.released_faults is not None and h.fault_keys <= view.released_faults


def turned_at(h: state.NodeHealth, *, in_device_scope: bool) -> dt.datetime | None:
    """When the node turned bad or silent, as the node breaker counts it; None if it does not
    count (healthy, warming up, or fenced GPU by GPU)."""
    if in_device_scope or h.state not in state.BAD_STATES:
        return None
    return h.bad_since


def node_pass(
    view: nodes.NodeView,
    h: state.NodeHealth,
    settings: Settings,
    breaker: actions.BreakerState,
    now: dt.datetime,
    *,
    in_device_scope: bool,
) -> tuple[list[actions.Action], Candidate | None, list[dt.datetime]]:
    """One node's part of a pass: its actions (before dry run), its quarantine if it should
    get one (ranked fleet-wide by `rank`), and every time at or after `now` when its
    decision may change without new input."""
    deadlines: list[dt.datetime] = []
    decided: list[actions.Action] = []
    if h.stale_at is not None and h.stale_at >= now:
        deadlines.append(h.stale_at)
    wanted = _desired_condition(h, view)
    if wanted is not None and not wanted.same_as(view.condition):
        decided.append(actions.SetCondition(view.name, wanted))
    if view.quarantine is not None:
        kept = _keep_quarantine(
            view, view.quarantine, h, settings, breaker=breaker, now=now, deadlines=deadlines
        )
        decided.extend(kept)
        return decided, None, deadlines
    if in_device_scope:
        return decided, None, deadlines  # fenced device by device; its other GPUs keep working
    candidate = _candidate(view, h, settings, now=now, decided=decided, deadlines=deadlines)
    if candidate is None:
        return decided, None, deadlines
    if breaker.open:
        decided.append(actions.Skipped(view.name, candidate, actions.SkipReason.BREAKER_OPEN))
        return decided, None, deadlines
    onset = h.bad_since or now
    return decided, ((_QUARANTINE_PRIORITY[h.state], onset, view.name), candidate), deadlines


def rank(candidates: list[Candidate], *, budget: int, decided: list[actions.Action]) -> None:
    """Quarantine the first `budget` candidates in line; hold back the rest."""
    taken, held = in_line(candidates, budget)
    decided.extend(taken)
    decided.extend(actions.Skipped(c.node, c, actions.SkipReason.MAX_QUARANTINED) for c in held)


def in_line(candidates: list[tuple[Any, _A]], budget: int) -> tuple[list[_A], list[_A]]:
    """The candidates in their place in line (the first of each pair): the first `budget`,
    and the rest."""
    ranked = [candidate for _, candidate in sorted(candidates, key=lambda item: item[0])]
    return ranked[:budget], ranked[budget:]


def finish(decided: list[actions.Action], settings: Settings) -> list[actions.Action]:
    """The pass's actions as carried out: under dry run, every node action held back."""
    return [_dry(action) for action in decided] if settings.dry_run else decided


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


def judge_breaker(
    breaker: actions.BreakerState,
    settings: Settings,
    *,
    now: dt.datetime,
    total: int,
    turned_after: Callable[[dt.datetime], list[str]],
    all_contained: bool,
    decided: list[actions.Action],
    deadlines: list[dt.datetime],
) -> actions.BreakerState:
    """The node breaker, from fleet-wide figures: `total` nodes judged, `turned_after(t)` the
    names (sorted) of those that turned bad or silent after `t`, and whether every one is
    contained. Nodes in device scope count in the device breaker instead."""
    if breaker.open:
        return keep_open(breaker, all_contained, settings.breaker_healthy_close_s, now,
                         devices=False, decided=decided, deadlines=deadlines)  # fmt: skip
    turned = turned_after(window_start(breaker, settings.breaker_window_s, now))
    share = 100 * len(turned) / total if total else 0.0
    if share > settings.breaker_percent and len(turned) >= settings.breaker_min_nodes:
        shown = ", ".join(turned[:10]) + (", …" if len(turned) > 10 else "")
        message = (
            f"{len(turned)} of {total} GPU nodes ({share:.0f}%) turned bad or stale within "
            f"{settings.breaker_window_s:g}s (limit {settings.breaker_percent:g}%): {shown}"
        )
        decided.append(actions.OpenBreaker(message=message, nodes=tuple(turned)))
        return actions.BreakerState(
            open=True, opened_at=now, message=message, reset_at=breaker.reset_at,
            reset_by=breaker.reset_by,
        )  # fmt: skip
    return breaker


def keep_open(
    breaker: actions.BreakerState,
    contained: bool,
    close_s: float,
    now: dt.datetime,
    *,
    devices: bool,
    decided: list[Any],
    deadlines: list[dt.datetime],
) -> actions.BreakerState:
    """An open breaker (node or `devices`), closed once everything it counts stayed
    `contained` for `close_s` seconds (`FleetHealthy`)."""
    if not contained:
        return breaker.model_copy(update={"fleet_healthy_since": None})
    since = breaker.fleet_healthy_since or now
    closes_at = since + dt.timedelta(seconds=close_s)
    if now >= closes_at:
        by = marks.CONTROLLER_IDENTITY
        decided.append(actions.CloseBreaker(reason="FleetHealthy", by=by, devices=devices))
        return actions.BreakerState(open=False, reset_at=now, reset_by=by)
    deadlines.append(closes_at)
    return breaker.model_copy(update={"fleet_healthy_since": since})


def window_start(breaker: actions.BreakerState, window_s: float, now: dt.datetime) -> dt.datetime:
    """Since when a closed breaker counts what turned bad: the window, or its last close."""
    start = now - dt.timedelta(seconds=window_s)
    return breaker.reset_at if breaker.reset_at is not None and breaker.reset_at > start else start


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
    """What clears the node: the strictest of what clears each latched fault."""
    latched = [nodes.clearing_for(f.action) for f in h.faults if f.latched]
    strictest = max(latched, key=nodes.CLEARING_STRICTNESS.__getitem__, default=None)
    return strictest or nodes.Clearing.HEALTHY_REPORTS


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
