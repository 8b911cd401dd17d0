"""The heartbeat wire schema: one node's report, agent -> controller (`POST /v1/heartbeats`).

Field names are camelCase on the wire and snake_case in Python (aliases). The schema is
versioned by `schemaVersion`; the controller refuses a version it does not know with a 422
naming the field, so an agent newer than its controller is told plainly instead of being
half-understood.

The models are strict, so they mean exactly what the hot path's decoder
(`shared.fastheartbeat`, msgspec) enforces: a number is never a string (`"1"` is not an int),
a bool is never a number (`1` is not `true`, `true` is not `1`), floats are finite, keys are
the camelCase aliases only, and a timestamp is RFC 3339 with an offset (`TIMESTAMP`). Read
wire bytes with `validate_json`, which is the authority the fast decoder is tested against.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any, Literal

import pydantic
from pydantic import alias_generators

from shared import health, patterns

SCHEMA_VERSION: Literal[1] = 1
"""The only heartbeat schema version this build speaks."""

MAX_GPUS_PER_NODE = 64
MAX_REASONS_PER_GPU = 32
MAX_SEQUENCE = 2**63 - 1
"""`sequence` is an int64 (the agent counts from 0 per start); a bigger one is forged."""
MAX_COUNTER = 2**64 - 1
"""NVML's counters are unsigned 64-bit."""

NODE_NAME = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
REASON_CODE = r"[A-Z][A-Za-z0-9]{0,62}"
TIMESTAMP = (
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?(Z|[+-][0-9]{2}:[0-9]{2})"
)
"""RFC 3339 with an offset, as the agent writes it (`2026-01-01T00:00:00.123456Z`); digits past
the microsecond are dropped."""


def _full(body: str, max_length: int | None = None) -> pydantic.StringConstraints:
    """A full-match constraint, run by pydantic-core (see shared.patterns.rust)."""
    return pydantic.StringConstraints(max_length=max_length, pattern=patterns.rust(body))


def _schema(body: str) -> Any:  # pydantic.Field's FieldInfo, typed Any by pydantic
    """The same pattern in the published JSON Schema (ECMA-262: `^(?:…)$`)."""
    return pydantic.Field(json_schema_extra={"pattern": patterns.schema(body)})


def parse_timestamp(text: str) -> dt.datetime:
    """A `TIMESTAMP` string as an aware datetime; ValueError for a date or time that does not
    exist (month 13, second 60). The one parser both decoders use, so they agree."""
    return dt.datetime.fromisoformat(text)


_TIMESTAMP_RE = patterns.compile_full(TIMESTAMP)


def _timestamp(value: object) -> object:
    if isinstance(value, dt.datetime):
        if value.utcoffset() is None:
            msg = "a timestamp needs a UTC offset"
            raise ValueError(msg)
        return value
    if isinstance(value, str) and patterns.full(_TIMESTAMP_RE, value):
        return parse_timestamp(value)
    msg = "an RFC 3339 timestamp with an offset is required, e.g. 2026-01-01T00:00:00Z"
    raise ValueError(msg)


def _exact_int(value: object) -> object:
    if type(value) is not int:  # a bool or a float equals 1 too; the wire means the number
        msg = "an integer is required"
        raise ValueError(msg)
    return value


Timestamp = Annotated[
    dt.datetime,
    pydantic.BeforeValidator(_timestamp),
    pydantic.Field(json_schema_extra={"pattern": patterns.schema(TIMESTAMP)}),
]
K8sName = Annotated[str, _full(NODE_NAME, 253), _schema(NODE_NAME)]
"""A Node's name: a DNS-1123 subdomain."""
ShortText = Annotated[str, pydantic.StringConstraints(max_length=1024)]
Counter = Annotated[int, pydantic.Field(ge=0, le=MAX_COUNTER)]


class WireModel(pydantic.BaseModel):
    """Frozen, strict (no coercion), strict-about-unknown-fields, camelCase on the wire."""

    model_config = pydantic.ConfigDict(
        frozen=True,
        extra="forbid",
        alias_generator=alias_generators.to_camel,
        populate_by_name=True,
        allow_inf_nan=False,
        strict=True,
    )


class Reason(WireModel):
    """One finding behind a verdict, with the evidence an on-call engineer needs."""

    code: Annotated[str, _full(REASON_CODE), _schema(REASON_CODE)]
    """PascalCase reason, used verbatim as a NodeCondition reason (`XidFallenOffBus`)."""
    verdict: health.Verdict
    action: health.Action
    message: ShortText = ""
    xid: Annotated[int, pydantic.Field(ge=0, le=2**32 - 1)] | None = None
    latched: bool = False
    """True when the fault stays until `clears_when` is observed, whatever later probes show."""
    clears_when: ShortText = ""
    """Human-readable clearing condition of a latched fault (`new bootId`, `manual release`)."""
    since: Timestamp | None = None


class GpuReadings(WireModel):
    """The key readings a controller shows beside a verdict; absent means not supported."""

    temperature_c: float | None = None
    power_w: float | None = None
    utilization_pct: float | None = None
    memory_used_mib: float | None = None
    ecc_uncorrected_volatile: Counter | None = None
    ecc_corrected_volatile: Counter | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    pcie_replay_count: Counter | None = None
    nvlinks_down: Counter | None = None


class GpuReport(WireModel):
    """One GPU's verdict as the agent decided it."""

    index: Annotated[int, pydantic.Field(ge=0, lt=MAX_GPUS_PER_NODE)]
    uuid: Annotated[str, pydantic.StringConstraints(min_length=1, max_length=96)]
    name: ShortText = ""
    pci_bus_id: ShortText = ""
    verdict: health.Verdict
    action: health.Action = health.Action.NONE
    reasons: Annotated[list[Reason], pydantic.Field(max_length=MAX_REASONS_PER_GPU)] = []
    readings: GpuReadings = GpuReadings()


class Heartbeat(WireModel):
    """One node's report. The controller keys fleet state on `node_name`."""

    schema_version: Annotated[Literal[1], pydantic.BeforeValidator(_exact_int)]
    node_name: K8sName
    boot_id: Annotated[str, pydantic.StringConstraints(min_length=1, max_length=64)]
    agent_url: Annotated[str, pydantic.StringConstraints(max_length=512)] = ""
    """Accepted and ignored: the controller derives the agent's URL from the pod its token is
    bound to, never from the body (DESIGN.md section 10). Kept so agents of schema 1 still
    validate; a later schema version drops it."""
    interval_s: Annotated[float, pydantic.Field(gt=0, le=3600)]
    """Seconds until the next report. The controller accepts only its own range (settings
    `heartbeat_min_interval_s`..`heartbeat_max_interval_s`); this bound is the wire's."""
    sequence: Annotated[int, pydantic.Field(ge=0, le=MAX_SEQUENCE)]
    sent_at: Timestamp
    """The agent's clock; the controller refuses a report outside its skew window."""
    driver_version: ShortText = ""
    dcgm_available: bool = False
    gpus: Annotated[list[GpuReport], pydantic.Field(max_length=MAX_GPUS_PER_NODE)]


def validate_json(raw: bytes | str) -> Heartbeat:
    """Read one heartbeat from wire bytes: the aliases only (never the Python field names),
    strict; pydantic.ValidationError else. The slow path, and the reference of the fast one."""
    return Heartbeat.model_validate_json(raw, by_alias=True, by_name=False)
