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


class Limiter:
    """The asyncio side: `await acquire(cls)` returns when the write may be sent."""

    def __init__(
        self,
        rates: budget.Rates,
        *,
        observe: Observe | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        self.queue = budget.Budget(rates, clock())
        self._observe = observe
        self._timer: asyncio.TimerHandle | None = None

    @property
    def waiting(self) -> int:
        """Writes waiting for the budget now."""
        return len(self.queue)

    async def acquire(self, cls: WriteClass) -> None:
        """Wait for a token of the budget for one write of class `cls`."""
        now = self._clock()
        if self.queue.take_at_once(cls, now):
            self._seen(cls, 0.0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.queue.offer(future, cls, now)
        self._pump()
        rates = self.queue.rates
        try:
            async with asyncio.timeout(rates.max_wait_s):
                await future
        except TimeoutError:
            self.queue.withdraw(future)
            msg = (
                f"a {cls.label} write waited {rates.max_wait_s:g} s for the API write budget"
                f" ({rates.rate_per_s:g}/s, burst {rates.burst}) and was given up"
            )
            raise TimeoutError(msg) from None
        except asyncio.CancelledError:
            self.queue.withdraw(future)
            raise

    def _seen(self, cls: WriteClass, waited_s: float) -> None:
        if self._observe is not None:
            self._observe(cls, waited_s)

    def _pump(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        now = self._clock()
        for ticket, cls, waited in self.queue.grant(now):
            if isinstance(ticket, asyncio.Future) and not ticket.done():
                ticket.set_result(None)
                self._seen(cls, waited)
        due = self.queue.next_at(now)
        if due is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closing
                loop = asyncio.get_running_loop()
                self._timer = loop.call_later(max(due - now, 0.001), self._pump)
