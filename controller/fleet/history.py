"""The node's own record of what TauGrid did to it: the `taugrid.dev/history` annotation.

Kubernetes Events expire after about an hour; an on-call engineer looking at a node the next
morning still needs to know who quarantined it, why and when it was released. The annotation
holds the last `MAX_ENTRIES` actions as compact JSON, oldest first, each text bounded so the
annotation stays far below the 256 KiB limit on all annotations of an object.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Sequence
from typing import Any

from controller import marks, timestamps

MAX_ENTRIES = 20
MAX_TEXT_CHARS = 256


class HistoryError(ValueError):
    """The history annotation is not what TauGrid writes; the message names the field."""


@dataclasses.dataclass(frozen=True, slots=True)
class Entry:
    """One action taken on a node."""

    at: dt.datetime
    action: str
    """PascalCase action (`Quarantine`, `Release`, `ManualRelease`, `EvictGpuPods`)."""
    reason: str
    by: str
    """`taugrid-controller` for automatic actions, the on-call user's name otherwise."""
    message: str = ""

    def to_json(self) -> dict[str, str]:
        """Return the entry as the camelCase JSON object stored in the annotation."""
        return {
            "at": timestamps.rfc3339_exact(self.at),
            "action": _bound(self.action),
            "reason": _bound(self.reason),
            "by": _bound(self.by),
            "message": _bound(self.message),
        }


def parse(raw: str | None) -> tuple[Entry, ...]:
    """Read the annotation value; None or "" is an empty history.

    Raises HistoryError naming the annotation and the offending entry and field when the value
    was not written by `render` (hand-edited or truncated).
    """
    if not raw:
        return ()
    try:
        data: Any = json.loads(raw)
    except json.JSONDecodeError as err:
        msg = f"{marks.HISTORY_ANNOTATION}: not JSON ({err.msg} at character {err.pos})"
        raise HistoryError(msg) from err
    if not isinstance(data, list):
        msg = f"{marks.HISTORY_ANNOTATION}: expected a JSON list, got {type(data).__name__}"
        raise HistoryError(msg)
    return tuple(_parse_entry(index, item) for index, item in enumerate(data))


def _parse_entry(index: int, item: Any) -> Entry:
    where = f"{marks.HISTORY_ANNOTATION}[{index}]"
    if not isinstance(item, dict):
        msg = f"{where}: expected an object, got {type(item).__name__}"
        raise HistoryError(msg)
    fields: dict[str, str] = {}
    for name in ("at", "action", "reason", "by"):
        value = item.get(name)
        if not isinstance(value, str) or not value:
            msg = f"{where}.{name}: required non-empty string"
            raise HistoryError(msg)
        fields[name] = value
    message = item.get("message", "")
    if not isinstance(message, str):
        msg = f"{where}.message: expected a string"
        raise HistoryError(msg)
    try:
        at = timestamps.parse_strict(fields["at"], f"{where}.at")
    except ValueError as err:
        raise HistoryError(str(err)) from err
    return Entry(
        at=at, action=fields["action"], reason=fields["reason"], by=fields["by"], message=message
    )


def append(entries: Sequence[Entry], entry: Entry) -> tuple[Entry, ...]:
    """Return the history with `entry` added, keeping only the newest `MAX_ENTRIES`."""
    return (*entries, entry)[-MAX_ENTRIES:]


def render(entries: Sequence[Entry]) -> str:
    """Return the annotation value: compact JSON of the newest `MAX_ENTRIES` entries."""
    return json.dumps([entry.to_json() for entry in entries[-MAX_ENTRIES:]], separators=(",", ":"))


def _bound(text: str) -> str:
    return text if len(text) <= MAX_TEXT_CHARS else text[: MAX_TEXT_CHARS - 1] + "…"
