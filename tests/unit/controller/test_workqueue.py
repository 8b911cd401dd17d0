"""The work queue: keys handed out once, scheduled looks, per-key backoff and the resync."""

from __future__ import annotations

from controller import workqueue


def test_a_key_added_many_times_is_taken_once_and_the_first_take_is_a_resync() -> None:
    """Adds coalesce; the first take says everything (nothing is known yet), the next not."""
    q: workqueue.WorkQueue[str] = workqueue.WorkQueue(resync_s=30.0)
    for key in ("a", "b", "a", "a"):
        q.add(key)
    first, second = q.take(0.0), q.take(1.0)
    assert (first.everything, sorted(first.keys)) == (True, ["a", "b"])
    assert (second.everything, second.keys) == (False, frozenset())
    assert (first.wants("zzz"), second.wants("a")) == (True, False)


def test_a_scheduled_key_is_due_at_its_time_and_a_new_schedule_replaces_the_old() -> None:
    """`due_at` schedules one look per key: replaced by the next, cancelled by None."""
    q: workqueue.WorkQueue[str] = workqueue.WorkQueue(resync_s=1e9)
    q.take(0.0)
    q.due_at("a", 10.0)
    q.due_at("a", 20.0)
    q.due_at("b", 5.0)
    q.due_at("c", 7.0)
    q.due_at("c", None)
    seen = [(t, sorted(q.take(t).keys), q.next_scheduled(t)) for t in (4.0, 5.0, 19.0, 20.0)]
    assert seen == [(4.0, [], 1.0), (5.0, ["b"], 15.0), (19.0, [], 1.0), (20.0, ["a"], None)]


def test_a_failed_key_is_retried_after_a_doubling_backoff_until_it_succeeds() -> None:
    """1 s, 2 s, 4 s … capped; success forgets the failures."""
    q: workqueue.WorkQueue[str] = workqueue.WorkQueue(resync_s=1e9, backoff_s=1.0,
                                                      max_backoff_s=3.0)  # fmt: skip
    q.take(0.0)
    delays = [q.failed("a", 0.0) for _ in range(4)]
    assert (delays, q.take(2.9).keys, q.take(3.0).keys) == (
        [1.0, 2.0, 3.0, 3.0], frozenset(), frozenset({"a"}),
    )  # fmt: skip
    q.succeeded("a")
    assert q.failed("a", 10.0) == 1.0


def test_the_resync_comes_every_interval_and_on_demand() -> None:
    """Every `resync_s` after the last, a take says everything; `resync` asks for one now."""
    q: workqueue.WorkQueue[str] = workqueue.WorkQueue(resync_s=30.0)
    takes = [q.take(t).everything for t in (0.0, 10.0, 29.0, 30.0, 31.0)]
    q.resync()
    assert (takes, q.next_due(31.0), q.take(32.0).everything, q.next_due(32.0)) == (
        [True, False, False, True, False], 0.0, True, 30.0,
    )  # fmt: skip


def test_a_forgotten_key_is_due_for_nothing() -> None:
    """A key whose object is gone loses its mark, its schedule and its retry."""
    q: workqueue.WorkQueue[str] = workqueue.WorkQueue(resync_s=1e9)
    q.take(0.0)
    q.add("a")
    q.due_at("a", 5.0)
    q.failed("a", 0.0)
    q.forget("a")
    assert (q.take(100.0).keys, q.next_scheduled(100.0), len(q)) == (frozenset(), None, 0)
