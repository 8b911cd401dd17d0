"""The base of the agent's own pydantic models (its readings, its latched state, its answers):
frozen, strict (no coercion), unknown fields refused, camelCase on the wire. The heartbeat
itself is `shared.heartbeat`'s msgspec structs."""

from __future__ import annotations

import pydantic
from pydantic import alias_generators


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
