"""The pacing of eviction rounds on quarantined nodes (`controller.fleet.evictions`)."""

from __future__ import annotations

import datetime as dt

import pytest

from controller.fleet import evictions

T0 = dt.datetime(2026, 12, 5, 12, 0, tzinfo=dt.UTC)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def test_the_first_round_on_a_node_runs_at_once() -> None:
    rounds = evictions.Rounds(retry_s=5, sweep_s=30)
    assert rounds.due("n1", T0)
    assert rounds.next_due(T0) is None


@pytest.mark.parametrize(("left_pods", "wait_s"), [(True, 5), (False, 30)])
def test_the_next_round_waits_retry_s_after_pods_were_left_else_sweep_s(
    left_pods: bool, wait_s: float
) -> None:
    rounds = evictions.Rounds(retry_s=5, sweep_s=30)
    rounds.ran("n1", T0, left_pods=left_pods)
    assert not rounds.due("n1", at(1))
    assert not rounds.due("n1", at(wait_s - 0.001))
    assert rounds.due("n1", at(wait_s))
    assert rounds.next_due(at(1)) == at(wait_s)
    assert rounds.due("n2", at(1)), "another node is paced on its own"


def test_the_next_round_counts_from_the_last_one() -> None:
    rounds = evictions.Rounds(retry_s=5, sweep_s=30)
    rounds.ran("n1", T0, left_pods=False)
    rounds.ran("n1", at(30), left_pods=True)  # a pod that tolerated the taint, behind a PDB
    assert not rounds.due("n1", at(34))
    assert rounds.due("n1", at(35))


def test_a_released_node_is_forgotten_and_a_later_quarantine_starts_at_once() -> None:
    rounds = evictions.Rounds(retry_s=5, sweep_s=30)
    rounds.ran("n1", T0, left_pods=True)
    rounds.ran("n2", T0, left_pods=False)
    rounds.keep_only({"n2"})
    assert rounds.due("n1", at(1))
    assert not rounds.due("n2", at(1))
    assert rounds.next_due(at(1)) == at(30)


def test_next_due_is_the_earliest_round_still_to_come() -> None:
    rounds = evictions.Rounds(retry_s=5, sweep_s=30)
    rounds.ran("a", T0, left_pods=False)  # at 30
    rounds.ran("b", at(10), left_pods=True)  # at 15
    assert rounds.next_due(at(11)) == at(15)
    assert rounds.next_due(at(15)) == at(30), "a round due now is not still to come"
    assert rounds.next_due(at(30)) is None
