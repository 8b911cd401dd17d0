"""The controller's names for the heartbeat's hot path (`shared.heartbeat` declares it).

`POST /v1/heartbeats` is the controller's busiest call: `decode` reads and validates an 8-GPU
report in one msgspec step (`bench/heartbeat_parse.py`), and fleet state keeps the struct it
yields as it is. What a refused body is told comes from `heartbeat.validate_json`.

Pure: no I/O.
"""

from __future__ import annotations

from typing import Any

import msgspec

from shared.heartbeat import (
    GpuReadings,
    GpuReport,
    Heartbeat,
    Reason,
    Stamp,
    check,
    decode,
    decoder,
    encode,
    encoder,
    stamp,
    to_json,
    wire_time,
)

__all__ = [
    "GpuReadings", "GpuReport", "Heartbeat", "Reason", "Report", "Stamp", "check", "decode",
    "decoder", "encode", "encoder", "gpu_json", "stamp", "wire", "wire_time", "with_agent_url",
]  # fmt: skip

Report = Heartbeat
"""A heartbeat as the controller holds it (once a pydantic model too; now the one struct)."""


def wire(report: Heartbeat) -> bytes:
    """The wire form of a heartbeat (`heartbeat.encode`)."""
    return encode(report)


def with_agent_url(report: Heartbeat, url: str) -> Heartbeat:
    """The same heartbeat with `agent_url` replaced."""
    return msgspec.structs.replace(report, agent_url=url)


def gpu_json(gpu: GpuReport) -> dict[str, Any]:
    """One GPU's report as JSON-ready data, every field present."""
    data: dict[str, Any] = to_json(gpu)
    return data
