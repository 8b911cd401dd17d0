"""The list-then-watch cache's own bookkeeping: what it tells when objects go away."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Sequence
from typing import Any

from controller.kube import watching


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
    cache = watching.Watched(call, lambda o: {"uid": o["metadata"]["uid"]}, kind="pods",
                             key=lambda o: o["metadata"]["uid"],
                             on_delete=lambda o: gone.append(o["uid"]))  # fmt: skip
    task = asyncio.create_task(cache.run())
    async with asyncio.timeout(5):
        await relisted.wait()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert (gone, list(cache.items)) == (["c", "b"], ["a"])
