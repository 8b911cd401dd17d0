"""Label and field selectors answered in memory, as the API server answers them (pure).

A watch-fed cache answers a list call with a selector from what it holds; these functions
decide which cached objects the API server would have returned. Only the equality-based
forms are understood (`key`, `!key`, `key=value`, `key==value`, `key!=value`, joined by
commas, all of which must hold); anything else (`key in (a,b)`) raises `UnsupportedError`, and
the caller lists from the API server instead.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any


class UnsupportedError(ValueError):
    """A selector form answered only by the API server."""


class Op(enum.StrEnum):
    """How one requirement tests a label."""

    EXISTS = "Exists"
    ABSENT = "Absent"
    EQUALS = "Equals"
    DIFFERS = "Differs"


@dataclasses.dataclass(frozen=True)
class Requirement:
    """One comma-separated term of a label selector."""

    key: str
    op: Op
    value: str = ""


def parse(selector: str) -> tuple[Requirement, ...]:
    """The requirements of an equality-based label selector ('' selects everything)."""
    out: list[Requirement] = []
    for raw in selector.split(","):
        term = raw.strip()
        if not term:
            if selector.strip():
                msg = f"an empty term in the label selector {selector!r}"
                raise UnsupportedError(msg)
            continue
        if "(" in term or " " in term:
            msg = f"a set-based label selector term: {term!r}"
            raise UnsupportedError(msg)
        if "=" in term:
            sep = next(s for s in ("!=", "==", "=") if s in term)
            key, value = term.split(sep, 1)
            op = Op.DIFFERS if sep == "!=" else Op.EQUALS
            out.append(Requirement(_key(key, term), op, _value(value, term)))
        elif term.startswith("!"):
            out.append(Requirement(_key(term[1:], term), Op.ABSENT))
        else:
            out.append(Requirement(_key(term, term), Op.EXISTS))
    return tuple(out)


def _key(key: str, term: str) -> str:
    if not key or any(c in key for c in "=!<>"):
        msg = f"no label key in the selector term {term!r}"
        raise UnsupportedError(msg)
    return key


def _value(value: str, term: str) -> str:
    if any(c in value for c in "=!<>"):
        msg = f"a malformed selector term {term!r}"
        raise UnsupportedError(msg)
    return value


def holds(requirements: tuple[Requirement, ...], labels: Mapping[str, str]) -> bool:
    """Whether `labels` meet every requirement (as the API server judges a label selector:
    `key!=value` also holds where the label is absent)."""
    for req in requirements:
        present = req.key in labels
        if req.op == Op.EXISTS and not present:
            return False
        if req.op == Op.ABSENT and present:
            return False
        if req.op == Op.EQUALS and (not present or labels[req.key] != req.value):
            return False
        if req.op == Op.DIFFERS and present and labels[req.key] == req.value:
            return False
    return True


def matches(selector: str, labels: Mapping[str, str]) -> bool:
    """Whether an object with `labels` is selected by `selector` (see `parse`)."""
    return holds(parse(selector), labels)


FIELDS = ("spec.nodeName", "metadata.name", "metadata.namespace")
"""The field selector paths answered in memory."""


def field_value(obj: Mapping[str, Any], path: str) -> str:
    """The value of a field path of a raw object ('' where it is missing)."""
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return "" if value is None else str(value)


def parse_fields(selector: str) -> tuple[tuple[str, str], ...]:
    """The (path, value) pairs of an equality field selector ('' selects everything);
    `UnsupportedError` for `!=` or a path outside `FIELDS`."""
    out: list[tuple[str, str]] = []
    for raw in selector.split(","):
        term = raw.strip()
        if not term:
            continue
        if "!=" in term or "=" not in term:
            msg = f"a field selector term answered only by the API server: {term!r}"
            raise UnsupportedError(msg)
        path, value = term.replace("==", "=", 1).split("=", 1)
        if path not in FIELDS:
            msg = f"a field selector path answered only by the API server: {path!r}"
            raise UnsupportedError(msg)
        out.append((path, value))
    return tuple(out)


def fields_hold(fields: tuple[tuple[str, str], ...], obj: Mapping[str, Any]) -> bool:
    """Whether a raw object meets every (path, value) of a field selector."""
    return all(field_value(obj, path) == value for path, value in fields)
