"""A client-side budget for our writes to the API server, served by priority (issue 17).

The API server protects itself (API Priority and Fairness), but a controller that answers a
storm of 1,000 failing nodes with 3,000 writes at once still crowds out everything else on
it, its own lease renewal included. So every write we send (POST, PUT, PATCH, DELETE) spends
a token of one budget shared by all our clients: `rate_per_s` refilled, `burst` at once, as
client-go's QPS and burst. Reads and watches are not limited (the watch caches make them
rare). When the budget is spent, writes wait, and the waiting ones are served by class:

    Lease < Review < Node < Run < Event < Eviction

(the lease first: losing it stops everything; reviews, below, wait in a budget of their own;
then node and device quarantine; then runs and admission; then
Events; evictions last). Strict priority would starve the tail during a long storm, so a
waiter is promoted one class for every `aging_s` it has waited: its rank is
`class × aging_s + arrival time`, an order that does not change while waiters age together,
so a heap keeps it. Evictions also pass a pace of their own (`eviction_per_s`, as
kube-controller-manager's node eviction rate does), so a storm's drain never takes the whole
budget whatever the other classes do.

TokenReviews and SubjectAccessReviews do not spend this budget: any authenticated caller
can cause them (a fresh `?namespace=` buys one access review), so a flood of callers would
otherwise queue the Lease renewal and the quarantine writes behind itself (security review 3,
finding 1). They have a budget of their own (`pool_of`, chart `controller.apiReviews`),
served by a `Budget` of its own, so they never draw from, nor outrank, what is here.

This module is pure (the time is passed in); `controller.kube.ratelimit` classes each request
and is the asyncio side the clients await.
"""

from __future__ import annotations

import dataclasses
import enum
import heapq
import itertools


class WriteClass(enum.IntEnum):
    """Who a write is for, first served first."""

    LEASE = 0
    REVIEW = 1
    """Only ever queued in the reviews' own budget (`pool_of`): it outranks nothing else."""
    NODE = 2
    RUN = 3
    EVENT = 4
    EVICTION = 5

    @property
    def label(self) -> str:
        """The metric label."""
        return self.name.lower()


class Pool(enum.StrEnum):
    """Which budget a write spends: the replica's writes, or the reviews' own."""

    WRITES = "writes"
    REVIEWS = "reviews"


def pool_of(cls: WriteClass) -> Pool:
    """The budget a write of `cls` spends: reviews (which any authenticated caller can cause)
    their own, everything else the shared one, so no caller can delay the Lease renewal or
    a quarantine write by making the controller review (security review 3, finding 1)."""
    return Pool.REVIEWS if cls is WriteClass.REVIEW else Pool.WRITES


@dataclasses.dataclass(frozen=True, slots=True)
class Rates:
    """The budget a replica ships with (chart `controller.apiWrites`)."""

    rate_per_s: float = 100.0
    """Writes per second, refilled."""
    burst: int = 300
    """Writes at once."""
    aging_s: float = 2.0
    """Waiting this long promotes a write one class."""
    eviction_per_s: float = 20.0
    """Evictions per second at most, whatever else is waiting."""
    eviction_burst: int = 40
    max_wait_s: float = 60.0
    """A write that waited this long for the budget fails as a timed-out call would."""


_EPSILON = 1e-9
"""A token refilled to 0.999999999 by float arithmetic is a token."""


class Pace:
    """A token bucket: `burst` at once, refilled at `rate_per_s` (pure)."""

    def __init__(self, rate_per_s: float, burst: int, now: float) -> None:
        self.rate_per_s = rate_per_s
        self.burst = float(max(burst, 1))
        self.tokens = self.burst
        self.at = now

    def _refill(self, now: float) -> None:
        if now > self.at:
            self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate_per_s)
            self.at = now

    def ready(self, now: float) -> bool:
        """Whether a token is there."""
        self._refill(now)
        return self.tokens >= 1.0 - _EPSILON

    def spend(self, now: float) -> None:
        """Take one token (the caller checked `ready`)."""
        self._refill(now)
        self.tokens -= 1.0

    def next_at(self, now: float) -> float:
        """When the next token is there."""
        self._refill(now)
        if self.tokens >= 1.0 - _EPSILON or self.rate_per_s <= 0:
            return now
        return now + (1.0 - self.tokens) / self.rate_per_s


@dataclasses.dataclass(order=True, frozen=True, slots=True)
class _Waiting:
    rank: float
    seq: int
    cls: WriteClass = dataclasses.field(compare=False)
    ticket: object = dataclasses.field(compare=False)
    since: float = dataclasses.field(compare=False)


class Budget:
    """The shared write budget with its queue (pure: every call is given `now`)."""

    def __init__(self, rates: Rates, now: float) -> None:
        self.rates = rates
        self.pace = Pace(rates.rate_per_s, rates.burst, now)
        self.evictions = Pace(rates.eviction_per_s, rates.eviction_burst, now)
        self._waiting: list[_Waiting] = []
        self._parked: list[_Waiting] = []
        """Evictions that reached the head while their own pace was spent."""
        self._queued: set[int] = set()
        """The tickets (by identity) waiting, in either list."""
        self._gone: set[int] = set()
        """Tickets withdrawn but still in a list: skipped when they come up."""
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._queued)

    def take_at_once(self, cls: WriteClass, now: float) -> bool:
        """Spend a token for a write of `cls` when nothing waits and one is there."""
        if self._queued or not self.pace.ready(now):
            return False
        if cls is WriteClass.EVICTION:
            if not self.evictions.ready(now):
                return False
            self.evictions.spend(now)
        self.pace.spend(now)
        return True

    def offer(self, ticket: object, cls: WriteClass, now: float) -> None:
        """Queue one write."""
        rank = cls * self.rates.aging_s + now
        heapq.heappush(self._waiting, _Waiting(rank, next(self._seq), cls, ticket, now))
        self._queued.add(id(ticket))

    def withdraw(self, ticket: object) -> None:
        """Forget a write that no longer waits (its caller gave up); O(1), and a ticket that
        was already granted or withdrawn is left alone."""
        if id(ticket) in self._queued:
            self._queued.discard(id(ticket))
            self._gone.add(id(ticket))

    def grant(self, now: float) -> list[tuple[object, WriteClass, float]]:
        """The writes that may go now, first served first: (ticket, class, seconds waited)."""
        granted: list[tuple[object, WriteClass, float]] = []
        if self._parked and self.evictions.ready(now):
            # An eviction the pace held keeps its place: it goes back in at its old rank.
            for w in self._parked:
                heapq.heappush(self._waiting, w)
            self._parked.clear()
        while self._waiting and self.pace.ready(now):
            head = heapq.heappop(self._waiting)
            if id(head.ticket) in self._gone:
                self._gone.discard(id(head.ticket))
                continue
            if head.cls is WriteClass.EVICTION:
                if not self.evictions.ready(now):
                    self._parked.append(head)
                    continue
                self.evictions.spend(now)
            self.pace.spend(now)
            self._queued.discard(id(head.ticket))
            granted.append((head.ticket, head.cls, now - head.since))
        if not self._queued:  # whatever is left in the lists was withdrawn
            self._waiting.clear()
            self._parked.clear()
            self._gone.clear()
        return granted

    def next_at(self, now: float) -> float | None:
        """When `grant` may give something again; None when nothing waits."""
        due: list[float] = []
        if not self._queued:
            return None
        if self._waiting:
            due.append(self.pace.next_at(now))
        if self._parked:
            due.append(max(self.evictions.next_at(now), self.pace.next_at(now)))
        return min(due) if due else None
