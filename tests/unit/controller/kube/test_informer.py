"""A watch-fed cache's bookkeeping: lists, watch events and our own writes (`note`) in any
order leave it holding the newest copy, only a change readers see wakes them, and what goes
away is told.

These orders cannot be produced on demand against a real API server (they are races
between a write's response and the watch), so the cache's steps are driven directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Sequence
from typing import Any

import pytest

from controller.kube import informer


class _Response:
    """A raw kubernetes_asyncio response: a LIST's body, or a watch's lines."""

    def __init__(
        self, body: dict[str, Any] | None = None, lines: Sequence[dict[str, Any]] = ()
    ) -> None:
        self.status = 200
        self._body = json.dumps(body or {}).encode()
        self._lines = [json.dumps(x).encode() + b"\n" for x in lines]
        self.content = self

    async def read(self) -> bytes:
        return self._body

    async def readline(self) -> bytes:
        return self._lines.pop(0) if self._lines else b""

    def release(self) -> None:
        pass


def _pod(uid: str) -> dict[str, Any]:
    return {"metadata": {"name": f"p-{uid}", "namespace": "ns", "uid": uid}}


async def test_an_object_missing_from_a_relist_is_told_gone_like_a_deleted_one() -> None:
    """A DELETED event tells the trimmed object gone; so does a relist after a watch error
    that no longer has an object (it was deleted while the watch was down)."""
    lists = [
        {"metadata": {"resourceVersion": "1"}, "items": [_pod("a"), _pod("b"), _pod("c")]},
        {"metadata": {"resourceVersion": "5"}, "items": [_pod("a")]},
    ]
    watches = [
        [{"type": "DELETED", "object": _pod("c")}, {"type": "ERROR", "object": {}}],
    ]
    relisted = asyncio.Event()

    async def call(**kwargs: Any) -> _Response:
        if kwargs.get("watch"):
            if watches:
                return _Response(lines=watches.pop(0))
            relisted.set()
            await asyncio.Event().wait()  # the second watch stays open
        return _Response(lists.pop(0))

    gone: list[str] = []
    cache: informer.Informer[informer.Raw] = informer.Informer(
        call, lambda o: {"uid": o["metadata"]["uid"]}, kind="pods",
        key=lambda o: o["metadata"]["uid"], on_delete=lambda o: gone.append(o["uid"]),
    )  # fmt: skip
    task = asyncio.create_task(cache.run())
    async with asyncio.timeout(5):
        await relisted.wait()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert (gone, list(cache.items)) == (["c", "b"], ["a"])


def obj(name: str, rv: int | None, value: str = "v") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns"}
    if rv is not None:
        meta["resourceVersion"] = str(rv)
    return {"metadata": meta, "data": {"value": value}}


def keep_rv(raw: dict[str, Any]) -> dict[str, Any]:
    return raw


Step = tuple[str, Any]


def replay(steps: list[Step], trim: Any = keep_rv) -> tuple[dict[str, str], int]:
    """Apply the steps to a fresh cache; return {name: value} and how many pokes it made."""
    pokes: list[None] = []

    async def never(**_: Any) -> Any:
        raise AssertionError

    cache: informer.Informer[informer.Raw] = informer.Informer(
        never, trim, kind="test", on_change=lambda: pokes.append(None)
    )
    for step, arg in steps:
        if step == "list":
            items, rv = arg
            cache.listed(items, str(rv))
        elif step == "note":
            cache.note(arg)
        else:
            cache.event(step, arg)
    held = {o["metadata"]["name"]: o["data"]["value"] for o in cache.items.values()}
    return held, len(pokes)


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        pytest.param([("list", ([obj("a", 5, "1")], 10)), ("note", obj("a", 12, "2"))],
                     {"a": "2"}, id="our write is shown before the watch brings it"),
        pytest.param([("list", ([obj("a", 5, "1")], 10)), ("note", obj("a", 12, "2")),
                      ("MODIFIED", obj("a", 11, "1.5"))],
                     {"a": "2"}, id="a watch event older than our write does not undo it"),
        pytest.param([("list", ([], 10)), ("note", obj("a", 12, "2")),
                      ("ADDED", obj("a", 12, "2")), ("MODIFIED", obj("a", 13, "3"))],
                     {"a": "3"}, id="the watch's copy of our write and later changes apply"),
        pytest.param([("list", ([obj("a", 5)], 10)), ("note", obj("a", 12)),
                      ("DELETED", obj("a", 14))],
                     {}, id="a delete after our write removes the object"),
        pytest.param([("list", ([], 10)), ("MODIFIED", obj("a", 12, "2")),
                      ("MODIFIED", obj("a", 13, "3")), ("note", obj("a", 12, "2"))],
                     {"a": "3"}, id="a write the watch has already passed is not shown again"),
        pytest.param([("list", ([obj("a", 5)], 10)), ("DELETED", obj("a", 14)),
                      ("note", obj("a", 12))],
                     {}, id="a late write response does not bring a deleted object back"),
        pytest.param([("BOOKMARK", obj("", 20)), ("note", obj("a", 12))],
                     {}, id="nothing is shown before the cache has listed"),
        pytest.param([("list", ([], 10)), ("BOOKMARK", obj("", 20)), ("note", obj("a", 15))],
                     {}, id="a bookmark past our write means the watch has brought it"),
        pytest.param([("list", ([], 10)), ("note", obj("a", None))],
                     {}, id="a write without a numeric version is left to the watch"),
        pytest.param([("list", ([obj("a", 5, "1")], 10)), ("note", obj("a", 12, "2")),
                      ("list", ([obj("a", 5, "1")], 11))],
                     {"a": "1"}, id="a relist replaces everything, our writes included"),
    ],
)  # fmt: skip
def test_the_cache_holds_the_newest_copy_whatever_the_order(
    steps: list[Step], expected: dict[str, str]
) -> None:
    """Lists, watch events and our own writes in any order leave the newest copy held."""
    held, _ = replay(steps)
    assert expected == held


def without_rv(raw: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": raw["metadata"]["name"], "namespace": "ns"},
            "data": raw["data"]}  # fmt: skip


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        pytest.param([("list", ([obj("a", 5, "1")], 10))], 1, id="a list wakes the readers"),
        pytest.param([("list", ([obj("a", 5, "1")], 10)), ("MODIFIED", obj("a", 11, "1")),
                      ("MODIFIED", obj("a", 12, "1"))],
                     1, id="changes the trim removes wake nobody"),
        pytest.param([("list", ([obj("a", 5, "1")], 10)), ("MODIFIED", obj("a", 11, "2"))],
                     2, id="a change of what readers see wakes them"),
        pytest.param([("list", ([], 10)), ("note", obj("a", 12, "2")),
                      ("ADDED", obj("a", 12, "2"))],
                     2, id="the watch's echo of our own write wakes nobody again"),
        pytest.param([("list", ([], 10)), ("DELETED", obj("a", 12))],
                     1, id="the delete of an object never held wakes nobody"),
    ],
)  # fmt: skip
def test_only_a_change_readers_see_wakes_them(steps: list[Step], expected: int) -> None:
    """The cache calls `on_change` only when what it holds, as trimmed, changed."""
    _, pokes = replay(steps, trim=without_rv)
    assert expected == pokes


def test_each_change_is_told_once_with_its_key_and_both_views_parsed_once() -> None:
    """A subscriber hears every change readers see (a relist only of what differs), with
    the old and new views; an object is parsed once per change, never per read."""

    async def never(**_: Any) -> Any:
        raise AssertionError

    parsed: list[str] = []

    def view(raw: dict[str, Any]) -> str:
        parsed.append(raw["metadata"]["name"])
        return str(raw["data"]["value"])

    cache = informer.Informer(never, without_rv, kind="test", view=view)
    told: list[tuple[str, str | None, str | None]] = []
    cache.subscribe(lambda c: told.append((c.key, c.old, c.new)))
    cache.listed([obj("a", 5, "1"), obj("b", 5, "1")], "10")
    cache.event("MODIFIED", obj("a", 11, "2"))
    cache.event("MODIFIED", obj("a", 12, "2"))  # only its version changed: trimmed away
    cache.note(obj("b", 13, "3"))
    cache.event("DELETED", obj("a", 14, "2"))
    cache.listed([obj("b", 13, "3"), obj("c", 15, "1")], "16")  # b as before: not told
    assert told == [
        ("ns/a", None, "1"), ("ns/b", None, "1"), ("ns/a", "1", "2"), ("ns/b", "1", "3"),
        ("ns/a", "2", None), ("ns/c", None, "1"),
    ]  # fmt: skip
    assert (parsed, cache.views) == (["a", "b", "a", "b", "c"], {"ns/b": "3", "ns/c": "1"})


def test_a_parser_set_later_parses_what_is_held_and_tells_nobody() -> None:
    """`parse_with` (the reconciler's Workload parser) re-parses the held items in place."""

    async def never(**_: Any) -> Any:
        raise AssertionError

    cache: informer.Informer[Any] = informer.Informer(never, without_rv, kind="test")
    told: list[object] = []
    cache.subscribe(told.append)
    cache.listed([obj("a", 5, "1")], "10")
    cache.parse_with(lambda raw: raw["data"]["value"] + "!")
    cache.event("MODIFIED", obj("a", 11, "2"))
    assert (len(told), cache.views) == (2, {"ns/a": "2!"})


def test_an_object_its_parser_fails_on_is_left_out_and_the_watch_goes_on() -> None:
    """A view that raises leaves that object out (logged), never the others, and never stops
    the cache: a later version it can read is taken, one it cannot read again is dropped
    (its earlier copy told gone), and a relist does the same."""

    async def never(**_: Any) -> Any:
        raise AssertionError

    def view(raw: dict[str, Any]) -> str:
        value = str(raw["data"]["value"])
        if value == "bad":
            raise ValueError(value)
        return value

    cache = informer.Informer(never, without_rv, kind="test", view=view)
    told: list[tuple[str, str | None, str | None]] = []
    cache.subscribe(lambda c: told.append((c.key, c.old, c.new)))
    cache.listed([obj("a", 5, "bad"), obj("b", 5, "1")], "10")
    held = [dict(cache.views)]
    cache.event("MODIFIED", obj("a", 11, "2"))
    cache.event("MODIFIED", obj("b", 12, "bad"))
    held.append(dict(cache.views))
    cache.listed([obj("a", 13, "bad"), obj("b", 13, "3")], "14")
    held.append(dict(cache.views))
    assert held == [{"ns/b": "1"}, {"ns/a": "2"}, {"ns/b": "3"}]
    assert told == [
        ("ns/b", None, "1"), ("ns/a", None, "2"), ("ns/b", "1", None),
        ("ns/b", None, "3"), ("ns/a", "2", None),
    ]  # fmt: skip
    assert set(cache.items) == {"ns/b"}


def test_our_own_write_is_held_before_the_first_list_and_noted_after() -> None:
    """`put` on a cache fed by hand keeps the newest copy by resourceVersion; once listed, it
    is `note` (a copy the watch has passed is not shown again)."""

    async def never(**_: Any) -> Any:
        raise AssertionError

    cache: informer.Informer[informer.Raw] = informer.Informer(never, keep_rv, kind="test")
    cache.put(obj("a", 7, "7"))
    cache.put(obj("a", 5, "5"))  # older than what is held: not shown
    before = cache.items["ns/a"]["data"]["value"]
    cache.listed([obj("a", 8, "8")], "10")
    cache.put(obj("a", 9, "9"))  # the watch is past it (10)
    cache.put(obj("a", 12, "12"))
    assert (before, cache.items["ns/a"]["data"]["value"]) == ("7", "12")
