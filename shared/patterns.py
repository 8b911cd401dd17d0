"""Full-match patterns: one body, matched whole in Python, published for JSON Schema.

Python's `$` also matches just before a trailing newline, so `re.match(r"^[a-z]+$", "abc\n")`
passes, and a name with a newline reaches the API server, which refuses it (a 500 and a
poison object the reconciler retries forever; security review M1). Every validation pattern
is therefore written as a body without anchors, compiled here and matched with
`re.fullmatch`, which has no such exception.

The same body is published in the JSON Schema and OpenAPI documents anchored the way
ECMA-262 (the dialect those documents specify) reads it: `^(?:body)$`, where `$` is the end of
the input. pydantic-core's own patterns run in Rust's regex engine, where the whole-input
anchors are `\\A` and `\\z`: `rust()` writes those. msgspec's `Meta(pattern=...)` runs
`re.search`, so its form carries Python's whole-input anchors `\\A` and `\\Z`: `search()`.

Pure: no I/O.
"""

from __future__ import annotations

import re


def compile_full(body: str) -> re.Pattern[str]:
    """Compile a pattern body for `fullmatch`; a body carrying its own anchors is refused,
    so a `$` cannot slip back in."""
    if body.startswith(("^", r"\A")) or body.endswith(("$", r"\Z", r"\z")):
        msg = f"pattern body {body!r} carries anchors; write it bare and match it with fullmatch"
        raise ValueError(msg)
    return re.compile(body)


def schema(pattern: re.Pattern[str] | str) -> str:
    """The JSON Schema (ECMA-262) form of a full-match pattern: `^(?:body)$`."""
    body = pattern.pattern if isinstance(pattern, re.Pattern) else pattern
    return f"^(?:{body})$"


def rust(body: str) -> str:
    """The pydantic-core (Rust regex) form of a full-match pattern: `\\A(?:body)\\z`."""
    return rf"\A(?:{body})\z"


def search(body: str) -> str:
    """The form of a full-match pattern for a `re.search` user (msgspec): `\\A(?:body)\\Z`.

    Python's `\\Z` is the end of the input (never before a trailing newline, unlike `$`)."""
    compile_full(body)
    return rf"\A(?:{body})\Z"


def full(pattern: re.Pattern[str], text: str) -> bool:
    """Whether `text` matches `pattern` as a whole (never just a prefix, never before a `\\n`)."""
    return pattern.fullmatch(text) is not None
