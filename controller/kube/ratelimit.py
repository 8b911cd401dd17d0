"""The asyncio side of the API write budget (`controller.budget`): which class a request to
the API server is, and a `Limiter` the clients await before every write (`client.py`)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Callable

from controller import budget
from controller.budget import WriteClass

WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})

_CLASSES: tuple[tuple[re.Pattern[str], WriteClass], ...] = (
    (re.compile(r"/apis/coordination\.k8s\.io/v1/namespaces/[^/]+/leases(/[^/]+)?"),
     WriteClass.LEASE),
    (re.compile(r"/apis/authentication\.k8s\.io/v1/tokenreviews"), WriteClass.REVIEW),
    (re.compile(r"/apis/authorization\.k8s\.io/v1/(subject|self)accessreviews"),
     WriteClass.REVIEW),
    (re.compile(r"/api/v1/nodes/[^/]+(/status)?"), WriteClass.NODE),
    (re.compile(r"/apis/resource\.k8s\.io/[^/]+/devicetaintrules(/[^/]+)?"), WriteClass.NODE),
    (re.compile(r"/api/v1/namespaces/[^/]+/pods/[^/]+/eviction"), WriteClass.EVICTION),
    (re.compile(r"(/api/v1|/apis/events\.k8s\.io/v1)/namespaces/[^/]+/events"),
     WriteClass.EVENT),
)  # fmt: skip
"""Matched whole (`fullmatch`) against the request's path."""


def classify(method: str, path: str) -> WriteClass | None:
    """The class of a request to the API server; None for a read (not limited)."""
    if method.upper() not in WRITES:
        return None
    for pattern, cls in _CLASSES:
        if pattern.fullmatch(path):
            return cls
    return WriteClass.RUN


Observe = Callable[[WriteClass, float], None]
"""Told each write's class and how long it waited for the budget (metrics)."""


_NAMES = {budget.Pool.WRITES: "write", budget.Pool.REVIEWS: "review"}

REVIEWS = budget.Rates(rate_per_s=50.0, burst=100, max_wait_s=10.0)
"""The reviews' own budget when none is given (settings `api_reviews_per_s`, `api_review_burst`)."""


class Limiter:
    """The asyncio side: `await acquire(cls)` returns when the write may be sent. Two budgets:
    the replica's writes, and the reviews' own (`budget.pool_of`), each with its queue."""

    def __init__(
        self,
        rates: budget.Rates,
        *,
        reviews: budget.Rates = REVIEWS,
        observe: Observe | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        now = clock()
        self.queues = {budget.Pool.WRITES: budget.Budget(rates, now),
                       budget.Pool.REVIEWS: budget.Budget(reviews, now)}  # fmt: skip
        self._observe = observe
        self._timers: dict[budget.Pool, asyncio.TimerHandle] = {}

    @property
    def queue(self) -> budget.Budget:
        """The replica's write budget (the Lease, nodes, runs, Events, evictions)."""
        return self.queues[budget.Pool.WRITES]

    @property
    def waiting(self) -> int:
        """Writes waiting for either budget now."""
        return sum(len(q) for q in self.queues.values())

    async def acquire(self, cls: WriteClass, *, max_wait_s: float | None = None) -> None:
        """Wait for a token of the budget for one write of class `cls`, at most the budget's
        `max_wait_s` or the one given (a caller's own deadline, which the wait counts in)."""
        pool = budget.pool_of(cls)
        queue = self.queues[pool]
        now = self._clock()
        if queue.take_at_once(cls, now):
            self._seen(cls, 0.0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue.offer(future, cls, now)
        self._pump(pool)
        rates = queue.rates
        bound = rates.max_wait_s if max_wait_s is None else min(max_wait_s, rates.max_wait_s)
        try:
            async with asyncio.timeout(bound):
                await future
        except TimeoutError:
            queue.withdraw(future)
            msg = (
                f"a {cls.label} write waited {bound:g} s for the API {_NAMES[pool]} budget"
                f" ({rates.rate_per_s:g}/s, burst {rates.burst}) and was given up"
            )
            raise TimeoutError(msg) from None
        except asyncio.CancelledError:
            queue.withdraw(future)
            raise

    def _seen(self, cls: WriteClass, waited_s: float) -> None:
        if self._observe is not None:
            self._observe(cls, waited_s)

    def _pump(self, pool: budget.Pool) -> None:
        timer = self._timers.pop(pool, None)
        if timer is not None:
            timer.cancel()
        queue = self.queues[pool]
        now = self._clock()
        for ticket, cls, waited in queue.grant(now):
            if isinstance(ticket, asyncio.Future) and not ticket.done():
                ticket.set_result(None)
                self._seen(cls, waited)
        due = queue.next_at(now)
        if due is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closing
                loop = asyncio.get_running_loop()
                self._timers[pool] = loop.call_later(max(due - now, 0.001), self._pump, pool)
