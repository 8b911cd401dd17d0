"""DESIGN.md section 5's rows for Xid 144-150, 154 and 157, through the verdict core."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from agent import latching, readings, verdicts
from agent.probing import kmsg
from shared import health
from tests.unit.agent import test_verdicts as tv

H, D, F = health.Verdict.HEALTHY, health.Verdict.DEGRADED, health.Verdict.FAILED
A = health.Action
WINDOW = 300.0
POLICY = dataclasses.replace(tv.POLICY, nvlink5_decode_window_s=WINDOW)
R570 = "570.148.08"
LINK_DOWN_RESET = "149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 09 (0x025525c6 0x00000000 0x00000000)"
BER_IGNORE = "149, NETIR_BER_EVENT Nonfatal XC0 i0 Link 00 (0x00000226 0x00000001)"
REMAP_154_EVAL = "145, RLW_REMAP Nonfatal XC0 i0 Link 00 (0x00000082 0x00000001 0x00000000)"
UNLISTED = "(0x00000082 0x00004000)"
TREX = "147, TREX Nonfatal XC0 i0 Link 00 (0x00000184 0x80000000)"
V2_REMAP = "145, RLW_REMAP Nonfatal XC0 i0 Link 00 (0x00000004 0x00000040)"


def at(t: float) -> dt.datetime:
    """Seconds after T0."""
    return tv.T0 + dt.timedelta(seconds=t)


def nvml(code: int, t: float) -> readings.XidEvent:
    """An Xid from NVML's event set: the number alone."""
    return readings.XidEvent(xid=code, at=at(t), source=readings.XidSource.NVML, gpu_index=0)


def line(text: str, t: float) -> readings.XidEvent:
    """A kernel-log Xid line `NVRM: Xid (PCI:0000:07:00): <text>`, read as the reader does."""
    message = f"NVRM: Xid (PCI:0000:07:00): {text}"
    record = kmsg.Record(seq=int(t * 1000), timestamp_us=int(t * 1e6), message=message)
    event = kmsg.to_event(record, gpus_by_pci={(0, 7, 0): 0}, boot_time=tv.T0)
    assert event is not None
    return event


@dataclasses.dataclass
class Pass:
    """One probe pass: seconds after T0, counted Xids, late kernel-log twins, snapshot fields."""

    t: float
    xids: tuple[readings.XidEvent, ...] = ()
    twins: tuple[readings.XidEvent, ...] = ()
    fields: dict[str, object] = dataclasses.field(default_factory=dict)


def run(passes: list[Pass], driver: str = R570) -> tuple[latching.GpuState, verdicts.GpuVerdict]:
    """Fold the passes; return GPU 0's last state and verdict."""
    state = latching.NodeState()
    out: tuple[verdicts.GpuVerdict, ...] = ()
    for p in passes:
        inputs = verdicts.Inputs(
            boot_id=tv.BOOT,
            snapshots=(tv.snap(at(p.t), **p.fields),),
            xids=p.xids,
            twins=p.twins,
            driver_version=driver,
        )
        state, out = verdicts.evaluate_node(state, inputs, POLICY, at(p.t))
    return state.gpus[tv.UUID], out[0]


def codes(verdict: verdicts.GpuVerdict) -> set[str]:
    """The reason codes of a verdict."""
    return {r.code for r in verdict.reasons}


@pytest.mark.parametrize(
    ("passes", "verdict", "action", "code"),
    [
        pytest.param([Pass(0), Pass(1, (nvml(145, 1),))], D, A.INSPECT, "XidNvLink5Undecoded",
                     id="an NVML 145 without its line is Degraded and Inspect-pending"),
        pytest.param([Pass(0), Pass(1, (nvml(145, 1),)), Pass(1 + WINDOW + 1)], H, A.NONE, None,
                     id="an undecoded 145 returns to Healthy once the window passes"),
        pytest.param([Pass(0), Pass(1, (nvml(149, 1),)), Pass(2, twins=(line(BER_IGNORE, 1.5),))],
                     H, A.NONE, None,
                     id="the late kernel-log twin decodes it: a BER event is ignored"),
        pytest.param([Pass(0), Pass(1, (nvml(149, 1),)),
                      Pass(2, twins=(line(LINK_DOWN_RESET, 1.5),))],
                     F, A.RESET_GPU, "XidNvLinkNetirError",
                     id="the late twin decodes a link-down that resets the GPU"),
        pytest.param([Pass(0), Pass(1, (line(LINK_DOWN_RESET, 1),))], F, A.RESET_GPU,
                     "XidNvLinkNetirError", id="a decoded RESET_GPU line resets the GPU"),
        pytest.param([Pass(0), Pass(1, (line(BER_IGNORE, 1),))], H, A.NONE, None,
                     id="a decoded IGNORE line is counted only"),
        pytest.param([Pass(0), Pass(1, (line(REMAP_154_EVAL, 1),))], H, A.RESTART_APP,
                     "XidNvLinkRlwError",
                     id="a decoded XID_154_EVAL line says restart the app, the 154 decides"),
        pytest.param([Pass(0), Pass(1, (line(f"145, RLW_REMAP Nonfatal {UNLISTED}", 1),))],
                     H, A.NONE, "XidNvLink5Unmatched",
                     id="a line no row of the decode matches names no action, as NVSentinel"),
        pytest.param([Pass(0), Pass(1, (line(TREX, 1),))],
                     H, A.NONE, None, id="147 is ignored"),
    ],
)  # fmt: skip
def test_nvlink5_xids_are_decided_per_subcode(
    passes: list[Pass], verdict: health.Verdict, action: health.Action, code: str | None
) -> None:
    """Xid 144-150 follow NVIDIA's decode; without one they wait, Degraded, never escalated."""
    state, out = run(passes)
    assert (verdict, action) == (out.verdict, out.action)
    if code is not None:
        assert code in codes(out)
    assert sum(state.xid_counts.values()) == 1


def test_an_undecoded_nvlink5_xid_never_escalates_to_a_reboot() -> None:
    """The same undecoded Xid 145 twice inside the escalation window stays Degraded, unlatched."""
    state, out = run([Pass(0), Pass(1, (nvml(145, 1),)), Pass(100, (nvml(145, 100),))])
    assert (out.verdict, out.action) == (D, A.INSPECT)
    assert state.latched == ()
    assert state.xid_counts == {145: 2}
    assert all(not r.latched for r in out.reasons)


def test_a_decoded_reset_repeat_escalates_like_any_reset_class_xid() -> None:
    """A RESET_GPU decode back after an observed reset, inside the window, asks for a reboot."""
    _, out = run(
        [
            Pass(0),
            Pass(1, (line(LINK_DOWN_RESET, 1),)),
            Pass(2, fields={"ecc_sbe_volatile": 3}),
            Pass(10),
            Pass(3600, (line(LINK_DOWN_RESET, 3600),)),
        ]
    )
    assert (out.verdict, out.action) == (F, A.REBOOT_NODE)
    assert "XidRepeated" in codes(out)


def test_a_v2_line_from_an_r575_driver_is_read_with_the_v2_patterns() -> None:
    """From R575 on the unit sits in IntrInfo[6:0]: 0x04 is RLW_REMAP, not V1's RLW_CTRL row."""
    state, out = run(
        [Pass(0), Pass(1, (line(V2_REMAP, 1),))],
        driver="580.65.06",
    )  # fmt: skip
    assert (out.verdict, out.action) == (F, A.RESET_GPU)
    assert "RLW_REMAP" in " ".join(r.message for r in out.reasons)
    _, earlier = run(
        [Pass(0), Pass(1, (line(V2_REMAP, 1),))],
        driver=R570,
    )  # fmt: skip
    assert "XidNvLink5Unmatched" in codes(earlier)
    assert state.nvlink5_pending == ()


def test_157_is_counted_and_keeps_the_gpu_healthy() -> None:
    """Xid 157 RESOURCE_RETIREMENT_FAILURE: NVIDIA says workloads may still run."""
    state, out = run([Pass(0), Pass(1, (nvml(157, 1),))])
    assert (out.verdict, out.action, out.reasons) == (H, A.NONE, ())
    assert state.xid_counts == {157: 1}


@pytest.mark.parametrize(
    ("value", "verdict", "action", "code"),
    [
        pytest.param(0, H, A.NONE, None, id="0 NONE needs nothing"),
        pytest.param(1, F, A.RESET_GPU, "RecoveryActionGpuReset", id="1 GPU_RESET"),
        pytest.param(2, F, A.REBOOT_NODE, "RecoveryActionNodeReboot", id="2 NODE_REBOOT"),
        pytest.param(3, D, A.RESET_GPU, "RecoveryActionDrainP2p", id="3 DRAIN_P2P"),
        pytest.param(4, D, A.RESET_GPU, "RecoveryActionDrainAndReset", id="4 DRAIN_AND_RESET"),
        pytest.param(5, D, A.NONE, "RecoveryActionRecoverImexDomain",
                     id="5 RECOVER_IMEX_DOMAIN keeps work off without latching"),
        pytest.param(6, F, A.RESET_GPU, "RecoveryActionBusReset", id="6 BUS_RESET"),
        pytest.param(7, F, A.REBOOT_NODE, "RecoveryActionSystemReboot", id="7 SYSTEM_REBOOT"),
        pytest.param(9, D, A.NONE, "RecoveryActionUnknown",
                     id="a value NVML adds later is named and only degrades"),
    ],
)  # fmt: skip
def test_xid_154_follows_the_recovery_action_nvml_reports(
    value: int, verdict: health.Verdict, action: health.Action, code: str | None
) -> None:
    """Every one of NVML's eight recovery actions (field 230) maps onto a verdict and action."""
    _, out = run([Pass(0), Pass(1, (nvml(154, 1),), fields={"recovery_action": value})])
    assert (verdict, action) == (out.verdict, out.action)
    assert ({code} if code else set()) == codes(out)


def test_xid_154s_line_stands_in_when_nvml_cannot_read_the_field() -> None:
    """Where field 230 is not readable, the kernel-log line's "to 0x1" is the recovery action."""
    text = "154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"
    _, out = run(
        [
            Pass(0, fields={"recovery_action": None}),
            Pass(1, (nvml(154, 1),), twins=(line(text, 1.2),), fields={"recovery_action": None}),
        ]
    )
    assert (out.verdict, out.action) == (F, A.RESET_GPU)
    assert "the Xid 154 kernel-log line says GPU_RESET" in out.reasons[0].message


def test_a_reboot_forgets_pending_nvlink5_xids() -> None:
    """A new boot id clears what was waiting for a decode."""
    state = latching.NodeState()
    state, _ = verdicts.evaluate_node(
        state,
        verdicts.Inputs(boot_id=tv.BOOT, snapshots=(tv.snap(at(1)),), xids=(nvml(145, 1),)),
        POLICY,
        at(1),
    )
    state, out = verdicts.evaluate_node(
        state, verdicts.Inputs(boot_id="boot-2", snapshots=(tv.snap(at(2)),)), POLICY, at(2)
    )
    assert (out[0].verdict, state.gpus[tv.UUID].nvlink5_pending) == (H, ())
