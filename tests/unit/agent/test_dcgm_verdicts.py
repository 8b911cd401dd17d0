"""Diagnostics and health checks of every dcgmi layout, through the verdict core.

Node findings (what names no GPU) concern every GPU of the run the same way: never GPU 0 alone.
"""

from __future__ import annotations

import datetime as dt
import json
import pathlib

import pytest

from agent import dcgmerrors, latching, readings, verdicts
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


HGX = tuple(range(8))
"""An HGX H200 node's eight GPUs, as the DCGM 4.6 samples name them."""


@pytest.mark.parametrize(
    ("fixture", "expected"),
    [
        pytest.param(
            "diag4.6_l1_fm_training.json",
            dict.fromkeys(HGX, (D, A.NONE, NODE_WARN)),
            id="Fabric Manager still training (CONFIG, no entity) degrades the node, fails no GPU",
        ),
        pytest.param(
            "diag4.6_l1_recovery_reset_gpu3.json",
            {**dict.fromkeys(HGX, (H, A.NONE, frozenset())),
             3: (F, A.RESET_GPU, frozenset({"DcgmDiagFailed"}))},
            id="GPU 3's pending recovery reset is GPU 3's alone, not the seven printed Fail",
        ),
        pytest.param(
            "diag4.6_l3_faulty_memory_remap_pending_gpu2.json",
            {**dict.fromkeys(HGX, (H, A.NONE, frozenset())),
             2: (F, A.INSPECT, frozenset({"DcgmDiagFailed"}))},
            id="faulty memory (ISOLATE) beside a pending remap (RESET) is Inspect, not a reset",
        ),
    ],
)  # fmt: skip
def test_a_dcgm4_failure_lands_on_the_gpus_its_errors_name(
    fixture: str, expected: dict[int, tuple[health.Verdict, health.Action, frozenset[str]]]
) -> None:
    """DCGM sets a failed check's result on every GPU; only the errors say whose it is."""
    assert expected == verdicts_of(HGX, diag(fixture, HGX))


def test_fabric_manager_training_latches_nothing() -> None:
    """The CONFIG finding of a training Fabric Manager is shown, never latched for a person."""
    state = latching.NodeState()
    inputs = verdicts.Inputs(
        boot_id="b",
        snapshots=tuple(snapshot(g) for g in HGX),
        diag=diag("diag4.6_l1_fm_training.json", HGX),
    )
    state, _ = verdicts.evaluate_node(state, inputs, POLICY, T0)
    assert {uuid: gpu.latched for uuid, gpu in state.gpus.items()} == {
        f"GPU-{g:08d}": () for g in HGX
    }


def test_after_a_reboot_fabric_manager_training_waits_for_the_next_run() -> None:
    """A reset-latched GPU stays waiting for a pass through FM training; the retry clears it."""
    uuid = "GPU-00000003"
    fault = latching.LatchedFault(
        code="XidUncontainedEcc", verdict=F, action=A.RESET_GPU, since=T0, last_seen=T0,
        boot_id="old", clears_when=latching.ClearingCondition.RESET_THEN_DIAG,
    )  # fmt: skip
    state = latching.NodeState(
        boot_id="old",
        gpus={uuid: latching.GpuState(uuid=uuid, index=3, latched=(fault,))},
    )
    booted = T0 + dt.timedelta(minutes=5)
    training = diag("diag4.6_l1_fm_training.json", HGX).model_copy(
        update={"finished_at": booted + dt.timedelta(seconds=30)}
    )
    snaps = tuple(snapshot(g) for g in HGX)
    state, out = verdicts.evaluate_node(
        state, verdicts.Inputs(boot_id="new", snapshots=snaps, diag=training), POLICY, booted
    )
    waiting = state.gpus[uuid].latched
    assert (out[3].verdict, out[3].action, [f.code for f in waiting]) == (
        F, A.RESET_GPU, ["XidUncontainedEcc"]
    )  # fmt: skip
    assert latching.diag_after_reset_due(
        state, training, runs_since_reset=1, retry_after_s=60, max_runs=10
    ) == training.finished_at + dt.timedelta(seconds=60)
    passing = readings.DiagResult(
        level=1,
        started_at=booted + dt.timedelta(seconds=90),
        finished_at=booted + dt.timedelta(seconds=120),
        overall=readings.DiagStatus.PASS,
        gpus=tuple(readings.GpuDiag(gpu_index=g, status=readings.DiagStatus.PASS) for g in HGX),
    )
    state, out = verdicts.evaluate_node(
        state,
        verdicts.Inputs(boot_id="new", snapshots=snaps, diag=passing),
        POLICY,
        booted + dt.timedelta(seconds=121),
    )
    assert (out[3].verdict, state.gpus[uuid].latched) == (H, ())


def test_a_gpu_waiting_for_its_diagnostic_passes_beside_anothers_recovery_action() -> None:
    """GPU 0 was reset; the run that blames GPU 3 (printed Fail on all) clears GPU 0."""
    uuid = "GPU-00000000"
    fault = latching.LatchedFault(
        code="XidUncontainedEcc", verdict=F, action=A.RESET_GPU, since=T0, last_seen=T0,
        boot_id="b", clears_when=latching.ClearingCondition.RESET_THEN_DIAG,
        reset_observed_at=T0,
    )  # fmt: skip
    state = latching.NodeState(
        boot_id="b", gpus={uuid: latching.GpuState(uuid=uuid, index=0, latched=(fault,))}
    )
    later = T0 + dt.timedelta(seconds=30)
    result = diag("diag4.6_l1_recovery_reset_gpu3.json", HGX).model_copy(
        update={"finished_at": later}
    )
    state, out = verdicts.evaluate_node(
        state,
        verdicts.Inputs(boot_id="b", snapshots=tuple(snapshot(g) for g in HGX), diag=result),
        POLICY,
        later,
    )
    assert (out[0].verdict, state.gpus[uuid].latched, out[3].action) == (H, (), A.RESET_GPU)


ISOLATE, UNKNOWN, TRIAGE, CONFIG, RESET, MONITOR = 2, 3, 4, 5, 6, 1


def finding(*errors: tuple[int, int | None]) -> readings.DiagResult:
    """A level-3 run in which GPU 0 failed with these (error_id, printed severity) errors."""
    warnings = [
        {"warning": f"error {code}", "error_id": code, "error_category": 10,
         **({} if severity is None else {"error_severity": severity})}
        for code, severity in errors
    ]  # fmt: skip
    body = {
        "DCGM Diagnostic": {
            "test_categories": [
                {"category": "Hardware", "tests": [{
                    "name": "diagnostic",
                    "results": [{"entity_group_id": 1, "entity_group": "GPU", "entity_id": 0,
                                 "status": "Fail", "warnings": warnings}],
                    "test_summary": {"status": "Fail", "warnings": warnings},
                }]},
            ]
        }
    }  # fmt: skip
    return dcgm.parse_diag(
        json.dumps(body), level=3, started_at=T0, finished_at=T0, gpu_indices=(0,)
    )


@pytest.mark.parametrize(
    ("errors", "expected"),
    [
        pytest.param(((52, ISOLATE), (85, RESET)), (F, A.INSPECT),
                     id="ISOLATE beside RESET decides Inspect (GetFailureResult stops at ISOLATE)"),
        pytest.param(((85, RESET), (52, ISOLATE)), (F, A.INSPECT),
                     id="the order the errors are printed in does not matter"),
        pytest.param(((9, TRIAGE), (85, RESET)), (F, A.INSPECT),
                     id="TRIAGE beside RESET asks a person, not a reset level 1 would pass"),
        pytest.param(((85, RESET), (29, CONFIG)), (F, A.RESET_GPU),
                     id="RESET beside CONFIG is a reset"),
        pytest.param(((125, RESET),), (F, A.RESET_GPU),
                     id="a recovery action GPU_RESET alone is a reset"),
        pytest.param(((10, MONITOR), (29, CONFIG)), (D, A.NONE),
                     id="MONITOR and CONFIG only degrade and latch nothing"),
        pytest.param(((111, RESET),), (F, A.INSPECT),
                     id="an ISOLATE-row code (NAN_VALUE) is ISOLATE whatever severity is printed"),
        pytest.param(((58, None), (85, None)), (F, A.INSPECT),
                     id="codes without a printed severity take dcgm_errors.c's (MEMORY_MISMATCH)"),
        pytest.param(((85, None),), (F, A.RESET_GPU),
                     id="a pending row remap without a printed severity is RESET by the table"),
    ],
)  # fmt: skip
def test_dcgm_severities_decide_in_dcgms_order(
    errors: tuple[tuple[int, int | None], ...], expected: tuple[health.Verdict, health.Action]
) -> None:
    """The verdict follows DCGM's precedence of severities, not their numeric maximum."""
    out = verdicts_of((0,), finding(*errors))
    assert expected == out[0][:2]


S = dcgmerrors.Severity


@pytest.mark.parametrize(
    ("code", "name", "severity"),
    [
        pytest.param(52, "FAULTY_MEMORY", S.ISOLATE, id="52 faulty memory is ISOLATE"),
        pytest.param(85, "PENDING_ROW_REMAP", S.RESET, id="85 pending remap is RESET"),
        pytest.param(112, "FABRIC_MANAGER_TRAINING_ERROR", dcgmerrors.Severity.CONFIG,
                     id="112 Fabric Manager training is CONFIG"),
        pytest.param(125, "GPU_RECOVERY_RESET", S.RESET, id="125 recovery reset is RESET"),
        pytest.param(126, "GPU_RECOVERY_REBOOT", dcgmerrors.Severity.ISOLATE,
                     id="126 recovery reboot is ISOLATE"),
        pytest.param(10, "CLOCKS_EVENT_THERMAL", S.MONITOR, id="10 thermal is MONITOR"),
        pytest.param(132, "UNCORRECTABLE_ROW_REMAP_LIMIT", dcgmerrors.Severity.TRIAGE,
                     id="132, the last code of DCGM 4.6, is TRIAGE"),
    ],
)  # fmt: skip
def test_the_error_table_is_dcgms(code: int, name: str, severity: dcgmerrors.Severity) -> None:
    """Rows of the table match dcgm_errors.h / dcgm_errors.c of DCGM 4.6.0, code for code."""
    assert dcgmerrors.ERRORS[code] == (name, severity)


P, FAIL = readings.DiagStatus.PASS, readings.DiagStatus.FAIL


def run_at(seconds: float, gpu0: readings.DiagStatus = P, error: str = "") -> readings.DiagResult:
    """A level-1 run that finished `seconds` after the reset, GPU 0 with `gpu0`, node-wide FM
    training (CONFIG) when GPU 0 passed."""
    at = T0 + dt.timedelta(seconds=seconds)
    fm = readings.DiagFinding(test="software", status=FAIL, severity=5, severities=(5,))
    return readings.DiagResult(
        level=1, started_at=at, finished_at=at, overall=FAIL, error=error,
        gpus=() if error else (readings.GpuDiag(gpu_index=0, status=gpu0),),
        node_findings=(fm,) if gpu0 is P and not error else (),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("last", "runs", "expected_s"),
    [
        pytest.param(None, 0, 0.0, id="no run since the reset: due at the reset"),
        pytest.param(run_at(-5.0), 0, 0.0,
                     id="a run before the reset does not count: due at the reset"),
        pytest.param(run_at(30.0), 1, 90.0,
                     id="the GPU passed, FM training (node-wide) kept it: again a minute on"),
        pytest.param(run_at(30.0, error="dcgmi diag -r 1 -j timed out after 120 s"), 1, 90.0,
                     id="a run that itself failed: again a minute on"),
        pytest.param(run_at(30.0, gpu0=FAIL), 1, None,
                     id="the run failed the GPU itself: it found something, no retry"),
        pytest.param(run_at(30.0), 10, None, id="after ten runs it stops retrying"),
    ],
)  # fmt: skip
def test_the_diagnostic_after_a_reset_is_retried_a_while(
    last: readings.DiagResult | None, runs: int, expected_s: float | None
) -> None:
    """The post-reset level-1 run is retried after a delay while the fault still waits."""
    fault = latching.LatchedFault(
        code="XidUncontainedEcc", verdict=F, action=A.RESET_GPU, since=T0, last_seen=T0,
        boot_id="b", clears_when=latching.ClearingCondition.RESET_THEN_DIAG,
        reset_observed_at=T0,
    )  # fmt: skip
    state = latching.NodeState(
        gpus={"GPU-0": latching.GpuState(uuid="GPU-0", index=0, latched=(fault,))}
    )
    due = latching.diag_after_reset_due(
        state, last, runs_since_reset=runs, retry_after_s=60, max_runs=10
    )
    assert due == (None if expected_s is None else T0 + dt.timedelta(seconds=expected_s))


def test_no_diagnostic_is_due_without_a_reset_waiting() -> None:
    """A node with no reset-latched fault waiting runs nothing by itself."""
    assert (
        latching.diag_after_reset_due(
            latching.NodeState(), None, runs_since_reset=0, retry_after_s=60, max_runs=10
        )
        is None
    )
