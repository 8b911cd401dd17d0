"""What one pass of the run reconciler read, indexed for the per-run work (pure).

The Workloads come parsed (the cache parses each once, as it arrives: `controller.kube.
informer`), since every pass computes the queue positions from all of them; a run's pods and
attempt object are parsed only when that run is decided (`attempt_of`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from controller import marks
from controller.runs import objects, owners, positions, views


def key(obj: Mapping[str, Any]) -> tuple[str, str]:
    """(namespace, name) of a raw object."""
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace", "")), str(meta.get("name", ""))


@dataclasses.dataclass
class Snapshot:
    """Everything one pass reads, indexed for the per-run work."""

    objects: dict[tuple[str, str, str], dict[str, Any]]
    """(namespace, kind, name) -> Job/RayJob/Service."""
    workloads: dict[tuple[str, str, str], views.WorkloadView]
    """(namespace, owner kind, owner name) -> Workload."""
    pods: dict[tuple[str, str, int], list[dict[str, Any]]]
    """(namespace, run, attempt) -> the pods carrying those labels (where to look only:
    `attempt_of` keeps those the attempt controls)."""
    local_queues: dict[tuple[str, str], str]
    """(namespace, LocalQueue) -> ClusterQueue."""
    nodes: views.NodeFacts
    positions: dict[tuple[str, str], positions.QueuePosition]
    reasons_ahead: dict[tuple[str, str], str]
    """(namespace, Workload) -> what Kueue said of the one ahead (`quota_reasons_ahead`)."""


def index(
    objects: list[dict[str, Any]],
    pods: list[dict[str, Any]],
    workloads: list[views.WorkloadView],
    local_queues: list[dict[str, Any]],
    nodes: list[dict[str, Any]],
) -> Snapshot:
    """Index what a pass read for the per-run work."""
    by_kind = {(key(o)[0], o["kind"], key(o)[1]): o for o in objects}
    by_owner = {(w.namespace, w.owner_kind, w.owner_name): w for w in workloads}
    by_attempt: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for pod in pods:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        attempt = str(labels.get(marks.ATTEMPT_LABEL, ""))
        if attempt.isdigit():
            ns, _ = key(pod)
            by_attempt.setdefault((ns, labels[marks.RUN_LABEL], int(attempt)), []).append(pod)
    local = {key(lq): str((lq.get("spec") or {}).get("clusterQueue", "")) for lq in local_queues}
    return Snapshot(
        objects=by_kind,
        workloads=by_owner,
        pods=by_attempt,
        local_queues=local,
        nodes=views.node_facts(nodes),
        positions=positions.compute_positions(workloads, local),
        reasons_ahead=positions.quota_reasons_ahead(workloads, local),
    )


@dataclasses.dataclass(frozen=True)
class SeenAttempt:
    """What a pass saw of one attempt: its object, its Workload, its pods."""

    attempt_object: views.AttemptObjectView | None
    workload: views.WorkloadView | None
    pods: tuple[views.PodView, ...]


def attempt_of(snap: Snapshot, run: objects.RunRef, kind: str, attempt: int) -> SeenAttempt:
    """The object (`kind`), Workload and pods of a run's attempt in a snapshot, parsed.

    The pods are those the attempt's labels select whose controller chain leads to this
    attempt of this run (`owners.owned_pods`, through the attempt object read here and the
    run's UID): a look-alike pod carrying the run's labels is no pod of it, so it counts in
    neither its status, its failure's cause nor its evidence."""
    name = objects.attempt_name(run.name, attempt)
    raw = snap.objects.get((run.namespace, kind, name))
    labelled = snap.pods.get((run.namespace, run.name, attempt), [])
    pods = owners.owned_pods(labelled, [raw] if raw is not None else [], run=run, attempt=attempt)
    return SeenAttempt(
        attempt_object=views.parse_attempt_object(raw) if raw is not None else None,
        workload=snap.workloads.get((run.namespace, kind, name)),
        pods=tuple(views.parse_pod(p) for p in pods),
    )
