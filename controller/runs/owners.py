"""Whose pod a pod is: its controller chain, not its labels (pure; security review 3,
finding 10).

Labels are only where to look: anyone who may create pods in a namespace may put a run's
labels on one. A pod is attempt N of a run only when its controller chain leads there: the
pod is controlled (`controller: true`) by the attempt's Job `<run>-a<N>` (its name and UID),
or by the RayCluster its RayJob `<run>-a<N>` names in `status.rayClusterName` (the name: the
controller may not read RayClusters), and that Job or RayJob is controlled by the TauRun of
that name, its UID the run's. `fault` is that rule, once; a run token's report
(`identity.owned`), the reconciler's snapshot (`snapshots.attempt_of`), live logs
(`logs.py`) and log keeping (`keeping.py`) all ask it, from objects they have already read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

from controller.runs import objects

ATTEMPT_KINDS = frozenset({"Job", "RayJob"})

Pod = TypeVar("Pod", bound=Mapping[str, Any])


def controller(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """An object's controller ownerReference ({} without one)."""
    for ref in ((obj or {}).get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            return ref
    return {}


def fault(
    pod: Mapping[str, Any],
    attempt_object: Mapping[str, Any] | None,
    *,
    run: objects.RunRef,
    attempt: int,
) -> str | None:
    """None when `pod` is attempt `attempt` of `run` by its controller chain through
    `attempt_object` (the Job or RayJob `<run>-a<N>` as read, None: none; `run.uid` the
    TauRun's UID as read, empty: none); otherwise what it is not controlled by: `object
    <run>-a<N>` when that object is missing or is not the run's, `Job <run>-a<N>` (or
    `RayJob …`) when the pod is not under it."""
    expected = objects.attempt_name(run.name, attempt)
    meta = (attempt_object or {}).get("metadata") or {}
    top = controller(attempt_object)
    kind = str((attempt_object or {}).get("kind", ""))
    if (
        attempt_object is None or kind not in ATTEMPT_KINDS
        or meta.get("name") != expected or meta.get("namespace") != run.namespace
        or not run.uid or top.get("kind") != objects.TAURUN_KIND
        or top.get("name") != run.name or top.get("uid") != run.uid
    ):  # fmt: skip
        return f"object {expected}"
    pod_namespace = ((pod.get("metadata") or {}).get("namespace")) or run.namespace
    ref = controller(pod)
    if pod_namespace != run.namespace:
        ok = False
    elif kind == "Job":
        ok = ref.get("kind") == "Job" and ref.get("name") == expected
        ok = ok and bool(meta.get("uid")) and ref.get("uid") == meta.get("uid")
    else:
        cluster = str(((attempt_object or {}).get("status") or {}).get("rayClusterName") or "")
        ok = ref.get("kind") == "RayCluster" and bool(cluster) and ref.get("name") == cluster
    return None if ok else f"{kind} {expected}"


def owned_pods(
    pods: Iterable[Pod],
    attempt_objects: Sequence[Mapping[str, Any]],
    *,
    run: objects.RunRef,
    attempt: int,
) -> list[Pod]:
    """The pods among `pods` that are attempt `attempt` of `run` (`fault` None) through one
    of `attempt_objects` (the objects named `<run>-a<N>` as read: a Job, a RayJob; one
    that is not the run's owns nothing), in their order; a look-alike is left out."""
    return [
        pod
        for pod in pods
        if any(fault(pod, obj, run=run, attempt=attempt) is None for obj in attempt_objects)
    ]
