"""A typed view of a Kubernetes Node, holding only what the quarantine policy reads.

Raw Node dicts stop at the adapter: it calls `parse` once per watch event and keeps the
`NodeView` (a few hundred bytes) instead of the whole object. Parsing is pure and forgiving
about what other tools may have scribbled on a node: a malformed TauGrid annotation becomes a
`problems` entry naming the field (for the shell to log) instead of an exception, so one
hand-edited node can never stop the controller from judging the others. Only a node without a
name is refused.

The TauGrid marks on a node (DESIGN.md section 2), all written in one patch by
`controller.conditions` so they are seen together or not at all:
- condition `GPUHealthy` (status True/False/Unknown);
- taint `taugrid.dev/gpu-unhealthy:NoSchedule`;
- `spec.unschedulable` with `taugrid.dev/cordoned: "true"` when the cordon is ours;
- `taugrid.dev/quarantined-by|at|reason`, and `taugrid.dev/quarantine`: a JSON record of the
  fault that caused the quarantine (what clears it, the boot ID then, the eviction deadline);
- `taugrid.dev/released-faults`: the faults an on-call engineer released by hand, which must
  not quarantine the node again;
- `taugrid.dev/history`: the last 20 actions.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import json
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from controller import marks, timestamps
from controller.fleet import history, state
from shared import health

_T = TypeVar("_T")

MAX_RELEASED_FAULTS = 512
"""Bound on the released-fault set kept in an annotation (64 GPUs × a few findings each)."""


class NodeParseError(ValueError):
    """The object is not a Node the controller can act on; the message names the field."""


class ConditionStatus(enum.StrEnum):
    """Kubernetes condition statuses."""

    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class QuarantineMode(enum.StrEnum):
    """Who put the node in quarantine, which decides who may take it out."""

    AUTOMATIC = "Automatic"
    MANUAL = "Manual"


class Clearing(enum.StrEnum):
    """What must be seen before an automatic release; ordered by strictness below."""

    HEALTHY_REPORTS = "HealthyReports"
    """Fresh healthy heartbeats for releaseAfter (unlatched faults, ResetGPU, silence)."""
    NEW_BOOT_ID = "NewBootId"
    """A boot ID different from the one at quarantine, then healthy reports (RebootNode)."""
    MANUAL_RELEASE = "ManualRelease"
    """Only an on-call release (Inspect faults and manual quarantines)."""


CLEARING_STRICTNESS = {
    Clearing.HEALTHY_REPORTS: 0,
    Clearing.NEW_BOOT_ID: 1,
    Clearing.MANUAL_RELEASE: 2,
}


def clearing_for(action: health.Action) -> Clearing:
    """Return what clears a latched fault whose remedy is `action` (DESIGN.md section 5)."""
    if action is health.Action.INSPECT:
        return Clearing.MANUAL_RELEASE
    if action is health.Action.REBOOT_NODE:
        return Clearing.NEW_BOOT_ID
    return Clearing.HEALTHY_REPORTS


@dataclasses.dataclass(frozen=True, slots=True)
class Condition:
    """The `GPUHealthy` condition as found on, or wanted for, a node."""

    status: ConditionStatus
    reason: str
    message: str
    last_transition_time: dt.datetime | None = None

    def same_as(self, other: Condition | None) -> bool:
        """Return True when `other` says the same thing, whatever its transition time."""
        return (
            other is not None
            and self.status is other.status
            and self.reason == other.reason
            and self.message == other.message
        )


@dataclasses.dataclass(frozen=True, slots=True)
class QuarantineRecord:
    """TauGrid's quarantine of a node, read back from its annotations."""

    mode: QuarantineMode
    by: str
    at: dt.datetime
    reason: str
    clears_with: Clearing
    boot_id: str | None = None
    """The boot ID reported when the quarantine began (NewBootId compares against it)."""
    faults: frozenset[state.FaultKey] = frozenset()
    evict_after: dt.datetime | None = None
    """When GPU pods may be evicted; None for no eviction (silence, manual quarantine)."""
    evicted_at: dt.datetime | None = None
    """When the first eviction pass ran, so it is recorded in history only once."""
    failed: bool = False
    """A GPU on the node failed (a Failed verdict): the runs on it are lost at once, and the
    run reconciler starts their next attempts without waiting for the eviction."""

    def to_annotation(self) -> str:
        """Return the `taugrid.dev/quarantine` value (mode, by, at and reason live beside it)."""
        record: dict[str, object] = {
            "clearsWith": self.clears_with.value,
            "bootId": self.boot_id,
            "faults": sorted(list(key) for key in self.faults),
            "evictAfter": timestamps.rfc3339_exact(self.evict_after),
            "evictedAt": timestamps.rfc3339_exact(self.evicted_at),
        }
        if self.failed:
            record["failed"] = True
        return json.dumps(record, separators=(",", ":"), sort_keys=True)


@dataclasses.dataclass(frozen=True, slots=True)
class NodeView:
    """What the policy needs to know about one Node."""

    name: str
    resource_version: str = ""
    gpu_capacity: int = 0
    managed: bool = True
    """False when the node carries `taugrid.dev/managed=false`: TauGrid never writes to it."""
    unschedulable: bool = False
    cordoned_by_us: bool = False
    tainted: bool = False
    """Our NoSchedule taint is present."""
    condition: Condition | None = None
    quarantine: QuarantineRecord | None = None
    released_faults: frozenset[state.FaultKey] | None = None
    """Faults an on-call engineer released by hand; None when there was no such release."""
    history: tuple[history.Entry, ...] = ()
    problems: tuple[str, ...] = ()
    """Malformed TauGrid annotations found on the node, each naming its field."""

    @property
    def is_gpu_node(self) -> bool:
        """Return True for a node that advertises GPUs, i.e. counts in fleet-size limits."""
        return self.gpu_capacity > 0


def parse(raw: Mapping[str, Any]) -> NodeView:
    """Build a NodeView from a Node as the API server returns it (camelCase JSON dict)."""
    metadata = _mapping(raw.get("metadata"))
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        msg = "metadata.name: a Node must have a non-empty name"
        raise NodeParseError(msg)
    labels = _mapping(metadata.get("labels"))
    annotations = _mapping(metadata.get("annotations"))
    spec = _mapping(raw.get("spec"))
    status = _mapping(raw.get("status"))
    problems: list[str] = []

    def read(parse: Callable[[Any], _T], value: Any, default: _T) -> _T:
        """`parse(value)`, or `default` with the ValueError's message kept in `problems`."""
        try:
            return parse(value)
        except ValueError as err:  # HistoryError is one
            problems.append(str(err))
            return default

    taints = spec.get("taints")
    return NodeView(  # the problems in this order: history, quarantine, release, condition, GPUs
        history=read(history.parse, _str_or_none(annotations.get(marks.HISTORY_ANNOTATION)), ()),
        quarantine=read(_parse_quarantine, annotations, None),
        released_faults=read(
            _parse_released, _str_or_none(annotations.get(marks.RELEASED_FAULTS_ANNOTATION)), None
        ),
        condition=read(find_condition, status.get("conditions"), None),
        gpu_capacity=_gpu_capacity(status, problems),
        name=name,
        resource_version=str(metadata.get("resourceVersion") or ""),
        managed=str(labels.get(marks.MANAGED_LABEL, "")).lower() != "false",
        unschedulable=spec.get("unschedulable") is True,
        cordoned_by_us=annotations.get(marks.CORDONED_ANNOTATION) == "true",
        tainted=isinstance(taints, list) and any(is_our_taint(t) for t in taints),
        problems=tuple(problems),
    )


def find_condition(conditions: Any) -> Condition | None:
    """Return the `GPUHealthy` condition from a `status.conditions` list, if present."""
    if not isinstance(conditions, list):
        return None
    for item in conditions:
        if isinstance(item, Mapping) and item.get("type") == marks.NODE_CONDITION:
            field = f"status.conditions[type={marks.NODE_CONDITION}]"
            try:
                status = ConditionStatus(str(item.get("status")))
            except ValueError as err:
                msg = f"{field}.status: {item.get('status')!r} is not True, False or Unknown"
                raise ValueError(msg) from err
            return Condition(
                status=status,
                reason=str(item.get("reason") or ""),
                message=str(item.get("message") or ""),
                last_transition_time=_time(item.get("lastTransitionTime"),
                                           f"{field}.lastTransitionTime"),
            )  # fmt: skip
    return None


def _parse_quarantine(annotations: Mapping[str, Any]) -> QuarantineRecord | None:
    by = annotations.get(marks.QUARANTINED_BY_ANNOTATION)
    if by is None:
        return None
    raw_record = annotations.get(marks.QUARANTINE_ANNOTATION)
    at = timestamps.parse_strict(
        annotations.get(marks.QUARANTINED_AT_ANNOTATION), marks.QUARANTINED_AT_ANNOTATION
    )
    reason = str(annotations.get(marks.QUARANTINED_REASON_ANNOTATION) or "")
    if not isinstance(raw_record, str):
        # Someone else's `quarantined-by` without our record: treat as a hand-made quarantine,
        # which only a person may release.
        return QuarantineRecord(
            mode=QuarantineMode.MANUAL,
            by=str(by),
            at=at,
            reason=reason,
            clears_with=Clearing.MANUAL_RELEASE,
        )
    try:
        record = json.loads(raw_record)
    except json.JSONDecodeError as err:
        msg = f"{marks.QUARANTINE_ANNOTATION}: not JSON ({err.msg})"
        raise ValueError(msg) from err
    if not isinstance(record, dict):
        msg = f"{marks.QUARANTINE_ANNOTATION}: expected a JSON object"
        raise ValueError(msg)
    clears_with = parse_clearing(record.get("clearsWith"), marks.QUARANTINE_ANNOTATION)
    boot_id = record.get("bootId")
    return QuarantineRecord(
        mode=QuarantineMode.AUTOMATIC if by == marks.CONTROLLER_IDENTITY else QuarantineMode.MANUAL,
        by=str(by),
        at=at,
        reason=reason,
        clears_with=clears_with,
        boot_id=boot_id if isinstance(boot_id, str) else None,
        faults=parse_keys(record.get("faults"), f"{marks.QUARANTINE_ANNOTATION}.faults"),
        evict_after=_time(record.get("evictAfter"), f"{marks.QUARANTINE_ANNOTATION}.evictAfter"),
        evicted_at=_time(record.get("evictedAt"), f"{marks.QUARANTINE_ANNOTATION}.evictedAt"),
        failed=record.get("failed") is True,
    )


def parse_clearing(value: Any, field: str) -> Clearing:
    """Read `<field>.clearsWith`, raising ValueError that names it and the values allowed."""
    try:
        return Clearing(str(value))
    except ValueError as err:
        allowed = ", ".join(c.value for c in Clearing)
        msg = f"{field}.clearsWith: {value!r} is not one of {allowed}"
        raise ValueError(msg) from err


def _time(value: Any, field: str) -> dt.datetime | None:
    """An optional timestamp: None when absent or empty, ValueError naming `field` if bad."""
    return timestamps.parse_strict(value, field) if value else None


def render_released(faults: frozenset[state.FaultKey]) -> str:
    """Return the `taugrid.dev/released-faults` value: a sorted JSON list of [uuid, code, since]."""
    return json.dumps(
        sorted(list(key) for key in faults)[:MAX_RELEASED_FAULTS], separators=(",", ":")
    )


def _parse_released(raw: str | None) -> frozenset[state.FaultKey] | None:
    if raw is None:
        return None
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as err:
        msg = f"{marks.RELEASED_FAULTS_ANNOTATION}: not JSON ({err.msg})"
        raise ValueError(msg) from err
    return parse_keys(data, marks.RELEASED_FAULTS_ANNOTATION)


def parse_keys(data: Any, field: str) -> frozenset[state.FaultKey]:
    """Read a JSON list of fault keys ([gpuUuid, code, since]), raising ValueError naming
    `field` and the entry when it is not one."""
    if not isinstance(data, list):
        msg = f"{field}: expected a JSON list of [gpuUuid, code, since]"
        raise ValueError(msg)
    keys: set[state.FaultKey] = set()
    for index, item in enumerate(data):
        valid = isinstance(item, list) and len(item) == 3
        if not (valid and all(isinstance(v, str) for v in item)):
            msg = f"{field}[{index}]: expected [gpuUuid, code, since] strings"
            raise ValueError(msg)
        keys.add(state.FaultKey(item[0], item[1], item[2]))
    return frozenset(keys)


def _gpu_capacity(status: Mapping[str, Any], problems: list[str]) -> int:
    for field in ("capacity", "allocatable"):
        value = _mapping(status.get(field)).get(marks.GPU_RESOURCE)
        if value is None:
            continue
        try:
            return int(str(value))
        except ValueError:
            problems.append(f"status.{field}[{marks.GPU_RESOURCE}]: not an integer: {value!r}")
    return 0


def is_our_taint(taint: Any) -> bool:
    """Whether a `spec.taints` entry is ours (`taugrid.dev/gpu-unhealthy:NoSchedule`)."""
    return (
        isinstance(taint, Mapping)
        and taint.get("key") == marks.TAINT_KEY
        and taint.get("effect") == marks.TAINT_EFFECT
    )


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None
