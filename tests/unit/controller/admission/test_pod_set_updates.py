"""What a Ready check adds to the pods: exactly one merged `podSetUpdates` entry per pod set.

Kueue v0.19 applies only the first entry of a pod set's name and drops the rest; from v0.21
its webhook refuses a check that names a pod set twice (`WorkloadValidateUniquePodSetUpdates`,
kueue#18021). The integration test checks the result against Kueue's own webhook."""

from __future__ import annotations

import pytest

from controller import marks
from controller.admission import entries, policy, views
from tests.unit.controller.fleet.fakes import T0, at

CHECK = "taugrid-gpu-health"
Update = entries.PodSetUpdate
NO_SCHEDULE = views.Toleration("gpu", "Exists", "", "NoSchedule")


def names(updates: tuple[entries.PodSetUpdate, ...]) -> list[str]:
    return [u.name for u in updates]


@pytest.mark.parametrize(
    ("pod_sets", "updates", "expected"),
    [
        pytest.param(
            ["main"], [], [Update("main")],
            id="a pod set no update names gets an empty one",
        ),
        pytest.param(
            ["head", "workers"],
            [Update("workers", labels={"a": "1"}), Update("workers", labels={"b": "2"}),
             Update("head", annotations={"c": "3"})],
            [Update("head", annotations={"c": "3"}),
             Update("workers", labels={"a": "1", "b": "2"})],
            id="two updates of one pod set become one, in the Workload's order",
        ),
        pytest.param(
            ["main"],
            [Update("main", node_selector={"zone": "a"}, tolerations=(NO_SCHEDULE,)),
             Update("main", node_selector={"zone": "a"}, tolerations=(NO_SCHEDULE,))],
            [Update("main", node_selector={"zone": "a"}, tolerations=(NO_SCHEDULE,))],
            id="the same key with the same value and an equal toleration are kept once",
        ),
        pytest.param(
            ["main", "main"], [Update("main", labels={"a": "1"})],
            [Update("main", labels={"a": "1"})],
            id="a pod set named twice is still covered once",
        ),
    ],
)  # fmt: skip
def test_merge_gives_each_pod_set_exactly_one_update(
    pod_sets: list[str], updates: list[entries.PodSetUpdate], expected: list[entries.PodSetUpdate]
) -> None:
    """The merge covers every pod set once, in order, with all its updates folded in."""
    merged = entries.merge_pod_set_updates(pod_sets, updates)

    assert list(merged) == expected
    assert names(merged) == list(dict.fromkeys(pod_sets))


@pytest.mark.parametrize(
    ("updates", "words"),
    [
        pytest.param([Update("driver")], "names 'driver'", id="a pod set the Workload has not"),
        pytest.param(
            [Update("main", labels={"a": "1"}), Update("main", labels={"a": "2"})],
            "labels: a is both '1' and '2'", id="one label given two values",
        ),
        pytest.param(
            [Update("main", node_selector={"z": "a"}), Update("main", node_selector={"z": "b"})],
            "nodeSelector: z is both", id="one node selector key given two values",
        ),
    ],
)  # fmt: skip
def test_merge_refuses_what_cannot_be_one_update(
    updates: list[entries.PodSetUpdate], words: str
) -> None:
    """A name the Workload has no pod set of, or a key given two values, is an error."""
    with pytest.raises(entries.PodSetUpdateError, match=words):
        entries.merge_pod_set_updates(["main"], updates)


def test_the_gate_marks_every_pod_set_once() -> None:
    """Each pod set gets the label and the check's name and time, nothing else."""
    updates = entries.gate_pod_set_updates(["head", "workers"], CHECK, T0)

    assert names(updates) == ["head", "workers"]
    for u in updates:
        assert u.labels == {marks.GATE_PASSED_LABEL: "true"}
        assert u.annotations == {
            marks.GATE_CHECK_ANNOTATION: CHECK,
            marks.GATE_PASSED_AT_ANNOTATION: "2025-03-01T12:00:00Z",
        }
        assert (u.node_selector, u.tolerations) == ({}, ())


def test_a_ready_entry_carries_one_update_per_pod_set() -> None:
    """The applied Ready entry names every pod set of the Workload exactly once."""
    decision = policy.Decision(views.CheckState.READY, "fits", since=at(5))

    body = entries.check_state_body(CHECK, decision, ["head", "workers", "workers"])

    assert body["podSetUpdates"] == [
        {"name": name, "labels": {marks.GATE_PASSED_LABEL: "true"},
         "annotations": {marks.GATE_CHECK_ANNOTATION: CHECK,
                         marks.GATE_PASSED_AT_ANNOTATION: "2025-03-01T12:00:05Z"}}
        for name in ("head", "workers")
    ]  # fmt: skip


@pytest.mark.parametrize(
    "state", [views.CheckState.RETRY, views.CheckState.PENDING], ids=lambda s: f"a {s} entry"
)
def test_only_ready_carries_updates(state: views.CheckState) -> None:
    """A Retry or Pending entry carries no podSetUpdates (applying it drops a Ready's)."""
    decision = policy.Decision(state, "waits", requeue_after_s=5, since=T0)

    assert "podSetUpdates" not in entries.check_state_body(CHECK, decision, ["main"])


def test_tolerations_are_spelt_as_kueue_reads_them() -> None:
    """Empty toleration fields are left out (Kueue refuses a value with Exists)."""
    body = entries.pod_set_update_body(Update("main", tolerations=(NO_SCHEDULE,)))

    assert body == {
        "name": "main",
        "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
    }
