"""A run's place in line and why it waits, in words (DESIGN.md section 7).

Queue positions come from Kueue's visibility API when it answers, else are computed from the
pending Workloads in Kueue's own order (priority, then creation). The waiting message says
what the run waits for: a missing queue, quota (how much, of what), an admission check; and
once it is admitted but its pods do not run, why not, from the pods' own status (the
scheduler's `PodScheduled` message, a container's waiting reason), and what Kueue's
`waitForPodsReady` will do about the quota it holds, and when.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from controller import marks, timestamps
from controller.runs import records, views
from shared import spec as specs


class PositionSource(enum.StrEnum):
    """Where a queue position came from (the API response says which)."""

    VISIBILITY = "visibility"
    """Kueue's visibility API (`pendingworkloads`) answered."""
    COMPUTED = "computed"
    """Computed here from the pending Workloads, in Kueue's order."""


# ---------------------------------------------------------------- queue position


@dataclasses.dataclass(frozen=True)
class QueuePosition:
    """Where a pending Workload stands; positions start at 0 (0 = next to be admitted)."""

    in_cluster_queue: int
    in_local_queue: int
    source: PositionSource


def kueue_order_key(w: views.WorkloadView) -> tuple[int, dt.datetime, str, str]:
    """Kueue's order of pending Workloads: higher priority first, then older queue-order
    timestamp first, then the smaller UID (`pkg/cache/queue` `baseCompareFunc`). Timestamps
    have whole seconds, so Workloads made within one second are in UID order, not in the order
    they were made, in Kueue's queue and in its visibility API alike; the name breaks what is
    left (a Workload read without its UID)."""
    when = w.queue_order_time or dt.datetime.max.replace(tzinfo=dt.UTC)
    return (-w.priority, when, w.uid, f"{w.namespace}/{w.name}")


def _in_line(
    pending: Iterable[views.WorkloadView], local_to_cluster: Mapping[tuple[str, str], str]
) -> list[list[views.WorkloadView]]:
    """The pending Workloads of each ClusterQueue, in Kueue's order (`kueue_order_key`);
    those of an unknown LocalQueue left out."""
    by_cq: dict[str, list[views.WorkloadView]] = {}
    for w in pending:
        cq = local_to_cluster.get((w.namespace, w.queue_name))
        if w.pending and cq is not None:
            by_cq.setdefault(cq, []).append(w)
    return [sorted(items, key=kueue_order_key) for items in by_cq.values()]


def compute_positions(
    pending: Iterable[views.WorkloadView], local_to_cluster: Mapping[tuple[str, str], str]
) -> dict[tuple[str, str], QueuePosition]:
    """Compute the position of every pending Workload, keyed by (namespace, name).

    `local_to_cluster` maps (namespace, LocalQueue) to its ClusterQueue; Workloads whose
    LocalQueue is unknown have no position.
    """
    out: dict[tuple[str, str], QueuePosition] = {}
    for items in _in_line(pending, local_to_cluster):
        per_lq: dict[tuple[str, str], int] = {}
        for pos, w in enumerate(items):
            lq = (w.namespace, w.queue_name)
            out[(w.namespace, w.name)] = QueuePosition(
                in_cluster_queue=pos, in_local_queue=per_lq.get(lq, 0),
                source=PositionSource.COMPUTED,
            )  # fmt: skip
            per_lq[lq] = per_lq.get(lq, 0) + 1
    return out


def quota_reasons_ahead(
    pending: Iterable[views.WorkloadView], local_to_cluster: Mapping[tuple[str, str], str]
) -> dict[tuple[str, str], str]:
    """For each pending Workload Kueue wrote no `QuotaReserved` message on, the message of
    the nearest one ahead of it in its ClusterQueue that has one, keyed by (namespace, name).

    Kueue tries a ClusterQueue's Workloads in order, and from v0.18 it sets aside those of
    the same shape as one that just did not fit without evaluating them
    (`SchedulingEquivalenceHashing`, on by default): they get no message of their own, and
    what holds them back is what holds back the one ahead."""
    out: dict[tuple[str, str], str] = {}
    for items in _in_line(pending, local_to_cluster):
        last = ""
        for w in items:
            reserved = w.condition("QuotaReserved")
            if reserved is not None and reserved.message:
                last = reserved.message
            elif last:
                out[(w.namespace, w.name)] = last
    return out


def position_from_visibility(
    items: Iterable[Mapping[str, Any]], namespace: str, workload: str
) -> QueuePosition | None:
    """Find a Workload in a visibility API `pendingworkloads` answer."""
    for item in items:
        meta = item.get("metadata") or {}
        if meta.get("name") == workload and meta.get("namespace", namespace) == namespace:
            return QueuePosition(
                in_cluster_queue=int(item.get("positionInClusterQueue") or 0),
                in_local_queue=int(item.get("positionInLocalQueue") or 0),
                source=PositionSource.VISIBILITY,
            )
    return None


# ---------------------------------------------------------------- why it waits

_QUOTA_RE = re.compile(
    r"insufficient (?:unused )?quota for ([\w./-]+) in flavor ([\w.-]+), (?:request > maximum"
    r" capacity \((\S+) > (\S+)\)|([\d.]+\w*) more needed)"
)

_RESOURCE_WORDS = {marks.GPU_RESOURCE: "GPUs", "cpu": "CPU", "memory": "memory"}


@dataclasses.dataclass(frozen=True)
class WaitContext:
    """What a waiting message may mention."""

    queue: str
    namespace: str
    queue_exists: bool
    cluster_queue: str = ""
    gpus_per_worker: int = 0
    workers: int = 1
    position: QueuePosition | None = None
    pods_ready_timeout_s: float | None = None
    """Kueue's `waitForPodsReady.timeout` as the platform configured it; None: not enabled."""
    not_ready: str = ""
    """Why the attempt's pods were last seen not running (kept on its record)."""
    now: dt.datetime | None = None
    reason_ahead: str = ""
    """What Kueue said of the Workload ahead of it when it said nothing of this one
    (`quota_reasons_ahead`)."""


def _duration(seconds: float) -> str:
    """`5m`, `90s`, `1h30m`: a timeout as a person writes it."""
    total = round(seconds)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    out = (f"{hours}h" if hours else "") + (f"{minutes}m" if minutes else "")
    return out + (f"{secs}s" if secs or not out else "")


IMAGE_REASONS = frozenset({
    "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull",
    "RegistryUnavailable", "SignatureValidationFailed",
})  # fmt: skip
"""A container's waiting reasons (the kubelet's) that mean its image cannot be pulled."""
START_REASONS = frozenset({
    "CreateContainerConfigError", "CreateContainerError", "RunContainerError",
    "PreCreateHookError", "PreStartHookError", "CrashLoopBackOff",
})  # fmt: skip
"""Waiting reasons that mean the container cannot be created or started."""


_WHAT = {"schedule": "cannot be scheduled", "image": "cannot pull its image",
         "start": "cannot start its container"}  # fmt: skip


def _problem(pod: views.PodView, kind: str) -> str:
    if kind == "schedule":
        return pod.unschedulable
    wanted = IMAGE_REASONS if kind == "image" else START_REASONS
    for _container, reason, message in pod.waiting:
        if reason in wanted:
            return f"{reason}: {message}" if message else reason
    return ""


def pods_not_running(pods: Sequence[views.PodView]) -> str:
    """Why an admitted attempt's pods do not run, in words ('' when they are all just
    starting, or running): the scheduler's message first, then an image that cannot be
    pulled, then a container that cannot start."""
    stuck = [p for p in pods if p.phase == "Pending" and not p.deleting]
    for kind, what in _WHAT.items():
        hit = [(p, why) for p in stuck if (why := _problem(p, kind))]
        if hit:
            pod, why = hit[0]
            more = f" (and {len(hit) - 1} more)" if len(hit) > 1 else ""
            return f"pod {pod.name}{more} {what}: {why.strip()}"
    return ""


def admitted_message(
    ctx: WaitContext, workload: views.WorkloadView | None, pods: Sequence[views.PodView]
) -> str:
    """The message of an admitted attempt whose pods are not running yet: why, and what
    Kueue's waitForPodsReady will do with the quota it holds ('' when nothing is wrong)."""
    why = pods_not_running(pods)
    if not why:
        return "" if pods else "admitted; waiting for its pods to be created"
    gpus = ctx.gpus_per_worker * ctx.workers
    quota = (f"its {gpus} GPU" + ("s" if gpus != 1 else "")) if gpus else "its quota"
    admitted = workload.condition("Admitted") if workload is not None else None
    if ctx.pods_ready_timeout_s is None:
        return (
            f"admitted, but {why}; nothing releases {quota} while it waits (the platform has"
            " not enabled Kueue's waitForPodsReady): fix it, or `tau cancel` the run"
        )
    timeout = _duration(ctx.pods_ready_timeout_s)
    if admitted is None or admitted.time is None:
        return (
            f"admitted, but {why}; unless its pods are ready within {timeout} of admission,"
            f" Kueue releases {quota} and queues it again (waitForPodsReady)"
        )
    deadline = admitted.time + dt.timedelta(seconds=ctx.pods_ready_timeout_s)
    if ctx.now is not None and ctx.now >= deadline:
        return (
            f"admitted, but {why}; its pods missed Kueue's waitForPodsReady deadline"
            f" ({timestamps.rfc3339(deadline)}): Kueue is releasing {quota} and queues it again"
        )
    return (
        f"admitted, but {why}; unless its pods are ready by {timestamps.rfc3339(deadline)},"
        f" Kueue releases {quota} and queues it again (waitForPodsReady, {timeout})"
    )


def waiting_message(ctx: WaitContext, workload: views.WorkloadView | None) -> str:
    """Say in plain words why a run is not running yet (empty when it is not waiting)."""
    if not ctx.queue_exists:
        return (
            f"queue {ctx.queue!r} does not exist in namespace {ctx.namespace}; set `queue:` to"
            " one that `tau queues` lists, or ask your platform team for one"
        )
    if workload is None:
        return f"submitted to queue {ctx.queue!r}; waiting for Kueue to pick it up"
    asked = ctx.gpus_per_worker * ctx.workers
    ahead = ""
    if ctx.position is not None:
        n = ctx.position.in_cluster_queue
        runs = "run is" if n == 1 else "runs are"
        ahead = f"; {n} {runs} ahead of it" if n else "; it is next in line"
    evicted = workload.condition("Evicted")
    last = f" (last seen: {ctx.not_ready})" if ctx.not_ready else ""
    if not workload.active:
        if evicted is not None and "re-queuing" in evicted.message:
            return (
                f"Kueue deactivated it after {workload.requeue_count or 'several'} tries: its"
                f" pods were never ready within the waitForPodsReady timeout{last}; fix the"
                " cause, then `tau cancel` and `tau resume` it"
            )
        return "the queue deactivated this run (an admission check rejected it)"
    if (
        evicted is not None and evicted.true and evicted.reason == "PodsReadyTimeout"
        and not workload.holds("QuotaReserved")
    ):  # fmt: skip
        timeout = f" of {_duration(ctx.pods_ready_timeout_s)}" if ctx.pods_ready_timeout_s else ""
        when = f" at {timestamps.rfc3339(evicted.time)}" if evicted.time else ""
        again = "it is queued again"
        if workload.requeue_at is not None and (ctx.now is None or workload.requeue_at > ctx.now):
            again = f"it is queued again at {timestamps.rfc3339(workload.requeue_at)} (backoff)"
        tries = f", {workload.requeue_count} times so far" if workload.requeue_count > 1 else ""
        return (
            f"Kueue released its quota{when}: its pods were not ready within the"
            f" waitForPodsReady timeout{timeout}{last}{tries}; {again}{ahead}"
        )
    checks = [(n, s, m) for n, s, m in workload.admission_checks if s != "Ready"]
    if workload.holds("QuotaReserved") and not workload.holds("Admitted"):
        if checks:
            detail = "; ".join(f"{n}: {m or s}" for n, s, m in checks)
            return f"quota reserved; waiting for admission checks ({detail})"
        return "quota reserved; waiting to be admitted"
    preempted = evicted is not None and evicted.reason in {"Preempted", "InClusterQueue"}
    if preempted and workload.holds("Evicted") and not workload.holds("QuotaReserved"):
        return f"preempted by higher-priority work; waiting to be admitted again{ahead}"
    reserved = workload.condition("QuotaReserved")
    kueue_text = (reserved.message if reserved is not None else "") or ctx.reason_ahead
    match = _QUOTA_RE.search(kueue_text)
    if match is not None:
        resource, flavor = match.group(1), match.group(2)
        words = _RESOURCE_WORDS.get(resource, resource)
        if match.group(3) is not None:
            return (
                f"waiting forever unless the queue grows: it asks for {match.group(3)} {words}"
                f" but queue {ctx.queue!r} can never give more than {match.group(4)}"
                f" (flavor {flavor})"
            )
        need = match.group(5)
        what = f"{asked} GPUs" if resource == marks.GPU_RESOURCE and asked else words
        return (
            f"waiting for quota: queue {ctx.queue!r} has not enough free {words} for the"
            f" {what} this run asks for ({need} more needed in flavor {flavor}){ahead}"
        )
    if reserved is not None and reserved.reason == "Inadmissible":
        return f"queue {ctx.queue!r} cannot admit work right now: {kueue_text}"
    if kueue_text:
        return f"waiting in queue {ctx.queue!r}: {kueue_text}{ahead}"
    return f"waiting in queue {ctx.queue!r}{ahead}"


def changes_at(
    workload: views.WorkloadView | None, pods_ready_timeout_s: float | None, now: dt.datetime
) -> dt.datetime | None:
    """The earliest time after `now` at which `place` words the same run differently with
    nothing else changing (None: no such time is to come): an admitted Workload's
    waitForPodsReady deadline, and the time Kueue queues an evicted one again."""
    times: list[dt.datetime] = []
    if workload is not None:
        admitted = workload.condition("Admitted")
        if pods_ready_timeout_s is not None and admitted is not None and admitted.time:
            times.append(admitted.time + dt.timedelta(seconds=pods_ready_timeout_s))
        if workload.requeue_at is not None:
            times.append(workload.requeue_at)
    return min((t for t in times if t > now), default=None)


def place(
    status: records.RunStatus,
    *,
    spec: specs.TauSpec,
    phase: str,
    workload: views.WorkloadView | None,
    namespace: str,
    position: QueuePosition | None,
    cluster_queue: str | None,
    held: str | None,
    pods: Sequence[views.PodView] = (),
    pods_ready_timeout_s: float | None = None,
    now: dt.datetime | None = None,
    reason_ahead: str = "",
) -> records.RunStatus:
    """The run's place in line and why it waits (a queued run), why its pods do not run (an
    admitted one), or neither; `held` is why our admission gate holds its Workload back,
    when it does. Why the pods were last seen not running is kept on the attempt's record,
    so the message after Kueue took them away can still say."""
    last = status.last_attempt
    ctx = WaitContext(
        queue=spec.queue, namespace=namespace, queue_exists=cluster_queue is not None,
        cluster_queue=cluster_queue or "", gpus_per_worker=spec.resources.gpus,
        workers=spec.workers, position=position, pods_ready_timeout_s=pods_ready_timeout_s,
        not_ready=last.not_ready if last is not None else "", now=now, reason_ahead=reason_ahead,
    )  # fmt: skip
    if phase != records.Phase.QUEUED:
        update: dict[str, Any] = {
            "queue_position": None, "queue_position_in_local_queue": None,
            "queue_position_source": None,
        }  # fmt: skip
        if phase == records.Phase.RUNNING:
            update["message"] = ""
        if phase == records.Phase.ADMITTED:
            update["message"] = admitted_message(ctx, workload, pods)
            why = pods_not_running(pods)
            if why and last is not None and last.not_ready != why:
                status = status.with_last_attempt(last.model_copy(update={"not_ready": why}))
        return status.model_copy(update=update)
    message = waiting_message(ctx, workload)
    if held:
        message = f"waiting for healthy GPU capacity: {held}"
    return status.model_copy(
        update={
            "message": message,
            "queue_position": position.in_cluster_queue if position else None,
            "queue_position_in_local_queue": position.in_local_queue if position else None,
            "queue_position_source": str(position.source) if position else None,
        }
    )
