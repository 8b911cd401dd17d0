"""A run's place in line and why it waits, in words (DESIGN.md section 7).

Queue positions come from Kueue's visibility API when it answers, else are computed from the
pending Workloads in Kueue's own order (priority, then creation). The waiting message says
what the run waits for: a missing queue, quota (how much, of what), an admission check.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import re
from collections.abc import Iterable, Mapping
from typing import Any

from controller import marks
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
    ahead_gpus: int = 0


def kueue_order_key(w: views.WorkloadView) -> tuple[int, dt.datetime, str]:
    """Kueue's order of pending Workloads: higher priority first, then older queue-order
    timestamp first (`pkg/queue` `queueOrderingFunc`); the name breaks ties."""
    when = w.queue_order_time or dt.datetime.max.replace(tzinfo=dt.UTC)
    return (-w.priority, when, f"{w.namespace}/{w.name}")


def compute_positions(
    pending: Iterable[views.WorkloadView], local_to_cluster: Mapping[tuple[str, str], str]
) -> dict[tuple[str, str], QueuePosition]:
    """Compute the position of every pending Workload, keyed by (namespace, name).

    `local_to_cluster` maps (namespace, LocalQueue) to its ClusterQueue; Workloads whose
    LocalQueue is unknown have no position.
    """
    by_cq: dict[str, list[views.WorkloadView]] = {}
    for w in pending:
        if not w.pending:
            continue
        cq = local_to_cluster.get((w.namespace, w.queue_name))
        if cq is not None:
            by_cq.setdefault(cq, []).append(w)
    out: dict[tuple[str, str], QueuePosition] = {}
    for items in by_cq.values():
        items.sort(key=kueue_order_key)
        per_lq: dict[tuple[str, str], int] = {}
        for pos, w in enumerate(items):
            lq = (w.namespace, w.queue_name)
            out[(w.namespace, w.name)] = QueuePosition(
                in_cluster_queue=pos, in_local_queue=per_lq.get(lq, 0),
                source=PositionSource.COMPUTED,
            )  # fmt: skip
            per_lq[lq] = per_lq.get(lq, 0) + 1
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
    if not workload.active:
        return "the queue deactivated this run (an admission check rejected it)"
    checks = [(n, s, m) for n, s, m in workload.admission_checks if s != "Ready"]
    if workload.holds("QuotaReserved") and not workload.holds("Admitted"):
        if checks:
            detail = "; ".join(f"{n}: {m or s}" for n, s, m in checks)
            return f"quota reserved; waiting for admission checks ({detail})"
        return "quota reserved; waiting to be admitted"
    if workload.holds("Evicted") and not workload.holds("QuotaReserved"):
        evicted = workload.condition("Evicted")
        why = evicted.reason if evicted is not None else ""
        if why in {"Preempted", "InClusterQueue"}:
            return f"preempted by higher-priority work; waiting to be admitted again{ahead}"
    reserved = workload.condition("QuotaReserved")
    kueue_text = reserved.message if reserved is not None else ""
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
) -> records.RunStatus:
    """The run's place in line and why it waits (a queued run), or neither; `held` is why
    our admission gate holds its Workload back, when it does."""
    if phase != records.Phase.QUEUED:
        update: dict[str, Any] = {
            "queue_position": None, "queue_position_in_local_queue": None,
            "queue_position_source": None,
        }  # fmt: skip
        if phase in {records.Phase.ADMITTED, records.Phase.RUNNING}:
            update["message"] = ""
        return status.model_copy(update=update)
    ctx = WaitContext(
        queue=spec.queue, namespace=namespace, queue_exists=cluster_queue is not None,
        cluster_queue=cluster_queue or "", gpus_per_worker=spec.resources.gpus,
        workers=spec.workers, position=position,
    )  # fmt: skip
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
