"""Diagnostics and health checks of every dcgmi layout, through the verdict core.

Node findings (what names no GPU) concern every GPU of the run the same way: never GPU 0 alone.
"""

from __future__ import annotations

import datetime as dt
import pathlib

import pytest

from agent import latching, readings, verdicts
from agent.probing import dcgm
from shared import health

FIXTURES = pathlib.Path(__file__).parents[2] / "fixtures" / "dcgm"
T0 = dt.datetime(2026, 5, 1, 12, 0, tzinfo=dt.UTC)
H, D, F = health.Verdict.HEALTHY, health.Verdict.DEGRADED, health.Verdict.FAILED
A = health.Action
POLICY = verdicts.Policy(dcgm_present=True)


def snapshot(index: int) -> readings.GpuSnapshot:
    """A healthy GPU."""
    return readings.GpuSnapshot(index=index, uuid=f"GPU-{index:08d}", taken_at=T0)


def verdicts_of(
    gpus: tuple[int, ...],
    diag: readings.DiagResult | None = None,
    check: readings.HealthCheck | None = None,
    passes: int = 1,
) -> dict[int, tuple[health.Verdict, health.Action, frozenset[str]]]:
    """(verdict, action, reason codes) per GPU after `passes` probe passes."""
    state = latching.NodeState()
    out: tuple[verdicts.GpuVerdict, ...] = ()
    for i in range(passes):
        inputs = verdicts.Inputs(
            boot_id="b", snapshots=tuple(snapshot(g) for g in gpus), diag=diag, health_check=check
        )
        state, out = verdicts.evaluate_node(state, inputs, POLICY, T0 + dt.timedelta(seconds=i))
    return {v.index: (v.verdict, v.action, frozenset(r.code for r in v.reasons)) for v in out}


def diag(fixture: str, gpus: tuple[int, ...]) -> readings.DiagResult:
    """A fixture parsed as a diagnostic of `gpus`."""
    text = (FIXTURES / fixture).read_text()
    return dcgm.parse_diag(text, level=1, started_at=T0, finished_at=T0, gpu_indices=gpus)


NODE_WARN = frozenset({"DcgmDiagNodeWarning"})
NODE_FAIL = frozenset({"DcgmDiagNodeFailed"})


@pytest.mark.parametrize(
    ("fixture", "gpus", "expected"),
    [
        pytest.param("diag3.3.1_deployment_fail.json", (0, 1, 3, 5), (D, A.NONE, NODE_WARN),
                     id="3.3.1 persistence mode off (CONFIG) only degrades every GPU"),
        pytest.param("diag3.2_vc_deployment_fail.json", (0, 1), (D, A.NONE, NODE_WARN),
                     id="a 3.2 deployment failure without a severity degrades, latches nothing"),
        pytest.param("diag3.3.9_deployment_fail.json", (0, 3, 5), (F, A.RESET_GPU, NODE_FAIL),
                     id="3.3.9 deployment errors reach every GPU alike, GPU 0 no more than 5"),
        pytest.param("diag4_summary_only_fail.json", (0, 1), (D, A.NONE, NODE_WARN),
                     id="a 4.x test_summary-only failure (MONITOR) is not a pass"),
    ],
)  # fmt: skip
def test_node_findings_reach_every_gpu_alike(
    fixture: str,
    gpus: tuple[int, ...],
    expected: tuple[health.Verdict, health.Action, frozenset[str]],
) -> None:
    """Every GPU of the run gets the same node finding, and none a GPU-level one."""
    assert dict.fromkeys(gpus, expected) == verdicts_of(gpus, diag(fixture, gpus))


def test_a_gpu_failure_stays_on_its_gpu() -> None:
    """A 4.x entity failure of severity RESET fails GPU 1 only."""
    out = verdicts_of((0, 1), diag("diag4_fail.json", (0, 1)))
    assert {0: (H, A.NONE, frozenset()), 1: (F, A.RESET_GPU, frozenset({"DcgmDiagFailed"}))} == out


def test_a_node_warning_stays_while_it_is_the_last_diagnostic() -> None:
    """A finding that does not latch is shown on every pass, not only the first."""
    out = verdicts_of((0,), diag("diag3.3.1_deployment_fail.json", (0,)), passes=3)
    assert out == {0: (D, A.NONE, NODE_WARN)}


def test_a_node_failure_is_no_passing_diagnostic_for_a_reset() -> None:
    """After a reset, a level-1 run whose node checks fail does not clear the latched fault."""
    state = latching.NodeState()
    lost = readings.GpuSnapshot(
        index=0, uuid="GPU-0", taken_at=T0, nvml_error=readings.NvmlErrorKind.RESET_REQUIRED
    )
    back = readings.GpuSnapshot(index=0, uuid="GPU-0", taken_at=T0)
    later = T0 + dt.timedelta(seconds=10)
    failing = diag("diag4_summary_only_fail.json", (0,)).model_copy(
        update={"started_at": later, "finished_at": later}
    )
    for snap, result, at in ((lost, None, T0), (back, None, T0), (back, failing, later)):
        state, out = verdicts.evaluate_node(
            state, verdicts.Inputs(boot_id="b", snapshots=(snap,), diag=result), POLICY, at
        )
    assert "GpuResetRequired" in {r.code for r in out[0].reasons}
    passing = diag("diag4_pass.json", (0,)).model_copy(
        update={"started_at": later, "finished_at": later + dt.timedelta(seconds=1)}
    )
    state, out = verdicts.evaluate_node(
        state, verdicts.Inputs(boot_id="b", snapshots=(back,), diag=passing), POLICY, later
    )
    assert (out[0].verdict, state.gpus["GPU-0"].latched) == (H, ())


def test_a_switch_health_failure_degrades_every_gpu() -> None:
    """A DCGM health failure of an NVSwitch is node-wide."""
    check = dcgm.parse_health((FIXTURES / "health_switch_fail.json").read_text(), at=T0)
    expected = (D, A.NONE, frozenset({"DcgmHealthNodeFailure"}))
    assert dict.fromkeys((0, 1), expected) == verdicts_of((0, 1), check=check)
