"""Per-caller limits: slots held while a request lasts, and token buckets per address."""

from __future__ import annotations

import contextlib

import pytest

from controller import errors, limits


def _refused(slots: limits.Slots, key: str) -> bool:
    try:
        with slots.hold(key, key):
            return False
    except errors.TooManyRequests:
        return True


def test_one_caller_gets_its_share_and_no_more_while_others_still_get_theirs() -> None:
    """Two holds for ada: her third is refused, bob's first is not."""
    slots = limits.Slots("log streams", per_key=2, total=10)
    with contextlib.ExitStack() as held:
        held.enter_context(slots.hold("ada", "ada"))
        held.enter_context(slots.hold("ada", "ada"))
        expected = (True, False, 2)
        assert expected == (_refused(slots, "ada"), _refused(slots, "bob"), slots.in_use)


def test_the_replica_wide_cap_holds_whoever_asks() -> None:
    """With the total taken by others, a new caller is refused too."""
    slots = limits.Slots("log streams", per_key=5, total=2)
    with slots.hold("ada", "ada"), slots.hold("bob", "bob"):
        assert _refused(slots, "carol")


def test_a_hold_is_released_however_the_request_ends() -> None:
    """An error inside the block (a client that hung up) gives the slot back."""
    slots = limits.Slots("log streams", per_key=1)
    with pytest.raises(ConnectionResetError), slots.hold("ada", "ada"):
        raise ConnectionResetError
    expected = (0, False)
    assert expected == (slots.in_use, _refused(slots, "ada"))


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _spend(buckets: limits.Buckets, key: str, n: int) -> int:
    """How many of n takes were granted."""
    granted = 0
    for _ in range(n):
        with contextlib.suppress(errors.TooManyRequests):
            buckets.take(key, "unknown tokens")
            granted += 1
    return granted


@pytest.mark.parametrize(
    ("wait_s", "expected"),
    [
        pytest.param(0.0, 0, id="an empty bucket grants nothing at once"),
        pytest.param(1.0, 2, id="it refills at its rate"),
        pytest.param(60.0, 5, id="it never holds more than its burst"),
    ],
)
def test_a_source_gets_its_burst_then_the_rate(wait_s: float, expected: int) -> None:
    """Burst 5 at 2 per second: 5 at once, then what the elapsed time refilled."""
    clock = Clock()
    buckets = limits.Buckets(rate_per_s=2.0, burst=5, clock=clock)
    first = _spend(buckets, "10.0.0.1", 10)
    clock.t += wait_s
    assert (5, expected) == (first, _spend(buckets, "10.0.0.1", 10))


def test_addresses_have_buckets_of_their_own() -> None:
    """One address spending its burst leaves another's untouched."""
    buckets = limits.Buckets(rate_per_s=1.0, burst=3, clock=Clock())
    expected = (3, 3)
    assert expected == (_spend(buckets, "a", 10), _spend(buckets, "b", 10))
