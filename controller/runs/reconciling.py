"""The run reconciler: from TauRun to attempt objects and back to the TauRun's status.

Level-triggered: each pass lists the TauRuns and everything they own (Jobs, RayJobs, pods,
Kueue Workloads and queues, nodes), asks the pure `controller.runs` what each run's state
is, and writes the difference: objects to create or delete, and the status (through the
status subresource, only when it changed). It never branches on which event happened.

Submissions and cancels are reconciled at once by `reconcile_now` (the API calls it), so a
`POST /v1/runs` returns with its Job already created; everything else is picked up by the
next pass (`run_pass_interval_s`). Only the leader reconciles, and every write checks that
the lease is still held. A run is ended by the controller itself when it fails (its object is
deleted before a retry is created), so two attempts never run at once.
"""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from controller import errors, leading, marks, metrics, timestamps
from controller.kube import runs as kube_runs
from controller.runs import (
    attempts,
    checkpoints,
    lifecycle,
    objects,
    positions,
    rendering,
    snapshots,
    views,
)
from shared import spec as specs

log = structlog.get_logger()


class RunNotFoundError(errors.NotFound):
    """The TauRun does not exist (or another manager owns it)."""

    def __init__(self, namespace: str, name: str) -> None:
        super().__init__(f"no run named {name!r} in namespace {namespace}", field="name")


class ResumeRefusedError(errors.Conflict):
    """A manual resume the run's state does not allow."""

    default_code = "NotResumable"

    def __init__(self, message: str) -> None:
        super().__init__(message, field="name")


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class Reconciler:
    """Drive every TauRun towards its spec; see the module docstring."""

    def __init__(
        self,
        store: kube_runs.RunStore,
        elector: leading.Elector,
        metrics_: metrics.ControllerMetrics,
        render: rendering.RenderSettings,
        *,
        pass_interval_s: float,
        ttl_after_finished_s: float | None,
        pod_annotations: Mapping[str, str] | None = None,
        manager: str = marks.DEFAULT_RUN_MANAGER,
        resume_priority_class: str = "",
        checkpoints_kept: int = checkpoints.DEFAULT_KEEP,
        gate_message: Callable[[str, str], str | None] | None = None,
        clock: Callable[[], dt.datetime] = _now,
    ) -> None:
        self.store = store
        self.elector = elector
        self.metrics = metrics_
        self.render = render
        self.pass_interval_s = pass_interval_s
        self.ttl_after_finished_s = ttl_after_finished_s
        self.pod_annotations = dict(pod_annotations or {})
        self.manager = manager
        self.resume_priority_class = resume_priority_class
        self.checkpoints_kept = checkpoints_kept
        self.gate_message = gate_message
        """Why our AdmissionCheck holds a Workload back, by (namespace, Workload name)."""
        self.attempts = attempts.Attempts(
            store, elector, metrics_, render, ttl_after_finished_s=ttl_after_finished_s,
            pod_annotations=pod_annotations,
        )  # fmt: skip
        self._clock = clock
        self._wake = asyncio.Event()
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._written: dict[tuple[str, str], int] = {}
        self._urgent: set[asyncio.Task[None]] = set()

    def poke(self) -> None:
        """Ask for a pass now."""
        self._wake.set()

    async def run(self) -> None:
        """Pass after pass until cancelled; an API failure costs one pass, never the loop."""
        await leading.run_passes(
            "runs", self._pass, wake=self._wake, interval_s=self.pass_interval_s,
            elector=self.elector,
            failures=lambda loop: self.metrics.pass_failures.labels(loop).inc(),
        )  # fmt: skip

    async def _pass(self) -> None:
        await self.pass_once()

    # ------------------------------------------------------------------ passes
    async def pass_once(self) -> None:
        """Reconcile every TauRun once."""
        items = [i for i in await self.store.list_runs() if self.manages(i)]
        snap = await self._snapshot(items)
        counts: dict[tuple[str, str], int] = {}
        for item in items:
            key = snapshots.key(item)
            async with self._lock(key):
                if self._stale(key, item):
                    fresh = await self.store.get_run(*key)
                    if fresh is None:
                        continue
                    item = fresh  # noqa: PLW2901  (the newer copy replaces the listed one)
                try:
                    result = await self._reconcile(item, snap)
                except leading.NotLeaderError:
                    raise
                except Exception as err:  # noqa: BLE001  (one bad run must not stop the others)
                    log.warning("run reconcile failed", run=f"{key[0]}/{key[1]}", error=repr(err))
                    result = item
            status = (result or item).get("status") or {}
            queue = str(((result or item).get("spec") or {}).get("queue") or specs.DEFAULT_QUEUE)
            phase = str(status.get("phase") or lifecycle.Phase.PENDING)
            counts[(phase, queue)] = counts.get((phase, queue), 0) + 1
        self.metrics.runs.clear()
        for (phase, queue), n in counts.items():
            self.metrics.runs.labels(phase, queue).set(n)

    async def reconcile_now(self, namespace: str, name: str) -> dict[str, Any] | None:
        """Reconcile one run at once (after a submission or a cancel); return it."""
        key = (namespace, name)
        async with self._lock(key):
            item = await self.store.get_run(namespace, name)
            if item is None or not self.manages(item):
                return item
            result = await self._reconcile(item, None)
        self.poke()
        return result

    async def record_checkpoint(
        self, namespace: str, name: str, report: checkpoints.Report
    ) -> dict[str, Any]:
        """Accept a checkpoint report from the run's current attempt: keep it in the status
        (newest `checkpoints_kept`) and rewrite the per-run ConfigMap its pods read as a file.
        Raise RunNotFoundError, or checkpoints.FencedError for a stale or unknown attempt."""
        async with self._lock((namespace, name)):
            item = await self._managed_run(namespace, name)
            old = item.get("status") or {}
            checkpoints.fence(report, int(old.get("currentAttempt") or 0))
            entry = checkpoints.record(report, self._clock())
            status = copy.deepcopy(old)
            status["checkpoints"] = checkpoints.add(
                old.get("checkpoints") or [], entry, self.checkpoints_kept
            )
            await self._write(item, old, status)
            self.elector.ensure_leader()
            body = objects.render_checkpoint_configmap(
                objects.run_ref(item),
                objects.checkpoint_configmap_name(name),
                "",
                ca_pem=self.render.ca_pem,
            )
            # The CA rides along: the merge patch keeps it, and a re-created map regains it.
            body["data"].update(checkpoints.configmap_data(entry))
            await self.store.write_configmap(body)
        self.metrics.checkpoints.inc()
        log.info("checkpoint", run=f"{namespace}/{name}", attempt=report.attempt,
                 step=report.step, path=report.path)  # fmt: skip
        return entry

    async def request_resume(
        self, namespace: str, name: str, *, checkpoint: str | None, by: str
    ) -> dict[str, Any]:
        """Start the next attempt of a Failed or Cancelled run by hand, from `checkpoint`
        (else the latest reported one). It gets a fresh `retry.maxAttempts` budget.
        Raise RunNotFoundError, or ResumeRefusedError when the run has not ended badly."""
        async with self._lock((namespace, name)):
            item = await self._managed_run(namespace, name)
            old = item.get("status") or {}
            refusal = lifecycle.resume_refusal(
                name, str(old.get("phase") or lifecycle.Phase.PENDING)
            )
            if refusal:
                raise ResumeRefusedError(refusal)
            try:
                spec = specs.validate_spec(item.get("spec") or {}).spec
            except specs.SpecError as err:
                msg = f"run {name!r} cannot be resumed: its spec is not valid ({err})"
                raise ResumeRefusedError(msg) from err
            annotations = (item.get("metadata") or {}).get("annotations") or {}
            if annotations.get(marks.CANCEL_ANNOTATION):
                self.elector.ensure_leader()
                cleared = await self.store.annotate_run(
                    namespace, name, {marks.CANCEL_ANNOTATION: None}
                )
                item = cleared or item
            now = self._clock()
            status = lifecycle.reopened(old, by=by, now=now)
            current = int(status.get("currentAttempt") or 0)
            latest = checkpoints.latest(status)
            start_from = checkpoint if checkpoint is not None else (
                str(latest.get("path", "")) if latest else "")  # fmt: skip
            await self.attempts.ensure_run_objects(objects.run_ref(item), status)
            await self.attempts.start(spec, objects.run_ref(item), status, current + 1, now,
                                      resume_from=start_from)  # fmt: skip
            status["message"] = (
                f"resumed by {by} from {start_from or 'the start (no checkpoint)'}; attempt"
                f" {current + 1} submitted to queue {spec.queue!r}"
            )
            written = await self._write(item, old, status)
        log.info("run resumed", run=f"{namespace}/{name}", by=by, attempt=current + 1,
                 resume_from=start_from)  # fmt: skip
        self.poke()
        return written

    async def _managed_run(self, namespace: str, name: str) -> dict[str, Any]:
        """The run, read fresh; RunNotFoundError when it is gone or another manager's."""
        item = await self.store.get_run(namespace, name)
        if item is None or not self.manages(item):
            raise RunNotFoundError(namespace, name)
        return item

    def manages(self, item: Mapping[str, Any]) -> bool:
        """Whether this reconciler is the run's manager (see `marks.MANAGED_BY_ANNOTATION`)."""
        annotations = (item.get("metadata") or {}).get("annotations") or {}
        return bool(
            annotations.get(marks.MANAGED_BY_ANNOTATION, marks.DEFAULT_RUN_MANAGER) == self.manager
        )

    def _lock(self, key: tuple[str, str]) -> asyncio.Lock:
        return self._locks.setdefault(key, asyncio.Lock())

    def _stale(self, key: tuple[str, str], item: Mapping[str, Any]) -> bool:
        written = self._written.get(key)
        if written is None:
            return False
        rv = str((item.get("metadata") or {}).get("resourceVersion", ""))
        return not rv.isdigit() or int(rv) < written

    async def _snapshot(self, items: list[dict[str, Any]]) -> snapshots.Snapshot:
        selector = marks.RUN_LABEL
        jobs, rayjobs, pods, workloads, lqs, nodes = await asyncio.gather(
            self.store.list_labelled("Job", selector),
            self._optional(self.store.list_labelled("RayJob", selector)),
            self.store.list_labelled("Pod", selector),
            self.store.list_kueue("workloads"),
            self.store.list_kueue("localqueues"),
            self.store.list_nodes(),
        )
        return snapshots.index([*jobs, *rayjobs], pods, workloads, lqs, nodes)

    async def _snapshot_of_run(self, namespace: str, name: str) -> snapshots.Snapshot:
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
        return snapshots.index(owned, pods, workloads, lqs, nodes)

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
                async with self._lock((namespace, name)):
                    item = await self.store.get_run(namespace, name)
                    if item is None or not self.manages(item):
                        continue
                    await self._reconcile(item, await self._snapshot_of_run(namespace, name))
        except asyncio.CancelledError:
            raise
        except leading.NotLeaderError:
            return
        except Exception as err:  # noqa: BLE001  (the full pass below tries again)
            log.warning("urgent reconcile failed", node=node, error=repr(err))
        self.poke()

    @staticmethod
    async def _optional(call: Any) -> list[dict[str, Any]]:
        """RayJobs are optional: a cluster without KubeRay lists none (and runs no ray runs)."""
        try:
            return list(await call)
        except Exception:  # noqa: BLE001  (no RayJob CRD: 404)
            return []

    # ------------------------------------------------------------------ one run
    async def _reconcile(
        self, item: dict[str, Any], snap: snapshots.Snapshot | None
    ) -> dict[str, Any] | None:
        """Bring one run a step closer to its spec; return the run as last written."""
        now = self._clock()
        namespace, name = snapshots.key(item)
        meta = item.get("metadata") or {}
        old = item.get("status") or {}
        status: dict[str, Any] = copy.deepcopy(old)
        status.setdefault("conditions", [])
        status.setdefault("attempts", [])
        phase = lifecycle.Phase(status.get("phase") or lifecycle.Phase.PENDING)
        try:
            spec = specs.validate_spec(item.get("spec") or {}).spec
        except specs.SpecError as err:
            if phase not in lifecycle.TERMINAL_PHASES:
                status.update(
                    phase=lifecycle.Phase.FAILED,
                    reason="InvalidSpec",
                    endTime=timestamps.rfc3339(now),
                    message=f"the spec is not valid: {err}",
                )
                lifecycle.set_phase_condition(
                    status["conditions"], lifecycle.Phase.FAILED, "InvalidSpec", str(err), now
                )
            return await self._write(item, old, status)
        ref = objects.RunRef(name=name, namespace=namespace, uid=str(meta.get("uid", "")))
        current = int(status.get("currentAttempt") or 0)

        if phase in lifecycle.TERMINAL_PHASES:
            await self.attempts.cleanup(spec, ref, status, now)
            return await self._write(item, old, status)

        if (meta.get("annotations") or {}).get(marks.CANCEL_ANNOTATION):
            await self.attempts.delete(spec, ref, current)
            lifecycle.end(status, lifecycle.Phase.CANCELLED, "Cancelled",
                      "cancelled on request; its quota is freed", now=now)  # fmt: skip
            if status["attempts"]:
                status["attempts"][-1].setdefault("endTime", timestamps.rfc3339(now))
                status["attempts"][-1]["phase"] = lifecycle.Phase.CANCELLED
            return await self._write(item, old, status)

        if current == 0:
            await self.attempts.ensure_run_objects(ref, status)
            await self.attempts.start(spec, ref, status, 1, now)
            return await self._write(item, old, status)

        if snap is None:  # a fast path caller: the next pass does the rest
            return item

        kind = "RayJob" if spec.kind == specs.RunKind.RAY else "Job"
        obj_name = objects.attempt_name(name, current)
        raw_obj = snap.objects.get((namespace, kind, obj_name))
        workload = snap.workloads.get((namespace, kind, obj_name))
        pods = [views.parse_pod(p) for p in snap.pods.get((namespace, name, current), [])]
        record = status["attempts"][-1] if status["attempts"] else {"number": current}

        if phase == lifecycle.Phase.RESUMING:
            await self._resume_if_due(spec, ref, status, record, now)
            return await self._write(item, old, status)

        if raw_obj is None:
            # Gone while the attempt lives (listed before it was created, or deleted by
            # hand): make sure it exists; a 409 means it was there all along.
            await self.attempts.create(spec, ref, current, status)
        obj = views.parse_attempt_object(raw_obj) if raw_obj is not None else None
        outcome = lifecycle.attempt_outcome(obj, workload, pods, snap.nodes)
        record = lifecycle.attempt_record(
            current, object_kind=kind, object_name=obj_name, outcome=outcome,
            workload=workload, previous=record,
        )  # fmt: skip
        status["attempts"][-1:] = [record]
        status["evidence"] = lifecycle.evidence(
            spec, namespace, attempts=status["attempts"], pods=pods, workload=workload,
            previous=status.get("evidence"),
        )  # fmt: skip
        first_start = timestamps.parse(status["attempts"][0].get("startTime"))
        if (
            lifecycle.timed_out(spec, first_start, now)
            and outcome.phase not in lifecycle.TERMINAL_PHASES
        ):
            await self.attempts.delete(spec, ref, current)
            record.update(phase=lifecycle.Phase.FAILED, failureClass=specs.FailureClass.TIMEOUT,
                          endTime=timestamps.rfc3339(now))  # fmt: skip
            self.metrics.run_attempts.labels(str(specs.FailureClass.TIMEOUT)).inc()
            lifecycle.end(status, lifecycle.Phase.FAILED, "Timeout",
                      f"the run exceeded its timeout of {spec.timeout}", now=now)  # fmt: skip
            return await self._write(item, old, status)
        waited = lifecycle.phase_conditions(status, outcome, workload, now)
        if waited is not None:
            self.metrics.run_queue_seconds.observe(waited)
        visible = None
        if outcome.phase == lifecycle.Phase.QUEUED and workload is not None and workload.pending:
            visible = await self.visibility_position(namespace, spec.queue, workload.name)
        position = visible
        if position is None and workload is not None:
            position = snap.positions.get((namespace, workload.name))
        held = None
        if self.gate_message is not None and workload is not None:
            held = self.gate_message(namespace, workload.name)
        positions.place(
            status, spec=spec, phase=outcome.phase, workload=workload, namespace=namespace,
            position=position, cluster_queue=snap.local_queues.get((namespace, spec.queue)),
            held=held,
        )  # fmt: skip
        if outcome.phase == lifecycle.Phase.SUCCEEDED:
            self.metrics.run_attempts.labels("Succeeded").inc()
            lifecycle.end(status, lifecycle.Phase.SUCCEEDED, "Completed", outcome.message, now=now,
                      ended=outcome.ended)  # fmt: skip
        elif outcome.phase == lifecycle.Phase.FAILED:
            failure = outcome.failure_class or specs.FailureClass.UNKNOWN
            self.metrics.run_attempts.labels(str(failure)).inc()
            budget_from = int(status.get("attemptBudgetFrom") or 0)
            if lifecycle.should_retry(spec, failure, current, budget_from=budget_from):
                await self.attempts.delete(spec, ref, current)
                record.setdefault(
                    "endTime", timestamps.rfc3339(now)
                )  # the backoff counts from here
                self.metrics.run_resumes.labels(str(failure)).inc()
                status.update(phase=lifecycle.Phase.RESUMING, reason=str(failure),
                              message=f"attempt {current} failed ({outcome.message}); starting"
                              f" attempt {current + 1}")  # fmt: skip
                lifecycle.set_phase_condition(
                    status["conditions"],
                    lifecycle.Phase.RESUMING,
                    str(failure),
                    outcome.message,
                    now,
                )
                await self._resume_if_due(spec, ref, status, record, now)
            else:
                # Kueue frees the quota of a finished Job; the object stays for logs (TTL).
                lifecycle.end(
                    status,
                    lifecycle.Phase.FAILED,
                    str(failure),
                    lifecycle.final_message(spec, failure, current, budget_from, outcome.message),
                    now=now,
                    ended=outcome.ended,
                )
        else:
            status["phase"] = outcome.phase
            status["reason"] = outcome.reason
        return await self._write(item, old, status)

    # ------------------------------------------------------------------ pieces
    async def visibility_position(
        self, namespace: str, queue: str, workload: str
    ) -> positions.QueuePosition | None:
        """Ask Kueue's visibility API for one Workload's position (None when it cannot)."""
        items = await self.store.pending_workloads(namespace, queue)
        if items is None:
            return None
        return positions.position_from_visibility(items, namespace, workload)

    async def _resume_if_due(
        self,
        spec: specs.TauSpec,
        ref: objects.RunRef,
        status: dict[str, Any],
        record: Mapping[str, Any],
        now: dt.datetime,
    ) -> None:
        ended = timestamps.parse(record.get("endTime")) or now
        current = int(status.get("currentAttempt") or 1)
        retries = current - 1 - int(status.get("attemptBudgetFrom") or 0)
        wait = lifecycle.retry_backoff_s(spec, retries)
        if wait and (now - ended).total_seconds() < wait:
            due = timestamps.rfc3339(ended + dt.timedelta(seconds=wait))
            status["message"] = (
                f"attempt {current} failed ({record.get('failureClass')}: {record.get('message')})"
                f"; attempt {current + 1} starts at {due} (retry.backoff, doubled per retry)"
            )
            return
        failure = str(record.get("failureClass") or "")
        priority = lifecycle.resume_priority_class(spec, failure, self.resume_priority_class)
        if priority is not None and not await self.attempts.priority_class_exists(priority):
            priority = None
        await self.attempts.start(spec, ref, status, current + 1, now, priority_class=priority)

    async def _write(
        self, item: dict[str, Any], old: Mapping[str, Any], status: dict[str, Any]
    ) -> dict[str, Any]:
        if _clean(status) == _clean(old):
            return item
        self.elector.ensure_leader()
        namespace, name = snapshots.key(item)
        written = await self.store.patch_run_status(namespace, name, status)
        if written is None:
            return item
        rv = str((written.get("metadata") or {}).get("resourceVersion", ""))
        if rv.isdigit():
            self._written[(namespace, name)] = int(rv)
        if status.get("phase") != old.get("phase"):
            log.info("run phase", run=f"{namespace}/{name}", phase=status.get("phase"),
                     attempt=status.get("currentAttempt"), reason=status.get("reason"))  # fmt: skip
        return written


def _clean(value: Any) -> Any:
    """Drop None values (a merge patch deletes them) so comparisons see what is stored."""
    if isinstance(value, Mapping):
        return {k: _clean(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return str(value) if isinstance(value, lifecycle.Phase) else value
