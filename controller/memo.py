"""Parse a raw object once while it stays the same object (pure).

The controller's watch-fed caches replace an object that changes and never edit one in
place (`controller.kube.informer.Informer`), so an object seen before with the same identity
reads the same: its view can be kept. Objects from a LIST are new every time and are parsed
every time. What was read since the `sweep` before last is kept; a raw object is held beside
its view, so its id cannot be reused meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Kept(Generic[T]):
    """`parse` of each raw object, once while it stays the same object (see the module)."""

    def __init__(self, parse: Callable[[Mapping[str, Any]], T]) -> None:
        self._parse = parse
        self._kept: dict[int, tuple[Mapping[str, Any], T]] = {}
        self._seen: dict[int, tuple[Mapping[str, Any], T]] = {}
        self.parsed = 0
        """Objects parsed so far (the rest were kept)."""

    def __call__(self, raw: Mapping[str, Any]) -> T:
        """The view of `raw`."""
        hit = self._seen.get(id(raw))
        if hit is None or hit[0] is not raw:
            hit = self._kept.get(id(raw))
            if hit is None or hit[0] is not raw:
                hit = raw, self._parse(raw)
                self.parsed += 1
            self._seen[id(raw)] = hit
        return hit[1]

    def sweep(self) -> None:
        """Forget what was not read since the last sweep."""
        self._kept, self._seen = self._seen, {}
