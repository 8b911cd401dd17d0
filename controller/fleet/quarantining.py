"""The quarantine loop: level-triggered passes of the pure policy, carried out on Nodes.

Each pass reads every heartbeat (the fleet state) and every node (the cache), asks
`policy.decide` what should be true, and writes only the difference (`conditions.patch_for`
returns None when a node is already as wanted). A heartbeat that changes a verdict or a node
event wakes the loop at once; otherwise it wakes at the policy's next deadline, at most every
`pass_interval_s`. Only the leader acts, and every write checks that the lease is still held.
"""

from __future__ import annotations

import asyncio
import collections
import datetime as dt
import time
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from controller import leading, marks
from controller import metrics as metrics_mod
from controller.fleet import actions, conditions, nodes, policy, state
from controller.kube import nodes as kube_nodes

log = structlog.get_logger()


MAX_PARALLEL_NODES = 32
"""Nodes acted on concurrently in one pass; actions on one node stay in order."""


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
        lease_name: str = "taugrid-controller",
        save_state: Callable[[dict[str, str]], Awaitable[None]] | None = None,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self.fleet = fleet_state
        self.cache = cache
        self.writer = writer
        self.settings = settings
        self.elector = elector
        self.metrics = metrics
        self.pass_interval_s = pass_interval_s
        self.lease_name = lease_name
        self._save_state = save_state
        self._saved: dict[str, str] | None = None
        self.clock = clock
        self.breaker = actions.BreakerState()
        self.last: actions.Decision | None = None
        self.wake = asyncio.Event()
        self._skips_logged: set[tuple[str, str]] = set()
        self._lock = asyncio.Lock()
        self.on_quarantine: list[Callable[[str], None]] = []
        """Called with the node's name after it is put in (or escalated within) quarantine:
        the run reconciler ends the attempts on a node whose GPU failed at once."""

    def poke(self) -> None:
        """Ask for a pass as soon as possible (a verdict changed, a node changed)."""
        self.wake.set()

    # ------------------------------------------------------------------ on-call
    async def manual(
        self, view: nodes.NodeView, *, release: bool, by: str, reason: str, now: dt.datetime
    ) -> None:
        """Quarantine or release a node by hand, as the policy allows (it raises
        errors.Invalid or errors.Conflict naming the field when it does not)."""
        h = None
        if view.name in self.fleet:
            interval = self.settings.default_interval_s
            h = self.fleet.assess(view.name, now, default_interval_s=interval)
        action: actions.NodeAction
        if release:
            action = policy.manual_release(view, h, by=by, reason=reason)
        else:
            action = policy.manual_quarantine(view, h, by=by, reason=reason, now=now)
        await self.apply(action, now)
        self.poke()

    async def reset_breaker(self, *, by: str, now: dt.datetime) -> None:
        """Close the circuit breaker on an operator's request (and record who did)."""
        self.breaker = policy.reset_breaker(self.breaker, by=by, now=now)
        await self.apply(actions.CloseBreaker(reason="Reset", by=by), now)
        self.poke()

    def set_dry_run(self, dry_run: bool, *, by: str) -> None:
        """Switch dry run on or off at runtime (kept on the Lease by the next pass)."""
        self.settings = self.settings.model_copy(update={"dry_run": dry_run})
        log.warning("dry run switched", dry_run=dry_run, by=by)
        self.poke()

    async def run(self) -> None:
        """Pass after pass while leading and the node cache is synced, until cancelled."""
        await leading.run_passes(
            "quarantine", self._pass_until_due, wake=self.wake, interval_s=self.pass_interval_s,
            elector=self.elector, ready=self.cache.synced.is_set,
            failures=lambda loop: self.metrics.pass_failures.labels(loop).inc(),
        )  # fmt: skip

    async def _pass_until_due(self) -> float | None:
        deadline = await self.run_pass()
        return None if deadline is None else (deadline - self.clock()).total_seconds()

    def views(self) -> list[nodes.NodeView]:
        """Parse every cached node (malformed annotations are reported, never raised)."""
        out = []
        for raw in self.cache.nodes.values():
            view = nodes.parse(raw)
            if view.problems:
                log.warning("malformed node annotations", node=view.name, problems=view.problems)
            out.append(view)
        return out

    async def run_pass(self) -> dt.datetime | None:
        """One level-triggered pass; return when the next one is due."""
        async with self._lock:
            started = time.perf_counter()
            now = self.clock()
            views = self.views()
            decision = policy.decide(self.fleet, views, self.settings, self.breaker, now)
            self.breaker = decision.breaker
            self.last = decision
            by_node: dict[str, list[actions.Action]] = collections.defaultdict(list)
            for action in decision.actions:
                node = getattr(action, "node", "")
                by_node[node].append(action)
            sem = asyncio.Semaphore(MAX_PARALLEL_NODES)

            async def run_node(node: str, todo: list[actions.Action]) -> None:
                async with sem:
                    for action in todo:
                        await self.apply(action, now, decision)

            await asyncio.gather(*(run_node(n, a) for n, a in by_node.items()))
            self._export(decision, views)
            await self._persist()
            self.metrics.pass_seconds.observe(time.perf_counter() - started)
            return decision.next_deadline

    def durable_state(self) -> dict[str, str]:
        """What must survive a failover: the breaker and the runtime dry-run switch."""
        return {
            marks.BREAKER_ANNOTATION: self.breaker.model_dump_json(by_alias=True),
            marks.DRY_RUN_ANNOTATION: "true" if self.settings.dry_run else "false",
        }

    def restore(self, saved: dict[str, str]) -> None:
        """Take over the breaker and dry-run state a previous leader left on the Lease."""
        raw = saved.get(marks.BREAKER_ANNOTATION)
        if raw:
            try:
                self.breaker = actions.BreakerState.model_validate_json(raw)
            except ValueError:
                log.warning("unreadable breaker state on the Lease; starting closed", value=raw)
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

    def _export(self, decision: actions.Decision, views: list[nodes.NodeView]) -> None:
        counts = collections.Counter(h.state.value for h in decision.health.values())
        for kind in state.NodeState:
            self.metrics.node_verdicts.labels(kind.value).set(counts.get(kind.value, 0))
        # The views parsed for this pass: no second parse of every node.
        self.metrics.quarantined_nodes.set(sum(1 for v in views if v.quarantine is not None))
        self.metrics.breaker_open.set(1 if decision.breaker.open else 0)
        self.metrics.dry_run.set(1 if self.settings.dry_run else 0)

    async def apply(
        self, action: actions.Action, now: dt.datetime, decision: actions.Decision | None = None
    ) -> None:
        """Carry out one action (idempotent: a node already as wanted is not written)."""
        if isinstance(action, actions.Skipped):
            key = (action.node, f"{action.wanted.kind}:{action.why}")
            if key not in self._skips_logged:
                self._skips_logged.add(key)
                log.info(
                    "action held back",
                    node=action.node,
                    action=action.wanted.kind.value,
                    reason=action.why.value,
                )
                self.metrics.quarantine_actions.labels(action.wanted.kind.value, "true").inc()
            return
        if isinstance(action, actions.OpenBreaker | actions.CloseBreaker):
            await self._breaker_event(action)
            return
        raw = self.cache.nodes.get(action.node)
        if raw is None:
            return
        patch = conditions.patch_for(action, raw, now)
        if patch is not None:
            self.elector.ensure_leader()
            updated = await self.writer.patch(action.node, patch)
            if updated is None:
                self.poke()  # conflict or gone: the next pass sees the new state
                return
            self.cache.put(updated)
            if isinstance(action, actions.Quarantine | actions.UpdateQuarantine):
                for listener in self.on_quarantine:
                    listener(action.node)
            self._record(action, raw, now, decision)
            await self._event(action, raw)
        if isinstance(action, actions.EvictGpuPods):
            self.elector.ensure_leader()
            outcome = await self.writer.evict_gpu_pods(action.node)
            for name, pods in (("evicted", outcome.evicted), ("blocked", outcome.blocked),
                               ("failed", outcome.failed)):  # fmt: skip
                if pods:
                    self.metrics.evictions.labels(name).inc(len(pods))
            if outcome.evicted or outcome.blocked or outcome.failed:
                log.info(
                    "eviction round",
                    node=action.node,
                    evicted=outcome.evicted,
                    blocked=outcome.blocked,
                    failed=outcome.failed,
                )
            if outcome.evicted:
                await self.writer.event(
                    raw, "Evicted", f"evicted GPU pods: {', '.join(outcome.evicted)}", warning=True
                )

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
        note = describe(action)
        warning = isinstance(action, actions.Quarantine | actions.EvictGpuPods) or (
            isinstance(action, actions.SetCondition)
            and action.condition.status is not nodes.ConditionStatus.TRUE
        )
        await self.writer.event(raw, action.kind.value, note, warning=warning)

    async def _breaker_event(self, action: actions.OpenBreaker | actions.CloseBreaker) -> None:
        if isinstance(action, actions.OpenBreaker):
            log.warning("quarantine breaker opened", message=action.message, nodes=action.nodes)
            text = action.message
        else:
            log.warning("quarantine breaker closed", reason=action.reason, by=action.by)
            text = f"breaker closed ({action.reason}{' by ' + action.by if action.by else ''})"
        self.metrics.quarantine_actions.labels(action.kind.value, "false").inc()
        await self.writer.breaker_event(self.lease_name, action.kind.value, text)


def describe(action: actions.NodeAction) -> str:
    """One line for the Event and the log that says what was done and why."""
    match action:
        case actions.SetCondition():
            return f"GPUHealthy={action.condition.status}: {action.condition.message}"
        case actions.Quarantine():
            return f"quarantined: {action.message}"
        case actions.UpdateQuarantine():
            return f"quarantine updated: clears with {action.record.clears_with}"
        case actions.RestoreTaint():
            return "restored the taugrid.dev/gpu-unhealthy taint"
        case actions.EvictGpuPods():
            return f"evicting GPU pods: {action.reason}"
        case actions.Release():
            return f"released: {action.message}"
        case actions.ManualRelease():
            return f"released by {action.by}: {action.reason}"
        case actions.ForgetManualRelease():
            return "healthy again; the earlier manual release is forgotten"
