"""The heartbeat wire schema bounds every field an agent (or a forger) can send (M6)."""

from __future__ import annotations

import json
from typing import Any

import pydantic
import pytest

from shared import heartbeat

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
        heartbeat.Heartbeat.model_validate_json(body)
    assert loc == caught.value.errors()[0]["loc"]


def test_agent_url_is_accepted_but_carries_no_weight_on_the_wire() -> None:
    """Schema 1 agents still send agentUrl; it validates (the controller ignores it)."""
    hb = heartbeat.Heartbeat.model_validate_json(_body(agentUrl="https://attacker.example/"))
    expected = "https://attacker.example/"
    assert expected == hb.agent_url
