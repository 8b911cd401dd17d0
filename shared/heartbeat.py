"""The heartbeat wire schema: one node's report, agent -> controller (`POST /v1/heartbeats`).

Declared once, as msgspec structs: the agent builds and sends them, the controller decodes
and keeps them (`decode`, the hot path), and the OpenAPI document publishes their
`msgspec.json.schema` (`json_schema`; a pydantic model may hold one, see `_Wire`).

Field names are camelCase on the wire and snake_case in Python. The schema is versioned by
`schemaVersion`; the controller refuses a version it does not know with a 422 naming the
field, so an agent newer than its controller is told plainly instead of being half-understood.

Strict: a number is never a string (`"1"` is not an int), a bool is never a number (`1` is not
`true`, `true` is not `1`), floats are finite, keys are the camelCase names only, and a
timestamp is RFC 3339 with an offset (`TIMESTAMP`). A pattern is written `\\A…\\Z` here,
because msgspec's `pattern` runs `re.search`, and `^(?:…)$` in the published schema.

`decode` says only the first problem, as msgspec found it. `validate_json` is the slow path
that explains a refusal: it re-reads the body against these same structs, field by field,
and raises a pydantic.ValidationError listing every problem at its field (what the
controller's 422 names). It decides nothing of its own: `decode` is the authority, and
`tests/unit/shared/test_fastheartbeat.py` checks that both refuse exactly the same bodies.

Pure: no I/O.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
import typing
from typing import Annotated, Any, Literal, TypeVar

import msgspec
import pydantic
import pydantic_core
from pydantic_core import core_schema

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

_TIMESTAMP_RE = patterns.compile_full(TIMESTAMP)
_NO_TIMESTAMP = "an RFC 3339 timestamp with an offset is required, e.g. 2026-01-01T00:00:00Z"


def parse_timestamp(text: str) -> dt.datetime:
    """A `TIMESTAMP` string as an aware datetime; ValueError for a date or time that does not
    exist (month 13, second 60)."""
    return dt.datetime.fromisoformat(text)


_PUBLISHED: dict[str, str] = {}
"""Each pattern as msgspec runs it (`\\A…\\Z`) -> as the document publishes it (`^(?:…)$`)."""


def _pattern(body: str, max_length: int | None = None) -> msgspec.Meta:
    """A full match of `body`; `json_schema` publishes it in ECMA-262's spelling."""
    _PUBLISHED[patterns.search(body)] = patterns.schema(body)
    return msgspec.Meta(max_length=max_length, pattern=patterns.search(body))


_FINITE = sys.float_info.max
Float = Annotated[float, msgspec.Meta(ge=-_FINITE, le=_FINITE)]
"""A finite float (msgspec already refuses NaN/Infinity tokens and numbers that overflow)."""
Counter = Annotated[int, msgspec.Meta(ge=0, extra_json_schema={"maximum": MAX_COUNTER})]
"""Unsigned 64-bit: msgspec bounds only what fits an int64, so `check` bounds the top."""
ShortText = Annotated[str, msgspec.Meta(max_length=1024)]


class Stamp(dt.datetime):
    """A wire timestamp: an aware datetime, checked against `TIMESTAMP` and parsed by
    `parse_timestamp`'s rule (msgspec's own datetime parser reads a wider grammar)."""


if typing.TYPE_CHECKING:
    WireTime: typing.TypeAlias = dt.datetime
else:
    WireTime = Stamp
"""A struct's timestamp field: decoded as a `Stamp` (the hook below), and any aware datetime
when built in Python, which msgspec writes in the same form."""


def _decode_hook(kind: type, value: object) -> object:
    if kind is Stamp:
        if isinstance(value, str) and patterns.full(_TIMESTAMP_RE, value):
            return Stamp.fromisoformat(value)  # ValueError (no such day) -> ValidationError
        raise ValueError(_NO_TIMESTAMP)
    raise NotImplementedError  # pragma: no cover - only Stamp is a custom type here


def _encode_hook(value: object) -> object:
    if isinstance(value, dt.datetime):  # a Stamp; msgspec writes a plain datetime itself
        text = value.isoformat()
        return text[:-6] + "Z" if text.endswith("+00:00") else text
    raise NotImplementedError  # pragma: no cover


def _schema_hook(kind: type) -> dict[str, Any]:
    if kind is Stamp:
        return {"type": "string", "format": "date-time", "pattern": patterns.schema(TIMESTAMP)}
    raise NotImplementedError  # pragma: no cover


def _aware(when: dt.datetime | None, field: str) -> None:
    """Refuse a naive datetime built in Python, so it never reaches the wire."""
    if when is not None and when.utcoffset() is None:
        raise refusal([((field,), "a timestamp needs a UTC offset")])


class _Wire(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True, gc=False,
            kw_only=True):  # fmt: skip
    """Unknown fields refused, camelCase on the wire, built by keyword.

    Not tracked by the garbage collector (`gc=False`): a report is frozen data that holds no
    reference back to itself, and a fleet's reports are most of what a leader keeps, so
    tracking them would only lengthen its full collections.

    A pydantic model may hold one (the controller's documents do): pydantic then converts
    with msgspec and publishes `json_schema` of the struct, so the schema stays this one."""

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> core_schema.CoreSchema:
        def validate(value: object) -> object:
            return value if isinstance(value, cls) else convert(value, cls)

        return core_schema.no_info_plain_validator_function(
            validate,
            ref=f"{cls.__module__}.{cls.__qualname__}",
            metadata={"pydantic_js_functions": [lambda _schema, _handler: json_schema(cls)]},
            serialization=core_schema.plain_serializer_function_ser_schema(to_json),
        )


class Reason(_Wire, frozen=True, kw_only=True):
    """One finding behind a verdict, with the evidence an on-call engineer needs."""

    code: Annotated[str, _pattern(REASON_CODE)]
    """PascalCase reason, used verbatim as a NodeCondition reason (`XidFallenOffBus`)."""
    verdict: health.Verdict
    action: health.Action
    message: ShortText = ""
    xid: Annotated[int, msgspec.Meta(ge=0, le=2**32 - 1)] | None = None
    latched: bool = False
    """True when the fault stays until `clears_when` is observed, whatever later probes show."""
    clears_when: ShortText = ""
    """Human-readable clearing condition of a latched fault (`new bootId`, `manual release`)."""
    since: WireTime | None = None

    def __post_init__(self) -> None:
        _aware(self.since, "since")


class GpuReadings(_Wire, frozen=True, kw_only=True):
    """The key readings a controller shows beside a verdict; absent means not supported."""

    temperature_c: Float | None = None
    power_w: Float | None = None
    utilization_pct: Float | None = None
    memory_used_mib: Float | None = None
    ecc_uncorrected_volatile: Counter | None = None
    ecc_corrected_volatile: Counter | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    pcie_replay_count: Counter | None = None
    nvlinks_down: Counter | None = None


_COUNTERS = ("ecc_uncorrected_volatile", "ecc_corrected_volatile", "pcie_replay_count",
             "nvlinks_down")  # fmt: skip
"""The `Counter` fields of `GpuReadings`, bounded above by `check`."""


class GpuReport(_Wire, frozen=True, kw_only=True):
    """One GPU's verdict as the agent decided it."""

    index: Annotated[int, msgspec.Meta(ge=0, lt=MAX_GPUS_PER_NODE)]
    uuid: Annotated[str, msgspec.Meta(min_length=1, max_length=96)]
    name: ShortText = ""
    pci_bus_id: ShortText = ""
    verdict: health.Verdict
    action: health.Action = health.Action.NONE
    reasons: Annotated[list[Reason], msgspec.Meta(max_length=MAX_REASONS_PER_GPU)] = []
    readings: GpuReadings = msgspec.field(default_factory=GpuReadings)
    """JSON `null` is refused."""


class Heartbeat(_Wire, frozen=True, kw_only=True):
    """One node's report. The controller keys fleet state on `node_name`."""

    schema_version: Literal[1]
    node_name: Annotated[str, _pattern(NODE_NAME, 253)]
    """A Node's name: a DNS-1123 subdomain."""
    boot_id: Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
    agent_url: Annotated[str, msgspec.Meta(max_length=512)] = ""
    """Accepted and ignored: the controller derives the agent's URL from the pod its token is
    bound to, never from the body (DESIGN.md section 10). Kept so agents of schema 1 still
    validate; a later schema version drops it."""
    interval_s: Annotated[float, msgspec.Meta(gt=0, le=3600)]
    """Seconds until the next report. The controller accepts only its own range (settings
    `heartbeat_min_interval_s`..`heartbeat_max_interval_s`); this bound is the wire's."""
    sequence: Annotated[int, msgspec.Meta(ge=0, le=MAX_SEQUENCE)]
    sent_at: WireTime
    """The agent's clock; the controller refuses a report outside its skew window."""
    driver_version: ShortText = ""
    dcgm_available: bool = False
    gpus: Annotated[list[GpuReport], msgspec.Meta(max_length=MAX_GPUS_PER_NODE)]


# ---------------------------------------------------------------------- the hot path
_DECODER = msgspec.json.Decoder(Heartbeat, dec_hook=_decode_hook)
_ENCODER = msgspec.json.Encoder(enc_hook=_encode_hook)
T = TypeVar("T")


def decode(raw: bytes | str) -> Heartbeat:
    """Decode and validate one heartbeat; msgspec.MsgspecError when the body is not one
    (`validate_json` says everything that is wrong with it)."""
    return check(_DECODER.decode(raw))


def check(hb: Heartbeat) -> Heartbeat:
    """The bound msgspec cannot say in a type (counters are unsigned 64-bit, above int64);
    msgspec.ValidationError past it, else `hb`."""
    for gpu in hb.gpus:  # cheaper here than a __post_init__ per GPU
        r = gpu.readings
        for counter in (r.ecc_uncorrected_volatile, r.ecc_corrected_volatile,
                        r.pcie_replay_count, r.nvlinks_down):  # fmt: skip
            if counter is not None and counter > MAX_COUNTER:
                msg = f"a counter past {MAX_COUNTER} (unsigned 64-bit)"
                raise msgspec.ValidationError(msg)
    return hb


def decoder(kind: type[T]) -> msgspec.json.Decoder[T]:
    """A strict decoder of `kind`, a struct that holds heartbeats (a follower's batch): the
    same timestamp rule as `decode`. Pass each heartbeat it yields through `check`."""
    return msgspec.json.Decoder(kind, dec_hook=_decode_hook)


def encoder() -> msgspec.json.Encoder:
    """An encoder of structs that hold heartbeats, writing timestamps as `encode` does."""
    return msgspec.json.Encoder(enc_hook=_encode_hook)


def encode(hb: Heartbeat) -> bytes:
    """The wire form of a heartbeat (camelCase JSON, `null` for absent optional values), as
    `decode` reads it back."""
    return _ENCODER.encode(hb)


def convert(value: object, kind: type[T]) -> T:
    """`value` (JSON-ready data, camelCase keys) as `kind`, under the wire's rules."""
    return msgspec.convert(value, kind, dec_hook=_decode_hook)


def to_json(value: object) -> Any:
    """A struct (or a list of them) as JSON-ready data, camelCase, every field present."""
    return msgspec.to_builtins(value, enc_hook=_encode_hook)


def stamp(when: dt.datetime) -> Stamp:
    """A wire timestamp holding `when` (an aware datetime)."""
    return Stamp.fromisoformat(when.isoformat())


def wire_time(when: dt.datetime) -> str:
    """A timestamp as the wire writes it: UTC, microseconds, `Z` (`TIMESTAMP`)."""
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# ---------------------------------------------------------------------- the schema, published
def json_schema(kind: type[msgspec.Struct]) -> dict[str, Any]:
    """The JSON Schema (2020-12, as OpenAPI 3.1 reads it) of `kind`, from msgspec, with every
    struct and enum it holds written in place (a pydantic document keeps no foreign `$ref`)."""
    schema, components = msgspec.json.schema_components(
        [kind], schema_hook=_schema_hook, ref_template="{name}"
    )

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                return inline(components[node["$ref"]])
            out = {k: inline(v) for k, v in node.items()}
            if "pattern" in out:
                out["pattern"] = _PUBLISHED.get(out["pattern"], out["pattern"])
            return out
        if isinstance(node, list):
            return [inline(v) for v in node]
        return node

    out: dict[str, Any] = inline(schema[0])
    return out


# ---------------------------------------------------------------------- the slow path
Loc = tuple[str | int, ...]


def refusal(problems: list[tuple[Loc, str]], title: str = "Heartbeat") -> pydantic.ValidationError:
    """`problems` (where, what) as a pydantic.ValidationError, which the controller turns into
    a 422 naming the first field (`controller.errors.validation_error`)."""
    return pydantic_core.ValidationError.from_exception_data(title, [
        {"type": pydantic_core.PydanticCustomError("heartbeat", "{message}", {"message": msg}),
         "loc": loc, "input": None}
        for loc, msg in problems
    ])  # fmt: skip


def validate_json(raw: bytes | str) -> Heartbeat:
    """Read one heartbeat from wire bytes, as `decode` does; pydantic.ValidationError naming
    every problem at its field when it is not one. The slow path: only a refusal pays for it."""
    try:
        return decode(raw)
    except msgspec.MsgspecError as err:
        problems = explain(raw) or [(_msgspec_loc(err), _msgspec_message(err))]
        raise refusal(problems) from err


def explain(raw: bytes | str) -> list[tuple[Loc, str]]:
    """Every problem of `raw` as a heartbeat, each at its field; empty when `decode` would
    take it. Only for a body `decode` refused: this walk is many times slower."""
    try:
        data = json.loads(raw)
    except ValueError as bad:  # UnicodeDecodeError is one
        return [((), f"the body is not JSON: {bad}")]
    return _problems(data, Heartbeat, ())


def _problems(value: object, kind: Any, loc: Loc) -> list[tuple[Loc, str]]:
    """What is wrong with `value` (JSON data) as `kind`, a type of these structs, each at its
    own field: in a struct every field (in order) and every unknown key; in a list of structs
    every item; elsewhere msgspec's own word, converting `value` alone."""
    if isinstance(kind, type) and issubclass(kind, msgspec.Struct) and isinstance(value, dict):
        try:  # one call for what is right, which is most of a refused body
            if _within_counters(convert(value, kind)):
                return []
        except msgspec.ValidationError:
            pass
        problems: list[tuple[Loc, str]] = []
        fields = msgspec.structs.fields(kind)
        for f in fields:
            here = (*loc, f.encode_name)
            if f.encode_name not in value:
                if f.required:
                    problems.append((here, "Field required"))
                continue
            item = value[f.encode_name]
            found = _problems(item, f.type, here)
            if not found and f.name in _COUNTERS and isinstance(item, int) and item > MAX_COUNTER:
                found = [(here, f"a counter past {MAX_COUNTER} (unsigned 64-bit)")]
            problems += found
        known = {f.encode_name for f in fields}
        problems += [((*loc, key), "an unknown field") for key in value if key not in known]
        return problems
    items = _struct_items(kind)
    if items is not None and isinstance(value, list):
        bounds = typing.get_args(kind)[1:]
        try:
            msgspec.convert(value, Annotated[list[Any], *bounds])  # its length only
        except msgspec.ValidationError as err:
            return [(loc, _msgspec_message(err))]
        return [p for i, v in enumerate(value) for p in _problems(v, items, (*loc, i))]
    try:
        convert(value, kind)
    except msgspec.ValidationError as err:
        return [((*loc, *_msgspec_loc(err)), _msgspec_message(err))]
    return []


def _within_counters(part: object) -> bool:
    """`check`'s bound, on a part of a heartbeat."""
    if isinstance(part, Heartbeat):
        return all(_within_counters(gpu) for gpu in part.gpus)
    if isinstance(part, GpuReport):
        part = part.readings
    if isinstance(part, GpuReadings):
        values = (getattr(part, name) for name in _COUNTERS)
        return all(v is None or v <= MAX_COUNTER for v in values)
    return True


def _struct_items(kind: Any) -> type[msgspec.Struct] | None:
    """The struct of `Annotated[list[S], …]`, else None."""
    if typing.get_origin(kind) is Annotated:
        kind = typing.get_args(kind)[0]
    if typing.get_origin(kind) is list:
        (item,) = typing.get_args(kind)
        if isinstance(item, type) and issubclass(item, msgspec.Struct):
            return item
    return None


_AT = " - at `$"


def _msgspec_message(err: msgspec.MsgspecError) -> str:
    return str(err).split(_AT, 1)[0]


def _msgspec_loc(err: msgspec.MsgspecError) -> Loc:
    """msgspec's path (`$.gpus[0].uuid`) as a location (`("gpus", 0, "uuid")`)."""
    text = str(err)
    if _AT not in text:
        return ()
    path = text.split(_AT, 1)[1].removesuffix("`")
    loc: list[str | int] = []
    for part in path.replace("[", ".[").split("."):
        if part.startswith("[") and part.endswith("]"):
            loc.append(int(part[1:-1]))
        elif part:
            loc.append(part)
    return tuple(loc)


# ---------------------------------------------------------------------- for pydantic models
def _timestamp(value: object) -> object:
    if isinstance(value, dt.datetime):
        if value.utcoffset() is None:
            msg = "a timestamp needs a UTC offset"
            raise ValueError(msg)
        return value
    if isinstance(value, str) and patterns.full(_TIMESTAMP_RE, value):
        return parse_timestamp(value)
    raise ValueError(_NO_TIMESTAMP)


Timestamp = Annotated[
    dt.datetime,
    pydantic.BeforeValidator(_timestamp),
    pydantic.Field(json_schema_extra={"pattern": patterns.schema(TIMESTAMP)}),
]
"""`Stamp`'s rule for a pydantic model's field (a follower's liveness entry)."""
K8sName = Annotated[
    str,
    pydantic.StringConstraints(max_length=253, pattern=patterns.rust(NODE_NAME)),
    pydantic.Field(json_schema_extra={"pattern": patterns.schema(NODE_NAME)}),
]
"""`Heartbeat.node_name`'s rule for a pydantic model's field: a DNS-1123 subdomain."""
