"""`memo.Kept`: a raw object is parsed once while it stays the same object."""

from __future__ import annotations

from typing import Any

from controller import memo


def test_an_object_is_parsed_once_while_it_is_the_same_object_and_kept_one_sweep() -> None:
    """The same object reads back its view; an equal but new object (a changed one, or a
    LIST's copy) is parsed again; an object not read since the sweep before last is
    forgotten."""
    calls: list[str] = []

    def parse(raw: Any) -> str:
        calls.append(raw["name"])
        return str(raw["name"]).upper()

    kept = memo.Kept(parse)
    a, b = {"name": "a"}, {"name": "b"}
    first = [kept(a), kept(b), kept(a)]
    kept.sweep()
    second = [kept(a), kept({"name": "b"})]  # b replaced by a new object
    kept.sweep()
    kept.sweep()  # nothing read in between: all forgotten
    third = kept(a)
    assert (first, second, third) == (["A", "B", "A"], ["A", "B"], "A")
    assert (calls, kept.parsed) == (["a", "b", "b", "a"], 4)
