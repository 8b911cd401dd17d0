"""A list-then-watch cache of one core kind, kept as trimmed raw JSON by namespace/name.

What a loop would otherwise list on every pass (the admission gate's nodes and pods): one
list at start and after a watch error, then the watch's events, so a pass reads memory and
the API server serves one watch instead of a list per pass. Objects are trimmed to what the
reader parses (`trim`), so a big cluster's pods cost a few hundred bytes each.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from controller.kube import _api

log = structlog.get_logger()

ListCall = Callable[..., Awaitable[Any]]
"""A kubernetes_asyncio list call (`CoreV1Api.list_node`, `list_pod_for_all_namespaces`)."""


def key_of(obj: dict[str, Any]) -> str:
    """`namespace/name` (just `name` for a cluster-scoped object)."""
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace") or ""
    name = str(meta.get("name") or "")
    return f"{ns}/{name}" if ns else name


class Watched:
    """List then watch one kind; `items` is current once `synced` is set."""

    def __init__(
        self,
        list_call: ListCall,
        trim: Callable[[dict[str, Any]], dict[str, Any]],
        *,
        kind: str,
        on_change: Callable[[], None] = lambda: None,
        on_delete: Callable[[dict[str, Any]], None] = lambda _obj: None,
        key: Callable[[dict[str, Any]], str] = key_of,
        retry_s: float = 1.0,
    ) -> None:
        self._list_call = list_call
        self._trim = trim
        self.kind = kind
        self._on_change = on_change
        self._on_delete = on_delete
        """Called with the trimmed object when it is gone: a DELETED event, or a relist
        without it (deleted while the watch was down)."""
        self._key = key
        self._retry_s = retry_s
        self.items: dict[str, dict[str, Any]] = {}
        self.synced = asyncio.Event()
        self.lists = 0
        """LISTs made: one at start, one after each watch failure."""

    def values(self) -> list[dict[str, Any]]:
        """Every object, as a list (a copy: safe to keep across awaits)."""
        return list(self.items.values())

    async def run(self) -> None:
        """Keep `items` current until cancelled; relist after watch errors."""
        while True:
            try:
                await self._watch(await self._list())
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001  (any API failure: relist after a pause)
                log.warning("watch failed; relisting", kind=self.kind, error=str(err))
                await asyncio.sleep(self._retry_s)

    async def _list(self) -> str:
        self.lists += 1
        data = await _api.read_json(await self._list_call(_preload_content=False))
        old, self.items = self.items, {self._key(o): self._trim(o) for o in data.get("items") or []}
        for gone in old.keys() - self.items.keys():
            self._on_delete(old[gone])
        self.synced.set()
        self._on_change()
        return str(data["metadata"]["resourceVersion"])

    async def _watch(self, rv: str) -> None:
        while True:
            resp = await self._list_call(
                watch=True, resource_version=rv, allow_watch_bookmarks=True,
                timeout_seconds=300, _preload_content=False,
            )  # fmt: skip
            if resp.status != 200:
                await _api.read_json(resp)  # raises: relist
            async with contextlib.aclosing(lines(resp)) as stream:
                async for line in stream:
                    event = json.loads(line)
                    obj = event.get("object") or {}
                    kind = event.get("type")
                    if kind == "ERROR":
                        return  # 410 Gone and friends: relist
                    rv = obj.get("metadata", {}).get("resourceVersion", rv)
                    if kind == "BOOKMARK":
                        continue
                    if kind == "DELETED":
                        if (gone := self.items.pop(self._key(obj), None)) is not None:
                            self._on_delete(gone)
                    else:
                        self.items[self._key(obj)] = self._trim(obj)
                    self._on_change()


async def lines(resp: Any) -> Any:
    """The non-empty lines of a watch response, released at the end."""
    try:
        while True:
            raw = await resp.content.readline()
            if not raw:
                return
            if raw.strip():
                yield raw
    finally:
        resp.release()
