"""The hot path's msgspec decoder and the slow path that explains its refusals agree.

A differential, property-based test: hypothesis writes heartbeats that are valid and ones that
are nearly so (one mutation each: a wrong type, a number as a string, a bool for an int, an
int for a bool, a number out of range, a NaN or Infinity token, a number that overflows, an
integer of hundreds of digits, an extra or a missing field, a newline after a string, a
snake_case key), and the field-by-field explanation (`heartbeat.explain`) must find a problem
in exactly the bodies `decode` refuses, so every refusal names its field. Neither may raise
anything but its own validation error.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import hypothesis
import msgspec
import pydantic
import pytest
from hypothesis import strategies as st

from shared import fastheartbeat, health, heartbeat

RAW = "\x00raw\x00"
"""A string value json.dumps writes as `"\\u0000raw\\u0000…"`: replaced by a literal token."""

_RAW_TOKENS = ["NaN", "Infinity", "-Infinity", "1e400", "-1e400", "9" * 400, "1.0", "1e2", "-0"]


_ODD_TIMESTAMPS = [
    "2026-01-01T00:00:00.123456789Z", "2026-02-30T00:00:00Z", "2026-01-01T24:00:00Z",
    "2026-01-01T00:00:00", "2026-01-01 00:00:00Z", "2026-01-01", "2026-01-01t00:00:00z",
    "2026-01-01T00:00:00Z\n", "1767225600", "2026-01-01T00:00:00+25:00", "2026-01-01T00:00:60Z",
    "２０２６-01-01T00:00:00Z", "2026-01-01T00:00:00.Z", "2026-01-01T00:00:00-00:00",
]  # fmt: skip
"""Timestamps at and past the edge of RFC 3339 (a mutation puts one in place of a string)."""


def _timestamps() -> st.SearchStrategy[str]:
    aware = st.datetimes(
        min_value=dt.datetime(1, 1, 2), max_value=dt.datetime(9999, 12, 30),  # noqa: DTZ001
        timezones=st.sampled_from([dt.UTC, dt.timezone(dt.timedelta(hours=-7, minutes=-30))]),
    )  # fmt: skip
    return st.one_of(
        aware.map(lambda d: d.isoformat().replace("+00:00", "Z")),
        aware.map(lambda d: d.isoformat(timespec="seconds")),
    )


def _maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), strategy)


def _text(max_size: int, min_size: int = 0) -> st.SearchStrategy[str]:
    """Strings within the field's length bounds, the bound itself among them."""
    return st.one_of(
        st.text(min_size=min_size, max_size=min(max_size, 12)), st.just("x" * max_size)
    )


_FLOATS = st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.integers(-10, 10**6))
_COUNTERS = st.integers(0, 2**64 - 1)
_SHORT = _text(1024)


def _optional_fields(draw: st.DrawFn, fields: dict[str, st.SearchStrategy[Any]]) -> dict[str, Any]:
    """Each optional field present or absent; present ones drawn from their strategy."""
    return {k: draw(s) for k, s in fields.items() if draw(st.integers(0, 3)) > 0}


@st.composite
def _readings(draw: st.DrawFn) -> dict[str, Any]:
    return _optional_fields(draw, {
        "temperatureC": _maybe(_FLOATS), "powerW": _maybe(_FLOATS),
        "utilizationPct": _maybe(_FLOATS), "memoryUsedMib": _maybe(_FLOATS),
        "eccUncorrectedVolatile": _maybe(_COUNTERS), "eccCorrectedVolatile": _maybe(_COUNTERS),
        "remappedRowsPending": _maybe(st.booleans()), "remappedRowsFailure": _maybe(st.booleans()),
        "pcieReplayCount": _maybe(_COUNTERS), "nvlinksDown": _maybe(_COUNTERS),
    })  # fmt: skip


_VERDICTS = st.sampled_from([v.value for v in health.Verdict])
_ACTIONS = st.sampled_from([a.value for a in health.Action])


@st.composite
def _reason(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "code": draw(st.from_regex(heartbeat.REASON_CODE, fullmatch=True)),
        "verdict": draw(_VERDICTS),
        "action": draw(_ACTIONS),
        **_optional_fields(draw, {
            "message": _SHORT, "xid": _maybe(st.integers(0, 2**32 - 1)),
            "latched": st.booleans(), "clearsWhen": _SHORT, "since": _maybe(_timestamps()),
        }),
    }  # fmt: skip


@st.composite
def _gpu(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "index": draw(st.integers(0, heartbeat.MAX_GPUS_PER_NODE - 1)),
        "uuid": draw(_text(96, min_size=1)),
        "verdict": draw(_VERDICTS),
        **_optional_fields(draw, {
            "name": _SHORT, "pciBusId": _SHORT, "action": _ACTIONS,
            "reasons": st.lists(_reason(), max_size=2), "readings": _readings(),
        }),
    }  # fmt: skip


@st.composite
def _heartbeat(draw: st.DrawFn) -> dict[str, Any]:
    """A heartbeat the schema accepts: every value inside its field's range."""
    return {
        "schemaVersion": 1,
        "nodeName": draw(st.from_regex(heartbeat.NODE_NAME, fullmatch=True).filter(
            lambda s: len(s) <= 253)),
        "bootId": draw(_text(64, min_size=1)),
        "intervalS": draw(st.one_of(st.floats(0, 3600, exclude_min=True), st.integers(1, 3600))),
        "sequence": draw(st.integers(0, 2**63 - 1)),
        "sentAt": draw(_timestamps()),
        "gpus": draw(st.lists(_gpu(), max_size=3)),
        **_optional_fields(draw, {
            "agentUrl": _text(512), "driverVersion": _SHORT, "dcgmAvailable": st.booleans(),
        }),
    }  # fmt: skip


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a document a mutation can hit (the root excluded)."""
    out: list[tuple[Any, ...]] = []
    children: Any = value.items() if isinstance(value, dict) else enumerate(value) \
        if isinstance(value, list) else ()  # fmt: skip
    for key, child in children:
        out.append((*prefix, key))
        out.extend(_paths(child, (*prefix, key)))
    return out


_EDGES = [0, -1, 1, 63, 64, 3600, 3601, 3600.0001, 0.0, -0.0, 2**32 - 1, 2**32, 2**63 - 1,
          2**63, 2**64 - 1, 2**64, -(2**63) - 1]  # fmt: skip
"""Numbers at and just past the schema's bounds (GPU index, interval, xid, int64, uint64)."""
_LENGTHS = [0, 1, 63, 64, 65, 96, 97, 253, 254, 512, 513, 1024, 1025]

_WRONG: st.SearchStrategy[Any] = st.one_of(
    st.sampled_from(["1", "1.5", "true", "", "Healthy\n", True, False, 1.5, None, [], {}]),
    st.sampled_from(_EDGES),
    st.sampled_from([RAW + t for t in _RAW_TOKENS]),
)


@st.composite
def _mutated(draw: st.DrawFn) -> dict[str, Any]:
    """A valid heartbeat with one thing changed."""
    doc = draw(_heartbeat())
    path = draw(st.sampled_from(_paths(doc)))
    *parents, last = path
    holder: Any = doc
    for key in parents:
        holder = holder[key]
    kinds = ["wrong", "newline", "extra", "missing", "snake", "long", "stretch", "timestamp"]
    kind = draw(st.sampled_from(kinds))
    if kind == "wrong":
        holder[last] = draw(_WRONG)
    elif kind == "newline" and isinstance(holder[last], str):
        holder[last] += "\n"
    elif kind == "stretch" and isinstance(holder[last], str):
        holder[last] = (holder[last] or "a")[0] * draw(st.sampled_from(_LENGTHS))
    elif kind == "timestamp" and isinstance(holder[last], str):
        holder[last] = draw(st.sampled_from(_ODD_TIMESTAMPS))
    elif kind == "extra" and isinstance(holder, dict):
        holder["unexpected"] = draw(_WRONG)
    elif kind == "missing" and isinstance(holder, dict):
        del holder[last]
    elif kind == "snake" and isinstance(holder, dict) and isinstance(last, str):
        snake = "".join(f"_{c.lower()}" if c.isupper() else c for c in last)
        holder[snake] = holder.pop(last)
    elif kind == "long" and isinstance(holder[last], list) and holder[last]:
        # at and just past the list bounds (32 reasons, 64 GPUs)
        size = draw(st.sampled_from([32, 33, 64, 65]))
        holder[last] = (holder[last] * size)[:size]
    return doc


def _body(doc: dict[str, Any]) -> bytes:
    text = json.dumps(doc)
    for token in _RAW_TOKENS:
        text = text.replace(json.dumps(RAW + token), token)
    return text.encode()


def _slow(raw: bytes) -> list[tuple[heartbeat.Loc, str]]:
    problems = heartbeat.explain(raw)
    if problems:
        with pytest.raises(pydantic.ValidationError) as caught:
            heartbeat.validate_json(raw)
        assert [loc for loc, _ in problems] == [e["loc"] for e in caught.value.errors()]
    return problems


def _struct(raw: bytes) -> fastheartbeat.Heartbeat | None:
    try:
        return fastheartbeat.decode(raw)
    except msgspec.DecodeError:  # ValidationError is one
        return None


def _fast(raw: bytes) -> heartbeat.Heartbeat | None:
    return _struct(raw)


def _assert_agree(raw: bytes) -> None:
    problems, decoded = _slow(raw), _struct(raw)
    assert (problems != []) == (decoded is None), (raw, problems)
    if decoded is not None:
        # what a follower relays reads back as the same heartbeat, of the same types
        again = fastheartbeat.decode(fastheartbeat.encode(decoded))
        assert decoded == again
        assert heartbeat.to_json(decoded) == heartbeat.to_json(again)
        # what the on-call API shows of each GPU, from the struct the controller keeps
        shown = [fastheartbeat.gpu_json(g) for g in decoded.gpus]
        assert shown == json.loads(msgspec.json.encode(heartbeat.to_json(decoded.gpus)))


_SETTINGS = hypothesis.settings(
    max_examples=400, deadline=None, suppress_health_check=[hypothesis.HealthCheck.too_slow]
)


@_SETTINGS
@hypothesis.given(_heartbeat())
def test_both_decoders_agree_on_well_formed_heartbeats(doc: dict[str, Any]) -> None:
    """Heartbeats drawn from the schema's own ranges: accepted (or refused) alike, equal."""
    _assert_agree(_body(doc))


@_SETTINGS
@hypothesis.given(_mutated())
def test_both_decoders_agree_on_heartbeats_with_one_thing_wrong(doc: dict[str, Any]) -> None:
    """One mutation away from valid: both refuse exactly the same bodies."""
    _assert_agree(_body(doc))


_VALID: dict[str, Any] = {
    "schemaVersion": 1, "nodeName": "gpu-1", "bootId": "b", "intervalS": 5, "sequence": 1,
    "sentAt": "2026-01-01T00:00:00Z",
    "gpus": [{"index": 0, "uuid": "GPU-1", "verdict": "Healthy",
              "readings": {"pcieReplayCount": 2**64 - 1}}],
}  # fmt: skip


@pytest.mark.parametrize(
    ("change", "accepted"),
    [
        pytest.param({}, True, id="a valid heartbeat is accepted"),
        pytest.param({"sequence": "1"}, False, id="a sequence written as a string is refused"),
        pytest.param({"dcgmAvailable": 1}, False, id="a 1 for a bool is refused"),
        pytest.param({"schemaVersion": True}, False, id="true for the schema version is refused"),
        pytest.param({"schemaVersion": 1.0}, False, id="1.0 for the schema version is refused"),
        pytest.param({"sequence": 1.0}, False, id="a float for an int is refused"),
        pytest.param({"intervalS": RAW + "NaN"}, False, id="a NaN token is refused"),
        pytest.param({"intervalS": RAW + "1e400"}, False, id="a number overflowing is refused"),
        pytest.param({"sequence": RAW + "9" * 400}, False, id="a 400-digit integer is refused"),
        pytest.param({"nodeName": "gpu-1\n"}, False, id="a newline after the name is refused"),
        pytest.param({"sentAt": "2026-01-01T00:00:00"}, False,
                     id="a timestamp without an offset is refused"),
        pytest.param({"sentAt": "2026-02-30T00:00:00Z"}, False,
                     id="a timestamp of a day that does not exist is refused"),
        pytest.param({"gpus": [{**_VALID["gpus"][0], "readings": {"pcieReplayCount": 2**64}}]},
                     False, id="a counter past uint64 is refused"),
        pytest.param({"gpus": [{**_VALID["gpus"][0], "readings": None}]}, False,
                     id="null readings are refused"),
        pytest.param({"extra": 1}, False, id="an unknown field is refused"),
    ],
)  # fmt: skip
def test_known_cases_are_decided_alike(change: dict[str, Any], accepted: bool) -> None:
    """The issue's named cases, as fixed examples beside the property: both say the same."""
    raw = _body({**_VALID, **change})
    _assert_agree(raw)
    assert accepted == (_fast(raw) is not None)


_FULL: dict[str, Any] = {
    **_VALID, "agentUrl": "u", "driverVersion": "d", "dcgmAvailable": False,
    "gpus": [{
        "index": 0, "uuid": "GPU-1", "name": "n", "pciBusId": "p", "verdict": "Failed",
        "action": "ResetGPU",
        "reasons": [{"code": "Xid", "verdict": "Failed", "action": "ResetGPU", "message": "m",
                     "xid": 79, "latched": True, "clearsWhen": "c",
                     "since": "2026-01-01T00:00:00Z"}],
        "readings": {"temperatureC": 1.5, "powerW": 2, "utilizationPct": 3.0,
                     "memoryUsedMib": 4.0, "eccUncorrectedVolatile": 5, "eccCorrectedVolatile": 6,
                     "remappedRowsPending": False, "remappedRowsFailure": True,
                     "pcieReplayCount": 7, "nvlinksDown": 8},
    }],
}  # fmt: skip
"""Every field of the schema present once: the template of the edge sweep."""


def _leaves(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _leaves(v, (*prefix, k))]
    if isinstance(value, list) and value:
        return [p for i, v in enumerate(value) for p in _leaves(v, (*prefix, i))]
    return [prefix]


def _replaced(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    copy = json.loads(json.dumps(doc))
    holder = copy
    for key in path[:-1]:
        holder = holder[key]
    holder[path[-1]] = value
    return copy


_SWEEP: list[Any] = [
    *_EDGES, *(RAW + t for t in _RAW_TOKENS), "1", "true", "", True, False, None, [], {},
    *("a" * n for n in _LENGTHS), *_ODD_TIMESTAMPS, "Xid\n", "gpu-1\n",
]  # fmt: skip


@pytest.mark.parametrize("path", _leaves(_FULL), ids=lambda p: "/".join(map(str, p)))
def test_every_field_is_decided_alike_at_and_past_its_bounds(path: tuple[Any, ...]) -> None:
    """An exhaustive sweep beside the property: each field of a complete heartbeat, given
    each edge value (bounds and one past, every wrong type, every odd token and length, every
    odd timestamp), is accepted or refused alike by both decoders."""
    for value in _SWEEP:
        _assert_agree(_body(_replaced(_FULL, path, value)))


def test_a_decoded_heartbeat_encodes_to_the_same_heartbeat() -> None:
    """What a follower sends the leader (`encode`) decodes to the heartbeat it decoded."""
    hb = fastheartbeat.decode(_body({**_VALID, "sentAt": "2026-01-01T00:00:00.5+01:00"}))
    assert hb == fastheartbeat.decode(fastheartbeat.encode(hb))
