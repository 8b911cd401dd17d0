"""Read untrusted JSON with limits, so no request body can make a parser raise what no
caller expects.

`json.loads` alone lets three things through that end as 500s (security review M2): an
integer of more than 4,300 digits raises a plain `ValueError` (CPython's conversion limit),
a few thousand `[` raise `RecursionError`, and `NaN`, `Infinity` and `1e400` become floats
no schema here means. `load` refuses all of them, and duplicate keys, with one error type
that says what and, where it can, where:

- integers of more than `MAX_INT_DIGITS` digits (20: an unsigned 64-bit counter fits);
- `NaN`, `Infinity`, `-Infinity`, and numbers that overflow to infinity;
- nesting deeper than `MAX_DEPTH`;
- a key given twice in one object;
- bytes that are not UTF-8.

Pure: no I/O.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

MAX_INT_DIGITS = 20
"""Most digits of an integer literal; 2**64 - 1 has 20. Quote a longer number as a string."""

MAX_DEPTH = 50
"""Deepest nesting of arrays and objects; every body this project reads is under ten deep."""


class JsonError(ValueError):
    """The document is not JSON we accept; `path`, `line` and `column` locate it where known."""

    def __init__(
        self, message: str, *, path: str = "", line: int | None = None, column: int | None = None
    ) -> None:
        self.message = message
        self.path = path
        self.line = line
        self.column = column
        where = f" (line {line}, column {column})" if line is not None else ""
        super().__init__(f"{message}{where}")


def _pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in items:
        if key in result:
            msg = f"duplicate key {key[:100]!r}"
            raise JsonError(msg, path=key[:253])
        result[key] = value
    return result


def _constant(name: str) -> object:
    msg = f"{name} is not a number JSON allows; send a finite number"
    raise JsonError(msg)


def _int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        msg = (
            f"a number of {len(text.lstrip('-'))} digits; at most {MAX_INT_DIGITS} are read"
            " (send a longer one as a string)"
        )
        raise JsonError(msg)
    return int(text)


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        msg = f"{text[:40]} is too large for a number (it overflows to infinity)"
        raise JsonError(msg)
    return value


def load(data: bytes | str) -> Any:
    """Parse one JSON document under the limits in the module docstring; JsonError else."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as err:
            msg = f"the body is not UTF-8 (invalid byte at offset {err.start}); send UTF-8 text"
            raise JsonError(msg) from err
    try:
        document = json.loads(
            data,
            object_pairs_hook=_pairs,
            parse_constant=_constant,
            parse_int=_int,
            parse_float=_float,
        )
    except json.JSONDecodeError as err:
        msg = f"invalid JSON: {err.msg}"
        raise JsonError(msg, line=err.lineno, column=err.colno) from err
    except RecursionError as err:
        msg = f"nesting too deep: at most {MAX_DEPTH} levels are allowed"
        raise JsonError(msg) from err
    check_depth(document)
    return document


def check_depth(document: object, limit: int = MAX_DEPTH) -> None:
    """Refuse data nested deeper than `limit`, without recursing (so any depth is safe)."""
    stack: list[tuple[object, int]] = [(document, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            children: Any = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        if depth > limit:
            msg = f"nesting too deep: at most {limit} levels are allowed"
            raise JsonError(msg)
        stack.extend((child, depth + 1) for child in children)


_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
"""A JSON string literal, escapes included (the unrolled form: linear, no backtracking)."""
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def check_raw_depth(raw: bytes, limit: int = MAX_DEPTH) -> None:
    """Refuse JSON bytes nested deeper than `limit` before any parser sees them (security
    review 3, finding 12: a decoder that recurses into 100,000 `[` raises RecursionError,
    a 500). Without recursing and without a Python loop over the bytes: the strings are
    dropped, then the brackets left; each pass removes every innermost empty pair, so a
    document `limit` deep is gone after `limit` passes. Brackets left that do not pair up
    are refused too (a decoder would refuse them, after recursing as deep)."""
    brackets = _STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
    for _ in range(limit):
        if not brackets:
            return
        brackets = brackets.replace(b"[]", b"").replace(b"{}", b"")
    if not brackets:
        return
    arrays, objects = (
        brackets.count(b"[") - brackets.count(b"]"),
        brackets.count(b"{") - brackets.count(b"}"),
    )
    if arrays or objects:
        msg = "invalid JSON: its brackets do not pair up"
        raise JsonError(msg)
    msg = f"nesting too deep: at most {limit} levels are allowed"
    raise JsonError(msg)
