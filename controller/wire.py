"""The base of the models the API, the TauRun status and the reports use: camelCase on the
wire, frozen, docstrings as descriptions.

Pure: pydantic and `shared.spec` only, so the pure core builds on it.
"""

from __future__ import annotations

import pydantic

from shared import spec as specs


class Wire(specs.SpecModel):
    """camelCase on the wire, frozen, unknown fields refused, docstrings as descriptions: the
    configuration of `tau.yaml`'s models (`shared.spec.SpecModel`), kept in one place."""


class Lenient(Wire):
    """Unknown fields ignored: path and query parameters (HTTP clients add their own) and a
    TauRun status (an older controller may have written members not modelled here)."""

    model_config = pydantic.ConfigDict(extra="ignore")
