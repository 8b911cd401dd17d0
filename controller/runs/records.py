"""The TauRun's status, typed: the one place its shape is written down (DESIGN.md §2).

The reconciler reads a TauRun's status into `RunStatus` and writes a `RunStatus` back; the
API reads it to answer researchers. Field names are camelCase on the cluster (aliases), times
are RFC 3339 with whole seconds (`metav1.Time`). A status written by an older controller
reads as well: unknown members are ignored here and left untouched on the cluster, because
the reconciler writes only the difference (`patch_body`) of the members modelled here.
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Mapping
from typing import Annotated, Any, Literal

import pydantic

from controller import timestamps
from controller import wire as wirebase  # `wire` here is the answer builder below


def _time(value: object) -> object:
    if isinstance(value, str):
        parsed = timestamps.parse(value)
        if parsed is None:
            msg = f"not an RFC 3339 time: {value!r}"
            raise ValueError(msg)
        return parsed
    return value


Time = Annotated[
    dt.datetime,
    pydantic.BeforeValidator(_time),
    pydantic.PlainSerializer(timestamps.rfc3339, return_type=str),
]
"""A time on the TauRun: read leniently, written as `metav1.Time` (whole seconds, `Z`)."""


class Phase(enum.StrEnum):
    """Where a run is in its life (DESIGN.md section 7)."""

    PENDING = "Pending"
    QUEUED = "Queued"
    ADMITTED = "Admitted"
    RUNNING = "Running"
    RESUMING = "Resuming"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    CANCELLED = "Cancelled"


class StatusModel(wirebase.Lenient):
    """Tolerant of members an older controller wrote."""


class Condition(StatusModel):
    """One condition per phase the run reached (type = the phase)."""

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str = ""
    message: str = ""
    last_transition_time: Time | None = None


class Eviction(StatusModel):
    """How often Kueue evicted (preempted) the attempt's Workload, by reason."""

    reason: str
    count: int


class AttemptRecord(StatusModel):
    """One attempt: its object, where it ran, how it ended."""

    number: int
    object_kind: str = ""
    object_name: str = ""
    phase: Phase = Phase.QUEUED
    created_time: Time | None = None
    start_time: Time | None = None
    end_time: Time | None = None
    nodes: tuple[str, ...] = ()
    exit_codes: tuple[int, ...] = ()
    failure_class: str | None = None
    message: str = ""
    """Why it failed, in words (with `failureClass`)."""
    workload: str = ""
    cluster_queue: str = ""
    flavors: dict[str, str] = {}
    evictions: tuple[Eviction, ...] = ()
    resume_from: str | None = None
    """The checkpoint it started from; "" a fresh start; None when not decided yet."""
    priority_class: str | None = None
    """The WorkloadPriorityClass it was given (the resume boost), when not the spec's."""
    not_ready: str = ""
    """Why its pods were last seen not running while it was admitted (unschedulable, an
    image that cannot be pulled...), kept after Kueue or a person removed the pods."""


class Checkpoint(StatusModel):
    """A checkpoint a run's pod reported (`POST …/checkpoints`)."""

    attempt: int
    step: int
    path: str
    time: Time


class MetricPoint(StatusModel):
    """One value of a metric at a training step."""

    step: int
    value: float
    time: Time


class MetricSeries(StatusModel):
    """One named metric over steps, lowest step first. Past its cap the older points are
    thinned (kept at a coarser spacing; the first and the newest always stay)."""

    name: str
    points: tuple[MetricPoint, ...] = ()
    thinned: int = 0
    """Points dropped by thinning so far."""


class Artifact(StatusModel):
    """Something the run produced, by URI (a model in a bucket, a file on a volume)."""

    uri: str
    size: int | None = None
    """Bytes, when the run knew them."""
    digest: str | None = None
    """`sha256:<hex>`, when the run knew it."""
    attempt: int = 0
    time: Time | None = None


class Results(StatusModel):
    """What the run's pods reported (`POST …/results`): metrics, artifacts, a summary."""

    metrics: tuple[MetricSeries, ...] = ()
    artifacts: tuple[Artifact, ...] = ()
    """Newest last; past the cap the oldest go (counted in `artifactsDropped`)."""
    artifacts_dropped: int = 0
    summary: str = ""
    summary_time: Time | None = None
    reports: int = 0
    """Reports merged so far."""
    updated_time: Time | None = None


class RerunSource(StatusModel):
    """The run a rerun was made from (`POST …/rerun`)."""

    name: str
    uid: str = ""
    spec_hash: str = ""
    image_id: str | None = pydantic.Field(default=None, alias="imageID")
    """The image the old run ran, by digest, when its evidence had one."""


class KueueEvidence(StatusModel):
    """Where Kueue admitted the run."""

    local_queue: str = ""
    priority_class: str | None = None
    workload: str = ""
    cluster_queue: str = ""
    flavors: dict[str, str] = {}
    evictions: tuple[Eviction, ...] = ()


class EvidenceAttempt(StatusModel):
    """What the evidence keeps of each attempt."""

    number: int
    object_name: str = ""
    nodes: tuple[str, ...] = ()
    exit_codes: tuple[int, ...] = ()
    failure_class: str | None = None
    start_time: Time | None = None
    end_time: Time | None = None


class Evidence(StatusModel):
    """Enough to reproduce the run and to see where it ran; values once seen are kept."""

    spec_hash: str = ""
    image: str = ""
    image_id: str | None = pydantic.Field(default=None, alias="imageID")
    kind: str = ""
    namespace: str = ""
    kueue: KueueEvidence = KueueEvidence()
    spec: dict[str, Any] = {}
    nodes: tuple[str, ...] = ()
    experiment: dict[str, Any] | None = None
    attempts: tuple[EvidenceAttempt, ...] = ()
    rerun_of: RerunSource | None = None
    """The run this one reruns, from its evidence (`tau rerun`)."""


class RunStatus(StatusModel):
    """`status` of a TauRun."""

    phase: Phase = Phase.PENDING
    reason: str = ""
    message: str = ""
    """Why the run waits or what ended it, in words."""
    current_attempt: int = 0
    attempts: tuple[AttemptRecord, ...] = ()
    checkpoints: tuple[Checkpoint, ...] = ()
    """The newest checkpoints, oldest first."""
    conditions: tuple[Condition, ...] = ()
    queue_position: int | None = None
    queue_position_in_local_queue: int | None = None
    queue_position_source: Literal["visibility", "computed"] | None = None
    start_time: Time | None = None
    end_time: Time | None = None
    evidence: Evidence | None = None
    objects_deleted: bool | None = None
    """True once a finished run's objects were deleted after the TTL."""
    attempt_budget_from: int = 0
    """`retry.maxAttempts` counts the attempts after this one (a manual resume resets it)."""
    results: Results | None = None
    """Metrics, artifacts and a summary the run reported, size-capped."""

    @property
    def last_attempt(self) -> AttemptRecord | None:
        """The newest attempt record, None before the first."""
        return self.attempts[-1] if self.attempts else None

    def with_last_attempt(self, record: AttemptRecord) -> RunStatus:
        """The status with its newest attempt record replaced by `record`."""
        return self.model_copy(update={"attempts": (*self.attempts[:-1], record)})

    def attempt(self, number: int) -> AttemptRecord | None:
        """The record of attempt `number`, None when there is none."""
        return next((a for a in self.attempts if a.number == number), None)


def read(raw: Mapping[str, Any] | None, *, results: bool = True) -> RunStatus:
    """The status of a raw TauRun; a status that cannot be read is reported, never guessed
    (ValueError naming the member). `results=False` leaves `results` out (None): the
    reconciler never needs them and they are most of a busy run's status, so its passes do
    not parse them, and `patch_body` of two such statuses never touches them."""
    members = dict(raw or {})
    if not results:
        members.pop("results", None)
    try:
        return RunStatus.model_validate(members)
    except pydantic.ValidationError as err:
        first = err.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        msg = f"status.{where}: {first['msg']}"
        raise ValueError(msg) from err


def wire(status: RunStatus) -> dict[str, Any]:
    """The status as stored on the cluster: camelCase, absent (None) members left out."""
    return status.model_dump(mode="json", by_alias=True, exclude_none=True)


def stored_alike(a: RunStatus, b: RunStatus) -> bool:
    """Whether two statuses are stored the same (`wire`). Equal ones are (times are stored
    in UTC, to the second), and comparing them is cheap; unequal ones may still be, so only
    those pay for two `model_dump`s."""
    return a == b or wire(a) == wire(b)


def patch_body(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that turns `old` into `new` (both `wire` forms, so
    members this model does not know are in neither and stay untouched): changed members
    are written, removed ones set to null; lists are replaced whole, as merge patch does."""
    out: dict[str, Any] = {}
    for key in new.keys() | old.keys():
        if key not in new:
            out[key] = None
        elif key not in old or old[key] != new[key]:
            if isinstance(new[key], Mapping) and isinstance(old.get(key), Mapping):
                out[key] = patch_body(old[key], new[key])
            else:
                out[key] = new[key]
    return out


def crd_status_schema() -> dict[str, Any]:
    """The TauRun CRD's `status` schema, derived from `RunStatus` (a Kubernetes structural
    schema: no references, `nullable` instead of a null type, free-form maps marked to keep
    their fields). The CRD in deploy/ holds exactly this; a test keeps them equal."""
    doc = RunStatus.model_json_schema(by_alias=True)
    defs = doc.get("$defs", {})
    kept = {"x-kubernetes-preserve-unknown-fields": True}  # members are kept, never pruned

    def convert(node: Mapping[str, Any]) -> dict[str, Any]:
        if "$ref" in node:
            return convert(defs[node["$ref"].rsplit("/", 1)[-1]])
        if options := node.get("anyOf"):
            kinds = [o for o in options if o.get("type") != "null"]
            return {**(convert(kinds[0]) if len(kinds) == 1 else kept), "nullable": True}
        kind = node.get("type")
        out: dict[str, Any]
        if "enum" in node:
            out = {"type": "string", "enum": list(node["enum"])}
        elif kind == "object" and "properties" in node:
            # Unknown members are kept (not pruned), so a controller that writes a new
            # member never needs a CRD upgrade first.
            out = {"type": "object", **kept, "properties": {
                k: _described(convert(v), v) for k, v in node["properties"].items()
            }}  # fmt: skip
        elif (
            kind == "object"
            and isinstance(node.get("additionalProperties"), Mapping)
            and node["additionalProperties"].get("type") == "string"
        ):
            out = {"type": "object", "additionalProperties": {"type": "string"}}
        elif kind == "object":
            out = {"type": "object", **kept}
        elif kind == "array":
            out = {"type": "array", "items": convert(node.get("items") or {})}
        elif kind in {"string", "integer", "boolean", "number"}:
            out = {"type": str(kind)}
            if node.get("format") == "date-time":
                out["format"] = "date-time"
        else:
            out = dict(kept)
        return out

    def _described(out: dict[str, Any], node: Mapping[str, Any]) -> dict[str, Any]:
        text = node.get("description")
        if not text and "$ref" in node:
            text = defs[node["$ref"].rsplit("/", 1)[-1]].get("description")
        return {"description": text, **out} if text else out

    status = convert(doc)
    status.update(kept)  # members an older controller wrote
    conditions = status["properties"]["conditions"]
    conditions.update({"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]})
    conditions["items"]["required"] = ["type", "status"]
    return {"type": "object", "description": doc.get("description", ""), **{
        k: v for k, v in status.items() if k != "type"
    }}  # fmt: skip


# ---------------------------------------------------------------- condition setters


def set_phase_condition(
    conditions: tuple[Condition, ...],
    phase: Phase,
    reason: str,
    message: str,
    now: dt.datetime,
) -> tuple[tuple[Condition, ...], bool]:
    """Record that the run reached `phase` (a True condition of that type), keeping the
    first time it was reached. Return the conditions and whether anything changed."""
    for i, c in enumerate(conditions):
        if c.type == str(phase):
            if c.status == "True":
                return conditions, False
            changed = c.model_copy(
                update={"status": "True", "reason": reason, "message": message,
                        "last_transition_time": now}
            )  # fmt: skip
            return (*conditions[:i], changed, *conditions[i + 1 :]), True
    added = Condition(
        type=str(phase), status="True", reason=reason or str(phase), message=message,
        last_transition_time=now,
    )  # fmt: skip
    return (*conditions, added), True


def with_phase_condition(
    status: RunStatus, phase: Phase, reason: str, message: str, now: dt.datetime
) -> RunStatus:
    """The status with `set_phase_condition` applied."""
    conditions, _ = set_phase_condition(status.conditions, phase, reason, message, now)
    return status.model_copy(update={"conditions": conditions})
