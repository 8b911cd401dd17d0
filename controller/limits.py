"""Limits on what one caller can make the controller do at once (review findings H2, M10).

Two kinds, both answered 429 (`errors.TooManyRequests`) before any work is done:
- `Slots`: concurrent holds per key (an identity) and in all, for work that holds a
  connection to the API server while it lasts (log streams) or costs several API calls
  (`/v1/queues`, run lists). A hold is released when the request ends, however it ends.
- `Buckets`: a token bucket per key (a source address) for what an unauthenticated caller
  can make us ask the API server (a TokenReview for a token we have not seen, a TauRun read
  for a run token we have not seen). A bucket that has been full for a while is forgotten,
  so a flood of addresses costs bounded memory.

Both take the time from a clock passed in and do no I/O.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import time
from collections.abc import Callable, Hashable, Iterator

from controller import errors

MAX_BUCKETS = 100_000
"""Source addresses remembered at once; beyond it the fullest are forgotten first."""


class Slots:
    """At most `per_key` holds per key and `total` in all."""

    def __init__(self, what: str, *, per_key: int, total: int | None = None) -> None:
        self.what = what
        self.per_key = per_key
        self.total = total
        self.held: collections.Counter[Hashable] = collections.Counter()

    @property
    def in_use(self) -> int:
        """Holds taken and not yet released, over every key."""
        return sum(self.held.values())

    @contextlib.contextmanager
    def hold(self, key: Hashable, who: str) -> Iterator[None]:
        """Hold one slot for `key` while the block runs; TooManyRequests when none is free."""
        if self.held[key] >= self.per_key:
            msg = (
                f"{who} already has {self.held[key]} {self.what} open, the most one caller may"
                f" have at once ({self.per_key}); close one and retry"
            )
            raise errors.TooManyRequests(msg, code="TooMany")
        if self.total is not None and self.in_use >= self.total:
            msg = f"this replica serves {self.total} {self.what} already; retry shortly"
            raise errors.TooManyRequests(msg, code="TooMany")
        self.held[key] += 1
        try:
            yield
        finally:
            self.held[key] -= 1
            if not self.held[key]:
                del self.held[key]


@dataclasses.dataclass
class _Bucket:
    tokens: float
    at: float


class Buckets:
    """A token bucket per key: `burst` at once, refilled at `rate_per_s`."""

    def __init__(
        self, *, rate_per_s: float, burst: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate_per_s = rate_per_s
        self.burst = burst
        self._clock = clock
        self._buckets: dict[Hashable, _Bucket] = {}

    def take(self, key: Hashable, what: str) -> None:
        """Spend one token of `key`'s bucket; TooManyRequests when it is empty."""
        now = self._clock()
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= MAX_BUCKETS:
                self._forget(now)
            bucket = self._buckets[key] = _Bucket(float(self.burst), now)
        bucket.tokens = min(float(self.burst), bucket.tokens + (now - bucket.at) * self.rate_per_s)
        bucket.at = now
        if bucket.tokens < 1.0:
            msg = f"too many {what}; retry in a few seconds"
            raise errors.TooManyRequests(msg, code="RateLimited")
        bucket.tokens -= 1.0

    def _forget(self, now: float) -> None:
        """Drop buckets that have refilled (they remember nothing); then the oldest."""
        full_after = self.burst / self.rate_per_s if self.rate_per_s > 0 else float("inf")
        for key in [k for k, b in self._buckets.items() if now - b.at >= full_after]:
            del self._buckets[key]
        while len(self._buckets) >= MAX_BUCKETS:
            self._buckets.pop(next(iter(self._buckets)))
