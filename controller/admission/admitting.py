"""The admission gate loop: our AdmissionCheck (`taugrid.dev/gpu-health`) answered on Workloads.

Each pass, on the leader only:
1. reads the AdmissionCheck named by the `admission_check` setting; a check that does not
   exist or names another controller is left alone (and nothing else happens);
2. keeps its `Active` condition True (Kueue deactivates every ClusterQueue that references an
   inactive check);
3. lists the ClusterQueues whose `admissionChecksStrategy` names the check and every
   Workload; when some Workload admitted through one of them waits on our check, it lists
   nodes, pods, ResourceFlavors and the runs' Jobs/RayJobs, asks the pure `policy.plan`
   what each check should say, and applies only the differences. Workloads, nodes, pods and
   ResourceClaims come from the informers (`controller.kube.informer`): nodes, pods and
   claims are parsed once, as the caches take them; what the claims hold is counted from
   the claims cache's changes (`dra.Claims.tell`); a Workload is parsed again only when the
   cache replaced it or its owner's labels changed (`views.ParsedWorkloads`, a join of two
   caches); a DRA node's GPU capacity is built again only when its view, its GPUs or what
   claims hold on it changed (`dra.WithDevices`).

Level-triggered: nothing depends on which event woke the pass. A pass runs every
`admission_pass_interval_s` and at once after `poke()` (the app pokes on node changes, so a
quarantine or a release is seen at once). Every write checks that the lease is still held.
Kueue resets a check to Pending after a Retry and drops its message, so the last message we
wrote per Workload is kept in memory for the run reconciler (`message_for`).
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from controller import leading, marks
from controller import metrics as metrics_mod
from controller.admission import dra, policy, views
from controller.kube import admission as kube_admission

log = structlog.get_logger()

MIN_PASS_GAP_S = 0.2
"""Pokes come with every node change; passes are spaced at least this much."""
RETRY_EVENT_REASON = "GPUHealthRetry"


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
        self.dra_resource = dra_resource
        self._wake = asyncio.Event()
        self._messages: dict[tuple[str, str], str] = {}
        self._evented: dict[tuple[str, str], str] = {}
        self._refusal = ""
        self._seen = views.ParsedWorkloads(dra_resource=dra_resource)
        """Every Workload, to see whether one waits."""
        self._workloads = views.ParsedWorkloads(dra_resource=dra_resource)
        """... and with its owner's labels, once one does."""
        self._claims = dra.Claims()
        """What the claims hold, counted from the claims cache's changes."""
        store.parse_with(node=views.parse_node, pod=views.parse_pod, claim=dra.parse_claim)
        store.claims.subscribe(lambda change: self._claims.tell(change.old, change.new))
        self._with_devices = dra.WithDevices()
        self._mark_claimed = dra.MarkClaimed()

    # ------------------------------------------------------------------ API
    def poke(self) -> None:
        """Ask for a pass as soon as possible (a node changed)."""
        self._wake.set()

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
            "admission", self._pass, wake=self._wake, interval_s=self.pass_interval_s,
            elector=self.elector, min_gap_s=MIN_PASS_GAP_S,
            on_follower=lambda: self.metrics.admission_check_active.set(0),
            failures=lambda loop: self.metrics.pass_failures.labels(loop).inc(),
        )  # fmt: skip

    async def _pass(self) -> None:
        await self.pass_once()

    # ------------------------------------------------------------------ one pass
    async def pass_once(self) -> None:
        """Keep the check Active and answer every Workload waiting on it."""
        now = self._clock()
        raw_check = await self.store.get_admission_check(self.check)
        if raw_check is None or not policy.owns_check(raw_check, self.controller_name):
            self._refuse(raw_check)
            return
        self._refusal = ""
        await self._keep_active(raw_check, now)
        queues = policy.queues_with_check(await self.store.list_kueue("clusterqueues"), self.check)
        raw_workloads = await self.store.list_kueue("workloads")
        seen = self._seen(raw_workloads)
        self._forget({(w.namespace, w.name) for w in seen})
        if not queues or not any(self._waits(w, queues) for w in seen):
            return
        node_list: list[views.NodeCapacity] = await self.store.node_views()
        pods: list[views.PodUsage] = await self.store.pod_views()
        raw_flavors = await self.store.list_kueue("resourceflavors")
        owners = await self.store.owner_labels()
        workloads = {(w.namespace, w.name): w for w in self._workloads(raw_workloads, owners)}
        flavors = {f.name: f for f in map(views.parse_flavor, raw_flavors)}
        if any(w.uses_dra for w in workloads.values()):
            # Fail closed: without the fleet's word every DRA node counts as stale.
            gpus = self.devices() if self.devices is not None else {}
            listed = await self.store.claim_views()
            claims = self._claims if listed is None else dra.Claims.of(listed)
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
        for key, decision in decisions.items():
            await self._write(workloads[key], decision)

    def _waits(self, w: views.Workload, queues: frozenset[str]) -> bool:
        """Whether the Workload may need a decision: cheap, before the expensive lists."""
        ours = w.check(self.check)
        if ours is None or w.cluster_queue not in queues or not w.quota_reserved:
            return False
        if w.evicted or w.finished:
            return False
        if ours.state == views.CheckState.READY:
            # Passed but not running: its DRA devices are checked again until it runs.
            return w.uses_dra and not w.pods_ready
        return ours.state in {views.CheckState.PENDING, ""} and not w.admitted

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
        body = policy.check_state_body(self.check, decision, [ps.name for ps in w.pod_sets])
        written = await self.store.apply_check_state(w.namespace, w.name, w.resource_version, body)
        if written is None:
            self.poke()  # changed since we read it (or gone): the next pass decides again
            return
        key = (w.namespace, w.name)
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
