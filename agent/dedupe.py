"""One Xid counts once: a kernel-log line and an NVML event for the same Xid are merged.

Pure: the monitor keeps the `Recent` list and passes `now`. Matching is one-to-one across
sources, so a genuine burst (Xid 119 three times) still counts three times while each NVML
event swallows at most one kernel-log line for the same GPU and Xid within the window.

A kernel-log line that arrives after its NVML twin is not counted again, but it is returned
as a `twin`: for Xid 144-150 only that line carries the subcode registers NVIDIA's decode
needs, so the verdict core must still see it.
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


@dataclasses.dataclass(frozen=True, slots=True)
class Deduped:
    """The outcome of one pass: what counts, the late kernel-log twins, the new recent list."""

    fresh: list[readings.XidEvent]
    twins: list[readings.XidEvent]
    """Kernel-log lines whose NVML twin was already counted (not counted again)."""
    recent: list[Seen]


def dedupe(
    recent: Iterable[Seen],
    events: Iterable[readings.XidEvent],
    *,
    window_s: float,
    now: dt.datetime,
) -> Deduped:
    """Return the events that are new, the late twins and the updated recent list."""
    kept = [s for s in recent if (now - s.at).total_seconds() <= 2 * window_s]
    fresh: list[readings.XidEvent] = []
    twins: list[readings.XidEvent] = []
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
            if event.source is readings.XidSource.KMSG:
                twins.append(event)
            continue
        kept.append(Seen(event.gpu_index, event.xid, event.at, event.source))
        fresh.append(event)
    return Deduped(fresh=fresh, twins=twins, recent=kept)
