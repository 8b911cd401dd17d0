"""The log keeper: the tail of every worker's log, kept in a TauRunLog (`keptlogs`).

Two ways in, one write path:
- a loop on its own interval (leader only) reads the tail of every running worker's log
  of the runs this controller manages, and of workers that ended and are not kept complete
  yet (a pod can vanish without warning: a node lost, a person deleting it), and writes
  what changed;
- the reconciler calls `keep_final` before it deletes an ended attempt's objects (the
  plan's deletes) and when a run ends, so the last lines of a failed attempt are kept
  before its pods go.

The pods are found by the run's labels and kept only when their controller chain leads to
the attempt (`owners.owned_pods`, against the run-labelled Jobs and RayJobs the reconciler's
caches hold): a look-alike pod's log is never kept as a run's.

Each read asks only for the tail (`tailLines`, `limitBytes`), with a timeout; a log that
cannot be read is skipped (what was kept before stays). A TauRunLog is created; one that
exists is replaced only when it is this run's own (its owner reference names the TauRun's
uid), never a complete capture by an incomplete one; one that is not ours is left alone
and reported (errors.Conflict naming it).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import structlog

from controller import errors, leading, marks, metrics
from controller.runs import keptlogs, objects, owners, records, snapshots, stores, views

log = structlog.get_logger()

MAX_TAIL_READS = 4
"""Reads of one tail at most (each asking for fewer lines when the byte limit cut it)."""
CONCURRENT_READS = 8
"""Log reads one pass makes at once."""
MAX_REMEMBERED = 20_000
"""Complete logs remembered (to skip re-reading them); forgotten all at once past this."""
_now = functools.partial(dt.datetime.now, dt.UTC)


class LogStore(stores.RunReads, Protocol):
    """What the keeper reads and writes (`controller.kube.runs.RunStore` implements it)."""

    async def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        """Pods of one namespace by label selector."""
        ...

    async def read_log_tail(
        self, namespace: str, pod: str, container: str, *, tail_lines: int, limit_bytes: int,
        timeout_s: float,
    ) -> bytes:  # fmt: skip
        """The tail of a container's log."""
        ...

    async def get_run_log(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A TauRunLog, None when there is none."""
        ...

    async def create_run_log(self, body: dict[str, Any]) -> bool:
        """Create a TauRunLog; False when it exists."""
        ...

    async def replace_run_log(self, body: dict[str, Any], resource_version: str) -> bool:
        """Replace a TauRunLog at a version; False when it changed since."""
        ...


class LogKeeper:
    """Keep the tail of each worker's log; see the module docstring."""

    def __init__(
        self,
        store: LogStore,
        elector: leading.Elector,
        metrics_: metrics.ControllerMetrics,
        *,
        manages: Callable[[Mapping[str, Any]], bool],
        keep_bytes: int = keptlogs.DEFAULT_KEEP_BYTES,
        interval_s: float = 30.0,
        read_timeout_s: float = 2.0,
        clock: Callable[[], dt.datetime] = _now,
    ) -> None:
        self.store = store
        self.elector = elector
        self.metrics = metrics_
        self.manages = manages
        self.keep_bytes = keep_bytes
        self.interval_s = interval_s
        self.read_timeout_s = read_timeout_s
        self._clock = clock
        self._wake = asyncio.Event()
        self._complete: set[tuple[str, str]] = set()
        self._reads = asyncio.Semaphore(CONCURRENT_READS)
        self.written = 0
        """TauRunLogs created or replaced, for the log and the tests."""
        self.refused = 0
        """Captures not written because a TauRunLog of that name is not the run's own."""

    async def run(self) -> None:
        """Pass after pass until cancelled (leader only)."""
        await leading.run_passes(
            "logs", self.pass_once, wake=self._wake, interval_s=self.interval_s,
            elector=self.elector,
            failures=lambda loop: self.metrics.pass_failures.labels(loop).inc(),
        )  # fmt: skip

    def poke(self) -> None:
        """Ask for a pass now."""
        self._wake.set()

    async def pass_once(self) -> float | None:
        """Capture the workers of every managed run's current attempt that have a log."""
        runs = {}
        for item in await self.store.list_runs():
            if self.manages(item):
                ref = objects.run_ref(item)
                runs[(ref.namespace, ref.name)] = (ref, item)
        by_attempt: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
        for pod in await self.store.list_labelled("Pod", marks.RUN_LABEL):
            meta = pod.get("metadata") or {}
            labels = meta.get("labels") or {}
            label = str(labels.get(marks.ATTEMPT_LABEL, ""))
            key = (str(meta.get("namespace", "")), str(labels.get(marks.RUN_LABEL, "")))
            if key in runs and label.isdigit():
                by_attempt.setdefault((*key, int(label)), []).append(pod)
        # Only runs with pods have their status read (a cluster keeps thousands of finished
        # runs, and reading a status is most of what a pass would cost them).
        current: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
        for (namespace, run_name, attempt), pods in by_attempt.items():
            _, item = runs[(namespace, run_name)]
            try:
                now_at = records.read(item.get("status"), results=False).current_attempt
            except ValueError:
                continue
            if attempt == now_at:
                current[(namespace, run_name, attempt)] = pods
        named = await self._attempt_objects(marks.RUN_LABEL) if current else {}
        work = []
        for (namespace, run_name, attempt), pods in current.items():
            ref, _ = runs[(namespace, run_name)]
            found = named.get((namespace, objects.attempt_name(run_name, attempt)), [])
            owned = owners.owned_pods(pods, found, run=ref, attempt=attempt)
            work.append(self.capture(ref, attempt, owned, final=False))
        await asyncio.gather(*work)
        return None

    async def _attempt_objects(self, selector: str) -> dict[tuple[str, str], list[dict[str, Any]]]:
        """The run-labelled Jobs and RayJobs (from the reconciler's caches once synced) by
        (namespace, name): what `owners.owned_pods` checks a pod's controller chain against.
        A cluster without KubeRay lists no RayJobs."""
        jobs = await self.store.list_labelled("Job", selector)
        try:
            rayjobs = await self.store.list_labelled("RayJob", selector)
        except Exception:  # noqa: BLE001  (no RayJob CRD: 404)
            rayjobs = []
        found: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for kind, items in (("Job", jobs), ("RayJob", rayjobs)):
            for obj in items:
                with_kind = obj if obj.get("kind") else {**obj, "kind": kind}
                found.setdefault(snapshots.key(obj), []).append(with_kind)
        return found

    async def keep_final(self, ref: objects.RunRef, attempts: Sequence[int]) -> None:
        """Keep the tails of these attempts' workers now (they are ending, or about to be
        deleted). Never raises: the delete that follows must happen whatever the logs do."""
        for attempt in attempts:
            selector = f"{marks.RUN_LABEL}={ref.name},{marks.ATTEMPT_LABEL}={attempt}"
            try:
                pods = await self.store.list_pods(ref.namespace, selector)
                named = await self._attempt_objects(f"{marks.RUN_LABEL}={ref.name}")
                found = named.get((ref.namespace, objects.attempt_name(ref.name, attempt)), [])
                owned = owners.owned_pods(pods, found, run=ref, attempt=attempt)
                await self.capture(ref, attempt, owned, final=True)
            except (asyncio.CancelledError, leading.NotLeaderError):
                raise
            except Exception as err:  # noqa: BLE001  (logs are evidence, not a precondition)
                log.warning("log not kept", run=f"{ref.namespace}/{ref.name}", attempt=attempt,
                            error=repr(err))  # fmt: skip

    async def capture(
        self, ref: objects.RunRef, attempt: int, pods: Sequence[Mapping[str, Any]], *, final: bool
    ) -> None:
        """Capture each worker of one attempt that has a log to keep."""
        jobs = []
        for worker, (raw, container) in enumerate(keptlogs.workers(pods)):
            pod = views.parse_pod(raw)
            key = (ref.namespace, keptlogs.name(ref.name, attempt, worker))
            if key in self._complete or pod.started is None:
                continue  # kept whole already, or never started: there is no log
            if not final and pod.phase not in {"Running", "Succeeded", "Failed"}:
                continue
            jobs.append(self._capture_one(ref, attempt, worker, pod, container))
        for result in await asyncio.gather(*jobs, return_exceptions=True):
            if isinstance(result, (leading.NotLeaderError, asyncio.CancelledError)):
                raise result
            if isinstance(result, errors.Conflict):
                self.refused += 1
                log.warning("log not kept", run=f"{ref.namespace}/{ref.name}", error=str(result))
            elif isinstance(result, BaseException):
                log.debug("log not read", run=f"{ref.namespace}/{ref.name}", error=repr(result))

    async def _capture_one(
        self, ref: objects.RunRef, attempt: int, worker: int, pod: views.PodView, container: str
    ) -> None:
        name = keptlogs.name(ref.name, attempt, worker)
        complete = keptlogs.finished(pod)
        if complete and not (await self._still_incomplete(ref, name)):
            return
        async with self._reads:
            data = await self._tail(ref.namespace, pod.name, container)
        text, truncated = keptlogs.keep(data, self.keep_bytes)
        body = keptlogs.render(
            ref, attempt, worker, pod=pod.name, container=container, log=text,
            now=self._clock(), complete=complete, truncated=truncated,
        )  # fmt: skip
        await self.write(ref, body)
        if complete:
            self._remember((ref.namespace, name))

    async def _still_incomplete(self, ref: objects.RunRef, name: str) -> bool:
        """For a worker that ended: whether its log still has to be kept whole (not when
        its TauRunLog says complete already: a new leader need not read it again)."""
        raw = await self.store.get_run_log(ref.namespace, name)
        if raw is not None:
            kept = keptlogs.read(raw)
            if kept.complete and kept.belongs_to(ref):
                self._remember((ref.namespace, name))
                return False
        return True

    async def _tail(self, namespace: str, pod: str, container: str) -> bytes:
        lines: int | None = keptlogs.tail_lines(self.keep_bytes)
        data = b""
        for _ in range(MAX_TAIL_READS):
            if lines is None:
                break
            data = await self.store.read_log_tail(
                namespace, pod, container, tail_lines=lines,
                limit_bytes=self.keep_bytes * keptlogs.READ_FACTOR, timeout_s=self.read_timeout_s,
            )  # fmt: skip
            lines = keptlogs.read_again(len(data), lines, self.keep_bytes)
        return data

    async def write(self, ref: objects.RunRef, body: dict[str, Any]) -> None:
        """Create the TauRunLog, or replace this run's own when the capture is news; raise
        errors.Conflict naming one that exists and is not this run's."""
        namespace, name = ref.namespace, body["metadata"]["name"]
        self.elector.ensure_leader()
        if await self.store.create_run_log(body):
            self.written += 1
            return
        raw = await self.store.get_run_log(namespace, name)
        if raw is None:  # deleted in between: the next capture creates it
            return
        kept = keptlogs.read(raw)
        if kept.owner_uid != ref.uid:
            msg = (
                f"TauRunLog {namespace}/{name} exists and does not belong to run {ref.name};"
                " it is left as it is, and this worker's log is not kept"
            )
            raise errors.Conflict(msg, field="name", code="NotOurs")
        if kept.belongs_to(ref) and not keptlogs.replaces(kept, body):
            return  # (one owned by the run but not as we write it is replaced: not ours)
        self.elector.ensure_leader()
        if await self.store.replace_run_log(body, kept.resource_version):
            self.written += 1

    async def read_kept(
        self, ref: objects.RunRef, attempt: int, worker: int
    ) -> keptlogs.Kept | None:
        """The kept log of one worker, None when there is none; errors.Conflict (409 naming
        it) when the object of that name is not this run's."""
        raw = await self.store.get_run_log(ref.namespace, keptlogs.name(ref.name, attempt, worker))
        if raw is None:
            return None
        kept = keptlogs.read(raw)
        if not kept.belongs_to(ref):
            msg = (
                f"TauRunLog {ref.namespace}/{kept.name} does not belong to run {ref.name}; it"
                " is not served as this run's log"
            )
            raise errors.Conflict(msg, field="worker", code="NotOurs")
        return kept

    def _remember(self, key: tuple[str, str]) -> None:
        if len(self._complete) >= MAX_REMEMBERED:
            self._complete.clear()
        self._complete.add(key)
