"""The run reconciler: read → decide → execute → patch status, for every TauRun.

Level-triggered, like the quarantine and admission loops: each pass lists the TauRuns and
everything they own (Jobs, RayJobs, pods, Kueue Workloads and queues, nodes, the
WorkloadPriorityClasses), turns one run's share of it into a `policy.RunInput`, asks the pure
`policy.decide_run` what to do, and carries the plan out (`attempts.Attempts`), writing the
status through the status subresource only when it changed. It never branches on which event
woke it: a pass, a submission (`reconcile_now`) and a quarantine (`urgent`) decide alike.

Submissions and cancels are reconciled at once (the API calls `reconcile_now`), so a
`POST /v1/runs` returns with its Job already created. Only the leader reconciles, and every
write checks that the lease is still held.

The store answers the pass's lists from watch-fed caches while this replica leads (see
`controller.kube.runs`), and a change in them pokes a pass: a Job or pod that changes is
reacted to at once, not at the next interval. Pokes coalesce (one pass answers every poke
that came during the one before) and passes are spaced `MIN_PASS_GAP_S` apart, so a storm
of pod updates costs a few passes a second, not one per update. A TauRun whose cached copy
is older than what this replica last wrote of it is read again (`_stale`), so a lagging
cache never makes a pass act twice.

A cluster's history costs a pass little: a finished run whose last step wrote nothing
(`policy.settled`) is not decided again while its TauRun keeps its resourceVersion, the
settings stay the same and its TTL has not come, since a finished run's step reads nothing
but its TauRun. Only its phase is counted.

Nor do live runs that stand still: each raw object is parsed once while the cache keeps it
(`snapshots.Views`), and a run whose last step wrote nothing (`policy.steady`) is not
decided again while its whole `RunInput` stays equal (`policy.same_input`), the settings
stay the same and its `requeue_at` has not come: `decide_run` is a function of those and
the clock, and `requeue_at` is when its reading of the clock changes. So a pass decides the
runs whose objects, queue position, gate word or nodes changed. Every
`full_pass_interval_s` a pass forgets both and decides every run: the safety net.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

import structlog

from controller import errors, leading, marks, metrics
from controller.runs import (
    attempts,
    checkpoints,
    collecting,
    objects,
    policy,
    positions,
    records,
    rendering,
    reruns,
    results,
    snapshots,
)
from shared import spec as specs

log = structlog.get_logger()

MIN_PASS_GAP_S = 0.5
"""The least time between two passes that pokes ask for (cache changes, submissions): a
storm of pod updates costs at most two passes a second. The interval is not lengthened."""
FULL_PASS_INTERVAL_S = 30.0
"""How often a pass decides every run again, kept ones included (the chart's
`fullPassIntervalS`, shared with the quarantine pass)."""


class RunNotFoundError(errors.NotFound):
    """The TauRun does not exist (or another manager owns it)."""

    def __init__(self, namespace: str, name: str) -> None:
        super().__init__(f"no run named {name!r} in namespace {namespace}", field="name")


class RunStore(attempts.ObjectStore, Protocol):
    """What the reconciler reads and writes (`controller.kube.runs.RunStore` implements it)."""

    async def get_run(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A TauRun, None when it does not exist."""
        ...

    async def list_runs(self, namespace: str | None = None) -> list[dict[str, Any]]:
        """Every TauRun (of a namespace)."""
        ...

    async def patch_run_status(
        self, namespace: str, name: str, status: dict[str, Any]
    ) -> dict[str, Any] | None:
        """Merge-patch a TauRun's status; None when it is gone."""
        ...

    async def list_labelled(
        self, kind: str, selector: str, *, field_selector: str = ""
    ) -> list[dict[str, Any]]:
        """Jobs, RayJobs or Pods with a label selector."""
        ...

    async def list_kueue(self, plural: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """Kueue objects of one plural (of a namespace)."""
        ...

    async def list_nodes(self, names: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """Nodes (metadata), all or the named ones."""
        ...

    async def pending_workloads(
        self, namespace: str, local_queue: str
    ) -> list[dict[str, Any]] | None:
        """Kueue's visibility API for a LocalQueue; None when it does not answer."""
        ...

    async def write_configmap(self, body: dict[str, Any]) -> None:
        """Merge a ConfigMap's data, creating it when missing."""
        ...


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class Reconciler:
    """Drive every TauRun towards its spec; see the module docstring."""

    def __init__(
        self,
        store: RunStore,
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
        self._settings = policy.RunSettings(
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
        self._wake = asyncio.Event()
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._written: dict[tuple[str, str], int] = {}
        self._settled: dict[tuple[str, str], Settled] = {}
        """Finished runs whose last step wrote nothing (`policy.settled`): a pass skips each
        while its TauRun and the settings stay as they were and its TTL has not come."""
        self._steady: dict[tuple[str, str], Steady] = {}
        """Live runs whose last step wrote nothing (`policy.steady`): a pass skips each while
        its input and the settings stay equal and its `requeue_at` has not come."""
        self._views = snapshots.Views()
        self._kept = 0
        """Runs kept (not decided again) in the pass under way: counted once it ends."""
        self.full_pass_interval_s = full_pass_interval_s
        self._full_at: dt.datetime | None = None
        """When a pass last decided every run (None: none has yet)."""
        self._urgent: set[asyncio.Task[None]] = set()
        self._priority_classes: frozenset[str] | None = None
        self._warned_missing_class = False
        self.collector = collecting.Collector(
            self, flush_s=results_flush_s, limits=results_limits or results.Limits(),
            pending_max=results_pending_max, clock=clock,
        )  # fmt: skip
        """Results reports, buffered and written in batches."""

    @property
    def settings(self) -> policy.RunSettings:
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
        """Reconcile every TauRun once; return the seconds until a run is next due."""
        items = [i for i in await self.store.list_runs() if self.manages(i)]
        snap, classes = await asyncio.gather(self.snapshot(), self._list_priority_classes())
        counts: dict[tuple[str, str], int] = {}
        due: list[dt.datetime] = []
        settings = self.settings
        now = self._clock()
        if self._full_at is None or (now - self._full_at).total_seconds() >= (
            self.full_pass_interval_s
        ):
            self._full_at = now
            self._settled.clear()
            self._steady.clear()
        present = {snapshots.key(i) for i in items}
        for kept in (self._settled, self._steady):
            for gone in [k for k in kept if k not in present]:
                del kept[gone]
        for item in items:
            key = snapshots.key(item)
            async with self.lock(key):
                if self._stale(key, item):
                    fresh = await self.store.get_run(*key)
                    if fresh is None:
                        continue
                    item = fresh  # noqa: PLW2901  (the newer copy replaces the listed one)
                known = self._settled.get(key)
                if known is not None and known.holds(item, settings, self._clock()):
                    result, at = item, known.requeue_at
                    self._kept += 1
                else:
                    self._settled.pop(key, None)
                    try:
                        result, at = await self._reconcile(item, snap, classes, keep=True)
                    except leading.NotLeaderError:
                        raise
                    except Exception as err:  # noqa: BLE001  (one bad run must not stop others)
                        log.warning("run reconcile failed", run=f"{key[0]}/{key[1]}",
                                    error=repr(err))  # fmt: skip
                        result, at = item, None
            if at is not None:
                due.append(at)
            status = result.get("status") or {}
            queue = str((result.get("spec") or {}).get("queue") or specs.DEFAULT_QUEUE)
            phase = str(status.get("phase") or records.Phase.PENDING)
            counts[(phase, queue)] = counts.get((phase, queue), 0) + 1
        self._views.sweep()
        self.metrics.run_decisions.labels("kept").inc(self._kept)
        self._kept = 0
        self.metrics.runs.clear()
        for (phase, queue), n in counts.items():
            self.metrics.runs.labels(phase, queue).set(n)
        return (min(due) - self._clock()).total_seconds() if due else None

    async def reconcile_now(self, namespace: str, name: str) -> dict[str, Any] | None:
        """Reconcile one run at once (after a submission or a cancel); return it. Only what
        needs no read of its attempt is decided here; the next pass does the rest."""
        async with self.lock((namespace, name)):
            item = await self.store.get_run(namespace, name)
            if item is None or not self.manages(item):
                return item
            result, _ = await self._reconcile(item, None, self._priority_classes)
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
            new = old.model_copy(
                update={
                    "checkpoints": checkpoints.add(old.checkpoints, entry, self.checkpoints_kept)
                }
            )
            await self.write_status(item, new)
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
            self._optional(self.store.list_labelled("RayJob", selector)),
            self.store.list_labelled("Pod", selector),
            self.store.list_kueue("workloads"),
            self.store.list_kueue("localqueues"),
            self.store.list_nodes(),
        )
        return snapshots.index([*jobs, *rayjobs], pods, workloads, lqs, nodes, known=self._views)

    async def snapshot_of_run(self, namespace: str, name: str) -> snapshots.Snapshot:
        """What one run's reconcile reads, and nothing else: its objects and pods, its
        namespace's Workloads and queues, and the nodes its pods are on. (Queue positions
        are then namespace-local; the next full pass corrects them.)"""
        selector = f"{marks.RUN_LABEL}={name}"
        jobs, rayjobs, pods, workloads, lqs = await asyncio.gather(
            self.store.list_labelled("Job", selector),
            self._optional(self.store.list_labelled("RayJob", selector)),
            self.store.list_labelled("Pod", selector),
            self.store.list_kueue("workloads", namespace),
            self.store.list_kueue("localqueues", namespace),
        )
        owned = [o for o in [*jobs, *rayjobs] if snapshots.key(o)[0] == namespace]
        pods = [p for p in pods if snapshots.key(p)[0] == namespace]
        on = sorted({str((p.get("spec") or {}).get("nodeName") or "") for p in pods} - {""})
        nodes = await self.store.list_nodes(names=on)
        return snapshots.index(owned, pods, workloads, lqs, nodes, known=self._views)

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

    @staticmethod
    async def _optional(call: Any) -> list[dict[str, Any]]:
        """RayJobs are optional: a cluster without KubeRay lists none (and runs no ray runs)."""
        try:
            return list(await call)
        except Exception:  # noqa: BLE001  (no RayJob CRD: 404)
            return []

    def run_input(
        self,
        item: Mapping[str, Any],
        snap: snapshots.Snapshot | None,
        classes: frozenset[str] | None,
        *,
        visible: positions.QueuePosition | None = None,
    ) -> policy.RunInput:
        """One run's share of what was read (`snap` None: only the TauRun itself)."""
        meta = item.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        status = self._views.status(item.get("status"))
        ref, spec = objects.run_ref(item), item.get("spec") or {}
        cancel = bool(annotations.get(marks.CANCEL_ANNOTATION))
        rerun_of = reruns.read_source(annotations)
        if snap is None:
            return policy.RunInput(
                ref=ref, spec=spec, status=status, cancel_requested=cancel, observed=False,
                priority_classes=classes, rerun_of=rerun_of,
            )  # fmt: skip
        seen = snapshots.attempt_of(
            snap, ref, attempt_kind(item), status.current_attempt, known=self._views
        )
        workload = seen.workload
        position = visible
        if position is None and workload is not None:
            position = snap.positions.get((ref.namespace, workload.name))
        queue = str(spec.get("queue") or specs.DEFAULT_QUEUE)
        held = None
        if self.gate_message is not None and workload is not None:
            held = self.gate_message(ref.namespace, workload.name)
        return policy.RunInput(
            ref=ref, spec=spec, status=status, cancel_requested=cancel, observed=True,
            attempt_object=seen.attempt_object, workload=workload, pods=seen.pods,
            nodes=snap.nodes, position=position,
            cluster_queue=snap.local_queues.get((ref.namespace, queue)), held=held,
            priority_classes=classes, rerun_of=rerun_of,
        )  # fmt: skip

    # ------------------------------------------------------------------ decide, execute
    async def _reconcile(
        self,
        item: dict[str, Any],
        snap: snapshots.Snapshot | None,
        classes: frozenset[str] | None,
        *,
        keep: bool = False,
    ) -> tuple[dict[str, Any], dt.datetime | None]:
        """Bring one run a step closer to its spec; return it as last written, and when it
        is next due. `keep` (a pass over every run): skip a live run whose input is what a
        step that wrote nothing read (`Steady`), and remember such a step."""
        key = snapshots.key(item)
        run = self.run_input(item, snap, classes)
        workload = run.workload
        if snap is not None and workload is not None and workload.pending:
            visible = await self.visibility_position(
                run.ref.namespace, str(run.spec.get("queue") or specs.DEFAULT_QUEUE), workload.name
            )
            if visible is not None:
                run = self.run_input(item, snap, classes, visible=visible)
        settings, now = self.settings, self._clock()
        steady = self._steady.pop(key, None) if keep else None
        if steady is not None and steady.holds(run, settings, now):
            self._steady[key] = steady
            self._kept += 1
            return item, steady.requeue_at
        plan = policy.decide_run(run, settings, now)
        self.metrics.run_decisions.labels("decided").inc()
        result = await self._execute(item, plan)
        if snap is not None and result is item and policy.settled(run, plan):
            self._settled[key] = Settled(resource_version(item), settings, plan.requeue_at)
        elif keep and snap is not None and result is item and policy.steady(run, plan):
            self._steady[key] = Steady(run, settings, plan.requeue_at)
        return result, plan.requeue_at

    async def _execute(self, item: dict[str, Any], plan: policy.RunPlan) -> dict[str, Any]:
        """Carry a plan out: its writes in order, then the status; count what it decided."""
        namespace, name = snapshots.key(item)
        try:
            annotated = await self.attempts.apply(objects.run_ref(item), plan)
            if annotated is not None:
                item = annotated
                self._note_written(item)
        except errors.NameTaken as err:
            # Somebody else's object holds a name this run needs (review M4): the run
            # cannot go on without writing into it, so it ends, saying which.
            log.warning("run name taken", run=f"{namespace}/{name}", problem=err.message)
            status = policy.name_taken(plan.status, err.message, self._clock())
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
        stored = (
            self._views.status(raw) if status.results is None else records.read(raw, results=True)
        )
        if records.stored_alike(stored, status):
            return item
        old, new = records.wire(stored), records.wire(status)
        self.elector.ensure_leader()
        namespace, name = snapshots.key(item)
        written = await self.store.patch_run_status(namespace, name, records.patch_body(old, new))
        if written is None:
            return item
        self._note_written(written)
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

    def _note_written(self, written: Mapping[str, Any]) -> None:
        """Remember the version of a TauRun this replica wrote: an older copy is stale."""
        rv = str((written.get("metadata") or {}).get("resourceVersion", ""))
        if rv.isdigit():
            self._written[snapshots.key(written)] = int(rv)

    def _stale(self, key: tuple[str, str], item: Mapping[str, Any]) -> bool:
        written = self._written.get(key)
        if written is None:
            return False
        rv = str((item.get("metadata") or {}).get("resourceVersion", ""))
        return not rv.isdigit() or int(rv) < written


@dataclasses.dataclass(frozen=True, slots=True)
class Settled:
    """A finished run decided with nothing to write (`policy.settled`), and what that
    decision read: the TauRun's resourceVersion and the settings; it holds until its TTL."""

    resource_version: str
    settings: policy.RunSettings
    requeue_at: dt.datetime | None

    def holds(
        self, item: Mapping[str, Any], settings: policy.RunSettings, now: dt.datetime
    ) -> bool:
        """Whether deciding `item` at `now` again would decide the same (nothing to write)."""
        return (
            bool(self.resource_version)
            and resource_version(item) == self.resource_version
            and settings == self.settings
            and (self.requeue_at is None or now < self.requeue_at)
        )


@dataclasses.dataclass(frozen=True, slots=True)
class Steady:
    """A live run decided with nothing to write (`policy.steady`), the input and settings
    that decision read, and until when it holds."""

    run: policy.RunInput
    settings: policy.RunSettings
    requeue_at: dt.datetime | None

    def holds(self, run: policy.RunInput, settings: policy.RunSettings, now: dt.datetime) -> bool:
        """Whether deciding `run` at `now` again would decide the same (nothing to write)."""
        return (
            (self.requeue_at is None or now < self.requeue_at)
            and settings == self.settings
            and policy.same_input(run, self.run)
        )


def resource_version(item: Mapping[str, Any]) -> str:
    """A raw object's resourceVersion ('' when it has none)."""
    return str((item.get("metadata") or {}).get("resourceVersion") or "")


def manages(item: Mapping[str, Any], manager: str) -> bool:
    """Whether `manager` manages the TauRun (its `taugrid.dev/managed-by`, else the default)."""
    annotations = (item.get("metadata") or {}).get("annotations") or {}
    return bool(annotations.get(marks.MANAGED_BY_ANNOTATION, marks.DEFAULT_RUN_MANAGER) == manager)


def attempt_kind(item: Mapping[str, Any]) -> str:
    """The kind of a raw TauRun's attempt objects (RayJob for ray runs, else Job)."""
    kind = str((item.get("spec") or {}).get("kind") or specs.RunKind.JOB)
    return "RayJob" if kind == str(specs.RunKind.RAY) else "Job"
