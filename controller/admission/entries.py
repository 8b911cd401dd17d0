"""Our entry in a Workload's `status.admissionChecks`, as the gate writes it (pure): the state
`policy` decided and, when Ready, one merged `podSetUpdates` entry per pod set."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from controller import marks, timestamps
from controller.admission import policy, views


@dataclasses.dataclass(frozen=True)
class PodSetUpdate:
    """One entry of an admission check's `podSetUpdates`: what Kueue adds to one pod set's
    pod template when it starts the Workload's Job (additions only: Kueue refuses to start
    a Job whose template already holds one of these keys with another value)."""

    name: str
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    annotations: Mapping[str, str] = dataclasses.field(default_factory=dict)
    node_selector: Mapping[str, str] = dataclasses.field(default_factory=dict)
    tolerations: tuple[views.Toleration, ...] = ()


class PodSetUpdateError(ValueError):
    """Updates that cannot become one per pod set: a name the Workload has no pod set of, or
    one key given two values for one pod set."""


def _merged(into: dict[str, str], more: Mapping[str, str], where: str) -> None:
    for key, value in more.items():
        if into.get(key, value) != value:
            msg = f"{where}: {key} is both {into[key]!r} and {value!r}"
            raise PodSetUpdateError(msg)
        into[key] = value


def merge_pod_set_updates(
    pod_sets: Sequence[str], updates: Iterable[PodSetUpdate]
) -> tuple[PodSetUpdate, ...]:
    """Exactly one update per pod set of the Workload, in its order, each name once.

    Updates naming the same pod set are merged into one (equal tolerations kept once): Kueue
    v0.19 applies only the first entry of a name and drops the others without a word
    (`getPodSetsInfoFromStatus` stops at the first match), and from v0.21 its webhook refuses
    a check whose `podSetUpdates` name a pod set twice (`WorkloadValidateUniquePodSetUpdates`,
    Beta and on by default, kueue#18021). A pod set no update names gets an empty one, so
    every pod set is covered once. Raises `PodSetUpdateError` for a name the Workload has no
    pod set of (Kueue's webhook refuses it) or a key given two values.
    """
    order = list(dict.fromkeys(pod_sets))
    fields: dict[str, tuple[dict[str, str], dict[str, str], dict[str, str]]] = {
        name: ({}, {}, {}) for name in order
    }
    tolerations: dict[str, list[views.Toleration]] = {name: [] for name in order}
    for u in updates:
        if u.name not in fields:
            msg = f"pod set update names {u.name!r}; the Workload's pod sets are {order}"
            raise PodSetUpdateError(msg)
        labels, annotations, selector = fields[u.name]
        _merged(labels, u.labels, f"pod set {u.name} labels")
        _merged(annotations, u.annotations, f"pod set {u.name} annotations")
        _merged(selector, u.node_selector, f"pod set {u.name} nodeSelector")
        tolerations[u.name] += [t for t in u.tolerations if t not in tolerations[u.name]]
    return tuple(
        PodSetUpdate(name, *fields[name], tolerations=tuple(tolerations[name])) for name in order
    )


def gate_pod_set_updates(
    pod_sets: Sequence[str], check: str, since: dt.datetime | None
) -> tuple[PodSetUpdate, ...]:
    """What our check adds to every pod set when it goes Ready: a label that selects the pods
    the gate passed, and annotations naming the check and when it passed them.

    Marks, not placement. The gate does not choose nodes: it counts whether the pods fit on
    healthy nodes, and the scheduler places them (our quarantine taint already keeps them off
    sick nodes). A nodeSelector naming the nodes it counted would pin the pods to a guess,
    and could clash with the flavor's own selector, which Kueue treats as a conflict that
    stops the Job from starting. What the gate does know, and a person or a later check
    wants on the pod, is that the gate passed it and when: a GPU quarantined after that time
    failed after admission, not before it.
    """
    annotations = {marks.GATE_CHECK_ANNOTATION: check}
    if since is not None:
        annotations[marks.GATE_PASSED_AT_ANNOTATION] = timestamps.rfc3339(since)
    mark = {marks.GATE_PASSED_LABEL: "true"}
    return merge_pod_set_updates(
        pod_sets, (PodSetUpdate(name, labels=mark, annotations=annotations) for name in pod_sets)
    )


def pod_set_update_body(u: PodSetUpdate) -> dict[str, Any]:
    """One `podSetUpdates` entry as Kueue's v1beta2 schema spells it (empty fields left out)."""
    body: dict[str, Any] = {"name": u.name}
    for key, value in (("labels", u.labels), ("annotations", u.annotations),
                       ("nodeSelector", u.node_selector)):  # fmt: skip
        if value:
            body[key] = dict(value)
    if u.tolerations:
        body["tolerations"] = [
            {k: v for k, v in dataclasses.asdict(t).items() if v} for t in u.tolerations
        ]
    return body


def check_state_body(
    check: str, decision: policy.Decision, pod_sets: Sequence[str]
) -> dict[str, Any]:
    """Our entry of `status.admissionChecks`, as server-side apply wants it (Kueue's v1beta2
    schema requires `message` and `lastTransitionTime`). A Ready entry carries one merged
    `podSetUpdates` entry per pod set of the Workload (`pod_sets`, its names in order; see
    `gate_pod_set_updates`); another state carries none, so applying it drops the earlier
    Ready's updates (Kueue holds them immutable only from Ready to Ready)."""
    body: dict[str, Any] = {
        "name": check,
        "state": str(decision.state),
        "message": decision.message[:32768],
        "lastTransitionTime": timestamps.rfc3339(decision.since) if decision.since else None,
    }
    if decision.requeue_after_s is not None:
        body["requeueAfterSeconds"] = decision.requeue_after_s
    if decision.state == views.CheckState.READY:
        updates = gate_pod_set_updates(pod_sets, check, decision.since)
        body["podSetUpdates"] = [pod_set_update_body(u) for u in updates]
    return {k: v for k, v in body.items() if v is not None}
