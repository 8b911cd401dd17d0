"""The heartbeat hot path's decoder: msgspec structs that mean exactly `shared.heartbeat`.

`POST /v1/heartbeats` is the controller's busiest call. msgspec decodes and validates an 8-GPU
report into these structs in ~0.4× the time pydantic-core takes for the same model
(`bench/heartbeat_parse.py`), and the controller's fleet state works on the structs as they
are (building the pydantic model from them would cost more than the decode saves): they
carry the same attribute names and types as the pydantic models (timestamps are aware
datetimes, verdicts and actions the `shared.health` enums), so nothing is built a second
time. `to_model` gives the pydantic model where one is wanted.

The two schemas must accept exactly the same bodies and yield equal values: every bound, every
pattern (written `\\A…\\Z`, because msgspec's `pattern` runs `re.search`), every default and
every alias here is taken from `shared.heartbeat`, and a property-based differential test
(`tests/unit/shared/test_fastheartbeat.py`) feeds both valid and near-valid bodies to each.
Where this decoder refuses, the caller re-reads the body on the slow path
(`heartbeat.validate_json`) to say what is wrong; that path is also the authority should the
two ever disagree.

Pure: no I/O.
"""

from __future__ import annotations

import datetime as dt
import sys
from typing import Annotated, Any, Literal, TypeVar

import msgspec
import pydantic

from shared import health, heartbeat, patterns

_FINITE = sys.float_info.max
Float = Annotated[float, msgspec.Meta(ge=-_FINITE, le=_FINITE)]
"""A finite float (msgspec already refuses NaN/Infinity tokens and numbers that overflow)."""
Counter = Annotated[int, msgspec.Meta(ge=0)]
"""Unsigned 64-bit: msgspec bounds only what fits an int64, so `decode` checks the top."""
ShortText = Annotated[str, msgspec.Meta(max_length=1024)]


class Stamp(dt.datetime):
    """A wire timestamp: an aware datetime, checked against `heartbeat.TIMESTAMP` and parsed
    by `heartbeat.parse_timestamp`'s rule, the model's own (msgspec's datetime parser reads a
    wider grammar, so it is not used)."""


_TIMESTAMP_RE = patterns.compile_full(heartbeat.TIMESTAMP)


def _decode_hook(kind: type, value: object) -> object:
    if kind is Stamp:
        if isinstance(value, str) and patterns.full(_TIMESTAMP_RE, value):
            return Stamp.fromisoformat(value)  # ValueError (no such day) -> ValidationError
        msg = "an RFC 3339 timestamp with an offset is required, e.g. 2026-01-01T00:00:00Z"
        raise ValueError(msg)
    raise NotImplementedError  # pragma: no cover - only Stamp is a custom type here


def _encode_hook(value: object) -> object:
    if isinstance(value, Stamp):
        text = value.isoformat()
        return text[:-6] + "Z" if text.endswith("+00:00") else text
    raise NotImplementedError  # pragma: no cover


class _Wire(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True, gc=False):
    """Unknown fields refused, camelCase on the wire (the aliases of `heartbeat.WireModel`).
    Not tracked by the garbage collector (`gc=False`): a report is frozen data that holds no
    reference back to itself, and a fleet's reports are most of what a leader keeps, so
    tracking them would only lengthen its full collections."""


class Reason(_Wire, frozen=True):
    code: Annotated[str, msgspec.Meta(pattern=patterns.search(heartbeat.REASON_CODE))]
    verdict: health.Verdict
    action: health.Action
    message: ShortText = ""
    xid: Annotated[int, msgspec.Meta(ge=0, le=2**32 - 1)] | None = None
    latched: bool = False
    clears_when: ShortText = ""
    since: Stamp | None = None


class GpuReadings(_Wire, frozen=True):
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


class GpuReport(_Wire, frozen=True):
    index: Annotated[int, msgspec.Meta(ge=0, lt=heartbeat.MAX_GPUS_PER_NODE)]
    uuid: Annotated[str, msgspec.Meta(min_length=1, max_length=96)]
    verdict: health.Verdict
    name: ShortText = ""
    pci_bus_id: ShortText = ""
    action: health.Action = health.Action.NONE
    reasons: Annotated[list[Reason], msgspec.Meta(max_length=heartbeat.MAX_REASONS_PER_GPU)] = []
    readings: GpuReadings = msgspec.field(default_factory=GpuReadings)
    """JSON `null` is refused, as it is by the model."""


class Heartbeat(_Wire, frozen=True):
    schema_version: Literal[1]
    node_name: Annotated[
        str, msgspec.Meta(max_length=253, pattern=patterns.search(heartbeat.NODE_NAME))
    ]
    boot_id: Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
    interval_s: Annotated[float, msgspec.Meta(gt=0, le=3600)]
    sequence: Annotated[int, msgspec.Meta(ge=0, le=heartbeat.MAX_SEQUENCE)]
    sent_at: Stamp
    gpus: Annotated[list[GpuReport], msgspec.Meta(max_length=heartbeat.MAX_GPUS_PER_NODE)]
    agent_url: Annotated[str, msgspec.Meta(max_length=512)] = ""
    driver_version: ShortText = ""
    dcgm_available: bool = False


_DECODER = msgspec.json.Decoder(Heartbeat, dec_hook=_decode_hook)
_ENCODER = msgspec.json.Encoder(enc_hook=_encode_hook)


def decode(raw: bytes) -> Heartbeat:
    """Decode and validate one heartbeat; msgspec.MsgspecError when the body is not one.
    Re-read a refused body with `heartbeat.validate_json` to explain it."""
    return check(_DECODER.decode(raw))


def decoder(kind: type[T]) -> msgspec.json.Decoder[T]:
    """A strict decoder of `kind`, a struct that holds heartbeats (a follower's batch): the
    same timestamp rule as `decode`. Pass each heartbeat it yields through `check`."""
    return msgspec.json.Decoder(kind, dec_hook=_decode_hook)


def encoder() -> msgspec.json.Encoder:
    """An encoder of structs that hold heartbeats, writing timestamps as `encode` does."""
    return msgspec.json.Encoder(enc_hook=_encode_hook)


def stamp(when: dt.datetime) -> Stamp:
    """A wire timestamp holding `when` (an aware datetime)."""
    return Stamp.fromisoformat(when.isoformat())


def wire_time(when: dt.datetime) -> str:
    """A timestamp as the wire writes it: UTC, microseconds, `Z` (`heartbeat.TIMESTAMP`)."""
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def check(hb: Heartbeat) -> Heartbeat:
    """The bound msgspec cannot say in a type (counters are unsigned 64-bit, above int64);
    msgspec.ValidationError past it, else `hb`."""
    for gpu in hb.gpus:  # cheaper here than a __post_init__ per GPU
        r = gpu.readings
        for counter in (r.ecc_uncorrected_volatile, r.ecc_corrected_volatile,
                        r.pcie_replay_count, r.nvlinks_down):  # fmt: skip
            if counter is not None and counter > heartbeat.MAX_COUNTER:
                msg = f"a counter past {heartbeat.MAX_COUNTER} (unsigned 64-bit)"
                raise msgspec.ValidationError(msg)
    return hb


def encode(hb: Heartbeat) -> bytes:
    """The wire form of a decoded heartbeat (camelCase), as `decode` reads it back; JSON
    `null` for absent optional values, as the struct holds them."""
    return _ENCODER.encode(hb)


_set = object.__setattr__
M = TypeVar("M", bound=pydantic.BaseModel)
T = TypeVar("T")


def _built(cls: type[M], values: dict[str, Any]) -> M:
    """An instance of `cls` holding `values` (every field, already valid), made the way
    `model_construct` makes one but without its per-field walk, which costs more than the
    decode itself. `tests/unit/shared/test_fastheartbeat.py` checks that
    every model field is given and that the result equals what `validate_json` builds."""
    model = cls.__new__(cls)
    _set(model, "__dict__", values)
    _set(model, "__pydantic_fields_set__", set(values))
    _set(model, "__pydantic_extra__", None)
    _set(model, "__pydantic_private__", None)
    return model


def to_model(hb: Heartbeat) -> heartbeat.Heartbeat:
    """The pydantic model of a decoded heartbeat, built without validating again (every value
    already passed the same bounds here)."""
    return _built(heartbeat.Heartbeat, {
        "schema_version": hb.schema_version,
        "node_name": hb.node_name,
        "boot_id": hb.boot_id,
        "agent_url": hb.agent_url,
        "interval_s": hb.interval_s,
        "sequence": hb.sequence,
        "sent_at": _datetime(hb.sent_at),
        "driver_version": hb.driver_version,
        "dcgm_available": hb.dcgm_available,
        "gpus": [_gpu(g) for g in hb.gpus],
    })  # fmt: skip


def _gpu(g: GpuReport) -> heartbeat.GpuReport:
    return _built(heartbeat.GpuReport, {
        "index": g.index,
        "uuid": g.uuid,
        "name": g.name,
        "pci_bus_id": g.pci_bus_id,
        "verdict": g.verdict,
        "action": g.action,
        "reasons": [_reason(x) for x in g.reasons],
        "readings": _built(heartbeat.GpuReadings, msgspec.structs.asdict(g.readings)),
    })  # fmt: skip


def _datetime(stamp: dt.datetime) -> dt.datetime:
    """The plain datetime the model holds for a wire `Stamp`."""
    return dt.datetime.fromisoformat(stamp.isoformat())


def _reason(x: Reason) -> heartbeat.Reason:
    return _built(heartbeat.Reason, {
        "code": x.code,
        "verdict": x.verdict,
        "action": x.action,
        "message": x.message,
        "xid": x.xid,
        "latched": x.latched,
        "clears_when": x.clears_when,
        "since": None if x.since is None else _datetime(x.since),
    })  # fmt: skip


Report = heartbeat.Heartbeat | Heartbeat
"""A heartbeat in either form: as this decoder reads it off the wire (the controller's hot
path), or as the pydantic model (what the agent and the tests build). Same attributes."""
GpuReportOf = heartbeat.GpuReport | GpuReport


def wire(report: Report) -> bytes:
    """The wire form (camelCase JSON, absent values left out) of a heartbeat in either form."""
    if isinstance(report, Heartbeat):
        return _ENCODER.encode(report)
    return report.model_dump_json(by_alias=True, exclude_none=True).encode()


def with_agent_url(report: Report, url: str) -> Report:
    """The same heartbeat with `agent_url` replaced."""
    if isinstance(report, Heartbeat):
        return msgspec.structs.replace(report, agent_url=url)
    return report.model_copy(update={"agent_url": url})


def gpu_json(gpu: GpuReportOf) -> dict[str, Any]:
    """One GPU's report as JSON-ready data, every field present, as the model dumps it."""
    if isinstance(gpu, GpuReport):
        data: dict[str, Any] = msgspec.to_builtins(gpu, enc_hook=_encode_hook)
        return data
    return gpu.model_dump(mode="json", by_alias=True)
