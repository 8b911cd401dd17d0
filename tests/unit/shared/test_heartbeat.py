"""The heartbeat wire schema bounds every field an agent (or a forger) can send (M6)."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pydantic
import pytest

from shared import health, heartbeat

GPU = {"index": 0, "uuid": "GPU-1", "verdict": "Healthy"}


def _body(**fields: Any) -> str:
    base: dict[str, Any] = {
        "schemaVersion": 1, "nodeName": "gpu-1", "bootId": "b", "intervalS": 5,
        "sequence": 1, "sentAt": "2026-01-01T00:00:00Z", "gpus": [GPU],
    }  # fmt: skip
    return json.dumps({**base, **fields})


def _raw(text: str, field: str, raw: str) -> str:
    """Put a literal JSON value (one json.dumps cannot write) in place of `field`."""
    marker = "__RAW__"
    return text.replace(f'"{field}": "{marker}"', f'"{field}": {raw}')


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        pytest.param(_body(sequence=2**63), ("sequence",), id="a sequence past int64"),
        pytest.param(_raw(_body(sequence="__RAW__"), "sequence", "9" * 400), ("sequence",),
                     id="a four-hundred-digit sequence"),
        pytest.param(_raw(_body(intervalS="__RAW__"), "intervalS", "1e400"), ("intervalS",),
                     id="an interval that overflows to infinity"),
        pytest.param(_body(gpus=[{**GPU, "readings": {"temperatureC": "__RAW__"}}]).replace(
            '"__RAW__"', "1e400"), ("gpus", 0, "readings", "temperatureC"),
            id="an infinite temperature"),
        pytest.param(_body(gpus=[{**GPU, "readings": {"pcieReplayCount": -1}}]),
                     ("gpus", 0, "readings", "pcieReplayCount"), id="a negative counter"),
        pytest.param(_body(gpus=[{**GPU, "readings": {"pcieReplayCount": 2**64}}]),
                     ("gpus", 0, "readings", "pcieReplayCount"), id="a counter past uint64"),
        pytest.param(_body(nodeName="gpu-1\n"), ("nodeName",),
                     id="a node name with a trailing newline"),
        pytest.param(_body(gpus=[{**GPU, "reasons": [{"code": "Xid\n", "verdict": "Failed",
                                                       "action": "RebootNode"}]}]),
                     ("gpus", 0, "reasons", 0, "code"), id="a reason code with a newline"),
    ],
)  # fmt: skip
def test_out_of_range_fields_are_refused(body: str, loc: tuple[object, ...]) -> None:
    """Each out-of-range value fails validation at its own field."""
    with pytest.raises(pydantic.ValidationError) as caught:
        heartbeat.validate_json(body)
    assert loc == caught.value.errors()[0]["loc"]


def test_agent_url_is_accepted_but_carries_no_weight_on_the_wire() -> None:
    """Schema 1 agents still send agentUrl; it validates (the controller ignores it)."""
    hb = heartbeat.validate_json(_body(agentUrl="https://attacker.example/"))
    expected = "https://attacker.example/"
    assert expected == hb.agent_url


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        pytest.param(_body(sequence="1"), ("sequence",), id="a number written as a string"),
        pytest.param(_body(dcgmAvailable=1), ("dcgmAvailable",), id="a 1 for a bool"),
        pytest.param(_body(schemaVersion=True), ("schemaVersion",),
                     id="true for the schema version"),
        pytest.param(_body(sequence=1.0), ("sequence",), id="a float for an int"),
        pytest.param(_raw(_body(intervalS="__RAW__"), "intervalS", "NaN"), ("intervalS",),
                     id="a NaN token"),
        pytest.param(_body(sentAt="2026-01-01T00:00:00"), ("sentAt",),
                     id="a time without an offset"),
        pytest.param(_body(sentAt="1767225600"), ("sentAt",), id="a time as seconds"),
        pytest.param(_body(gpus=[{**GPU, "verdict": "healthy"}]), ("gpus", 0, "verdict"),
                     id="a verdict in the wrong case"),
    ],
)  # fmt: skip
def test_the_model_is_strict(body: str, loc: tuple[object, ...]) -> None:
    """No coercion: what msgspec refuses, the model refuses too, at the same field."""
    with pytest.raises(pydantic.ValidationError) as caught:
        heartbeat.validate_json(body)
    assert loc == caught.value.errors()[0]["loc"]


def test_python_field_names_are_not_wire_names() -> None:
    """The wire takes the camelCase aliases only: `node_name` is an unknown field there."""
    body = _body().replace('"nodeName"', '"node_name"')
    with pytest.raises(pydantic.ValidationError) as caught:
        heartbeat.validate_json(body)
    assert {("nodeName",), ("node_name",)} == {e["loc"] for e in caught.value.errors()}


def test_a_time_without_a_zone_cannot_be_built() -> None:
    """The model refuses a naive datetime in Python too, so it never reaches the wire."""
    with pytest.raises(pydantic.ValidationError):
        heartbeat.Reason(code="X", verdict=health.Verdict.FAILED, action=health.Action.NONE,
                         since=dt.datetime(2026, 1, 1))  # noqa: DTZ001  # fmt: skip
