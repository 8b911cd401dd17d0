"""The quarantine loop: passes of the pure policy, carried out on Nodes.

Each pass judges the nodes its queue hands out (`controller.workqueue`: a Node the cache
told changed, parsed once as it arrived), the nodes whose heartbeat changed something
(`FleetState.take_changed`), device quarantine's scope, and those whose deadline came or that
had something left to do, and decides what the full level-triggered pass would decide for the
whole fleet (`controller.fleet.passes`); it writes only the difference
(`conditions.patch_for` returns None when a node is already as wanted). Every
`full_pass_interval_s` (the queue's resync) a pass judges every node again.
A heartbeat that changes a verdict or a node event wakes the loop at once; otherwise it
wakes at the policy's next deadline, at most every `pass_interval_s`. Only the leader acts,
and every write checks that the lease is still held.
"""

from __future__ import annotations

import asyncio
import collections
import datetime as dt
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import structlog

from controller import errors, leading, marks, workqueue
from controller import metrics as metrics_mod
from controller.fleet import (
    actions,
    conditions,
    devicepolicy,
    devices,
    evictions,
    history,
    nodes,
    passes,
    policy,
    state,
)
from controller.kube import devices as kube_devices
from controller.kube import informer
from controller.kube import nodes as kube_nodes

log = structlog.get_logger()


MAX_PARALLEL_NODES = 64
"""Nodes acted on concurrently in one pass; actions on one node stay in order. The API
server here took 200 node patches at 87/s 16 at a time and 147/s 64 at a time
(`bench/nodepatch.py`); the lease has a pool of its own, so these never delay a renewal."""

MANUAL_ATTEMPTS = 5
"""An on-call order refused because the node changed meanwhile is decided again on the
node as it is now, this many times at most (then 409)."""


class Quarantiner:
    """Owns the breaker state and the pass loop."""

    def __init__(
        self,
        fleet_state: state.FleetState,
        *,
        cache: kube_nodes.NodeCache,
        writer: kube_nodes.NodeWriter,
        settings: policy.Settings,
        elector: leading.Elector,
        metrics: metrics_mod.ControllerMetrics,
        pass_interval_s: float = 1.0,
        full_pass_interval_s: float = 30.0,
        eviction_retry_s: float = 5.0,
        lease_name: str = "taugrid-controller",
        save_state: Callable[[dict[str, str]], Awaitable[None]] | None = None,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
        device_cache: kube_devices.DeviceCache | None = None,
        device_writer: kube_devices.DeviceWriter | None = None,
        device_settings: devicepolicy.Settings | None = None,
    ) -> None:
        self.fleet = fleet_state
        self.cache = cache
        self.writer = writer
        self.settings = settings
        self.elector = elector
        self.metrics = metrics
        self.pass_interval_s = pass_interval_s
        self.queue: workqueue.WorkQueue[str] = workqueue.WorkQueue(resync_s=full_pass_interval_s)
        """The nodes whose Node changed, and the resync (see the module docstring)."""
        self.evictions = evictions.Rounds(retry_s=eviction_retry_s, sweep_s=full_pass_interval_s)
        """When each quarantined node's next eviction round may run (`fleet.evictions`)."""
        self.lease_name = lease_name
        self._save_state = save_state
        self._saved: dict[str, str] | None = None
        self.clock = clock
        self.breaker = actions.BreakerState()
        self.last: actions.Decision | None = None
        self.device_cache = device_cache
        self.device_writer = device_writer
        self.device_settings = device_settings
        self.device_breaker = actions.BreakerState()
        self.last_devices: actions.DeviceDecision | None = None
        self._records: set[asyncio.Task[None]] = set()
        """A device action's history entry and Event, written after its rules without
        holding up the next pass (the rules are what fence the GPU)."""
        self._inventory: devices.Inventory | None = None
        """The DRA fleet's GPUs, gathered from the slices' parsed views; None after a slice
        changed (gathered again when next read)."""
        self._rules: list[devices.TaintRule] | None = None
        """Every DeviceTaintRule's parsed view; None after a rule changed."""
        self._listings: dict[str, tuple[devicepolicy.Usable, ...]] = {}
        """The GPUs of DRA nodes without a fault as the gate is told of them: a node's
        listing goes when one of its slices changes, all of them when a rule does."""
        self._in_quarantine: set[str] = set()
        """The cached nodes carrying a quarantine of ours (the gauge)."""
        cache.parse_with(_parse_node)
        cache.subscribe(self._node_changed)
        if device_cache is not None:
            device_cache.slices.parse_with(devices.parse_slice)
            device_cache.rules.parse_with(devices.parse_rule)
            device_cache.slices.subscribe(self._slice_changed)
            device_cache.rules.subscribe(self._rule_changed)
        self.ledger = passes.Ledger()
        self.wake = self.queue.wake
        self._skips_logged: set[tuple[str, str]] = set()
        self._lock = asyncio.Lock()
        self.on_quarantine: list[Callable[[str], None]] = []
        """Called with the node's name after it is put in (or escalated within) quarantine:
        the run reconciler ends the attempts on a node whose GPU failed at once."""

    def poke(self) -> None:
        """Ask for a pass as soon as possible (a verdict changed, a node changed)."""
        self.wake.set()

    def _node_changed(self, change: informer.Change[nodes.NodeView]) -> None:
        self.queue.add(change.key)
        held = change.new is not None and change.new.quarantine is not None
        (self._in_quarantine.add if held else self._in_quarantine.discard)(change.key)

    def _slice_changed(self, change: informer.Change[tuple[devices.Device, ...]]) -> None:
        self._inventory = None
        for device in (*(change.old or ()), *(change.new or ())):
            self._listings.pop(device.node, None)
            self.queue.add(device.node)  # the node's GPUs changed: judged again

    def _rule_changed(self, change: informer.Change[devices.TaintRule]) -> None:
        self._rules = None
        self._listings.clear()  # a rule may select devices on any node
        for rule in (change.old, change.new):
            if rule is not None and rule.node:
                self.queue.add(rule.node)

    # ------------------------------------------------------------------ on-call
    async def manual(
        self, view: nodes.NodeView, *, release: bool, by: str, reason: str, now: dt.datetime
    ) -> None:
        """Quarantine or release a node by hand, as the policy allows (it raises
        errors.Invalid or errors.Conflict naming the field when it does not).

        The patch carries the node's resourceVersion, so a write by someone else in between
        (a pass writing the node's condition at that moment) refuses it: the node is read
        again and the order decided again on it, a few times, and a 409 says so if it
        never goes through. An order is never answered as done without being written."""
        for _ in range(MANUAL_ATTEMPTS):
            h = None
            if view.name in self.fleet:
                interval = self.settings.default_interval_s
                h = self.fleet.assess(view.name, now, default_interval_s=interval)
            action: actions.NodeAction
            if release:
                fenced = self.last_devices is not None and bool(
                    self.last_devices.fenced.get(view.name)
                )
                action = policy.manual_release(view, h, by=by, reason=reason,
                                               devices_fenced=fenced)  # fmt: skip
            else:
                action = policy.manual_quarantine(view, h, by=by, reason=reason, now=now)
            if await self.apply(action, now):
                self.poke()
                return
            raw = await self.writer.read(view.name)
            if raw is None:
                msg = f"node {view.name} does not exist"
                raise errors.NotFound(msg, field="name")
            self.cache.put(raw)
            view = self.cache.views.get(view.name) or nodes.parse(kube_nodes.trim_node(raw))
        self.poke()
        doing = "released" if release else "quarantined"
        msg = (f"node {view.name} changed {MANUAL_ATTEMPTS} times while it was being {doing};"
               " nothing was written: try again")  # fmt: skip
        raise errors.Conflict(msg, field="name", code="Changed")

    async def reset_breaker(self, *, by: str, now: dt.datetime, reason: str = "") -> None:
        """Close the circuit breakers (node and device) on an operator's request (and record
        who did, and why: `reason`, in the Event and the log)."""
        self.breaker = policy.reset_breaker(self.breaker, by=by, now=now)
        await self.apply(actions.CloseBreaker(reason="Reset", by=by, note=reason), now)
        was_open = self.device_breaker.open
        self.device_breaker = policy.reset_breaker(self.device_breaker, by=by, now=now)
        if was_open:
            await self.apply(
                actions.CloseBreaker(reason="Reset", by=by, devices=True, note=reason), now
            )
        self.poke()

    def set_dry_run(self, dry_run: bool, *, by: str) -> None:
        """Switch dry run on or off at runtime (kept on the Lease by the next pass)."""
        self.settings = self.settings.model_copy(update={"dry_run": dry_run})
        log.warning("dry run switched", dry_run=dry_run, by=by)
        self.poke()

    async def run(self) -> None:
        """Pass after pass while leading and the node cache is synced, until cancelled."""
        try:
            await leading.run_passes(
                "quarantine", self._pass_until_due, wake=self.wake,
                interval_s=self.pass_interval_s, elector=self.elector, ready=self._ready,
                failures=lambda loop: self.metrics.pass_failures.labels(loop).inc(),
            )  # fmt: skip
        finally:
            for task in list(self._records):
                task.cancel()

    def _ready(self) -> bool:
        """Nodes listed, and device slices and rules too when device quarantine is wired."""
        return self.cache.synced.is_set() and (
            self.device_cache is None or self.device_cache.synced()
        )

    def device_inputs(
        self, *, report: bool = False
    ) -> tuple[devices.Inventory, list[devices.TaintRule]]:
        """The DRA inventory and every DeviceTaintRule, from the device cache's parsed views
        (`report`: log the problems of damaged rules, once each time the rules change)."""
        cache = self.device_cache
        if cache is None:
            return devices.Inventory(), []
        if self._inventory is None:
            self._inventory = devices.inventory_of(cache.slices.views.values())
        if self._rules is None:
            self._rules = list(cache.rules.views.values())
            for rule in self._rules:
                if report and rule.problems:
                    log.warning("malformed device rule", rule=rule.name, problems=rule.problems)
        return self._inventory, self._rules

    def decide_devices(
        self, views: Mapping[str, nodes.NodeView], now: dt.datetime
    ) -> actions.DeviceDecision | None:
        """The device policy's decision for this pass (None without device quarantine)."""
        if self.device_settings is None or self.device_cache is None:
            return None
        if not self.device_cache.available():
            return None  # no DRA here (or no right to it): node quarantine only
        inventory, rules = self.device_inputs(report=True)
        return devicepolicy.decide(
            self.fleet, views, self.device_settings, self.device_breaker, now,
            inventory=inventory, rules=rules, dry_run=self.settings.dry_run,
        )  # fmt: skip

    def device_report(
        self, now: dt.datetime
    ) -> dict[str, tuple[bool, tuple[devicepolicy.Usable, ...]]]:
        """Per managed DRA node: fresh health data, and each GPU with whether a new claim
        may use it (`devicepolicy.usable`); what the admission gate counts."""
        if self.device_settings is None or self.device_cache is None:
            return {}
        if not self.device_cache.available():
            return {}
        inventory, rules = self.device_inputs()
        managed = [name for name, view in self.cache.views.items() if view.managed]
        return devicepolicy.usable(
            self.fleet, managed, self.device_settings, now,
            inventory=inventory, rules=rules, memo=self._listings,
        )  # fmt: skip

    def dra_render(self) -> bool:
        """Whether runs ask for GPUs through DRA claims now (`gpuMode`, detected under auto:
        GPUs are published as DRA devices and no managed node advertises nvidia.com/gpu)."""
        if self.device_settings is None:
            return False
        published = bool(self.device_cache and self.device_cache.slices.items)
        plugin_nodes = sum(
            1 for raw in self.cache.nodes.values()
            if marks.GPU_RESOURCE in (raw["status"].get("capacity") or {})
        )  # fmt: skip
        return devicepolicy.render_mode(self.device_settings.mode, dra_published=published,
                                        plugin_nodes=plugin_nodes)  # fmt: skip

    async def _pass_until_due(self) -> float | None:
        deadline = await self.run_pass()
        return None if deadline is None else (deadline - self.clock()).total_seconds()

    async def run_pass(self) -> dt.datetime | None:
        """One level-triggered pass; return when the next one is due."""
        async with self._lock:
            started = time.perf_counter()
            now = self.clock()
            batch = self.queue.take(now.timestamp())
            full, touched = batch.everything, set(batch.keys)
            by_name: dict[str, nodes.NodeView] = self.cache.views  # parsed as the cache took them
            device = self.decide_devices(by_name, now)
            if device is not None:
                self.device_breaker = device.breaker
                self.last_devices = device
            decision = passes.decide_changed(
                self.fleet, by_name, self.settings, self.breaker, now, ledger=self.ledger,
                changed=self.fleet.take_changed() | touched, everything=full,
                device_scope=device.scope if device else frozenset(),
                device_nodes=device.dra_nodes if device else frozenset(),
            )  # fmt: skip
            self.metrics.pass_nodes.labels("full" if full else "changed").observe(
                len(self.ledger.judged)
            )
            self.breaker = decision.breaker
            self.last = decision
            by_node: dict[str, list[actions.Action | DeviceStep]] = collections.defaultdict(list)
            self.evictions.keep_only(self._in_quarantine)
            for step in (*decision.actions, *(device.actions if device else ())):
                if isinstance(step, actions.EvictGpuPods) and not self.evictions.due(
                    step.node, now
                ):
                    continue  # its last round was moments ago (`fleet.evictions`)
                by_node[getattr(step, "node", "")].append(step)
            sem = asyncio.Semaphore(MAX_PARALLEL_NODES)
            events: list[tuple[actions.NodeAction, dict[str, Any]]] = []

            async def run_node(node: str, todo: list[actions.Action | DeviceStep]) -> None:
                async with sem:
                    for action in todo:
                        if isinstance(action, actions.FenceDevice | actions.UnfenceDevice
                                      | actions.SkippedDevice):  # fmt: skip
                            await self.apply_device(action, now)
                        else:
                            await self.apply(action, now, decision, events=events)

            async def record(action: actions.NodeAction, raw: dict[str, Any]) -> None:
                async with sem:
                    await self._event(action, raw)

            todo, deferred = passes.urgent_first(by_node)
            for wave in passes.fencing_first(todo):
                await asyncio.gather(*(run_node(n, a) for n, a in wave))
            # The pass's Events go after all of its node writes: an Event written beside each
            # fence held its slot, and 200 nodes failing at once had their last taint behind
            # ~400 writes instead of 200.
            await asyncio.gather(*(record(a, raw) for a, raw in events))
            if deferred:
                # Conditions past this pass's share: the next pass (at once) writes more,
                # and a fault meanwhile goes first.
                log.info("conditions left for the next pass", nodes=deferred)
                self.poke()
            self._export(decision)
            self._export_devices(device)
            await self._persist()
            self.metrics.pass_seconds.observe(time.perf_counter() - started)
            due = [d for d in (decision.next_deadline, device and device.next_deadline,
                               self.evictions.next_due(now)) if d]  # fmt: skip
            return min(due) if due else None

    def durable_state(self) -> dict[str, str]:
        """What must survive a failover: the breaker and the runtime dry-run switch."""
        return {
            marks.BREAKER_ANNOTATION: self.breaker.model_dump_json(by_alias=True),
            marks.DRY_RUN_ANNOTATION: "true" if self.settings.dry_run else "false",
            marks.DEVICE_BREAKER_ANNOTATION: self.device_breaker.model_dump_json(by_alias=True),
        }

    def restore(self, saved: dict[str, str]) -> None:
        """Take over the breaker and dry-run state a previous leader left on the Lease."""
        raw = saved.get(marks.BREAKER_ANNOTATION)
        if raw:
            try:
                self.breaker = actions.BreakerState.model_validate_json(raw)
            except ValueError:
                log.warning("unreadable breaker state on the Lease; starting closed", value=raw)
        raw_devices = saved.get(marks.DEVICE_BREAKER_ANNOTATION)
        if raw_devices:
            try:
                self.device_breaker = actions.BreakerState.model_validate_json(raw_devices)
            except ValueError:
                log.warning("unreadable device breaker state on the Lease; starting closed",
                            value=raw_devices)  # fmt: skip
        if marks.DRY_RUN_ANNOTATION in saved:
            dry = saved[marks.DRY_RUN_ANNOTATION] == "true"
            self.settings = self.settings.model_copy(update={"dry_run": dry})
        self._saved = self.durable_state()

    async def _persist(self) -> None:
        durable = self.durable_state()
        if self._save_state is None or durable == self._saved:
            return
        self.elector.ensure_leader()
        await self._save_state(durable)
        self._saved = durable

    def _export(self, decision: actions.Decision) -> None:
        counts = self.ledger.states  # kept per judged node: no walk over the fleet
        for kind in state.NodeState:
            self.metrics.node_verdicts.labels(kind.value).set(counts.get(kind, 0))
        self.metrics.quarantined_nodes.set(len(self._in_quarantine))
        self.metrics.breaker_open.set(1 if decision.breaker.open else 0)
        self.metrics.dry_run.set(1 if self.settings.dry_run else 0)

    async def apply(
        self,
        action: actions.Action,
        now: dt.datetime,
        decision: actions.Decision | None = None,
        *,
        events: list[tuple[actions.NodeAction, dict[str, Any]]] | None = None,
    ) -> bool:
        """Carry out one action (idempotent: a node already as wanted is not written);
        False when its patch was refused because the node changed meanwhile, or is gone.
        Its Event is written at once, or left in `events` for the caller to write later."""
        if isinstance(action, actions.Skipped):
            self._held_back(action, "action held back")
            return True
        if isinstance(action, actions.OpenBreaker | actions.CloseBreaker):
            await self._breaker_event(action)
            return True
        raw = self.cache.nodes.get(action.node)
        if raw is None:
            return False
        patch = conditions.patch_for(action, raw, now)
        if patch is not None:
            self.elector.ensure_leader()
            updated = await self.writer.patch(action.node, patch)
            if updated is None:
                self.poke()  # conflict or gone: the next pass sees the new state
                return False
            self.cache.put(updated)
            if isinstance(action, actions.Quarantine | actions.UpdateQuarantine):
                for listener in self.on_quarantine:
                    listener(action.node)
            self._record(action, raw, now, decision)
            if events is None:
                await self._event(action, raw)
            else:
                events.append((action, raw))
        if isinstance(action, actions.EvictGpuPods):
            self.elector.ensure_leader()
            outcome = await self.writer.evict_gpu_pods(action.node)
            self.evictions.ran(action.node, now, left_pods=bool(outcome.blocked or outcome.failed))
            pods = {"evicted": outcome.evicted, "blocked": outcome.blocked,
                    "failed": outcome.failed}  # fmt: skip
            for name, refs in pods.items():
                if refs:
                    self.metrics.evictions.labels(name).inc(len(refs))
            if any(pods.values()):
                log.info("eviction round", node=action.node, **pods)
            if outcome.evicted:
                node_note, told = actions.eviction_notes(action.node, outcome.evicted_pods)
                await self.writer.event(raw, "Evicted", node_note, warning=True)
                for pod, note in told:
                    await self.writer.pod_event(pod, "Evicted", note)
        return True

    def _held_back(
        self, action: actions.Skipped | actions.SkippedDevice, event: str, **fields: str
    ) -> None:
        """Log and count an action a limit held back, once per node, kind, reason (and device)."""
        kind = action.wanted.kind.value
        key = (action.node, ":".join((kind, action.why.value, *fields.values())))
        if key not in self._skips_logged:
            self._skips_logged.add(key)
            log.info(event, node=action.node, action=kind, reason=action.why.value, **fields)
            self.metrics.quarantine_actions.labels(kind, "true").inc()

    def _record(
        self,
        action: actions.NodeAction,
        raw: dict[str, Any],
        now: dt.datetime,
        decision: actions.Decision | None,
    ) -> None:
        self.metrics.quarantine_actions.labels(action.kind.value, "false").inc()
        if isinstance(action, actions.Quarantine) and decision is not None:
            h = decision.health.get(action.node)
            if h is not None and h.bad_since is not None:
                self.metrics.fault_to_quarantine.observe(
                    max((now - h.bad_since).total_seconds(), 0)
                )
        log.info("node action", node=action.node, action=action.kind.value)

    async def _event(self, action: actions.NodeAction, raw: dict[str, Any]) -> None:
        note = actions.describe(action)
        warning = isinstance(action, actions.Quarantine | actions.EvictGpuPods) or (
            isinstance(action, actions.SetCondition)
            and action.condition.status is not nodes.ConditionStatus.TRUE
        )
        await self.writer.event(raw, action.kind.value, note, warning=warning)

    async def _breaker_event(self, action: actions.OpenBreaker | actions.CloseBreaker) -> None:
        which = "device breaker" if action.devices else "breaker"
        if isinstance(action, actions.OpenBreaker):
            log.warning("quarantine breaker opened", breaker=which, message=action.message,
                        nodes=action.nodes)  # fmt: skip
            text = f"{which} opened: {action.message}" if action.devices else action.message
        else:
            log.warning("quarantine breaker closed", breaker=which, reason=action.reason,
                        by=action.by, note=action.note)  # fmt: skip
            text = actions.close_breaker_text(which, action)
        self.metrics.quarantine_actions.labels(action.kind.value, "false").inc()
        reason = ("Device" + action.kind.value) if action.devices else action.kind.value
        await self.writer.breaker_event(self.lease_name, reason, text)

    # ------------------------------------------------------------------ devices
    async def apply_device(self, action: DeviceStep, now: dt.datetime) -> None:
        """Carry out one device action: the rules, then the node's history and an Event."""
        if isinstance(action, actions.SkippedDevice):
            self._held_back(action, "device action held back",
                            device=actions.device_of(action.wanted))  # fmt: skip
            return
        cache, writer = self.device_cache, self.device_writer
        if cache is None or writer is None:
            return
        if isinstance(action, actions.FenceDevice):
            created = []
            for kind in _ORDER:
                if kind not in action.kinds:
                    continue
                self.elector.ensure_leader()
                body = devices.render_rule(action.device, kind, action.record)
                made = await writer.create_rule(body)
                if made is not None:
                    cache.rules.put(made)
                    created.append(body["metadata"]["name"])
            if not created:
                return
            self._observe_fence(action, now)
            dry = action.kinds == {devices.RuleKind.DRY_RUN}
            reason = "DeviceDryRun" if dry else "DeviceQuarantine"
            note = (f"{'dry run: would fence' if dry else 'fenced'} {action.device.name} "
                    f"({action.device.uuid}): {action.record.message}; rules "
                    f"{', '.join(created)}")  # fmt: skip
        else:
            removed = []
            for name, uid in action.rules:
                self.elector.ensure_leader()
                if await writer.delete_rule(name, uid):
                    cache.rules.gone(name)
                    removed.append(name)
            if not removed:
                return
            reason = "DeviceRelease"
            note = f"released {action.device} ({action.message}); deleted {', '.join(removed)}"
        self.metrics.quarantine_actions.labels(action.kind.value, "false").inc()
        log.info("device action", node=action.node, action=action.kind.value, reason=reason,
                 note=note)  # fmt: skip
        task = asyncio.create_task(self._device_history(action.node, reason, note, now))
        self._records.add(task)
        task.add_done_callback(self._recorded)

    def _recorded(self, task: asyncio.Task[None]) -> None:
        self._records.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("device action not recorded", error=str(task.exception()))

    def _observe_fence(self, action: actions.FenceDevice, now: dt.datetime) -> None:
        if action.escalation or action.kinds == {devices.RuleKind.DRY_RUN}:
            return
        streak = self.fleet.gpu_streak(action.node, action.device.uuid)
        if streak is not None and not streak[0]:
            self.metrics.fault_to_device_rule.observe(max((now - streak[1]).total_seconds(), 0))

    async def _device_history(self, node: str, reason: str, note: str, now: dt.datetime) -> None:
        raw = self.cache.nodes.get(node)
        if raw is None:
            return
        entry = history.Entry(now, reason, reason, marks.CONTROLLER_IDENTITY, note)
        self.elector.ensure_leader()
        updated = await self.writer.patch(node, conditions.history_patch(raw, entry))
        if updated is not None:
            self.cache.put(updated)
        await self.writer.event(raw, reason, note, warning=reason == "DeviceQuarantine")

    def _export_devices(self, device: actions.DeviceDecision | None) -> None:
        if device is None:
            return
        inventory = self.device_inputs()[0] if self.device_cache is not None else None
        fenced, kept = devicepolicy.fenced_and_kept(device, inventory)
        self.metrics.quarantined_devices.set(fenced)
        self.metrics.gpus_kept.set(kept)
        self.metrics.device_breaker_open.set(1 if device.breaker.open else 0)


DeviceStep = actions.FenceDevice | actions.UnfenceDevice | actions.SkippedDevice
_ORDER = (devices.RuleKind.UNHEALTHY, devices.RuleKind.DRY_RUN, devices.RuleKind.EVICT,
          devices.RuleKind.FAILED)  # fmt: skip
"""NoSchedule before NoExecute: a tolerating claim must never be allocated the device in
between."""


def _parse_node(raw: dict[str, Any]) -> nodes.NodeView:
    """A cached node's view (`nodes.parse`); malformed annotations are reported, never
    raised."""
    view = nodes.parse(raw)
    if view.problems:
        log.warning("malformed node annotations", node=view.name, problems=view.problems)
    return view
