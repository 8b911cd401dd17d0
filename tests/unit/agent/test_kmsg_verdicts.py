"""Issue 28: Xid bursts, HW slowdown and kernel-log-only findings decided as NVIDIA's tools do.

Built on real kernel-log captures: gpud's `dmesg-with-xid-119.log` (tests/fixtures/kmsg, source
and commit in its header) and NVSentinel/gpud parser test lines (source beside each constant).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import pathlib
import re

import pytest

from agent import latching, readings, verdicts
from agent.probing import kmsg
from shared import health, xid
from tests.unit.agent import test_verdicts as tv

H, D, F = health.Verdict.HEALTHY, health.Verdict.DEGRADED, health.Verdict.FAILED
A = health.Action
FIXTURES = pathlib.Path(__file__).parents[2] / "fixtures" / "kmsg"
_DMESG = re.compile(r"\[(?P<when>[^\]]+)\] (?P<msg>.*)")


def dmesg_events(
    name: str, pci_to_index: dict[tuple[int, int, int], int]
) -> list[readings.XidEvent]:
    """The Xid lines of a `dmesg -T` capture, as the kmsg reader would hand them on."""
    events: list[readings.XidEvent] = []
    lines = (FIXTURES / name).read_text().splitlines()
    first: dt.datetime | None = None
    for seq, text in enumerate(lines):
        match = _DMESG.fullmatch(text)
        if match is None:
            continue
        when = dt.datetime.strptime(match["when"], "%a %b %d %H:%M:%S %Y").replace(tzinfo=dt.UTC)
        first = first or when
        record = kmsg.Record(
            seq=seq, timestamp_us=int((when - first).total_seconds() * 1e6), message=match["msg"]
        )
        event = kmsg.to_event(record, gpus_by_pci=pci_to_index, boot_time=first)
        if event is not None:
            events.append(event)
    return events


@dataclasses.dataclass
class Pass:
    """One probe pass at `at`, with its Xids and snapshot fields."""

    at: dt.datetime
    xids: tuple[readings.XidEvent, ...] = ()
    fields: dict[str, object] = dataclasses.field(default_factory=dict)
    boot: str = tv.BOOT


def fold(passes: list[Pass]) -> tuple[latching.GpuState, verdicts.GpuVerdict]:
    """Fold the passes into a fresh state; return GPU 0's last state and verdict."""
    state = latching.NodeState()
    out: tuple[verdicts.GpuVerdict, ...] = ()
    for p in passes:
        inputs = verdicts.Inputs(
            boot_id=p.boot, snapshots=(tv.snap(p.at, **p.fields),), xids=p.xids
        )
        state, out = verdicts.evaluate_node(state, inputs, tv.POLICY, p.at)
    return state.gpus[tv.UUID], out[0]


def codes(verdict: verdicts.GpuVerdict) -> set[str]:
    """The reason codes of a verdict."""
    return {r.code for r in verdict.reasons}


def test_gpud_xid_119_burst_is_one_reset_incident() -> None:
    """gpud's real log: five Xid 119 on one GPU in six minutes is one ResetGPU, not a reboot."""
    events = dmesg_events("dmesg-with-xid-119.log", {(0, 0x9B, 0): 0})
    assert [e.xid for e in events] == [119] * 5
    assert xid.lookup(119).xid_class is xid.XidClass.RESET
    gpu, out = fold([Pass(events[0].at)] + [Pass(e.at, (e,)) for e in events])
    assert (out.verdict, out.action) == (F, A.RESET_GPU)
    assert "XidRepeated" not in codes(out)
    assert [f.code for f in gpu.latched] == [xid.lookup(119).reason]


BURST_XIDS = [code for code in (95, 109, 120, 62, 74, 119) if xid.lookup(code).xid_class is
              xid.XidClass.RESET]  # fmt: skip


def _at(t: float) -> dt.datetime:
    return tv.T0 + dt.timedelta(seconds=t)


@pytest.mark.parametrize("code", BURST_XIDS, ids=lambda c: f"a burst of xid {c} is one reset")
def test_a_burst_of_one_reset_xid_asks_for_one_reset(code: int) -> None:
    """One line per channel, process or link within minutes: the catalog's RESET_GPU, once."""
    burst = [Pass(_at(0))] + [
        Pass(_at(t), (tv.xid_event(code, _at(t)),)) for t in (1, 2, 5, 30, 240)
    ]
    gpu, out = fold(burst)
    assert (out.verdict, out.action) == (F, A.RESET_GPU)
    assert len(gpu.latched) == 1


RESET_SEEN = [Pass(_at(100), fields={"ecc_sbe_volatile": 3}), Pass(_at(110))]
"""Volatile ECC going back down: a GPU reset observed through NVML."""


@pytest.mark.parametrize(
    ("between", "action", "repeated"),
    [
        pytest.param([], A.RESET_GPU, False,
                     id="back with no reset in between is the same incident"),
        pytest.param(RESET_SEEN, A.REBOOT_NODE, True,
                     id="back after an observed reset escalates to a reboot"),
        pytest.param([Pass(_at(100), boot="boot-2")], A.REBOOT_NODE, True,
                     id="back after a reboot escalates to a reboot"),
    ],
)  # fmt: skip
def test_escalation_needs_the_rung_below_tried(
    between: list[Pass], action: health.Action, repeated: bool
) -> None:
    """XidRepeated (RebootNode) only when the Xid comes back after a reset was observed."""
    boot = between[-1].boot if between else tv.BOOT
    again = Pass(_at(3600), (tv.xid_event(119, _at(3600)),), boot=boot)
    _, out = fold([Pass(_at(0)), Pass(_at(1), (tv.xid_event(119, _at(1)),)), *between, again])
    assert out.action == action
    assert ("XidRepeated" in codes(out)) is repeated


def _slow(t: float, bits: int) -> Pass:
    return Pass(_at(t), fields={"clock_event_reasons": bits})


THERMAL = verdicts.CLOCK_EVENT_HW_THERMAL_SLOWDOWN
BRAKE = verdicts.CLOCK_EVENT_HW_POWER_BRAKE_SLOWDOWN


@pytest.mark.parametrize(
    ("passes", "verdict", "code"),
    [
        pytest.param([_slow(t, BRAKE) for t in range(0, 62, 5)], H, "HwPowerBrakeSlowdown",
                     id="61 s of power brake is a healthy warning"),
        pytest.param([_slow(t, THERMAL) for t in range(0, 62, 5)], H, "HwThermalSlowdown",
                     id="61 s of thermal slowdown is a healthy warning"),
        pytest.param([_slow(t, BRAKE) for t in range(0, 400, 30)], D, "HwPowerBrakeSlowdown",
                     id="power brake in 7 of 10 minutes is sustained and degrades"),
        pytest.param([_slow(t, THERMAL) for t in range(0, 400, 30)], D, "HwThermalSlowdown",
                     id="thermal slowdown in 7 of 10 minutes is sustained and degrades"),
        pytest.param([*[_slow(t, BRAKE) for t in range(0, 62, 5)], _slow(3600, 0)], H, None,
                     id="61 s of power brake then clear leaves nothing behind an hour later"),
        pytest.param([*[_slow(t, THERMAL) for t in range(0, 400, 30)], _slow(1100, 0)], H, None,
                     id="a sustained slowdown clears by itself once the window passes"),
    ],
)  # fmt: skip
def test_hw_slowdown_warns_and_degrades_only_at_a_sustained_rate(
    passes: list[Pass], verdict: health.Verdict, code: str | None
) -> None:
    """DCGM MONITOR: never latched, never an action, Degraded only at gpud's 0.6/min over 10 min."""
    gpu, out = fold(passes)
    assert out.verdict == verdict
    assert out.action == A.NONE
    assert gpu.latched == ()
    assert all(not r.latched for r in out.reasons)
    if code is None:
        assert codes(out) == set()
    else:
        assert code in codes(out)
