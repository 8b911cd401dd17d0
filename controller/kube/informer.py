"""The controller's one watch cache: list then watch one kind, keep each object trimmed and
parsed once, and tell subscribers which keys changed (the informer of client-go and Kueue).

What a loop would otherwise list on every pass (the admission gate's nodes and pods, the
run reconciler's TauRuns and what they own): one list at start and after a watch error,
then the watch's events, so a pass reads memory and the API server serves one watch
instead of a list per pass. Objects are trimmed to what the reader parses (`trim`), so a
big cluster's pods cost a few hundred bytes each.

The list call is any kubernetes_asyncio list call, bound with `functools.partial` to what
it selects (`partial(list_job_for_all_namespaces, label_selector=...)`, a custom object's
`partial(list_cluster_custom_object, group, version, plural)`): the cache calls it once to
list and again with `watch=True`. An `optional` kind the API server does not serve (a CRD
that is not installed: 404) or that we may not read (403: the chart grants no RayJobs
without Ray) is served as empty and synced, and asked for again every `absent_retry_s`; any
other kind's error is retried every `retry_s`, unsynced, so readers list (and see it).

Each object is parsed once, when it arrives (`view`: the reading domain's parser, passed in
by whoever builds the informer, as client-go's `SetTransform`): a reader takes `views`, never
parses again, and a raw object that did not change keeps its view. A change of what readers
see is told to every subscriber (`subscribe`) as a `Change` carrying the key and the old and
new views: a loop maps it to the keys of its own work (`controller.workqueue`) instead of
working out afterwards what changed. A relist tells each key that differs from before.

Our own writes can be shown before the watch brings them (`note`), so a reader never acts
twice on a copy older than what it wrote itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

import structlog
from kubernetes_asyncio import client

from controller.kube import _api, selectors

log = structlog.get_logger()

ListCall = Callable[..., Awaitable[Any]]
"""A kubernetes_asyncio list call (`CoreV1Api.list_node`, `list_pod_for_all_namespaces`),
with what it selects bound (`functools.partial`)."""


LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
"""kubectl's copy of what it applied: never read, so never cached."""


def trim_object(raw: dict[str, Any]) -> dict[str, Any]:
    """A cached object without what no reader of ours parses: `metadata.managedFields` and
    kubectl's last-applied copy (together often most of an object's bytes)."""
    meta = dict(raw.get("metadata") or {})
    meta.pop("managedFields", None)
    annotations = meta.get("annotations")
    if annotations and LAST_APPLIED in annotations:
        meta["annotations"] = {k: v for k, v in annotations.items() if k != LAST_APPLIED}
    return {**raw, "metadata": meta}


def key_of(obj: dict[str, Any]) -> str:
    """`namespace/name` (just `name` for a cluster-scoped object)."""
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace") or ""
    name = str(meta.get("name") or "")
    return f"{ns}/{name}" if ns else name


def version_of(obj: dict[str, Any]) -> int | None:
    """An object's resourceVersion as a number (etcd's revision), None when it is not one."""
    rv = str((obj.get("metadata") or {}).get("resourceVersion") or "")
    return int(rv) if rv.isdigit() else None


V = TypeVar("V")

Raw = dict[str, Any]
"""A trimmed object, the view of an informer that parses nothing."""


@dataclasses.dataclass(frozen=True, slots=True)
class Change(Generic[V]):
    """One key whose object readers see changed: `old` None when it appeared, `new` None
    when it went away."""

    key: str
    old: V | None
    new: V | None


def _raw(trimmed: dict[str, Any]) -> Any:
    return trimmed


class Informer(Generic[V]):
    """List then watch one kind; `items` (trimmed raw) and `views` (parsed once) are current
    once `synced` is set."""

    def __init__(
        self,
        list_call: ListCall,
        trim: Callable[[dict[str, Any]], dict[str, Any]],
        *,
        kind: str,
        view: Callable[[dict[str, Any]], V] = _raw,
        on_change: Callable[[], None] = lambda: None,
        on_delete: Callable[[dict[str, Any]], None] = lambda _obj: None,
        key: Callable[[dict[str, Any]], str] = key_of,
        retry_s: float = 1.0,
        optional: bool = False,
        absent_retry_s: float = 30.0,
    ) -> None:
        self._list_call = list_call
        self._trim = trim
        self.kind = kind
        self._on_change = on_change
        self._on_delete = on_delete
        """Called with the trimmed object when it is gone: a DELETED event, or a relist
        without it (deleted while the watch was down)."""
        self._key = key
        self._view = view
        self._subscribers: list[Callable[[Change[V]], None]] = []
        self._retry_s = retry_s
        self._optional = optional
        self._absent_retry_s = absent_retry_s
        self.items: dict[str, dict[str, Any]] = {}
        self.views: dict[str, V] = {}
        """Each item's view, parsed once when it arrived."""
        self.synced = asyncio.Event()
        self.lists = 0
        """LISTs made: one at start, one after each watch failure."""
        self.absent = False
        """An optional kind the API server does not serve, or will not show us (404, 403):
        served as empty."""
        self._rv: int | None = None
        """The resourceVersion the watch has reached (None: not a number, or not listed)."""
        self._noted: dict[str, int] = {}
        """Our own writes shown before the watch brought them: key -> resourceVersion."""

    def subscribe(self, handler: Callable[[Change[V]], None]) -> None:
        """Tell `handler` each change readers see from now on (called synchronously, in
        the order the watch brought them; it must not block)."""
        self._subscribers.append(handler)

    def parse(self, raw: dict[str, Any]) -> V:
        """The view the cache would hold of `raw` (an object listed while it is unsynced)."""
        return self._view(self._trim(raw))

    def parse_with(self, view: Callable[[dict[str, Any]], V]) -> None:
        """Parse with `view` from now on (the reading domain's parser), the items held
        already included; tells nobody (what the objects say did not change)."""
        self._view = view
        held, self.items, self.views = self.items, {}, {}
        for key, item in held.items():
            if (parsed := self._parse(key, item)) is not None:
                self.items[key], self.views[key] = item, parsed[0]

    def _tell(self, key: str, old: V | None, new: V | None) -> None:
        if self._subscribers:
            change = Change(key, old, new)
            for handler in self._subscribers:
                handler(change)

    async def current(self) -> list[dict[str, Any]]:
        """Every object, trimmed: the cache's once synced, else listed now (not held; an
        optional kind the API server does not serve or show is empty)."""
        if self.synced.is_set():
            return self.values()
        try:
            data = await _api.read_json(await self._list_call(_preload_content=False))
        except client.ApiException as err:
            if self._optional and err.status in {403, 404}:
                return []
            raise
        return [self._trim(o) for o in data.get("items") or []]

    async def current_views(self) -> list[V]:
        """Every object's view: the cache's once synced, else listed and parsed now."""
        if self.synced.is_set():
            return list(self.views.values())
        return [self._view(o) for o in await self.current()]

    def values(self) -> list[dict[str, Any]]:
        """Every object, as a list (a copy: safe to keep across awaits)."""
        return list(self.items.values())

    def select(
        self, label_selector: str = "", *, field_selector: str = "", namespace: str | None = None
    ) -> list[dict[str, Any]]:
        """The objects a list with these selectors would return (a copy);
        `selectors.UnsupportedError` for a selector only the API server can answer."""
        labels = selectors.parse(label_selector)
        fields = selectors.parse_fields(field_selector)
        return [
            obj
            for obj in self.items.values()
            if (namespace is None or (obj.get("metadata") or {}).get("namespace") == namespace)
            and selectors.holds(labels, (obj.get("metadata") or {}).get("labels") or {})
            and selectors.fields_hold(fields, obj)
        ]

    def note(self, obj: dict[str, Any]) -> None:
        """Show an object as one of our writes returned it, if the watch has not brought
        that version yet; the watch's older copies of it are then skipped until it does."""
        rv = version_of(obj)
        if rv is None or self._rv is None or rv <= self._rv or not self.synced.is_set():
            return  # unsynced, or the watch is past this write: its copy is as new or newer
        key = self._key(obj)
        if self._noted.get(key, 0) >= rv:
            return
        self._noted[key] = rv
        self._put(key, obj)

    def put(self, obj: dict[str, Any]) -> None:
        """Show an object as one of our writes returned it: `note` once synced; before the
        first list (a cache fed by hand), held unless a copy at least as new is."""
        if self.synced.is_set():
            self.note(obj)
            return
        key = self._key(obj)
        held = self.items.get(key)
        if held is None or (version_of(held) or 0) <= (version_of(obj) or 0):
            self._put(key, obj)

    def gone(self, key: str) -> None:
        """Forget an object we deleted ourselves, before the watch tells it."""
        if (held := self.items.pop(key, None)) is not None:
            old = self.views.pop(key, None)
            self._on_delete(held)
            self._tell(key, old, None)
            self._on_change()

    def reset(self) -> None:
        """Forget everything (the cache stopped): unsynced until it lists again."""
        self.synced.clear()
        self.items, self.views = {}, {}
        self._noted = {}
        self._rv = None
        self.absent = False

    async def run(self) -> None:
        """Keep `items` current until cancelled; relist after watch errors."""
        while True:
            try:
                await self._watch(await self._list())
                continue
            except asyncio.CancelledError:
                raise
            except client.ApiException as err:
                if self._optional and err.status in {403, 404}:
                    self._serve_absent(err.status)
                    await asyncio.sleep(self._absent_retry_s)
                    continue
                error: Exception = err
            except Exception as err:  # noqa: BLE001  (any API failure: relist after a pause)
                error = err
            log.warning("watch failed; relisting", kind=self.kind, error=str(error))
            await asyncio.sleep(self._retry_s)

    def _serve_absent(self, status: int) -> None:
        if not self.absent:
            log.info("optional kind not served or not permitted; caching none",
                     kind=self.kind, status=status)  # fmt: skip
        self.listed([], "", absent=True)

    async def _list(self) -> str:
        self.lists += 1
        data = await _api.read_json(await self._list_call(_preload_content=False))
        rv = str(data["metadata"]["resourceVersion"])
        self.listed(data.get("items") or [], rv)
        return rv

    def listed(self, items: list[dict[str, Any]], rv: str, *, absent: bool = False) -> None:
        """Hold what a list returned at `rv` (everything else is forgotten: told gone to
        `on_delete`, deleted while the watch was down): synced. `absent`: an optional kind
        not served, held as empty; `on_change` only when readers saw something before."""
        wake = not absent or bool(self.items) or not self.synced.is_set()
        old, old_views = self.items, self.views
        listed = {self._key(o): self._trim(o) for o in items}
        self.items, self.views = {}, {}
        for key, trimmed in listed.items():
            if old.get(key) == trimmed:
                self.items[key], self.views[key] = trimmed, old_views[key]  # parsed already
            elif (parsed := self._parse(key, trimmed)) is not None:
                self.items[key], self.views[key] = trimmed, parsed[0]
                self._tell(key, old_views.get(key), parsed[0])
        for gone in old.keys() - self.items.keys():
            self._on_delete(old[gone])
            self._tell(gone, old_views.get(gone), None)
        self._noted = {}
        self._rv = int(rv) if rv.isdigit() else None
        self.absent = absent
        self.synced.set()
        if wake:
            self._on_change()

    def _put(self, key: str, obj: dict[str, Any]) -> None:
        trimmed = self._trim(obj)
        if self.items.get(key) == trimmed:
            return  # only a change of what readers see wakes them
        parsed = self._parse(key, trimmed)
        if parsed is None:
            self.gone(key)  # unreadable now: readers no longer see its earlier copy
            return
        self.items[key] = trimmed
        old, self.views[key] = self.views.get(key), parsed[0]
        self._tell(key, old, parsed[0])
        self._on_change()

    def _parse(self, key: str, trimmed: dict[str, Any]) -> tuple[V] | None:
        """The view of an object (in a 1-tuple), None when the parser fails on it: the object
        is left out of the cache and logged, and the watch goes on (one object nobody's
        parser expected must not stop a loop from seeing every other)."""
        try:
            return (self._view(trimmed),)
        except Exception:  # any parser failure: this object only
            log.warning("object left out of the cache: its view failed", kind=self.kind,
                        key=key, exc_info=True)  # fmt: skip
            return None

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
                    self.event(str(kind), obj)

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        """Apply one watch event (ADDED, MODIFIED, DELETED or BOOKMARK) to `items`."""
        rv = version_of(obj)
        self._rv = rv
        if kind == "BOOKMARK":
            return
        key = self._key(obj)
        noted = self._noted.get(key)
        if noted is not None:
            if rv is not None and rv < noted:
                return  # older than our own write, which is shown already
            del self._noted[key]
        if kind == "DELETED":
            self.gone(key)
        else:
            self._put(key, obj)


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
