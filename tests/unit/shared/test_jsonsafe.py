"""Untrusted JSON: every body this project reads goes through one parser with limits."""

from __future__ import annotations

import pytest

from shared import jsonsafe


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        pytest.param(b'{"a": [1, 2.5, "x", true, null]}', {"a": [1, 2.5, "x", True, None]},
                     id="ordinary JSON loads as json.loads would"),
        pytest.param(b'{"n": ' + b"9" * 20 + b"}", {"n": int("9" * 20)},
                     id="twenty digits (an unsigned 64-bit counter) load"),
        pytest.param(b'{"n": -' + b"9" * 20 + b"}", {"n": -int("9" * 20)},
                     id="the sign does not count as a digit"),
        pytest.param("\ufeff{}".encode()[3:], {}, id="text after a stripped BOM loads"),
    ],
)  # fmt: skip
def test_valid_documents_load(data: bytes, expected: object) -> None:
    """What is within the limits loads unchanged."""
    assert expected == jsonsafe.load(data)


def test_fifty_levels_load_and_fifty_one_do_not() -> None:
    """The depth limit is MAX_DEPTH levels of arrays and objects, exactly."""
    jsonsafe.load(_nested(jsonsafe.MAX_DEPTH))
    with pytest.raises(jsonsafe.JsonError, match="nesting too deep"):
        jsonsafe.load(_nested(jsonsafe.MAX_DEPTH + 1))


@pytest.mark.parametrize(
    ("data", "message", "path"),
    [
        pytest.param(b'{"n": ' + b"1" * 21 + b"}", "21 digits", "",
                     id="a 21-digit integer"),
        pytest.param(b'{"n": ' + b"1" * 5000 + b"}", "5000 digits", "",
                     id="past CPython's 4,300-digit conversion limit"),
        pytest.param(b'{"n": 1e400}', "overflows to infinity", "", id="1e400"),
        pytest.param(b'{"n": -1e400}', "overflows to infinity", "", id="-1e400"),
        pytest.param(b'{"n": NaN}', "NaN is not a number", "", id="NaN"),
        pytest.param(b'{"n": Infinity}', "Infinity is not a number", "", id="Infinity"),
        pytest.param(b'{"n": -Infinity}', "-Infinity is not a number", "", id="-Infinity"),
        pytest.param(_nested(100_000), "nesting too deep", "",
                     id="a hundred thousand levels (past the recursion limit)"),
        pytest.param(_nested(500), "nesting too deep", "", id="five hundred levels"),
        pytest.param(b'{"a": 1, "a": 2}', "duplicate key 'a'", "a", id="a duplicate key"),
        pytest.param(b'{"a": caf\xc3}', "not UTF-8", "", id="bytes that are not UTF-8"),
        pytest.param(b'{"a": ', "invalid JSON", "", id="a truncated document"),
        pytest.param(b"", "invalid JSON", "", id="nothing at all"),
    ],
)  # fmt: skip
def test_refused_documents(data: bytes, message: str, path: str) -> None:
    """Each raises JsonError (a ValueError the callers map to 400), never the bare
    ValueError, OverflowError or RecursionError that json.loads lets out."""
    with pytest.raises(jsonsafe.JsonError) as caught:
        jsonsafe.load(data)
    assert (True, path) == (message in str(caught.value), caught.value.path)


def test_a_syntax_error_is_located() -> None:
    """The line and column of a syntax error are kept."""
    with pytest.raises(jsonsafe.JsonError) as caught:
        jsonsafe.load(b'{\n  "a": }')
    expected = (2, 8)
    assert expected == (caught.value.line, caught.value.column)


@pytest.mark.parametrize(
    ("raw", "refused"),
    [
        pytest.param(_nested(jsonsafe.MAX_DEPTH), False, id="nesting at the limit passes"),
        pytest.param(_nested(jsonsafe.MAX_DEPTH + 1), True, id="one level more is refused"),
        pytest.param(b"[" * 100_000 + b"]" * 100_000, True,
                     id="a hundred thousand levels are refused without recursing"),
        pytest.param(b'{"entries": [' + b"[" * 100_000 + b"]" * 100_000 + b"]}", True,
                     id="deep nesting inside a field is refused"),
        pytest.param(b'["' + b"[" * 100 + b'\\"{{{"]', False,
                     id="brackets inside strings, escaped quotes too, do not count"),
        pytest.param(b'{"a": [1, {"b": [[], {}]}], "c": "x"}', False,
                     id="an ordinary document passes"),
        pytest.param(b"[" * 100_000, True, id="brackets that never close are refused"),
    ],
)  # fmt: skip
def test_raw_depth_is_bounded_before_any_parser(raw: bytes, refused: bool) -> None:
    """Security review 3, finding 12: what the peer endpoint checks before msgspec, which
    recursed into 100,000 `[` (RecursionError, a 500)."""
    message = ""
    try:
        jsonsafe.check_raw_depth(raw)
    except jsonsafe.JsonError as err:
        message = str(err)
    named = f"at most {jsonsafe.MAX_DEPTH} levels" in message or "do not pair up" in message
    assert refused == named, message
