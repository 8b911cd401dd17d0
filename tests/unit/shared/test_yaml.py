"""YAML 1.2 core semantics, duplicate keys, tags and alias limits of `shared.yamlsafe`."""

from __future__ import annotations

import math

import pytest

from shared import yamlsafe

LOADERS = pytest.mark.parametrize(
    "fast", [True, False], ids=["with libyaml scanning", "with the pure Python scanner"]
)

BOMB = "\n".join(
    [
        'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]',
        *(
            f"{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]"
            for prev, name in zip("abcdefgh", "bcdefghi", strict=True)
        ),
    ]
)


@LOADERS
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("a: on", {"a": "on"}, id="on stays a string"),
        pytest.param("a: yes", {"a": "yes"}, id="yes stays a string"),
        pytest.param("a: off", {"a": "off"}, id="off stays a string"),
        pytest.param("a: No", {"a": "No"}, id="No stays a string"),
        pytest.param("a: y", {"a": "y"}, id="y stays a string"),
        pytest.param("a: 1:30", {"a": "1:30"}, id="1:30 stays a string, not sexagesimal"),
        pytest.param("a: 2024-01-01", {"a": "2024-01-01"}, id="a date stays a string"),
        pytest.param("a: 0o17", {"a": 15}, id="0o17 is octal fifteen"),
        pytest.param("a: 010", {"a": 10}, id="010 is decimal ten"),
        pytest.param("a: 0x1F", {"a": 31}, id="0x1F is hexadecimal"),
        pytest.param("a: -7", {"a": -7}, id="a signed integer is an int"),
        pytest.param("a: 1_000", {"a": "1_000"}, id="underscores make a string"),
        pytest.param("a: 1.5e3", {"a": 1500.0}, id="an exponent makes a float"),
        pytest.param("a: .5", {"a": 0.5}, id="a leading dot float is a float"),
        pytest.param("a: -.inf", {"a": -math.inf}, id="negative infinity is a float"),
        pytest.param("[true, True, TRUE]", [True, True, True], id="true is true in 3 spellings"),
        pytest.param("[false, False]", [False, False], id="false is false"),
        pytest.param("- ~\n- null\n- NULL\n-\n", [None] * 4, id="null has four forms"),
        pytest.param("a: '1'", {"a": "1"}, id="a quoted number is a string"),
        pytest.param("a: !!str 12", {"a": "12"}, id="an explicit str tag makes a string"),
        pytest.param("a: !!float 3", {"a": 3.0}, id="an explicit float tag converts an int"),
        pytest.param("<<: {b: 1}", {"<<": {"b": 1}}, id="the merge key is an ordinary key"),
        pytest.param("", None, id="an empty document is None"),
        pytest.param(
            "retry: {on: [AppError]}",
            {"retry": {"on": ["AppError"]}},
            id="on as a key stays the string on",
        ),
        pytest.param(
            "x: &x {k: v}\ny: *x",
            {"x": {"k": "v"}, "y": {"k": "v"}},
            id="a simple alias is expanded",
        ),
        pytest.param('{"a": [1, 2.5, null]}', {"a": [1, 2.5, None]}, id="JSON reads as YAML"),
    ],
)
def test_core_schema_values(text: str, expected: object, fast: bool) -> None:
    """Plain scalars are typed by the YAML 1.2 core schema, never by YAML 1.1's rules."""
    assert expected == yamlsafe.load(text, fast=fast)


def test_nan_is_a_float() -> None:
    """`.nan` is a float NaN (compared apart, since NaN is never equal to itself)."""
    value = yamlsafe.load("a: .nan")
    assert math.isnan(value["a"])


@LOADERS
@pytest.mark.parametrize(
    ("text", "message", "path", "line"),
    [
        pytest.param("a: 1\nb: 2\na: 3\n", "duplicate key 'a'", "a", 3, id="a duplicate key"),
        pytest.param(
            "retry:\n  when: [x]\n  when: [y]\n",
            "duplicate key 'when' (first at line 2)",
            "retry.when",
            3,
            id="a nested duplicate key names its path and both lines",
        ),
        pytest.param(
            "on: 1\n'on': 2\n", "duplicate key 'on'", "on", 2, id="on and 'on' are the same key"
        ),
        pytest.param(
            "a: !!python/object/apply:os.system [ls]",
            "tag !!python/object/apply:os.system is not allowed",
            "a",
            1,
            id="a python tag is refused",
        ),
        pytest.param("a: !custom x", "tag !custom is not allowed", "a", 1, id="a custom tag"),
        pytest.param("a: !!binary aGk=", "tag !!binary is not allowed", "a", 1, id="a binary tag"),
        pytest.param(
            "a: !!timestamp 2024-01-01",
            "tag !!timestamp is not allowed",
            "a",
            1,
            id="a timestamp tag",
        ),
        pytest.param(
            "a: !!set {x: null}", "tag !!set is not allowed", "a", 1, id="a set tag on a mapping"
        ),
        pytest.param(
            "a: !!int 1:30", "'1:30' is not a valid !!int", "a", 1, id="an impossible int tag"
        ),
        pytest.param("a: &a [*a]", "recursive alias", "", 1, id="a recursive alias"),
        pytest.param("a: *nope", "undefined alias 'nope'", "", 1, id="an undefined alias"),
        pytest.param(BOMB, "alias bomb", "", None, id="an alias bomb"),
        pytest.param(
            "a: &a x\nb: [" + ", ".join(["*a"] * 101) + "]",
            "too many aliases",
            "",
            2,
            id="more than a hundred aliases",
        ),
        pytest.param("[" * 10_000, "nesting", "", 1, id="ten thousand open brackets"),
        pytest.param("[" * 60, "nesting too deep", "", 1, id="sixty open brackets"),
        pytest.param("a: 1\n---\nb: 2\n", "single document", "", 2, id="two documents"),
        pytest.param("a: [1, 2\nb: 3\n", "invalid YAML", "", None, id="a syntax error"),
        pytest.param("? [a]\n: b\n", "plain value", "", 1, id="a list as a mapping key"),
        pytest.param("a: \x07", "invalid YAML", "", None, id="a control character"),
        pytest.param(
            "a: " + "1" * 5000,
            "5000 digits",
            "a",
            1,
            id="a five-thousand-digit integer (past CPython's int limit)",
        ),
        pytest.param(
            "a: [1, " + "1" * 21 + "]",
            "21 digits",
            "a[1]",
            1,
            id="a 21-digit integer names its path",
        ),
        pytest.param("a: 0x" + "f" * 30, "30 digits", "a", 1, id="a thirty-digit hex integer"),
        pytest.param(
            "a: [" + "x, " * 20_000 + "]",
            "more than 10000 nodes",
            "",
            1,
            id="twenty thousand list items stop while composing",
        ),
    ],
)
def test_refused_documents(
    text: str, message: str, path: str, line: int | None, fast: bool
) -> None:
    """Everything outside the core schema or past the limits raises a located YamlError."""
    with pytest.raises(yamlsafe.YamlError) as caught:
        yamlsafe.load(text, fast=fast)
    assert message in str(caught.value)
    assert path == caught.value.path
    if line is not None:
        assert line == caught.value.line


def test_twenty_digits_still_load() -> None:
    """An unsigned 64-bit number (20 digits) is within the limit."""
    expected = {"a": 2**64 - 1}
    assert expected == yamlsafe.load(f"a: {2**64 - 1}")


def test_alias_bomb_is_refused_before_expansion() -> None:
    """The bomb would expand to 9**9 strings; it is refused while measuring the node graph."""
    with pytest.raises(yamlsafe.YamlError, match=f"more than {yamlsafe.MAX_NODES} nodes"):
        yamlsafe.load(BOMB)


def test_aliases_within_limits_are_shared_safely() -> None:
    """A document that reuses one anchor many times (within limits) loads in full."""
    text = "base: &b {gpus: 1}\nruns: [" + ", ".join(["*b"] * yamlsafe.MAX_ALIASES) + "]"
    expected = [{"gpus": 1}] * yamlsafe.MAX_ALIASES
    assert expected == yamlsafe.load(text)["runs"]
