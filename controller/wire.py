"""The base of the models the API, the TauRun status and the reports use: camelCase on the
wire, frozen, docstrings as descriptions.

Pure: pydantic only, so the pure core builds on it.
"""

from __future__ import annotations

import pydantic
from pydantic import alias_generators


class Wire(pydantic.BaseModel):
    """camelCase on the wire, frozen, unknown fields refused, docstrings as descriptions."""

    model_config = pydantic.ConfigDict(
        frozen=True,
        extra="forbid",
        alias_generator=alias_generators.to_camel,
        populate_by_name=True,
        use_attribute_docstrings=True,
    )


class Lenient(Wire):
    """Unknown fields ignored: path and query parameters (HTTP clients add their own) and a
    TauRun status (an older controller may have written members not modelled here)."""

    model_config = pydantic.ConfigDict(extra="ignore")
