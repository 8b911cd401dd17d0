"""The keys a control loop has to work on, and when (pure, but for the wake event).

The other half of the informer pattern (`controller.kube.informer`): a change maps to the
keys of the loop's work (a pod to its run, a node to the runs with pods on it), and the loop
takes the keys that are due instead of deciding everything and working out what changed. As
client-go's rate-limited work queue and controller-runtime's `Reconcile` returning
`RequeueAfter`:

- `add` marks a key dirty; a key added many times before a take is taken once.
- `due_at` schedules a key's next look (a run's `requeue_at`, a node's deadline); a new
  schedule replaces the old, None cancels it.
- `failed` schedules a retry after a per-key backoff that doubles up to `max_backoff_s`;
  `succeeded` forgets the key's failures.
- `resync` (and every `resync_s`, the safety net) makes the next take say `everything`: the
  loop then works on every key it knows.

Times are seconds on whatever clock the loop passes in (`now`), so the queue is tested
without sleeping.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


@dataclasses.dataclass(frozen=True, slots=True)
class Batch(Generic[K]):
    """What one take hands the loop: the keys due, or `everything` (a resync)."""

    everything: bool
    keys: frozenset[K]

    def wants(self, key: K) -> bool:
        """Whether `key` is to be worked on in this batch."""
        return self.everything or key in self.keys


class WorkQueue(Generic[K]):
    """Deduplicated keys with delayed adds, per-key backoff and a periodic resync."""

    def __init__(
        self, *, resync_s: float, backoff_s: float = 1.0, max_backoff_s: float = 60.0
    ) -> None:
        self.resync_s = resync_s
        """Seconds between two resyncs (may be changed at any time: the next resync is due
        this long after the last)."""
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.wake = asyncio.Event()
        """Set when a key becomes due now (the loop's pass waits on it)."""
        self._dirty: set[K] = set()
        self._due: dict[K, float] = {}
        self._failures: dict[K, int] = {}
        self._retry: dict[K, float] = {}
        self._everything = True
        """The first take is a resync: nothing is known yet."""
        self._resynced_at: float | None = None

    def __len__(self) -> int:
        """Keys dirty now (scheduled ones not counted)."""
        return len(self._dirty)

    def add(self, key: K) -> None:
        """Mark `key` for the next take."""
        self._dirty.add(key)
        self.wake.set()

    def resync(self) -> None:
        """Make the next take say everything."""
        self._everything = True
        self.wake.set()

    def due_at(self, key: K, when: float | None) -> None:
        """Look at `key` again at `when` (None: no scheduled look), replacing any earlier
        schedule of it."""
        if when is None:
            self._due.pop(key, None)
        else:
            self._due[key] = when

    def failed(self, key: K, now: float) -> float:
        """Work on `key` failed: retry after its backoff; return the backoff."""
        n = self._failures.get(key, 0) + 1
        self._failures[key] = n
        delay = min(self.backoff_s * 2.0 ** (n - 1), self.max_backoff_s)
        self._retry[key] = now + delay
        return delay

    def succeeded(self, key: K) -> None:
        """Work on `key` went through: forget its failures."""
        self._failures.pop(key, None)
        self._retry.pop(key, None)

    def forget(self, key: K) -> None:
        """`key` is gone: drop everything queued for it."""
        self._dirty.discard(key)
        self._due.pop(key, None)
        self.succeeded(key)

    def take(self, now: float) -> Batch[K]:
        """The keys due at `now` (dirty, scheduled or retried), each handed out once; with
        `everything` set on a resync, which is then scheduled `resync_s` later."""
        resync_at = self._resync_at()
        everything = self._everything or (resync_at is not None and now >= resync_at)
        keys = set(self._dirty)
        self._dirty.clear()
        for timed in (self._due, self._retry):
            for key in [k for k, at in timed.items() if at <= now]:
                keys.add(key)
                del timed[key]
        if everything:
            self._everything = False
            self._resynced_at = now
        return Batch(everything, frozenset(keys))

    def _resync_at(self) -> float | None:
        return None if self._resynced_at is None else self._resynced_at + self.resync_s

    def next_scheduled(self, now: float) -> float | None:
        """Seconds from `now` until a key's schedule or retry comes (0 when one is due),
        None when no key has one; the resync not counted."""
        times = [*self._due.values(), *self._retry.values()]
        return max(min(times) - now, 0.0) if times else None

    def next_due(self, now: float) -> float | None:
        """Seconds from `now` until a key is due (0 when one is), None when nothing is
        scheduled and no resync will come."""
        if self._dirty or self._everything:
            return 0.0
        times = [*self._due.values(), *self._retry.values()]
        if (resync_at := self._resync_at()) is not None:
            times.append(resync_at)
        return max(min(times) - now, 0.0) if times else None
