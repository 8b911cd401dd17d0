"""The API write budget: a shared token bucket, waiters served by class with aging, evictions
paced on their own (pure: every call is given the time)."""

from __future__ import annotations

import dataclasses

import hypothesis
import pytest
from hypothesis import strategies as st

from controller import budget
from controller.budget import WriteClass


def _drain(b: budget.Budget, start: float, until: float, step: float) -> list[tuple[str, float]]:
    """Grant at every `step` from `start` to `until`: (ticket, time granted) in order."""
    out: list[tuple[str, float]] = []
    for k in range(round((until - start) / step) + 1):
        t = start + k * step
        out.extend((str(ticket), t) for ticket, _, _ in b.grant(t))
    return out


def test_writes_within_the_burst_go_at_once_and_the_next_waits_for_the_rate() -> None:
    """Burst 3 at 10/s: three at once, the fourth a tenth of a second later."""
    b = budget.Budget(budget.Rates(rate_per_s=10, burst=3), now=0.0)
    expected = [True, True, True, False]
    assert expected == [b.take_at_once(WriteClass.RUN, 0.0) for _ in range(4)]
    b.offer("fourth", WriteClass.RUN, 0.0)
    assert b.grant(0.05) == []
    assert pytest.approx(0.1) == b.next_at(0.05)
    assert [t for t, _, _ in b.grant(0.1)] == ["fourth"]


def test_nothing_jumps_the_queue_while_writes_wait() -> None:
    """A token that refilled goes to the waiting write, not to a newcomer at once."""
    b = budget.Budget(budget.Rates(rate_per_s=10, burst=1), now=0.0)
    assert b.take_at_once(WriteClass.RUN, 0.0)
    b.offer("waiting", WriteClass.EVENT, 0.0)
    assert not b.take_at_once(WriteClass.LEASE, 0.2)
    assert [t for t, _, _ in b.grant(0.2)] == ["waiting"]


@pytest.mark.parametrize(
    ("queued", "expected"),
    [
        pytest.param(
            [("evict", WriteClass.EVICTION), ("event", WriteClass.EVENT),
             ("run", WriteClass.RUN), ("taint", WriteClass.NODE),
             ("review", WriteClass.REVIEW), ("lease", WriteClass.LEASE)],
            ["lease", "review", "taint", "run", "event", "evict"],
            id="arrived together, the lease goes first and the eviction last",
        ),
        pytest.param(
            [("taint-a", WriteClass.NODE), ("run", WriteClass.RUN), ("taint-b", WriteClass.NODE)],
            ["taint-a", "taint-b", "run"],
            id="within one class, first come first served",
        ),
    ],
)  # fmt: skip
def test_waiting_writes_are_served_by_class(
    queued: list[tuple[str, WriteClass]], expected: list[str]
) -> None:
    """With the burst spent, one token every 0.1 s goes to the best-ranked waiter."""
    b = budget.Budget(budget.Rates(rate_per_s=10, burst=1), now=0.0)
    assert b.take_at_once(WriteClass.RUN, 0.0)
    for ticket, cls in queued:
        b.offer(ticket, cls, 0.0)
    assert expected == [t for t, _ in _drain(b, 0.1, 0.1 * len(queued), 0.1)]


def test_a_write_that_waited_long_enough_goes_before_newer_better_classes() -> None:
    """An Event (class 4) waiting 9 s outranks a node write arriving now (aging 2 s/class)."""
    b = budget.Budget(budget.Rates(rate_per_s=1, burst=1, aging_s=2.0), now=0.0)
    assert b.take_at_once(WriteClass.RUN, 0.0)
    b.offer("old-event", WriteClass.EVENT, 0.0)
    b.offer("new-taint", WriteClass.NODE, 9.0)
    assert [t for t, _, _ in b.grant(9.0)] == ["old-event"]


def test_a_flood_of_lease_writes_does_not_starve_an_event() -> None:
    """Lease writes taking the whole rate forever: the Event still goes once it has waited
    4 × aging (its class), before every lease write that arrived after that."""
    rates = budget.Rates(rate_per_s=10, burst=1, aging_s=2.0)
    b = budget.Budget(rates, now=0.0)
    assert b.take_at_once(WriteClass.LEASE, 0.0)
    b.offer("event", WriteClass.EVENT, 0.0)
    granted_at = None
    for i in range(1, 300):
        t = i * 0.1
        b.offer(f"lease-{i}", WriteClass.LEASE, t)
        if any(ticket == "event" for ticket, _, _ in b.grant(t)):
            granted_at = t
            break
    assert granted_at is not None
    assert WriteClass.EVENT * rates.aging_s <= granted_at <= WriteClass.EVENT * rates.aging_s + 0.2


def test_evictions_keep_their_own_pace_and_leave_the_rest_of_the_budget_to_others() -> None:
    """100 evictions and 20 run writes at 50/s with evictions at 5/s: in the first second the
    runs all go and no more evictions than their pace allows."""
    rates = budget.Rates(rate_per_s=50, burst=1, eviction_per_s=5, eviction_burst=1)
    b = budget.Budget(rates, now=0.0)
    assert b.take_at_once(WriteClass.RUN, 0.0)
    for i in range(100):
        b.offer(f"evict-{i}", WriteClass.EVICTION, 0.0)
    for i in range(20):
        b.offer(f"run-{i}", WriteClass.RUN, 0.0)
    first_second = [t for t, _ in _drain(b, 0.02, 1.0, 0.02)]
    evictions = [t for t in first_second if t.startswith("evict")]
    assert sum(t.startswith("run") for t in first_second) == 20
    assert 1 <= len(evictions) <= 1 + 5  # the burst, then 5/s
    assert [f"evict-{i}" for i in range(len(evictions))] == evictions  # in their order


def test_a_withdrawn_write_is_never_granted_and_spends_nothing() -> None:
    """The caller gave up: its place goes to the next, and the queue forgets it."""
    b = budget.Budget(budget.Rates(rate_per_s=10, burst=1), now=0.0)
    assert b.take_at_once(WriteClass.RUN, 0.0)
    b.offer("gave-up", WriteClass.LEASE, 0.0)
    b.offer("stays", WriteClass.RUN, 0.0)
    b.withdraw("gave-up")
    b.withdraw("gave-up")  # twice is harmless
    expected = (["stays"], 0, None)
    assert expected == ([t for t, _, _ in b.grant(0.1)], len(b), b.next_at(0.1))


@dataclasses.dataclass(frozen=True)
class _Arrival:
    at_tick: int
    cls: WriteClass


@hypothesis.given(
    st.lists(
        st.builds(_Arrival, st.integers(0, 40), st.sampled_from(list(WriteClass))),
        min_size=1,
        max_size=120,
    ),
    st.integers(1, 20),
)
@hypothesis.settings(max_examples=200, deadline=None)
def test_every_write_is_granted_once_and_the_rate_is_never_exceeded(
    arrivals: list[_Arrival], burst: int
) -> None:
    """Whatever arrives: each write is granted exactly once, and no window of a second ever
    sees more than burst + rate grants (nor more evictions than theirs)."""
    rates = budget.Rates(rate_per_s=20, burst=burst, eviction_per_s=5, eviction_burst=2)
    b = budget.Budget(rates, now=0.0)
    by_tick: dict[int, list[tuple[str, WriteClass]]] = {}
    for n, a in enumerate(arrivals):
        by_tick.setdefault(a.at_tick, []).append((f"w{n}", a.cls))
    granted: list[tuple[str, WriteClass, float]] = []
    tick, step = 0, 0.05
    while len(granted) < len(arrivals):
        t = tick * step
        for ticket, cls in by_tick.get(tick, []):
            if b.take_at_once(cls, t):
                granted.append((ticket, cls, t))
            else:
                b.offer(ticket, cls, t)
        granted.extend((str(k), c, t) for k, c, _ in b.grant(t))
        tick += 1
        assert tick < 100_000, "the queue never drained"
    assert sorted(f"w{n}" for n in range(len(arrivals))) == sorted(g[0] for g in granted)
    times = [g[2] for g in granted]
    evictions = [g[2] for g in granted if g[1] is WriteClass.EVICTION]
    for start in times:
        assert sum(start <= x < start + 1.0 for x in times) <= burst + rates.rate_per_s + 1
        assert sum(start <= x < start + 1.0 for x in evictions) <= 2 + 5 + 1


@pytest.mark.parametrize(
    ("cls", "expected"),
    [
        pytest.param(WriteClass.REVIEW, budget.Pool.REVIEWS,
                     id="a review spends the reviews' own budget"),
        pytest.param(WriteClass.LEASE, budget.Pool.WRITES, id="the lease spends the write budget"),
        pytest.param(WriteClass.NODE, budget.Pool.WRITES,
                     id="a node write spends the write budget"),
        pytest.param(WriteClass.RUN, budget.Pool.WRITES, id="a run write spends the write budget"),
        pytest.param(WriteClass.EVENT, budget.Pool.WRITES, id="an Event spends the write budget"),
        pytest.param(WriteClass.EVICTION, budget.Pool.WRITES,
                     id="an eviction spends the write budget"),
    ],
)  # fmt: skip
def test_only_reviews_spend_the_reviews_budget(cls: WriteClass, expected: budget.Pool) -> None:
    """Security review 3, finding 1: the reviews any caller can cause never draw from the
    budget of the Lease and of quarantine."""
    assert expected == budget.pool_of(cls)
