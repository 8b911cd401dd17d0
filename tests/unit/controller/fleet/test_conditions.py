"""Node patches: minimal, idempotent, and never touching what is not ours."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from controller import marks, timestamps
from controller.fleet import actions, conditions, nodes, state
from tests.unit.controller.fleet import fakes
from tests.unit.controller.fleet.fakes import at

FAILED = nodes.Condition(nodes.ConditionStatus.FALSE, "XidFallenOffBus", "GPU-a: XidFallenOffBus")
RECORD = nodes.QuarantineRecord(
    mode=nodes.QuarantineMode.AUTOMATIC,
    by=marks.CONTROLLER_IDENTITY,
    at=at(0),
    reason="XidFallenOffBus",
    clears_with=nodes.Clearing.NEW_BOOT_ID,
    boot_id="boot-1",
    faults=frozenset({state.FaultKey("GPU-a", "XidFallenOffBus", "2025-03-01T12:00:00Z")}),
    evict_after=at(60),
)
FOREIGN_TAINT = {"key": "example.com/maintenance", "effect": "NoSchedule"}


def _quarantined(*, cordoned_by_us: bool = True) -> dict[str, Any]:
    node = fakes.raw_node("n1", taints=[FOREIGN_TAINT])
    patch = conditions.patch_for(actions.Quarantine("n1", RECORD, "m", cordon=True), node, at(0))
    assert patch is not None
    node = fakes.apply(node, patch)
    if not cordoned_by_us:
        node["metadata"]["annotations"].pop(marks.CORDONED_ANNOTATION)
    return node


ACTIONS: list[tuple[str, actions.NodeAction, dict[str, Any]]] = [
    ("a condition is written once", actions.SetCondition("n1", FAILED), fakes.raw_node("n1")),
    (
        "a quarantine is written once",
        actions.Quarantine("n1", RECORD, "GPU-a fell off the bus", cordon=True),
        fakes.raw_node("n1", taints=[FOREIGN_TAINT]),
    ),
    (
        "an escalation is written once",
        actions.UpdateQuarantine(
            "n1", dataclasses.replace(RECORD, clears_with=nodes.Clearing.MANUAL_RELEASE)
        ),
        _quarantined(),
    ),
    (
        "the first eviction pass is recorded once",
        actions.EvictGpuPods("n1", at(60), "XidFallenOffBus", first=True),
        _quarantined(),
    ),
    (
        "a release is written once",
        actions.Release("n1", "FaultCleared", "healthy", uncordon=True),
        _quarantined(),
    ),
    (
        "a manual release is written once",
        actions.ManualRelease("n1", "alice", "replaced", RECORD.faults, uncordon=True),
        _quarantined(),
    ),
]


@pytest.mark.parametrize(("action", "node"), [a[1:] for a in ACTIONS], ids=[a[0] for a in ACTIONS])
def test_patches_are_idempotent(action: actions.NodeAction, node: dict[str, Any]) -> None:
    """Applying an action's patch and asking again gives None, even a minute later."""
    first = conditions.patch_for(action, node, at(100))
    assert first is not None
    patched = fakes.apply(node, first)

    second = conditions.patch_for(action, patched, at(160))

    assert second is None


def test_quarantine_patch_keeps_foreign_taints_and_guards_with_the_resource_version() -> None:
    """Our taint is added beside others, in one patch with the cordon and our annotations."""
    node = fakes.raw_node("n1", taints=[FOREIGN_TAINT])

    patch = conditions.patch_for(actions.Quarantine("n1", RECORD, "m", cordon=True), node, at(0))

    assert patch is not None
    expected_spec = {
        "taints": [FOREIGN_TAINT, {"key": marks.TAINT_KEY, "effect": marks.TAINT_EFFECT}],
        "unschedulable": True,
    }
    assert expected_spec == patch.body["spec"]
    assert (
        patch.body["metadata"]["resourceVersion"],
        patch.body["metadata"]["annotations"][marks.CORDONED_ANNOTATION],
        patch.body["metadata"]["annotations"][marks.QUARANTINED_BY_ANNOTATION],
    ) == ("1", "true", "taugrid-controller")


@pytest.mark.parametrize(
    ("cordoned_by_us", "expected_unschedulable"),
    [
        pytest.param(True, False, id="release undoes our own cordon"),
        pytest.param(False, True, id="release leaves a cordon that is not ours"),
    ],
)
def test_release_only_undoes_our_cordon(cordoned_by_us: bool, expected_unschedulable: bool) -> None:
    """Uncordon happens only when `taugrid.dev/cordoned` says the cordon was ours."""
    node = _quarantined(cordoned_by_us=cordoned_by_us)
    patch = conditions.patch_for(
        actions.Release("n1", "FaultCleared", "", uncordon=True), node, at(9)
    )
    assert patch is not None

    view = nodes.parse(fakes.apply(node, patch))

    expected = (expected_unschedulable, False, None, [FOREIGN_TAINT])
    assert expected == (
        view.unschedulable,
        view.tainted,
        view.quarantine,
        fakes.apply(node, patch)["spec"]["taints"],
    )


@pytest.mark.parametrize(
    ("first", "second", "expected_time"),
    [
        pytest.param(
            FAILED,
            nodes.Condition(nodes.ConditionStatus.FALSE, "RowRemapFailure", "GPU-b"),
            at(0),
            id="a new reason with the same status keeps the transition time",
        ),
        pytest.param(
            FAILED,
            nodes.Condition(nodes.ConditionStatus.TRUE, "GpusHealthy", "all 8 GPUs healthy"),
            at(50),
            id="a new status moves the transition time",
        ),
    ],
)
def test_last_transition_time_moves_only_with_status(
    first: nodes.Condition, second: nodes.Condition, expected_time: object
) -> None:
    """Kueue's rule: lastTransitionTime is the time of the last status change."""
    entries: list[dict[str, Any]] = []
    conditions.set_condition(entries, first, at(0))

    changed = conditions.set_condition(entries, second, at(50))

    expected = (True, timestamps.rfc3339_exact(expected_time))  # type: ignore[call-overload]
    assert expected == (changed, entries[0]["lastTransitionTime"])


def test_condition_patch_merges_by_type_and_leaves_kubelet_conditions() -> None:
    """The status patch names only GPUHealthy; strategic merge keeps Ready as it was."""
    node = fakes.raw_node("n1")
    patch = conditions.condition_patch(node, FAILED, at(0))
    assert patch is not None

    patched = fakes.apply(node, patch)

    expected = ["Ready", "GPUHealthy"]
    assert expected == [c["type"] for c in patched["status"]["conditions"]]
    assert (patch.content_type, patch.subresource) == (conditions.STRATEGIC_MERGE_PATCH, "status")


def test_history_is_bounded_to_twenty_entries() -> None:
    """Many quarantine cycles keep only the last 20 actions on the node."""
    node = fakes.raw_node("n1")
    for cycle in range(15):
        for action in (
            actions.Quarantine("n1", RECORD, "m", cordon=True),
            actions.Release("n1", "FaultCleared", "", uncordon=True),
        ):
            patch = conditions.patch_for(action, node, at(cycle))
            assert patch is not None
            node = fakes.apply(node, patch)

    history = nodes.parse(node).history

    assert (len(history), history[-1].action) == (20, "Release")
