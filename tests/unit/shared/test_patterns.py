"""Full-match validation everywhere: no pattern of ours lets a trailing newline through."""

from __future__ import annotations

import ast
import pathlib
import re

import pydantic
import pytest

from shared import heartbeat, patterns

ROOT = pathlib.Path(__file__).resolve().parents[3]
PACKAGES = ("agent", "controller", "shared")


def _regex_literals() -> list[tuple[str, str]]:
    """Every string given to re.compile/match/fullmatch/search, or as `pattern=`."""
    found = []
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if not isinstance(node, ast.Call):
                    continue
                args: list[ast.expr] = []
                func = node.func
                if isinstance(func, ast.Attribute) and func.attr in {
                    "compile", "match", "fullmatch", "search", "compile_full",
                }:  # fmt: skip
                    args = node.args[:1]
                args += [k.value for k in node.keywords if k.arg == "pattern"]
                for arg in args:
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                        where = f"{path.relative_to(ROOT)}:{node.lineno}"
                        found.append((where, arg.value))
    return found


def test_no_regex_literal_ends_in_a_dollar() -> None:
    """`$` matches before a trailing newline in Python; every pattern uses fullmatch or \\Z."""
    literals = _regex_literals()
    assert len(literals) >= 15, "the scan finds the project's patterns"
    offenders = [w for w, text in literals if text.endswith("$") and not text.endswith("\\$")]
    expected: list[str] = []
    assert expected == offenders


def test_no_validation_regex_is_used_with_match() -> None:
    """The compiled name patterns of shared.spec are matched in full, never with .match
    (the one search finds a digest suffix, anchored with \\Z)."""
    source = (ROOT / "shared" / "spec.py").read_text(encoding="utf-8")
    expected = ["_DIGEST_RE.search("]
    assert expected == re.findall(r"\w+_RE\.(?:match|search)\(", source)


@pytest.mark.parametrize(
    "body",
    [
        pytest.param("^[a-z]+", id="a caret"),
        pytest.param("[a-z]+$", id="a dollar"),
        pytest.param(r"[a-z]+\Z", id="a backslash-Z"),
    ],
)
def test_a_body_with_anchors_is_refused(body: str) -> None:
    """Bodies are written bare, so no anchor can slip back in."""
    with pytest.raises(ValueError, match="carries anchors"):
        patterns.compile_full(body)


def test_the_three_forms_of_one_body() -> None:
    """Python matches the body in full; JSON Schema and pydantic-core get it anchored."""
    compiled = patterns.compile_full("[a-z]+")
    actual = (
        patterns.full(compiled, "abc"),
        patterns.full(compiled, "abc\n"),
        patterns.schema(compiled),
        patterns.rust("[a-z]+"),
    )
    expected = (True, False, "^(?:[a-z]+)$", r"\A(?:[a-z]+)\z")
    assert expected == actual


@pytest.mark.parametrize(
    ("field", "value"),
    [
        pytest.param("node_name", "gpu-1\n", id="a node name with a trailing newline"),
        pytest.param("node_name", "gpu..1", id="a node name with an empty label"),
    ],
)
def test_heartbeat_names_are_matched_in_full(field: str, value: str) -> None:
    """pydantic-core's patterns are anchored with \\A and \\z: a newline is not a name."""
    adapter = pydantic.TypeAdapter(heartbeat.K8sName)
    with pytest.raises(pydantic.ValidationError):
        adapter.validate_python(value)
