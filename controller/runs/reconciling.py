"""The run reconciler: read → decide → execute → patch status, for the TauRuns that are due.

The store's watch caches (`controller.kube.informer`, kept by `RunStore.run_caches` while
this replica leads) tell every change (`RunStore.subscribe`), and `queueing.runs_of` maps it
to the runs it concerns, which are queued (`controller.workqueue`); a change of the settings
(the GPU request mode) queues every run.

A pass decides the queued runs, the runs whose `requeue_at` has come (the one time a run's
decision reads the clock differently, `policy.steady`), and the runs whose Workload is
pending (their queue position and the gate's word are computed or polled, not watched);
every `full_pass_interval_s` it decides every run (the resync, the safety net). A step that
wrote something is decided again next pass, reading back what it wrote. A store that tells
no changes (before its caches sync) gets every run decided every pass.

Each run's share of what was read becomes a `plans.RunInput`, the pure `policy.decide_run`
says what to do, and `attempts.Attempts` carries the plan out, writing the status through the
status subresource only when it changed. A pass, a submission (`reconcile_now`) and a
quarantine (`urgent`) decide alike. Only the leader reconciles, and every write checks that
the lease is still held. Our own writes are shown in the caches as they return
(`Informer.note`), so a pass never reads a copy older than what this replica wrote.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import functools
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, cast

import structlog

from controller import errors, leading, marks, metrics, workqueue
from controller.kube import informer
from controller.runs import (
    attempts,
    checkpoints,
    collecting,
    objects,
    plans,
    policy,
    positions,
    queueing,
    records,
    rendering,
    reruns,
    results,
    snapshots,
    stores,
    views,
)
from controller.settings import RunsSettings
from shared import spec as specs

log = structlog.get_logger()

MIN_PASS_GAP_S = 0.5
"""The least time between two passes that changes ask for (cache changes, submissions): a
storm of pod updates costs at most two passes a second. The interval is not lengthened."""
FULL_PASS_INTERVAL_S = 30.0
"""How often a pass decides every run again (the queue's resync; the chart's
`fullPassIntervalS`, shared with the quarantine pass)."""

RunKey = queueing.RunKey
_now = functools.partial(dt.datetime.now, dt.UTC)


class RunNotFoundError(errors.NotFound):
    """The TauRun does not exist (or another manager owns it)."""

    def __init__(self, namespace: str, name: str) -> None:
        super().__init__(f"no run named {name!r} in namespace {namespace}", field="name")


class Reconciler:
    """Drive every TauRun towards its spec; see the module docstring."""

    def __init__(
        self,
        store: stores.RunStore,
        elector: leading.Elector,
        metrics_: metrics.ControllerMetrics,
        render: rendering.RenderSettings,
        *,
        pass_interval_s: float,
        ttl_after_finished_s: float | None,
        pod_annotations: Mapping[str, str] | None = None,
        manager: str = marks.DEFAULT_RUN_MANAGER,
        resume_priority_class: str = "",
        allowed_priority_classes: Sequence[str] = (),
        pods_ready_timeout_s: float | None = None,
        checkpoints_kept: int = checkpoints.DEFAULT_KEEP,
        gate_message: Callable[[str, str], str | None] | None = None,
        results_limits: results.Limits | None = None,
        results_flush_s: float = 1.0,
        results_pending_max: int = 4096,
        keep_logs: Callable[[objects.RunRef, Sequence[int]], Awaitable[None]] | None = None,
        clock: Callable[[], dt.datetime] = _now,
        dra: Callable[[], bool] | None = None,
        full_pass_interval_s: float = FULL_PASS_INTERVAL_S,
    ) -> None:
        self.store = store
        self.elector = elector
        self.metrics = metrics_
        self.render = render
        self.dra = dra
        """Whether attempts ask for GPUs through DRA claims now (the fleet detects it under
        `gpuMode: auto`); None keeps `render.dra`."""
        self._settings = plans.RunSettings(
            render=render, ttl_after_finished_s=ttl_after_finished_s,
            pod_annotations=dict(pod_annotations or {}),
            resume_priority_class=resume_priority_class,
            allowed_priority_classes=tuple(allowed_priority_classes),
            pods_ready_timeout_s=pods_ready_timeout_s,
        )  # fmt: skip
        self.pass_interval_s = pass_interval_s
        self.manager = manager
        self.checkpoints_kept = checkpoints_kept
        self.gate_message = gate_message
        """Why our AdmissionCheck holds a Workload back, by (namespace, Workload name)."""
        self.attempts = attempts.Attempts(store, elector, keep_logs)
        self._clock = clock
        self.queue: workqueue.WorkQueue[RunKey] = workqueue.WorkQueue(resync_s=full_pass_interval_s)
        """The runs due for a decision (see the module docstring)."""
        self._wake = self.queue.wake
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._live: set[RunKey] = set()
        """Runs not settled when last decided (`policy.settled`): what a node's change
        concerns."""
        self._namespaces: dict[str, set[RunKey]] = {}
        """The runs of each namespace as of the last pass (what a LocalQueue concerns)."""
        self._decided_with: plans.RunSettings | None = None
        self._feed = store if isinstance(store, stores.ChangeFeed) else None
        if self._feed is not None:
            self._feed.subscribe(self._on_change)
            self._feed.parse_workloads_with(views.parse_workload)
        self._urgent: set[asyncio.Task[None]] = set()
        self._priority_classes: frozenset[str] | None = None
        self._warned_missing_class = False
        self.collector = collecting.Collector(
            self, flush_s=results_flush_s, limits=results_limits or results.Limits(),
            pending_max=results_pending_max, clock=clock,
        )  # fmt: skip
        """Results reports, buffered and written in batches."""

    @classmethod
    def from_settings(
        cls,
        store: stores.RunStore,
        elector: leading.Elector,
        metrics_: metrics.ControllerMetrics,
        runs: RunsSettings,
        render: rendering.RenderSettings,
        *,
        full_pass_interval_s: float,
        gate_message: Callable[[str, str], str | None] | None = None,
        keep_logs: Callable[[objects.RunRef, Sequence[int]], Awaitable[None]] | None = None,
        dra: Callable[[], bool] | None = None,
    ) -> Reconciler:
        """A reconciler with the runs section's settings (the resync is the fleet's
        `full_pass_interval_s`, which the quarantine pass shares)."""
        return cls(
            store, elector, metrics_, render,
            pass_interval_s=runs.run_pass_interval_s,
            ttl_after_finished_s=runs.run_ttl_after_finished_s,
            pod_annotations=runs.run_pod_annotations, manager=runs.run_manager,
            resume_priority_class=runs.resume_priority_class,
            allowed_priority_classes=runs.allowed_priority_classes,
            pods_ready_timeout_s=runs.pods_ready_timeout_s,
            checkpoints_kept=runs.run_checkpoints_kept, gate_message=gate_message,
            results_limits=results.Limits(points=runs.run_results_points,
                                          metrics=runs.run_results_metrics,
                                          artifacts=runs.run_results_artifacts),
            results_flush_s=runs.run_results_flush_s,
            results_pending_max=runs.run_results_pending_max,
            keep_logs=keep_logs, dra=dra, full_pass_interval_s=full_pass_interval_s,
        )  # fmt: skip

    @property
    def full_pass_interval_s(self) -> float:
        """How often a pass decides every run (the queue's resync)."""
        return self.queue.resync_s

    @full_pass_interval_s.setter
    def full_pass_interval_s(self, value: float) -> None:
        self.queue.resync_s = value

    @property
    def settings(self) -> plans.RunSettings:
        """What every run's decisions depend on, with the GPU request mode of the moment."""
        if self.dra is None:
            return self._settings
        render = dataclasses.replace(self._settings.render, dra=self.dra())
        return dataclasses.replace(self._settings, render=render)

    def poke(self) -> None:
        """Ask for a pass now."""
        self._wake.set()

    async def run(self) -> None:
        """Pass after pass until cancelled; an API failure costs one pass, never the loop."""
        await leading.run_passes(
            "runs", self.pass_once, wake=self._wake, interval_s=self.pass_interval_s,
            elector=self.elector, min_gap_s=MIN_PASS_GAP_S,
            failures=lambda loop: self.metrics.pass_failures.labels(loop).inc(),
        )  # fmt: skip

    # ------------------------------------------------------------------ passes
    async def pass_once(self) -> float | None:
        """Decide the runs that are due (see the module docstring); return the seconds until
        a run is next due."""
        items = [i for i in await self.store.list_runs() if self.manages(i)]
        snap, classes = await asyncio.gather(self.snapshot(), self._list_priority_classes())
        counts: dict[tuple[str, str], int] = {}
        settings = self.settings
        if settings != self._decided_with:
            self._decided_with = settings
            self.queue.resync()
        now = self._clock()
        batch = self.queue.take(now.timestamp())
        if self._feed is None or not self._feed.synced:
            batch = workqueue.Batch(everything=True, keys=batch.keys)
        present = {snapshots.key(i) for i in items}
        seen = set().union(self._live, *self._namespaces.values())
        for gone in seen - present:  # deleted (or no longer ours): nothing queued for it
            self._live.discard(gone)
            self.queue.forget(gone)
        self._namespaces = {}
        kept = 0
        for item in items:
            key = snapshots.key(item)
            self._namespaces.setdefault(key[0], set()).add(key)
            if batch.wants(key) or queueing.pending(item, snap, attempt_kind(item)):
                async with self.lock(key):
                    try:
                        item = await self._reconcile(item, snap, classes)  # noqa: PLW2901
                        self.queue.succeeded(key)
                    except leading.NotLeaderError:
                        raise
                    except Exception as err:  # noqa: BLE001  (one bad run must not stop others)
                        log.warning("run reconcile failed", run=f"{key[0]}/{key[1]}",
                                    error=repr(err))  # fmt: skip
                        self.queue.failed(key, self._clock().timestamp())
            else:
                kept += 1
            queue = str((item.get("spec") or {}).get("queue") or specs.DEFAULT_QUEUE)
            phase = str((item.get("status") or {}).get("phase") or records.Phase.PENDING)
            counts[(phase, queue)] = counts.get((phase, queue), 0) + 1
        self.metrics.run_decisions.labels("kept").inc(kept)
        self.metrics.runs.clear()
        for (phase, queue), n in counts.items():
            self.metrics.runs.labels(phase, queue).set(n)
        return self.queue.next_scheduled(self._clock().timestamp())

    def _on_change(self, kind: str, change: informer.Change[Any]) -> None:
        """Queue the runs a cache's change concerns (`queueing.runs_of`)."""
        keys = queueing.runs_of(
            kind, change.key, change.old, change.new, live=self._live, namespaces=self._namespaces
        )
        if keys is queueing.EVERY_RUN:
            self.queue.resync()
        for key in keys:
            self.queue.add(key)

    async def reconcile_now(self, namespace: str, name: str) -> dict[str, Any] | None:
        """Reconcile one run at once (after a submission or a cancel); return it. Only what
        needs no read of its attempt is decided here; the next pass does the rest."""
        async with self.lock((namespace, name)):
            item = await self.store.get_run(namespace, name)
            if item is None or not self.manages(item):
                return item
            result = await self._reconcile(item, None, self._priority_classes)
        self.poke()
        return result

    async def record_checkpoint(
        self, namespace: str, name: str, report: checkpoints.Report
    ) -> dict[str, Any]:
        """Accept a checkpoint report from the run's current attempt: keep it in the status
        (newest `checkpoints_kept`) and rewrite the per-run ConfigMap its pods read as a file.
        Raise RunNotFoundError, or checkpoints.FencedError for a stale or unknown attempt."""
        async with self.lock((namespace, name)):
            item = await self.managed_run(namespace, name)
            old = records.read(item.get("status"), results=False)
            checkpoints.fence(report, old.current_attempt)
            directory = ((item.get("spec") or {}).get("checkpoint") or {}).get("dir")
            path = checkpoints.confine(
                report.path, directory if isinstance(directory, str) else None
            )
            report = dataclasses.replace(report, path=path)
            entry = checkpoints.record(report, self._clock())
            kept = checkpoints.add(old.checkpoints, entry, self.checkpoints_kept)
            await self.write_status(item, old.model_copy(update={"checkpoints": kept}))
            self.elector.ensure_leader()
            body = objects.render_checkpoint_configmap(
                objects.run_ref(item), objects.checkpoint_configmap_name(name), "",
                ca_pem=self.render.ca_pem,
            )  # fmt: skip
            # The CA rides along: the merge patch keeps it, and a re-created map regains it.
            body["data"].update(checkpoints.configmap_data(entry))
            await self.store.write_configmap(body)
        self.metrics.checkpoints.inc()
        log.info("checkpoint", run=f"{namespace}/{name}", attempt=report.attempt,
                 step=report.step, path=report.path)  # fmt: skip
        return checkpoints.wire(entry)

    async def request_resume(
        self, namespace: str, name: str, *, checkpoint: str | None, by: str
    ) -> dict[str, Any]:
        """Start the next attempt of a Failed or Cancelled run by hand (`policy.decide_resume`);
        raise RunNotFoundError, or errors.Conflict when the run has not ended badly."""
        async with self.lock((namespace, name)):
            item = await self.managed_run(namespace, name)
            run = self.run_input(item, None, self._priority_classes)
            plan = policy.decide_resume(run, self.settings, self._clock(), checkpoint=checkpoint,
                                        by=by)  # fmt: skip
            written = await self._execute(item, plan)
        log.info("run resumed", run=f"{namespace}/{name}", by=by, attempt=plan.started[0],
                 resume_from=plan.status.attempts[-1].resume_from)  # fmt: skip
        self.poke()
        return written

    def urgent(self, node: str) -> None:
        """A node was just quarantined: reconcile the runs with pods on it at once, each from
        a snapshot of its own (a full pass reads the whole cluster: too slow to wait for when
        a GPU under a run has failed). Then ask for a full pass, which confirms."""
        task = asyncio.create_task(self._reconcile_runs_on(node), name=f"urgent-{node}")
        self._urgent.add(task)
        task.add_done_callback(self._urgent.discard)

    async def _reconcile_runs_on(self, node: str) -> None:
        try:
            pods = await self.store.list_labelled(
                "Pod", marks.RUN_LABEL, field_selector=f"spec.nodeName={node}"
            )
            hit = sorted(
                {(snapshots.key(p)[0], str(p["metadata"]["labels"][marks.RUN_LABEL])) for p in pods}
            )
            for namespace, name in hit:
                async with self.lock((namespace, name)):
                    item = await self.store.get_run(namespace, name)
                    if item is None or not self.manages(item):
                        continue
                    snap = await self.snapshot_of_run(namespace, name)
                    await self._reconcile(item, snap, self._priority_classes)
        except asyncio.CancelledError:
            raise
        except leading.NotLeaderError:
            return
        except Exception as err:  # noqa: BLE001  (the full pass below tries again)
            log.warning("urgent reconcile failed", node=node, error=repr(err))
        self.poke()

    # ------------------------------------------------------------------ read
    async def snapshot(self) -> snapshots.Snapshot:
        selector = marks.RUN_LABEL
        jobs, rayjobs, pods, workloads, lqs, nodes = await asyncio.gather(
            self.store.list_labelled("Job", selector),
            self._rayjobs(selector),
            self.store.list_labelled("Pod", selector),
            self._workload_views(),
            self.store.list_kueue("localqueues"),
            self.store.list_nodes(),
        )
        return snapshots.index([*jobs, *rayjobs], pods, workloads, lqs, nodes)

    async def snapshot_of_run(self, namespace: str, name: str) -> snapshots.Snapshot:
        """What one run's reconcile reads, and nothing else: its objects and pods, its
        namespace's Workloads and queues, and the nodes its pods are on. (Queue positions
        are then namespace-local; the next full pass corrects them.)"""
        selector = f"{marks.RUN_LABEL}={name}"
        jobs, rayjobs, pods, workloads, lqs = await asyncio.gather(
            self.store.list_labelled("Job", selector),
            self._rayjobs(selector),
            self.store.list_labelled("Pod", selector),
            self.store.list_kueue("workloads", namespace),
            self.store.list_kueue("localqueues", namespace),
        )
        owned = [o for o in [*jobs, *rayjobs] if snapshots.key(o)[0] == namespace]
        pods = [p for p in pods if snapshots.key(p)[0] == namespace]
        on = sorted({str((p.get("spec") or {}).get("nodeName") or "") for p in pods} - {""})
        nodes = await self.store.list_nodes(names=on)
        return snapshots.index(owned, pods, [views.parse_workload(w) for w in workloads], lqs,
                               nodes)  # fmt: skip

    async def _workload_views(self) -> list[views.WorkloadView]:
        """The Workloads as the cache parsed them once, else (no cache, or not synced yet)
        listed and parsed now."""
        cached = self._feed.workload_views() if self._feed is not None else None
        if cached is not None:
            return cast("list[views.WorkloadView]", cached)
        return [views.parse_workload(w) for w in await self.store.list_kueue("workloads")]

    async def _list_priority_classes(self) -> frozenset[str] | None:
        """The WorkloadPriorityClasses, once per pass (None when Kueue cannot list them)."""
        try:
            items = await self.store.list_kueue("workloadpriorityclasses")
        except Exception as err:  # noqa: BLE001  (no Kueue class API: resume unboosted)
            log.warning("cannot list WorkloadPriorityClasses", error=repr(err))
            return self._priority_classes
        found = frozenset(str((c.get("metadata") or {}).get("name", "")) for c in items)
        wanted = self.settings.resume_priority_class
        if wanted and wanted not in found and not self._warned_missing_class:
            log.warning("resume priority class missing; resumed attempts queue normally",
                        priority_class=wanted)  # fmt: skip
            self._warned_missing_class = True
        self._priority_classes = found
        return found

    async def _rayjobs(self, selector: str) -> list[dict[str, Any]]:
        """RayJobs are optional: a cluster without KubeRay lists none (and runs no ray runs).
        The list is started here, not handed in as a coroutine: a pass cancelled before this
        task's first step would leave such a coroutine never awaited."""
        try:
            return list(await self.store.list_labelled("RayJob", selector))
        except Exception:  # noqa: BLE001  (no RayJob CRD: 404)
            return []

    def run_input(
        self,
        item: Mapping[str, Any],
        snap: snapshots.Snapshot | None,
        classes: frozenset[str] | None,
        *,
        visible: positions.QueuePosition | None = None,
    ) -> plans.RunInput:
        """One run's share of what was read (`snap` None: only the TauRun itself)."""
        meta = item.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        status = records.read(item.get("status"), results=False)
        ref, spec = objects.run_ref(item), item.get("spec") or {}
        cancel = bool(annotations.get(marks.CANCEL_ANNOTATION))
        rerun_of = reruns.read_source(annotations)
        if snap is None:
            return plans.RunInput(
                ref=ref, spec=spec, status=status, cancel_requested=cancel, observed=False,
                priority_classes=classes, rerun_of=rerun_of,
            )  # fmt: skip
        seen = snapshots.attempt_of(snap, ref, attempt_kind(item), status.current_attempt)
        workload = seen.workload
        position = visible
        if position is None and workload is not None:
            position = snap.positions.get((ref.namespace, workload.name))
        queue = str(spec.get("queue") or specs.DEFAULT_QUEUE)
        held = None
        if self.gate_message is not None and workload is not None:
            held = self.gate_message(ref.namespace, workload.name)
        return plans.RunInput(
            ref=ref, spec=spec, status=status, cancel_requested=cancel, observed=True,
            attempt_object=seen.attempt_object, workload=workload, pods=seen.pods,
            nodes=snap.nodes, position=position,
            reason_ahead=snap.reasons_ahead.get((ref.namespace, workload.name), "")
            if workload is not None else "",
            cluster_queue=snap.local_queues.get((ref.namespace, queue)), held=held,
            priority_classes=classes, rerun_of=rerun_of,
        )  # fmt: skip

    # ------------------------------------------------------------------ decide, execute
    async def _reconcile(
        self,
        item: dict[str, Any],
        snap: snapshots.Snapshot | None,
        classes: frozenset[str] | None,
    ) -> dict[str, Any]:
        """Bring one run a step closer to its spec; return it as last written. Queue it
        again: next pass when the step wrote something (it is read back), at its
        `requeue_at` otherwise."""
        key = snapshots.key(item)
        run = self.run_input(item, snap, classes)
        workload = run.workload
        if snap is not None and workload is not None and workload.pending:
            visible = await self.visibility_position(
                run.ref.namespace, str(run.spec.get("queue") or specs.DEFAULT_QUEUE), workload.name
            )
            if visible is not None:
                run = self.run_input(item, snap, classes, visible=visible)
        plan = policy.decide_run(run, self.settings, self._clock())
        self.metrics.run_decisions.labels("decided").inc()
        result = await self._execute(item, plan)
        if snap is not None and policy.settled(run, plan):
            self._live.discard(key)
        else:
            self._live.add(key)
        if result is not item or not policy.steady(run, plan):
            self.queue.add(key)
        at = plan.requeue_at
        self.queue.due_at(key, at.timestamp() if at is not None else None)
        return result

    async def _execute(self, item: dict[str, Any], plan: plans.RunPlan) -> dict[str, Any]:
        """Carry a plan out: its writes in order, then the status; count what it decided."""
        namespace, name = snapshots.key(item)
        try:
            annotated = await self.attempts.apply(objects.run_ref(item), plan)
            if annotated is not None:
                item = annotated
        except errors.NameTaken as err:
            # Somebody else's object holds a name this run needs (review M4): the run
            # cannot go on without writing into it, so it ends, saying which.
            log.warning("run name taken", run=f"{namespace}/{name}", problem=err.message)
            status = policy.refused(plan.status, "NameTaken", err.message, self._clock())
            return await self.write_status(item, status)
        except errors.AdmissionRefused as err:
            # The cluster's admission refused an object of the run (the controller's policy:
            # a Secret its namespace does not list for runs, say): no retry changes that.
            log.warning("run refused", run=f"{namespace}/{name}", problem=err.message)
            status = policy.refused(plan.status, "AdmissionRefused", err.message, self._clock())
            return await self.write_status(item, status)
        for attempt in plan.started:
            self.metrics.run_attempts.labels("started").inc()
            log.info("attempt started", run=f"{namespace}/{name}", attempt=attempt)
        if plan.ended is not None:
            self.metrics.run_attempts.labels(plan.ended).inc()
        if plan.resumed is not None:
            self.metrics.run_resumes.labels(plan.resumed).inc()
        if plan.queue_wait_s is not None:
            self.metrics.run_queue_seconds.observe(plan.queue_wait_s)
        return await self.write_status(item, plan.status)

    async def visibility_position(
        self, namespace: str, queue: str, workload: str
    ) -> positions.QueuePosition | None:
        """Ask Kueue's visibility API for one Workload's position (None when it cannot)."""
        items = await self.store.pending_workloads(namespace, queue)
        if items is None:
            return None
        return positions.position_from_visibility(items, namespace, workload)

    async def write_status(self, item: dict[str, Any], status: records.RunStatus) -> dict[str, Any]:
        """Patch the status with what changed (nothing when nothing did)."""
        # The results are written by the collector alone (with them in `status`); a status
        # read without them patches everything else and leaves them as they are.
        raw = item.get("status")
        stored = records.read(raw, results=status.results is not None)
        if records.stored_alike(stored, status):
            return item
        old, new = records.wire(stored), records.wire(status)
        self.elector.ensure_leader()
        namespace, name = snapshots.key(item)
        written = await self.store.patch_run_status(namespace, name, records.patch_body(old, new))
        if written is None:
            return item
        if new.get("phase") != old.get("phase"):
            log.info("run phase", run=f"{namespace}/{name}", phase=new.get("phase"),
                     attempt=new.get("currentAttempt"), reason=new.get("reason"))  # fmt: skip
        return written

    # ------------------------------------------------------------------ helpers
    async def managed_run(self, namespace: str, name: str) -> dict[str, Any]:
        """The run, read fresh; RunNotFoundError when it is gone or another manager's."""
        item = await self.store.get_run(namespace, name)
        if item is None or not self.manages(item):
            raise RunNotFoundError(namespace, name)
        return item

    def manages(self, item: Mapping[str, Any]) -> bool:
        """Whether this reconciler is the run's manager (see `marks.MANAGED_BY_ANNOTATION`)."""
        return manages(item, self.manager)

    def lock(self, key: tuple[str, str]) -> asyncio.Lock:
        return self._locks.setdefault(key, asyncio.Lock())


def manages(item: Mapping[str, Any], manager: str) -> bool:
    """Whether `manager` manages the TauRun (its `taugrid.dev/managed-by`, else the default)."""
    annotations = (item.get("metadata") or {}).get("annotations") or {}
    return bool(annotations.get(marks.MANAGED_BY_ANNOTATION, marks.DEFAULT_RUN_MANAGER) == manager)


def attempt_kind(item: Mapping[str, Any]) -> str:
    """The kind of a raw TauRun's attempt objects (RayJob for ray runs, else Job)."""
    kind = str((item.get("spec") or {}).get("kind") or specs.RunKind.JOB)
    return "RayJob" if kind == str(specs.RunKind.RAY) else "Job"
