"""Which runs a cache's change concerns (pure): the run reconciler's map from its informers'
changes to the keys of its work queue, as Kueue's event handlers map an object to the
Workloads it affects.

- a TauRun: itself; a Job, RayJob or Pod: the run its `taugrid.dev/run` label names (before
  and after the change); a Workload: the run of the attempt object that owns it;
- a LocalQueue: the runs of its namespace; a Node (its quarantine annotations): every live
  run (a finished run reads only its own TauRun); a WorkloadPriorityClass: every run.

A change that leaves what a decision reads of the object as it was queues none (a pod's
annotation, say). What no watch tells (a pending Workload's place in line, Kueue's visibility
API, the gate's word) is read every pass for the runs it concerns (`pending`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence, Set
from typing import Any

from controller import marks
from controller.runs import objects, snapshots, views

RunKey = tuple[str, str]
"""(namespace, name) of a TauRun."""

EVERY_RUN: Sequence[RunKey] = ()
"""What `runs_of` answers for a change every run may read (compare by identity)."""


def _read_owned(parse: Callable[[Mapping[str, Any]], Any]) -> Callable[[Any], Any]:
    """What a decision reads of a run's Job, RayJob or Pod: its view, and its labels and
    owners (which attempt it is, whose it is)."""

    def read(obj: Mapping[str, Any]) -> Any:
        meta = obj.get("metadata") or {}
        return parse(obj), meta.get("labels"), meta.get("ownerReferences")

    return read


_READ = {
    "Pod": _read_owned(views.parse_pod),
    "Job": _read_owned(views.parse_attempt_object),
    "RayJob": _read_owned(views.parse_attempt_object),
}
"""By cache: what a decision reads of an object of that kind, to compare before and after."""


def runs_of(
    kind: str,
    key: str,
    old: Any,
    new: Any,
    *,
    live: Set[RunKey],
    namespaces: Mapping[str, Set[RunKey]],
) -> Sequence[RunKey]:
    """The runs a change of the object `key` of cache `kind` (`old` → `new`, each None when it
    came or went) concerns; `EVERY_RUN` when every run may read it. `live`: the runs not
    settled when last decided; `namespaces`: the runs of each namespace."""
    if old is not None and new is not None:
        read = _READ.get(kind)
        if read is not None and read(old) == read(new):
            return ()
        if kind == "workloads" and old == new:
            return ()
    if kind == "workloadpriorityclasses":
        return EVERY_RUN
    found: set[RunKey] = set()
    for obj in (old, new):
        if obj is not None:
            found.update(_runs_of_one(kind, key, obj, live, namespaces))
    return sorted(found)


def _runs_of_one(
    kind: str, key: str, obj: Any, live: Set[RunKey], namespaces: Mapping[str, Set[RunKey]]
) -> Set[RunKey] | Sequence[RunKey]:
    namespace, _, name = key.rpartition("/")
    if kind == "TauRun":
        return [(namespace, name)]
    if kind in {"Job", "RayJob", "Pod"}:
        run = ((obj.get("metadata") or {}).get("labels") or {}).get(marks.RUN_LABEL)
        return [(namespace, str(run))] if run else ()
    if kind == "workloads":
        run = objects.run_of_attempt(obj.owner_name)
        return [(obj.namespace, run)] if run else ()
    if kind == "localqueues":
        return namespaces.get(namespace, ())
    if kind == "Node":
        return live
    return ()


def pending(item: Mapping[str, Any], snap: snapshots.Snapshot, kind: str) -> bool:
    """Whether the run's current attempt (of object `kind`) has a Workload waiting for quota:
    its queue position and the gate's word are computed or polled every pass, not watched."""
    status = item.get("status") or {}
    attempt = status.get("currentAttempt")
    if not isinstance(attempt, int) or attempt < 1:
        return False
    namespace, run = snapshots.key(item)
    workload = snap.workloads.get((namespace, kind, objects.attempt_name(run, attempt)))
    return workload is not None and workload.pending
