"""Minimal, idempotent Node patches for the policy's actions, as pure code.

The actuator fetches (or holds from its watch) the raw Node, asks `patch_for(action, node, now)`
and sends the result only when it is not None. Applying a patch and asking again returns None:
that is what makes the actuator safe to run on every pass, after a failover, or twice.

Two kinds of patch, because a Node's condition lives in the status subresource:
- `SetCondition` gives a strategic merge patch of `status.conditions`, merged by `type`, so
  the kubelet's own conditions are never touched. Its `lastTransitionTime` moves only when the
  status changes (Kueue's `SetConditionAndUpdate` rule).
- every other action gives a JSON merge patch of metadata and spec. `spec.taints` is a list
  that both patch kinds replace whole, so the body carries `metadata.resourceVersion`: a taint
  someone else added meanwhile makes the API server answer 409 (requeue), never lost.
Taint, cordon and quarantine annotations go in one patch, so a reader never sees a cordon
without the annotation that says it is ours.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
from collections.abc import Mapping, MutableSequence
from typing import Any, Literal

from controller import marks, timestamps
from controller.fleet import actions, history, nodes

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"

_QUARANTINE_ANNOTATIONS = (
    marks.QUARANTINED_BY_ANNOTATION,
    marks.QUARANTINED_AT_ANNOTATION,
    marks.QUARANTINED_REASON_ANNOTATION,
    marks.QUARANTINE_ANNOTATION,
    marks.CORDONED_ANNOTATION,
)


@dataclasses.dataclass(frozen=True, slots=True)
class NodePatch:
    """One PATCH request for a Node."""

    subresource: Literal["", "status"]
    """"status" for the status subresource, "" for the Node itself."""
    content_type: str
    body: dict[str, Any]


def set_condition(
    conditions: MutableSequence[dict[str, Any]], desired: nodes.Condition, now: dt.datetime
) -> bool:
    """Set the `GPUHealthy` entry of a conditions list in place; return whether it changed.

    `lastTransitionTime` becomes `now` only when the status changes (or the entry is new).
    """
    for entry in conditions:
        if entry.get("type") != marks.NODE_CONDITION:
            continue
        changed = False
        if entry.get("status") != desired.status.value:
            entry["status"] = desired.status.value
            entry["lastTransitionTime"] = timestamps.rfc3339_exact(now)
            changed = True
        if entry.get("reason") != desired.reason:
            entry["reason"] = desired.reason
            changed = True
        if entry.get("message") != desired.message:
            entry["message"] = desired.message
            changed = True
        return changed
    conditions.append(
        {
            "type": marks.NODE_CONDITION,
            "status": desired.status.value,
            "reason": desired.reason,
            "message": desired.message,
            "lastTransitionTime": timestamps.rfc3339_exact(now),
        }
    )
    return True


def condition_patch(
    node: Mapping[str, Any], desired: nodes.Condition, now: dt.datetime
) -> NodePatch | None:
    """Return the status patch that makes the node's `GPUHealthy` say `desired`, or None."""
    status = node.get("status")
    raw = status.get("conditions") if isinstance(status, Mapping) else None
    ours = [
        copy.deepcopy(dict(c))
        for c in (raw if isinstance(raw, list) else [])
        if isinstance(c, Mapping) and c.get("type") == marks.NODE_CONDITION
    ][:1]
    if not set_condition(ours, desired, now):
        return None
    return NodePatch("status", STRATEGIC_MERGE_PATCH, {"status": {"conditions": ours}})


def patch_for(
    action: actions.NodeAction, node: Mapping[str, Any], now: dt.datetime
) -> NodePatch | None:
    """Return the minimal patch that carries out `action` on `node`, or None when done."""
    if isinstance(action, actions.SetCondition):
        return condition_patch(node, action.condition, now)
    view = nodes.parse(node)
    wanted = _Changes(node)
    by, message = marks.CONTROLLER_IDENTITY, ""  # the history entry's, unless said otherwise
    if isinstance(action, actions.Quarantine):
        record = action.record
        wanted.taint(present=True)
        if action.cordon and not view.unschedulable:
            wanted.cordon()
        wanted.annotate(
            {
                marks.QUARANTINED_BY_ANNOTATION: record.by,
                marks.QUARANTINED_AT_ANNOTATION: timestamps.rfc3339_exact(record.at),
                marks.QUARANTINED_REASON_ANNOTATION: record.reason,
                marks.QUARANTINE_ANNOTATION: record.to_annotation(),
                marks.RELEASED_FAULTS_ANNOTATION: None,
            }
        )
        reason, by, message = record.reason, record.by, action.message
    elif isinstance(action, actions.UpdateQuarantine):
        if view.quarantine is None:
            return None
        wanted.annotate({marks.QUARANTINE_ANNOTATION: action.record.to_annotation()})
        reason = action.record.reason
        evict_after = timestamps.rfc3339_exact(action.record.evict_after) or "never"
        message = f"clears with {action.record.clears_with.value}; evict after {evict_after}"
    elif isinstance(action, actions.RestoreTaint):
        if view.quarantine is None:
            return None
        wanted.taint(present=True)
        reason = view.quarantine.reason
    elif isinstance(action, actions.EvictGpuPods):
        current = view.quarantine
        if current is None or current.evicted_at is not None:
            return None
        evicted = dataclasses.replace(current, evicted_at=now)
        wanted.annotate({marks.QUARANTINE_ANNOTATION: evicted.to_annotation()})
        reason, message = action.reason, f"due since {timestamps.rfc3339_exact(action.deadline)}"
    elif isinstance(action, actions.Release):
        _end_quarantine(wanted, view, uncordon=action.uncordon)
        reason, message = action.reason, action.message
    elif isinstance(action, actions.ManualRelease):
        _end_quarantine(wanted, view, uncordon=action.uncordon)
        wanted.annotate(
            {marks.RELEASED_FAULTS_ANNOTATION: nodes.render_released(action.released_faults)}
        )
        reason, by = action.reason, action.by
    else:  # ForgetManualRelease
        wanted.annotate({marks.RELEASED_FAULTS_ANNOTATION: None})
        return wanted.patch(view, None)
    return wanted.patch(view, history.Entry(now, action.kind.value, reason, by, message))


def history_patch(node: Mapping[str, Any], entry: history.Entry) -> NodePatch:
    """The patch that adds one entry to a node's history and changes nothing else (device
    quarantine records each of its actions on the device's node)."""
    view = nodes.parse(node)
    annotations = {marks.HISTORY_ANNOTATION: history.render(history.append(view.history, entry))}
    return NodePatch("", MERGE_PATCH, {"metadata": {"annotations": annotations}})


def _end_quarantine(wanted: _Changes, view: nodes.NodeView, *, uncordon: bool) -> None:
    wanted.taint(present=False)
    if uncordon and view.cordoned_by_us and view.unschedulable:
        wanted.uncordon()
    wanted.annotate(dict.fromkeys(_QUARANTINE_ANNOTATIONS))


class _Changes:
    """Collects the differences between a node's TauGrid marks and the wanted ones."""

    def __init__(self, node: Mapping[str, Any]) -> None:
        metadata = node.get("metadata")
        annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
        spec = node.get("spec")
        taints = spec.get("taints") if isinstance(spec, Mapping) else None
        self._annotations: Mapping[str, Any] = (
            annotations if isinstance(annotations, Mapping) else {}
        )
        self._taints: list[Any] = list(taints) if isinstance(taints, list) else []
        self._new_taints: list[Any] | None = None
        self._unschedulable: bool | None = None
        self._annotation_changes: dict[str, str | None] = {}

    def taint(self, *, present: bool) -> None:
        ours = [t for t in self._taints if nodes.is_our_taint(t)]
        if present and not ours:
            self._new_taints = [
                *self._taints,
                {"key": marks.TAINT_KEY, "effect": marks.TAINT_EFFECT},
            ]
        elif not present and ours:
            self._new_taints = [t for t in self._taints if not nodes.is_our_taint(t)]

    def cordon(self) -> None:
        self._unschedulable = True
        self.annotate({marks.CORDONED_ANNOTATION: "true"})

    def uncordon(self) -> None:
        self._unschedulable = False

    def annotate(self, wanted: Mapping[str, str | None]) -> None:
        for key, value in wanted.items():
            if self._annotations.get(key) != value:
                self._annotation_changes[key] = value
            else:
                self._annotation_changes.pop(key, None)

    def patch(self, view: nodes.NodeView, entry: history.Entry | None) -> NodePatch | None:
        if (
            self._new_taints is None
            and self._unschedulable is None
            and not self._annotation_changes
        ):
            return None
        annotations = dict(self._annotation_changes)
        if entry is not None:
            annotations[marks.HISTORY_ANNOTATION] = history.render(
                history.append(view.history, entry)
            )
        metadata: dict[str, Any] = {"annotations": annotations}
        if view.resource_version:
            metadata["resourceVersion"] = view.resource_version
        body: dict[str, Any] = {"metadata": metadata}
        spec: dict[str, Any] = {}
        if self._new_taints is not None:
            spec["taints"] = self._new_taints
        if self._unschedulable is not None:
            spec["unschedulable"] = self._unschedulable
        if spec:
            body["spec"] = spec
        return NodePatch("", MERGE_PATCH, body)
