"""The fault table of DESIGN.md section 5, row by row, plus latching, clearing and escalation."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import pytest

from agent import latching, readings, verdicts
from shared import health

T0 = dt.datetime(2026, 5, 1, 12, 0, tzinfo=dt.UTC)
UUID = "GPU-00000000-0000-0000-0000-000000000000"
BOOT = "boot-1"
POLICY = verdicts.Policy(escalation_window_s=24 * 3600, debounce_s=60, dcgm_present=False)


def snap(at: dt.datetime = T0, **fields: Any) -> readings.GpuSnapshot:
    """Build a healthy GPU snapshot with `fields` overridden."""
    base: dict[str, Any] = {
        "index": 0,
        "uuid": UUID,
        "pci_bus_id": "00000000:07:00.0",
        "taken_at": at,
        "ecc_dbe_volatile": 0,
        "ecc_sbe_volatile": 0,
        "remap_pending": False,
        "remap_failure": False,
        "clock_event_reasons": 0,
        "nvlink_up": dict.fromkeys(range(4), True),
        "recovery_action": 0,
    }
    base.update(fields)
    return readings.GpuSnapshot(**base)


def xid_event(code: int, at: dt.datetime = T0) -> readings.XidEvent:
    """An Xid on GPU 0 from the NVML event set."""
    return readings.XidEvent(xid=code, at=at, source=readings.XidSource.NVML, gpu_index=0)


@dataclasses.dataclass
class Step:
    """One probe pass: seconds after T0, the snapshot fields, Xids, boot id, diag result."""

    t: float
    fields: dict[str, Any] = dataclasses.field(default_factory=dict)
    xids: tuple[int, ...] = ()
    boot: str = BOOT
    diag: readings.DiagStatus | None = None
    gone: bool = False


def run(
    steps: list[Step], policy: verdicts.Policy = POLICY, state: latching.NodeState | None = None
) -> tuple[latching.NodeState, verdicts.GpuVerdict]:
    """Fold the steps into a fresh state; return the last state and GPU 0's last verdict."""
    state = state or latching.NodeState()
    verdict: verdicts.GpuVerdict | None = None
    for step in steps:
        at = T0 + dt.timedelta(seconds=step.t)
        diag = None
        if step.diag is not None:
            diag = readings.DiagResult(
                level=1,
                started_at=at,
                finished_at=at,
                overall=step.diag,
                gpus=(readings.GpuDiag(gpu_index=0, status=step.diag),),
            )
        inputs = verdicts.Inputs(
            boot_id=step.boot,
            snapshots=() if step.gone else (snap(at, **step.fields),),
            xids=tuple(xid_event(x, at) for x in step.xids),
            diag=diag,
        )
        state, out = verdicts.evaluate_node(state, inputs, policy, at)
        verdict = out[0]
    assert verdict is not None
    return state, verdict


H, D, F = health.Verdict.HEALTHY, health.Verdict.DEGRADED, health.Verdict.FAILED
A = health.Action

FAULT_TABLE = [
    pytest.param([Step(0), Step(1, xids=(79,))], F, A.REBOOT_NODE, "XidFallenOffBus", True,
                 id="xid 79 fails the GPU and asks for a reboot"),
    pytest.param([Step(0), Step(1, {"nvml_error": readings.NvmlErrorKind.GPU_IS_LOST})],
                 F, A.REBOOT_NODE, "GpuLost", True,
                 id="NVML GPU_IS_LOST fails the GPU and asks for a reboot"),
    pytest.param([Step(0), Step(1, gone=True)], F, A.REBOOT_NODE, "GpuLost", True,
                 id="a GPU that stops enumerating is treated as lost"),
    pytest.param([Step(0), Step(1, {"remap_pending": True}, xids=(48,))],
                 D, A.RESET_GPU, "XidDoubleBitEccRemapPending", True,
                 id="xid 48 with a remap pending degrades the GPU and asks for a reset"),
    pytest.param([Step(0), Step(1, {"remap_failure": True}, xids=(48,))],
                 F, A.INSPECT, "XidDoubleBitEccRemapFailure", True,
                 id="xid 48 with a remap failure fails the GPU for inspection"),
    pytest.param([Step(0), Step(1, {"remap_failure": True}, xids=(64,))],
                 F, A.INSPECT, "XidRowRemapFailure", True,
                 id="xid 64 with a remap failure fails the GPU for inspection"),
    pytest.param([Step(0), Step(1, {"remap_failure": True})], F, A.INSPECT, "RowRemapFailure",
                 True, id="a remap failure alone fails the GPU for inspection"),
    pytest.param([Step(0, {"ecc_dbe_volatile": 2}), Step(1, {"ecc_dbe_volatile": 3})],
                 D, A.RESET_GPU, "EccUncorrectedRising", True,
                 id="rising uncorrected ECC degrades the GPU and asks for a reset"),
    *[
        pytest.param([Step(0), Step(1, xids=(code,))], F, A.RESET_GPU, None, True,
                     id=f"xid {code} fails the GPU and asks for a reset")
        for code in (95, 62, 109, 119, 120, 140, 143)
    ],
    pytest.param([Step(0), Step(1, xids=(95,)), Step(2, {"ecc_sbe_volatile": 3}), Step(10),
                  Step(3600, xids=(95,))],
                 F, A.REBOOT_NODE, "XidRepeated", True,
                 id="the same reset-class xid back after an observed reset escalates to a reboot"),
    pytest.param([Step(0), Step(1, xids=(13,))], H, A.RESTART_APP, "XidGraphicsEngineException",
                 False, id="xid 13 alone keeps the GPU healthy and says restart the app"),
    pytest.param([Step(0, {"clock_event_reasons": 0x40}), Step(61, {"clock_event_reasons": 0x40})],
                 H, A.NONE, "HwThermalSlowdown", False,
                 id="a minute of thermal slowdown is a warning, not a fault (DCGM MONITOR)"),
    pytest.param([Step(0), Step(1, {"nvlink_up": {0: True, 1: False, 2: True, 3: True}})],
                 D, A.RESET_GPU, "NvLinkDown", True,
                 id="an nvlink that was up going down degrades the GPU and asks for a reset"),
    pytest.param([Step(0), Step(1, {"nvml_error": readings.NvmlErrorKind.RESET_REQUIRED})],
                 F, A.RESET_GPU, "GpuResetRequired", True,
                 id="NVML RESET_REQUIRED fails the GPU and asks for a reset"),
    pytest.param([Step(0), Step(1, {"nvml_error": readings.NvmlErrorKind.UNKNOWN})],
                 F, A.RESET_GPU, "NvmlError", True, id="an unknown NVML error fails the GPU"),
    pytest.param([Step(0), Step(1, {"recovery_action": 2})], F, A.REBOOT_NODE,
                 "RecoveryActionNodeReboot", True,
                 id="NVIDIA's recovery-action flag asking for a reboot is followed"),
]  # fmt: skip


@pytest.mark.parametrize(("steps", "verdict", "action", "code", "latched"), FAULT_TABLE)
def test_fault_table_row(
    steps: list[Step],
    verdict: health.Verdict,
    action: health.Action,
    code: str | None,
    latched: bool,
) -> None:
    """Each row of the fault table yields its verdict, action, reason and latching."""
    _, out = run(steps)
    assert (verdict, action) == (out.verdict, out.action)
    top = [r for r in out.reasons if r.action == action]
    assert top, out.reasons
    if code is not None:
        assert code == top[0].code
    assert latched == top[0].latched
    if latched:
        assert top[0].clears_when


@pytest.mark.parametrize(
    "code", [13, 31, 32, 43, 45, 68, 69, 94], ids=lambda c: f"application xid {c} alone"
)
def test_application_xids_never_change_the_verdict(code: int) -> None:
    """Application Xids are counted, say RestartApp on the event, and leave the GPU Healthy."""
    state, out = run([Step(0), Step(1, xids=(code,))])
    assert out.verdict == health.Verdict.HEALTHY
    assert {code: 1} == state.gpus[UUID].xid_counts
    _, later = run([Step(1000)], state=state)
    assert (later.verdict, later.action) == (health.Verdict.HEALTHY, health.Action.NONE)


@pytest.mark.parametrize(
    ("steps", "verdict"),
    [
        pytest.param(
            [Step(0, {"clock_event_reasons": 0x40}), Step(59, {"clock_event_reasons": 0x40})],
            health.Verdict.HEALTHY,
            id="thermal slowdown inside the debounce window does not count yet",
        ),
        pytest.param(
            [
                Step(0, {"clock_event_reasons": 0x40}),
                Step(30, {"clock_event_reasons": 0}),
                Step(61, {"clock_event_reasons": 0x40}),
            ],
            health.Verdict.HEALTHY,
            id="an interrupted slowdown restarts the debounce window",
        ),
        pytest.param(
            [Step(0, {"clock_event_reasons": 0x4}), Step(120, {"clock_event_reasons": 0x4})],
            health.Verdict.HEALTHY,
            id="a software power cap is not a hardware slowdown",
        ),
    ],
)
def test_debounce(steps: list[Step], verdict: health.Verdict) -> None:
    """Clock-event findings count only after persisting for the whole debounce window."""
    _, out = run(steps)
    assert verdict == out.verdict


@pytest.mark.parametrize(
    ("steps", "verdict"),
    [
        pytest.param([Step(0), Step(1, xids=(95,)), Step(24 * 3600 + 2, xids=(95,))],
                     health.Action.RESET_GPU, id="a repeat after the window only asks for a reset"),
        pytest.param([Step(0), Step(1, xids=(95,)), Step(2, xids=(62,))],
                     health.Action.RESET_GPU, id="two different reset-class xids do not escalate"),
        pytest.param([Step(0), Step(1, xids=(13,)), Step(2, xids=(13,))],
                     health.Action.RESTART_APP, id="application xids never escalate"),
    ],
)  # fmt: skip
def test_escalation_needs_the_same_reset_xid_inside_the_window(
    steps: list[Step], verdict: health.Action
) -> None:
    """Only the same reset-class Xid twice inside the escalation window asks for a reboot."""
    _, out = run(steps)
    assert verdict == out.action


LOST = {"nvml_error": readings.NvmlErrorKind.GPU_IS_LOST}
RESET_REQ = {"nvml_error": readings.NvmlErrorKind.RESET_REQUIRED}
PASS, FAIL = readings.DiagStatus.PASS, readings.DiagStatus.FAIL


@pytest.mark.parametrize(
    ("steps", "dcgm", "still_latched"),
    [
        pytest.param([Step(0, xids=(79,)), Step(10), Step(20)], False, True,
                     id="a reboot fault stays while the boot id is the same"),
        pytest.param([Step(0, xids=(79,)), Step(10, boot="boot-2")], False, False,
                     id="a reboot fault clears on a new boot id"),
        pytest.param([Step(0, xids=(95,)), Step(10), Step(20)], False, True,
                     id="a reset fault stays while no reset is seen"),
        pytest.param([Step(0, RESET_REQ), Step(10)], False, False,
                     id="a reset fault clears on an observed reset without DCGM"),
        pytest.param([Step(0, RESET_REQ), Step(10)], True, True,
                     id="with DCGM an observed reset alone is not enough"),
        pytest.param([Step(0, RESET_REQ), Step(10), Step(20, diag=PASS)], True, False,
                     id="with DCGM a reset then a passing level-1 diag clears the fault"),
        pytest.param([Step(0, RESET_REQ), Step(10), Step(20, diag=FAIL)], True, True,
                     id="with DCGM a failing diag after the reset keeps the fault"),
        pytest.param([Step(0, RESET_REQ), Step(5, RESET_REQ, diag=PASS), Step(10)], True, True,
                     id="with DCGM a diag that passed before the reset does not count"),
        pytest.param([Step(0, xids=(95,)), Step(10, boot="boot-2")], False, False,
                     id="a reset fault clears on a new boot id without DCGM"),
        pytest.param([Step(0, {"ecc_sbe_volatile": 5}, xids=(95,)),
                      Step(10, {"ecc_sbe_volatile": 0})], False, False,
                     id="volatile ECC counters going back to zero show a reset"),
        pytest.param([Step(0, {"remap_pending": True}), Step(10, {"remap_pending": True})],
                     False, True, id="a pending remap stays until it is applied"),
        pytest.param([Step(0, {"remap_pending": True}), Step(10, {"remap_pending": False})],
                     False, False, id="an applied remap shows the reset and clears the fault"),
        pytest.param([Step(0, {"remap_failure": True}), Step(10, boot="boot-2")], False, True,
                     id="an inspect fault survives a reboot"),
        pytest.param([Step(0, {"clock_event_reasons": 0x40}),
                      Step(61, {"clock_event_reasons": 0x40}),
                      Step(200, {"clock_event_reasons": 0})], False, False,
                     id="a thermal slowdown never latches, nothing stays after it ends"),
        pytest.param([Step(0, LOST), Step(10, LOST, boot="boot-2")], False, True,
                     id="a GPU still lost after a reboot latches again"),
    ],
)  # fmt: skip
def test_latching_and_clearing(steps: list[Step], dcgm: bool, still_latched: bool) -> None:
    """A latched fault clears only on its clearing condition."""
    policy = dataclasses.replace(POLICY, dcgm_present=dcgm)
    state, out = run(steps, policy)
    assert still_latched == bool(state.gpus[UUID].latched)
    assert still_latched == (out.verdict != health.Verdict.HEALTHY)


def test_each_latched_fault_says_what_clears_it() -> None:
    """Reboot, reset and inspect faults each name their own clearing condition."""
    state, out = run(
        [Step(0), Step(1, {"remap_failure": True}, xids=(79, 95))],
        dataclasses.replace(POLICY, dcgm_present=True),
    )
    clears = {r.code: r.clears_when for r in out.reasons}
    assert clears["XidFallenOffBus"] == "a new bootId (reboot the node)"
    assert "passing level-1 DCGM diagnostic" in clears["XidUncontainedEcc"]
    assert "manual release" in clears["RowRemapFailure"]
    assert {f.code: f.clears_when for f in state.gpus[UUID].latched} == {
        "XidFallenOffBus": latching.ClearingCondition.NEW_BOOT_ID,
        "XidUncontainedEcc": latching.ClearingCondition.RESET_THEN_DIAG,
        "RowRemapFailure": latching.ClearingCondition.MANUAL_RELEASE,
    }


@pytest.mark.parametrize(
    ("force", "code", "remaining"),
    [
        pytest.param(False, None, {"XidFallenOffBus"}, id="a release frees only inspect faults"),
        pytest.param(True, None, set(), id="a forced release frees every fault"),
        pytest.param(True, "XidFallenOffBus", {"RowRemapFailure"},
                     id="a release by code frees only that fault"),
    ],
)  # fmt: skip
def test_manual_release(force: bool, code: str | None, remaining: set[str]) -> None:
    """Manual release clears inspect faults, and with force any named fault."""
    state, _ = run([Step(0, {"remap_failure": True}, xids=(79,))])
    gpu, _released = latching.release(state.gpus[UUID], code=code, force=force)
    assert remaining == {f.code for f in gpu.latched}


def test_a_released_fault_whose_condition_holds_latches_again() -> None:
    """Releasing a remap failure that NVML still reports brings it straight back."""
    state, _ = run([Step(0, {"remap_failure": True})])
    gpu, _ = latching.release(state.gpus[UUID], code=None, force=False)
    state = state.model_copy(update={"gpus": {UUID: gpu}})
    _, out = run([Step(10, {"remap_failure": True})], state=state)
    assert out.action == health.Action.INSPECT


def test_not_supported_readings_are_absent_not_faults() -> None:
    """A GPU that supports none of the counters is Healthy."""
    bare = dict.fromkeys(
        (
            "ecc_dbe_volatile",
            "ecc_sbe_volatile",
            "remap_pending",
            "remap_failure",
            "clock_event_reasons",
            "nvlink_up",
            "recovery_action",
        )
    )
    _, out = run([Step(0, bare), Step(10, bare)])
    assert (
        out.verdict,
        out.action,
        out.reasons,
    ) == (health.Verdict.HEALTHY, health.Action.NONE, ())


def test_a_missing_counter_reading_keeps_the_ecc_baseline() -> None:
    """A pass that could not read ECC does not reset the baseline the next rise is judged by."""
    _, out = run(
        [
            Step(0, {"ecc_dbe_volatile": 2}),
            Step(10, {"ecc_dbe_volatile": None}),
            Step(20, {"ecc_dbe_volatile": 3}),
        ]
    )
    assert "EccUncorrectedRising" in {r.code for r in out.reasons}


def test_nvml_unavailable_makes_known_gpus_unknown() -> None:
    """When NVML cannot start, GPUs we knew are Unknown, and their latches stay visible."""
    state, _ = run([Step(0, xids=(95,))])
    state, out = verdicts.evaluate_node(
        state, verdicts.Inputs(boot_id=BOOT, snapshots=(), nvml_available=False), POLICY, T0
    )
    codes = {r.code for r in out[0].reasons}
    assert {"XidUncontainedEcc", "NvmlUnavailable"} == codes
    assert out[0].verdict == health.Verdict.FAILED


def test_kmsg_cursor_advances_and_resets_on_a_new_boot() -> None:
    """The kernel-log cursor moves to the newest folded record and starts over after a reboot."""
    event = readings.XidEvent(
        xid=13, at=T0, source=readings.XidSource.KMSG, gpu_index=0, kmsg_seq=42
    )
    state, _ = verdicts.evaluate_node(
        latching.NodeState(),
        verdicts.Inputs(boot_id=BOOT, snapshots=(snap(),), xids=(event,)),
        POLICY,
        T0,
    )
    assert state.kmsg_seq == 42
    state, _ = verdicts.evaluate_node(
        state, verdicts.Inputs(boot_id="boot-2", snapshots=(snap(),)), POLICY, T0
    )
    assert state.kmsg_seq is None


@pytest.mark.parametrize(
    ("severity", "action"),
    [
        pytest.param(6, health.Action.RESET_GPU,
                     id="a diag failure of reset severity asks for a reset"),
        pytest.param(2, health.Action.INSPECT,
                     id="a diag failure of isolate severity asks for inspection"),
        pytest.param(1, health.Action.NONE, id="a diag failure of monitor severity only degrades"),
    ],
)  # fmt: skip
def test_diag_failures_fold_into_the_verdict(severity: int, action: health.Action) -> None:
    """A failing DCGM diagnostic maps its error severity onto an action."""
    result = readings.DiagResult(
        level=1,
        started_at=T0,
        finished_at=T0,
        overall=readings.DiagStatus.FAIL,
        gpus=(
            readings.GpuDiag(
                gpu_index=0,
                status=readings.DiagStatus.FAIL,
                findings=(
                    readings.DiagFinding(
                        test="memory", status=readings.DiagStatus.FAIL, severity=severity
                    ),
                ),
            ),
        ),
    )
    _, out = verdicts.evaluate_node(
        latching.NodeState(),
        verdicts.Inputs(boot_id=BOOT, snapshots=(snap(),), diag=result),
        POLICY,
        T0,
    )
    assert action == out[0].action
    assert out[0].verdict != health.Verdict.HEALTHY
