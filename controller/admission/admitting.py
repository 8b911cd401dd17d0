"""The admission gate loop: our AdmissionCheck (`taugrid.dev/gpu-health`) answered on Workloads.

The caches (`controller.kube.informer`, in `kube.admission.AdmissionStore`) parse each node,
pod, ResourceClaim and Workload once, as they arrive, and tell their changes; the gate maps
each change to the Workloads it concerns and queues their keys (`controller.workqueue`):
- a Workload that waits on our check (`views.waits`) → itself; one Ready on DRA devices
  whose pods do not run yet → itself every `pass_interval_s` until they do (its devices may
  fail meanwhile, and no watch tells a heartbeat going stale);
- the fleet's poke (a quarantine, a release, a device verdict) → every waiting Workload, at
  once; a node, pod, claim or ResourceFlavor change → every waiting one, at the next pass;
- an AdmissionCheck or ClusterQueue change → everything (which queues name the check);
- a Workload gone → nothing more, and what we remember of it is forgotten.

A pass with no key due reads and writes nothing. Otherwise, on the leader only, it
1. reads the AdmissionCheck named by the `admission_check` setting; a check that does not
   exist or names another controller is left alone (and nothing else happens);
2. keeps its `Active` condition True (Kueue deactivates every ClusterQueue that references an
   inactive check);
3. asks the pure `policy.plan` what each waiting Workload's check should say (the plan is
   global, since capacity is shared: every Workload is counted) and writes the answers of
   the Workloads the queue handed out (all of them on a resync, every
   `full_pass_interval_s`). What the claims hold is counted from the claims cache's changes
   (`dra.Claims.tell`); a DRA node's GPU capacity is built again only when its view, its
   GPUs or what claims hold on it changed (`dra.WithDevices`).

Every write checks that the lease is still held. Kueue resets a check to Pending after a
Retry and drops its message, so the last message we wrote per Workload is kept in memory
for the run reconciler (`message_for`).
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from controller import leading, marks, workqueue
from controller import metrics as metrics_mod
from controller.admission import dra, entries, policy, views
from controller.kube import admission as kube_admission
from controller.kube import informer

log = structlog.get_logger()

MIN_PASS_GAP_S = 0.2
"""Pokes come with every node change; passes are spaced at least this much."""
RETRY_EVENT_REASON = "GPUHealthRetry"

Key = tuple[str, str]
"""A Workload's (namespace, name)."""


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class Gate:
    """Answer one AdmissionCheck on every Workload that waits on it; see the module."""

    def __init__(
        self,
        store: kube_admission.AdmissionStore,
        elector: leading.Elector,
        metrics: metrics_mod.ControllerMetrics,
        *,
        check: str = marks.DEFAULT_ADMISSION_CHECK,
        retry_after_s: float = views.DEFAULT_RETRY_AFTER_S,
        pass_interval_s: float = 1.0,
        full_pass_interval_s: float = 30.0,
        controller_name: str = marks.ADMISSION_CHECK_CONTROLLER,
        clock: Callable[[], dt.datetime] = _now,
        devices: Callable[[], Mapping[str, tuple[bool, tuple[dra.Slot, ...]]]] | None = None,
        dra_resource: str = marks.GPU_RESOURCE,
    ) -> None:
        self.store = store
        self.elector = elector
        self.metrics = metrics
        self.check = check
        self.retry_after_s = retry_after_s
        self.pass_interval_s = pass_interval_s
        self.controller_name = controller_name
        self._clock = clock
        self.devices = devices
        """The DRA nodes' GPUs as device quarantine judges them (wired by the root from
        the fleet); None: no DRA fleet, and DRA pod sets fit nowhere."""
        self.queue: workqueue.WorkQueue[Key] = workqueue.WorkQueue(resync_s=full_pass_interval_s)
        """The Workloads to decide (see the module docstring)."""
        self._waiting: set[Key] = set()
        """The Workloads waiting on our check, as the cache last told them."""
        self._waiting_due = False
        """Every waiting Workload is already scheduled for the next pass (a capacity change
        came since the last take), so the next change need not walk them again: pods change
        many times a second in a busy cluster."""
        self._messages: dict[Key, str] = {}
        self._evented: dict[Key, str] = {}
        self._refusal = ""
        self._claims = dra.Claims()
        """What the claims hold, counted from the claims cache's changes."""
        store.nodes.parse_with(views.parse_node)
        store.pods.parse_with(views.parse_pod)
        store.claims.parse_with(dra.parse_claim)
        store.kueue["workloads"].parse_with(
            functools.partial(views.parse_workload, dra_resource=dra_resource)
        )
        store.claims.subscribe(self._claim_changed)
        store.kueue["workloads"].subscribe(self._workload_changed)
        for cache in (store.nodes, store.pods, store.kueue["resourceflavors"]):
            cache.subscribe(lambda _change: self._all_waiting(at_once=False))
        for cache in (store.kueue["admissionchecks"], store.kueue["clusterqueues"]):
            cache.subscribe(lambda _change: self.queue.resync())
        self._with_devices = dra.WithDevices()
        self._mark_claimed = dra.MarkClaimed()

    # ------------------------------------------------------------------ API
    def poke(self) -> None:
        """A node or a device verdict changed: decide every waiting Workload again at once."""
        self._all_waiting(at_once=True)

    def message_for(self, namespace: str, workload: str) -> str | None:
        """Why the check holds the Workload back: the last Retry or Pending message this
        leader wrote on it (None when it has none, or when it last said Ready).

        It outlives Kueue's reset of the check to Pending after a Retry, so the run
        reconciler can say why a run waits.
        """
        return self._messages.get((namespace, workload))

    async def run(self) -> None:
        """Pass after pass until cancelled; an API failure costs one pass, never the loop."""
        await leading.run_passes(
            "admission", self.pass_once, wake=self.queue.wake, interval_s=self.pass_interval_s,
            elector=self.elector, min_gap_s=MIN_PASS_GAP_S,
            on_follower=lambda: self.metrics.admission_check_active.set(0),
            failures=lambda loop: self.metrics.pass_failures.labels(loop).inc(),
        )  # fmt: skip

    # ------------------------------------------------------------------ changes → keys
    def _workload_changed(self, change: informer.Change[Any]) -> None:
        w: views.Workload | None = change.new
        namespace, _, name = change.key.partition("/")
        key = (namespace, name)
        if w is None or not views.waits(w, self.check):
            self._waiting.discard(key)
            self.queue.forget(key)
            if w is None:
                self._messages.pop(key, None)
                self._evented.pop(key, None)
            return
        self._waiting.add(key)
        ours = w.check(self.check)
        if ours is not None and ours.state == views.CheckState.READY:
            self._recheck(key)  # its pods are on their way: looked at again on the timer
        else:
            self.queue.add(key)

    def _claim_changed(self, change: informer.Change[Any]) -> None:
        self._claims.tell(change.old, change.new)
        self._all_waiting(at_once=False)

    def _all_waiting(self, *, at_once: bool) -> None:
        """Queue every waiting Workload: now (`at_once`), or for the next pass (once per
        pass, however many changes come before it)."""
        if at_once:
            for key in self._waiting:
                self.queue.add(key)
        elif not self._waiting_due:
            now = self._clock().timestamp()
            for key in self._waiting:
                self.queue.due_at(key, now)
            self._waiting_due = True

    def _recheck(self, key: Key) -> None:
        self.queue.due_at(key, self._clock().timestamp() + self.pass_interval_s)

    # ------------------------------------------------------------------ one pass
    async def pass_once(self) -> None:
        """Keep the check Active and answer the Workloads the queue hands out. A pass that
        fails (the API server, a lost lease) queues its Workloads again after a backoff that
        doubles per failure (`WorkQueue.failed`), not only at the next resync."""
        now = self._clock()
        batch = self.queue.take(now.timestamp())
        self._waiting_due = False
        if not batch.everything and not batch.keys:
            return
        try:
            await self._answer(batch, now)
        except Exception:
            for key in batch.keys | (self._waiting if batch.everything else set()):
                self.queue.failed(key, now.timestamp())
            raise
        for key in batch.keys:
            self.queue.succeeded(key)

    async def _answer(self, batch: workqueue.Batch[Key], now: dt.datetime) -> None:
        raw_check = await self.store.get_admission_check(self.check)
        if raw_check is None or not policy.owns_check(raw_check, self.controller_name):
            self._refuse(raw_check)
            return
        self._refusal = ""
        await self._keep_active(raw_check, now)
        queues = policy.queues_with_check(await self.store.list_kueue("clusterqueues"), self.check)
        listed: list[views.Workload] = await self.store.kueue["workloads"].current_views()
        if batch.everything:
            self._forget({(w.namespace, w.name) for w in listed})
        if not queues or not any(views.waits(w, self.check, queues) for w in listed):
            return
        node_list: list[views.NodeCapacity] = await self.store.nodes.current_views()
        pods: list[views.PodUsage] = await self.store.pods.current_views()
        raw_flavors = await self.store.list_kueue("resourceflavors")
        owners = await self.store.owner_labels()
        workloads = {
            (w.namespace, w.name): views.with_owner(w, owners.get((w.namespace, *w.owner)))
            for w in listed
        }
        flavors = {f.name: f for f in map(views.parse_flavor, raw_flavors)}
        if any(w.uses_dra for w in workloads.values()):
            # Fail closed: without the fleet's word every DRA node counts as stale.
            gpus = self.devices() if self.devices is not None else {}
            claim_list = await self.store.claim_views()
            claims = self._claims if claim_list is None else dra.Claims.of(claim_list)
            node_list = self._with_devices(node_list, gpus, claims)
            pods = self._mark_claimed(pods, claims.pods)
        decisions = policy.plan(
            list(workloads.values()),
            node_list,
            flavors,
            pods,
            now,
            check=self.check,
            retry_after_s=self.retry_after_s,
            queues=queues,
        )
        for key, w in workloads.items():
            if not batch.wants(key):
                if key in decisions:  # its answer changed for another's sake: the next pass
                    self.queue.due_at(key, now.timestamp())
                continue
            if (decision := decisions.get(key)) is not None:
                await self._write(w, decision)
            if w.uses_dra and views.waits(w, self.check, queues):
                self._recheck(key)

    def _refuse(self, raw_check: Mapping[str, Any] | None) -> None:
        """Log once why the configured check is not ours to answer."""
        self.metrics.admission_check_active.set(0)
        if raw_check is None:
            why = "it does not exist"
        else:
            other = (raw_check.get("spec") or {}).get("controllerName")
            why = f"its controllerName is {other!r}, not {self.controller_name!r}"
        if why != self._refusal:
            log.warning("admission check not answered", check=self.check, reason=why)
            self._refusal = why

    async def _keep_active(self, raw_check: Mapping[str, Any], now: dt.datetime) -> None:
        message = f"answered by the TauGrid controller {self.elector.identity}"
        condition = policy.active_condition(raw_check, now, message)
        if condition is not None:
            self.elector.ensure_leader()
            if await self.store.apply_active(self.check, condition) is None:
                self.metrics.admission_check_active.set(0)
                return  # deleted meanwhile
            log.info("admission check active", check=self.check)
        self.metrics.admission_check_active.set(1)

    def _forget(self, present: set[tuple[str, str]]) -> None:
        """Drop what we remember of Workloads that are gone."""
        for memory in (self._messages, self._evented):
            for key in [k for k in memory if k not in present]:
                del memory[key]

    async def _write(self, w: views.Workload, decision: policy.Decision) -> None:
        self.elector.ensure_leader()
        body = entries.check_state_body(self.check, decision, [ps.name for ps in w.pod_sets])
        key = (w.namespace, w.name)
        written = await self.store.apply_check_state(w.namespace, w.name, w.resource_version, body)
        if written is None:
            self.queue.add(key)  # changed since we read it (or gone): decided again
            return
        if decision.state == views.CheckState.READY:
            self._messages.pop(key, None)  # a Ready check holds nothing back
        else:
            self._messages[key] = decision.message
        self.metrics.admission_decisions.labels(str(decision.state)).inc()
        log.info("admission decision", workload=f"{w.namespace}/{w.name}", check=self.check,
                 state=str(decision.state), reason=decision.message, run=w.run or None,
                 attempt=w.attempt)  # fmt: skip
        if decision.state == views.CheckState.RETRY and self._evented.get(key) != decision.message:
            self._evented[key] = decision.message
            await self.store.workload_event(w.namespace, w.name, w.uid, RETRY_EVENT_REASON,
                                            decision.message, warning=True)  # fmt: skip
