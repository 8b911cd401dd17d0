"""What one pass of the run reconciler read, indexed for the per-run work (pure).

The objects come from watch-fed caches, which replace an object that changes and never edit
one in place (`watching.Watched`): `Views` parses each raw object once while it stays the
same object (`memo.Kept`), so a pass parses what changed, not every run's share again, and an
unchanged share reads back as the same views (which `policy.same_input` compares by identity
first).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from controller import marks, memo
from controller.runs import objects, owners, positions, records, views


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
    all_workloads: list[views.WorkloadView]
    pods: dict[tuple[str, str, int], list[dict[str, Any]]]
    """(namespace, run, attempt) -> the pods carrying those labels (where to look only:
    `attempt_of` keeps those the attempt controls)."""
    local_queues: dict[tuple[str, str], str]
    """(namespace, LocalQueue) -> ClusterQueue."""
    nodes: views.NodeFacts
    positions: dict[tuple[str, str], positions.QueuePosition]


def _read_status(raw: Mapping[str, Any]) -> records.RunStatus:
    return records.read(raw, results=False)


class Views:
    """The views of one reconciler's raw objects, each parsed once while it stays the same
    object (see the module docstring); one per reconciler, swept after each pass."""

    def __init__(self) -> None:
        self.workload = memo.Kept(views.parse_workload)
        self.pod = memo.Kept(views.parse_pod)
        self.attempt_object = memo.Kept(views.parse_attempt_object)
        self._status = memo.Kept(_read_status)
        self._nodes: tuple[views.NodeFacts, ...] = ()
        """The last two distinct facts: a full pass's, and an urgent run's few nodes'."""

    def status(self, raw: Mapping[str, Any] | None) -> records.RunStatus:
        """A TauRun's `status` without its results (`records.read`; ValueError when it
        cannot be read)."""
        return _read_status({}) if raw is None else self._status(raw)

    def node_facts(self, nodes: list[dict[str, Any]]) -> views.NodeFacts:
        """`views.node_facts`, the same object as before while the facts are equal (so a
        kept run's input compares its nodes by identity, not set by set)."""
        facts = views.node_facts(nodes)
        for known in self._nodes:
            if known == facts:
                return known
        self._nodes = (facts, *self._nodes[:1])
        return facts

    def sweep(self) -> None:
        for kept in (self.workload, self.pod, self.attempt_object, self._status):
            kept.sweep()


def index(
    objects: list[dict[str, Any]],
    pods: list[dict[str, Any]],
    workloads: list[dict[str, Any]],
    local_queues: list[dict[str, Any]],
    nodes: list[dict[str, Any]],
    *,
    known: Views | None = None,
) -> Snapshot:
    """Index what a pass read for the per-run work (`known`: views kept from the passes
    before; None parses everything)."""
    parsed = known or Views()
    by_kind = {(key(o)[0], o["kind"], key(o)[1]): o for o in objects}
    seen = [parsed.workload(w) for w in workloads]
    by_owner = {(w.namespace, w.owner_kind, w.owner_name): w for w in seen}
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
        all_workloads=seen,
        pods=by_attempt,
        local_queues=local,
        nodes=parsed.node_facts(nodes),
        positions=positions.compute_positions(seen, local),
    )


@dataclasses.dataclass(frozen=True)
class SeenAttempt:
    """What a pass saw of one attempt: its object, its Workload, its pods."""

    attempt_object: views.AttemptObjectView | None
    workload: views.WorkloadView | None
    pods: tuple[views.PodView, ...]


def attempt_of(
    snap: Snapshot, run: objects.RunRef, kind: str, attempt: int, *, known: Views | None = None
) -> SeenAttempt:
    """The object (`kind`), Workload and pods of a run's attempt in a snapshot (`known`:
    views kept from the passes before; None parses them).

    The pods are those the attempt's labels select whose controller chain leads to this
    attempt of this run (`owners.owned_pods`, through the attempt object read here and the
    run's UID): a look-alike pod carrying the run's labels is no pod of it, so it counts in
    neither its status, its failure's cause nor its evidence."""
    parsed = known or Views()
    name = objects.attempt_name(run.name, attempt)
    raw = snap.objects.get((run.namespace, kind, name))
    labelled = snap.pods.get((run.namespace, run.name, attempt), [])
    pods = owners.owned_pods(labelled, [raw] if raw is not None else [], run=run, attempt=attempt)
    return SeenAttempt(
        attempt_object=parsed.attempt_object(raw) if raw is not None else None,
        workload=snap.workloads.get((run.namespace, kind, name)),
        pods=tuple(parsed.pod(p) for p in pods),
    )
