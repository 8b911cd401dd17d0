"""The one install's pre-delete hook: which Kueue objects it deletes, in what order, and that
it waits for them (Kueue takes its finalizers off only while it runs) within its bound."""

from __future__ import annotations

import pytest

from controller.kube import uninstall
from controller.kube.uninstall import Target


@pytest.mark.parametrize(
    ("text", "target"),
    [
        ("localqueues/default/default", Target("localqueues", "default", "default")),
        ("clusterqueues/taugrid-dev", Target("clusterqueues", "taugrid-dev")),
        ("resourceflavors/h100", Target("resourceflavors", "h100")),
        ("admissionchecks/taugrid-gpu-health", Target("admissionchecks", "taugrid-gpu-health")),
        ("workloadpriorityclasses/taugrid-resume",
         Target("workloadpriorityclasses", "taugrid-resume")),
    ],
)  # fmt: skip
def test_a_target_names_one_object_of_a_kind_the_hook_deletes(text: str, target: Target) -> None:
    """Each target round-trips to the text it came from."""
    assert uninstall.parse_target(text) == target
    assert str(target) == text


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("workloads/default/w1", "the kind must be one of"),
        ("nodes/gpu-node-0", "the kind must be one of"),
        ("localqueues/default", "localqueues/NAMESPACE/NAME"),
        ("clusterqueues/ns/cq", "clusterqueues/NAME"),
        ("clusterqueues/", "clusterqueues/NAME"),
        ("localqueues//q", "localqueues/NAMESPACE/NAME"),
    ],
)
def test_a_target_outside_the_kinds_or_misshapen_is_refused(text: str, says: str) -> None:
    """Nothing but the chart's five kinds, each in its own shape: the hook's RBAC allows no
    more, and a Workload of a user is never the hook's to delete."""
    with pytest.raises(uninstall.TargetError, match=says):
        uninstall.parse_target(text)


def test_the_objects_go_feeders_first_without_duplicates() -> None:
    """LocalQueues before the ClusterQueue, that before the flavor and the check it names."""
    given = [Target("resourceflavors", "h100"), Target("admissionchecks", "c"),
             Target("clusterqueues", "cq"), Target("localqueues", "q", "b"),
             Target("localqueues", "q", "a"), Target("clusterqueues", "cq"),
             Target("workloadpriorityclasses", "p")]  # fmt: skip
    assert [str(t) for t in uninstall.ordered(given)] == [
        "localqueues/a/q", "localqueues/b/q", "clusterqueues/cq", "resourceflavors/h100",
        "admissionchecks/c", "workloadpriorityclasses/p",
    ]  # fmt: skip


class FakeKueue:
    """Objects with Kueue's finalizer: a deleted object goes after `lag` more polls, and an
    object whose finalizer nobody removes (Kueue gone) never goes."""

    def __init__(self, objects: list[Target], lag: int, stuck: frozenset[Target] = frozenset()):
        self.present = set(objects)
        self.lag = lag
        self.stuck = stuck
        self.deleted: list[Target] = []
        self.polls: dict[Target, int] = {}
        self.now = 0.0

    async def delete(self, t: Target) -> None:
        self.deleted.append(t)

    async def exists(self, t: Target) -> bool:
        if t not in self.present:
            return False
        if t in self.deleted and t not in self.stuck:
            self.polls[t] = self.polls.get(t, 0) + 1
            if self.polls[t] > self.lag:
                self.present.discard(t)
                return False
        return True

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds


OBJECTS = [Target("localqueues", "default", "default"), Target("clusterqueues", "taugrid-dev"),
           Target("resourceflavors", "h100")]  # fmt: skip


async def test_the_hook_deletes_every_object_and_waits_until_all_are_gone() -> None:
    """Deleted in order, then polled until Kueue has let each go: nothing is left."""
    kueue = FakeKueue(OBJECTS, lag=3)
    left = await uninstall.remove(OBJECTS, kueue.delete, kueue.exists, timeout_s=60,
                                  clock=kueue.clock, sleep=kueue.sleep)  # fmt: skip
    assert left == []
    assert kueue.deleted == uninstall.ordered(OBJECTS)
    assert kueue.present == set()
    assert kueue.now >= 3 * uninstall.POLL_S  # it did wait for the finalizers


async def test_an_object_gone_already_is_no_error_and_needs_no_wait() -> None:
    """A second uninstall attempt (or an object the user deleted) finds nothing to wait for."""
    kueue = FakeKueue([], lag=3)
    left = await uninstall.remove(OBJECTS, kueue.delete, kueue.exists, timeout_s=60,
                                  clock=kueue.clock, sleep=kueue.sleep)  # fmt: skip
    assert left == []
    assert kueue.now == 0


async def test_an_object_that_stays_past_the_bound_is_reported() -> None:
    """A ClusterQueue Kueue does not release (a Workload still admitted to it) is named once
    the bound has passed, so the hook fails and `helm uninstall` says why."""
    stuck = Target("clusterqueues", "taugrid-dev")
    kueue = FakeKueue(OBJECTS, lag=1, stuck=frozenset({stuck}))
    left = await uninstall.remove(OBJECTS, kueue.delete, kueue.exists, timeout_s=30,
                                  clock=kueue.clock, sleep=kueue.sleep)  # fmt: skip
    assert left == [stuck]
    assert 30 <= kueue.now <= 30 + uninstall.POLL_S


def test_bad_arguments_exit_2_before_touching_the_cluster(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A misshapen target is refused by name; no client is made (none exists here)."""
    assert uninstall.main(["clusterqueues/taugrid-dev", "pods/x"]) == 2
    assert "pods/x" in capsys.readouterr().err
