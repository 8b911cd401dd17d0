"""One Xid counts once: a kernel-log line and an NVML event for the same Xid are merged.

Pure: the monitor keeps the `Recent` list and passes `now`. Matching is one-to-one across
sources, so a genuine burst (Xid 119 three times) still counts three times while each NVML
event swallows at most one kernel-log line for the same GPU and Xid within the window.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable

from agent import readings


@dataclasses.dataclass(frozen=True, slots=True)
class Seen:
    """An Xid already counted, and whether its twin from the other source has been matched."""

    gpu: int | None
    xid: int
    at: dt.datetime
    source: readings.XidSource
    matched: bool = False


def dedupe(
    recent: Iterable[Seen],
    events: Iterable[readings.XidEvent],
    *,
    window_s: float,
    now: dt.datetime,
) -> tuple[list[readings.XidEvent], list[Seen]]:
    """Return the events that are new and the updated recent list (older entries pruned)."""
    kept = [s for s in recent if (now - s.at).total_seconds() <= 2 * window_s]
    fresh: list[readings.XidEvent] = []
    for event in events:
        twin = next(
            (
                i
                for i, s in enumerate(kept)
                if not s.matched
                and s.source is not event.source
                and s.gpu == event.gpu_index
                and s.xid == event.xid
                and abs((s.at - event.at).total_seconds()) <= window_s
            ),
            None,
        )
        if twin is not None:
            kept[twin] = dataclasses.replace(kept[twin], matched=True)
            continue
        kept.append(Seen(event.gpu_index, event.xid, event.at, event.source))
        fresh.append(event)
    return fresh, kept
