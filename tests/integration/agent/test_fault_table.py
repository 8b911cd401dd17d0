"""Each fault-table row through real pynvml on the fake NVML library, in process.

The fake is loaded once for this module (pynvml keeps one global library handle); each test
resets it, starts a fresh `Monitor` on a fresh state file, steps probe passes until the verdict
shows, checks action, latching and metrics, then applies the clearing condition.
"""

from __future__ import annotations

import asyncio
import dataclasses
import pathlib
import time
from collections.abc import AsyncIterator, Callable, Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent import metrics, monitoring, settings, snapshots
from devcluster import fakenvml
from shared import health

DEADLINE_S = 30.0
GPU = 3


@pytest.fixture(scope="module")
def fake() -> Iterator[fakenvml.InProcessControl]:
    """Build and load the fake library once for the module."""
    control = fakenvml.InProcessControl(fakenvml.build())
    yield control
    control.reset_all()


@dataclasses.dataclass
class Rig:
    """A monitor on the fake, and the files it uses."""

    control: fakenvml.InProcessControl
    config: settings.Settings
    boot: pathlib.Path
    kmsg: pathlib.Path
    monitor: monitoring.Monitor

    async def restart(self, boot_id: str | None = None) -> None:
        """Stop the monitor and start a new one (a new boot id simulates a reboot)."""
        await self.monitor.stop()
        if boot_id is not None:
            self.boot.write_text(boot_id + "\n")
        self.monitor = monitoring.Monitor(self.config)
        await self.monitor.start(loops=False)

    async def until(self, check: Callable[[snapshots.View], bool]) -> snapshots.View:
        """Step probe passes until `check(view)` holds, against a generous deadline."""
        deadline = time.monotonic() + DEADLINE_S
        while True:
            view = await self.monitor.probe_once()
            if check(view):
                return view
            if time.monotonic() > deadline:
                pytest.fail(f"condition not met before the deadline; last view: {view.verdicts}")
            await asyncio.sleep(0.05)

    async def registered(self) -> None:
        """Wait until the event thread has registered every GPU."""
        await self.until(lambda v: v.events_registered == 8)


@pytest.fixture
async def rig(fake: fakenvml.InProcessControl, tmp_path: pathlib.Path) -> AsyncIterator[Rig]:
    """A fresh fake state and monitor per test."""
    fake.reset_all()
    boot = tmp_path / "boot_id"
    boot.write_text("boot-1\n")
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    config = settings.Settings(
        node_name="gpu-node-1",
        boot_id_path=boot,
        state_path=tmp_path / "state.json",
        kmsg_path=kmsg,
        dcgm_enabled=False,
        debounce_s=0.3,
        counter_interval_s=0.01,
        event_wait_ms=50,
        auth_enabled=False,
    )
    mon = monitoring.Monitor(config)
    await mon.start(loops=False)
    r = Rig(fake, config, boot, kmsg, mon)
    try:
        yield r
    finally:
        await r.monitor.stop()


def fixed(view: snapshots.View) -> bool:
    """The GPU's last readings show no remap failure and no thermal slowdown."""
    snap = next(s for s in view.snapshots if s.index == GPU)
    return snap.remap_failure is False and not (snap.clock_event_reasons or 0) & 0x40


def gpu_verdict(view: snapshots.View, index: int = GPU) -> tuple[health.Verdict, health.Action]:
    """The (verdict, action) of one GPU."""
    v = next(v for v in view.verdicts if v.index == index)
    return v.verdict, v.action


def metric_value(view: snapshots.View, name: str, **labels: str) -> float | None:
    """Parse `/metrics` and return one sample's value."""
    text = metrics.render(view)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return None


def inject_lost(c: fakenvml.InProcessControl) -> None:
    c.lost(GPU)


def inject_remap_pending_48(c: fakenvml.InProcessControl) -> None:
    c.remap(GPU, "pending")
    c.xid(GPU, 48)


def inject_remap_failure_64(c: fakenvml.InProcessControl) -> None:
    c.remap(GPU, "failure")
    c.xid(GPU, 64)


def inject_ecc(c: fakenvml.InProcessControl) -> None:
    c.ecc_uncorrected(GPU, 2)


def inject_xid95(c: fakenvml.InProcessControl) -> None:
    c.ecc_corrected(GPU, 1)  # so that the reset shows: volatile counters go back to zero
    c.xid(GPU, 95)


def inject_reset_required(c: fakenvml.InProcessControl) -> None:
    c.reset_required(GPU)


def inject_nvlink(c: fakenvml.InProcessControl) -> None:
    c.nvlink_down(GPU, 5)


def inject_thermal(c: fakenvml.InProcessControl) -> None:
    c.thermal(GPU, on=True)


def clear_reboot(c: fakenvml.InProcessControl) -> None:
    c.clear(GPU)


def clear_reset(c: fakenvml.InProcessControl) -> None:
    c.reset(GPU)


def clear_thermal(c: fakenvml.InProcessControl) -> None:
    c.thermal(GPU, on=False)


def clear_remap_failure(c: fakenvml.InProcessControl) -> None:
    c.remap(GPU, "clear")


D, F = health.Verdict.DEGRADED, health.Verdict.FAILED
A = health.Action

ROWS = [
    pytest.param(inject_lost, F, A.REBOOT_NODE, clear_reboot, "reboot",
                 id="a GPU falling off the bus fails until a new boot id"),
    pytest.param(inject_remap_pending_48, D, A.RESET_GPU, clear_reset, "reset",
                 id="xid 48 with a pending remap degrades until a reset"),
    pytest.param(inject_remap_failure_64, F, A.INSPECT, clear_remap_failure, "release",
                 id="xid 64 with a remap failure fails until a manual release"),
    pytest.param(inject_ecc, D, A.RESET_GPU, clear_reset, "reset",
                 id="rising uncorrected ECC degrades until a reset"),
    pytest.param(inject_xid95, F, A.RESET_GPU, clear_reset, "reset",
                 id="xid 95 fails until a reset"),
    pytest.param(inject_reset_required, F, A.RESET_GPU, clear_reset, "reset",
                 id="RESET_REQUIRED fails until a reset"),
    pytest.param(inject_nvlink, D, A.RESET_GPU, clear_reset, "reset",
                 id="an NVLink going down degrades until a reset"),
]  # fmt: skip


@pytest.mark.parametrize(("inject", "verdict", "action", "fix", "clearing"), ROWS)
async def test_fault_row_latches_and_clears_only_on_its_condition(  # noqa: PLR0917 - parametrized
    rig: Rig,
    inject: Callable[[fakenvml.InProcessControl], None],
    verdict: health.Verdict,
    action: health.Action,
    fix: Callable[[fakenvml.InProcessControl], None],
    clearing: str,
) -> None:
    """The fault yields its verdict and action, survives the fix alone, and clears on its rule."""
    await rig.registered()
    await rig.until(lambda v: gpu_verdict(v) == (health.Verdict.HEALTHY, health.Action.NONE))
    inject(rig.control)
    view = await rig.until(lambda v: gpu_verdict(v) == (verdict, action))
    assert metric_value(view, "taugrid_gpu_verdict", gpu=str(GPU), verdict=str(verdict)) == 1
    assert metric_value(view, "taugrid_gpu_latched_faults", gpu=str(GPU)) >= 1  # type: ignore[operator]
    uuid = next(v.uuid for v in view.verdicts if v.index == GPU)
    assert all(f.clears_when for f in view.state.gpus[uuid].latched)
    # Latched: a restart of the agent on the same boot keeps it.
    await rig.restart()
    view = await rig.until(lambda v: bool(v.verdicts))
    assert gpu_verdict(view)[0] != health.Verdict.HEALTHY
    fix(rig.control)
    if clearing == "reboot":
        for _ in range(3):
            view = await rig.monitor.probe_once()
        assert gpu_verdict(view) == (verdict, action), "a fix without a reboot must not clear"
        await rig.restart(boot_id="boot-2")
    elif clearing == "release":
        # Release only once a pass has read the fixed state: a release while the cached
        # counters still show the fault latches it again, by design.
        view = await rig.until(lambda v: fixed(v) and v.taken_at is not None)
        for _ in range(3):
            view = await rig.monitor.probe_once()
        assert gpu_verdict(view)[0] != health.Verdict.HEALTHY, "only a release clears it"
        released = await rig.monitor.release(gpu=GPU, code=None, force=False)
        assert released
    await rig.until(lambda v: gpu_verdict(v) == (health.Verdict.HEALTHY, health.Action.NONE))


async def test_application_xid_is_counted_and_keeps_the_gpu_healthy(rig: Rig) -> None:
    """Xid 13 from NVML and the same Xid in the kernel log count once and change no verdict."""
    await rig.registered()
    rig.control.xid(GPU, 13)
    uuid_view = await rig.until(lambda v: bool(v.verdicts))
    pci = next(s.pci_bus_id for s in uuid_view.snapshots if s.index == GPU)
    ts = int(time.monotonic() * 1_000_000)
    short = pci[4:-2]  # 00000000:18:00.0 -> 0000:18:00
    with rig.kmsg.open("a") as fh:
        fh.write(f"4,101,{ts},-;NVRM: Xid (PCI:{short}): 13, pid=42, name=python, Graphics\n")
    view = await rig.until(
        lambda v: (
            metric_value(v, "taugrid_gpu_xid_total", gpu=str(GPU), xid="13") == 1
            and v.state.kmsg_seq == 101
        )
    )
    assert gpu_verdict(view) == (health.Verdict.HEALTHY, health.Action.RESTART_APP)
    assert metric_value(view, "DCGM_FI_DEV_XID_ERRORS", gpu=str(GPU)) == 13


async def test_same_reset_xid_back_after_a_reset_escalates_to_a_reboot(rig: Rig) -> None:
    """Xid 95 twice with no reset between is one incident; back after a reset, a reboot."""
    await rig.registered()
    rig.control.xid(GPU, 95)
    await rig.until(lambda v: gpu_verdict(v) == (F, A.RESET_GPU))
    rig.control.xid(GPU, 95)
    view = await rig.until(
        lambda v: any(g.index == GPU and g.xid_counts.get(95) == 2 for g in v.state.gpus.values())
    )
    for _ in range(3):
        view = await rig.monitor.probe_once()
    assert gpu_verdict(view) == (F, A.RESET_GPU), "a burst without a reset is not a repeat"
    rig.control.ecc_corrected(GPU, 1)  # so that the reset shows: volatile counters go to zero
    await rig.until(lambda v: any(s.index == GPU and s.ecc_sbe_volatile for s in v.snapshots))
    rig.control.reset(GPU)
    await rig.until(lambda v: gpu_verdict(v) == (health.Verdict.HEALTHY, A.NONE))
    rig.control.xid(GPU, 95)
    await rig.until(lambda v: gpu_verdict(v) == (F, A.REBOOT_NODE))


async def test_thermal_slowdown_warns_and_needs_no_release(rig: Rig) -> None:
    """HW thermal slowdown is DCGM MONITOR: a Healthy reason while on, gone when it stops."""
    await rig.registered()
    inject_thermal(rig.control)
    view = await rig.until(
        lambda v: any(
            r.code == "HwThermalSlowdown" for g in v.verdicts if g.index == GPU for r in g.reasons
        )
    )
    assert gpu_verdict(view) == (health.Verdict.HEALTHY, A.NONE)
    clear_thermal(rig.control)
    view = await rig.until(lambda v: fixed(v) and v.taken_at is not None)
    view = await rig.monitor.probe_once()
    assert gpu_verdict(view) == (health.Verdict.HEALTHY, A.NONE)
    uuid = next(v.uuid for v in view.verdicts if v.index == GPU)
    assert view.state.gpus[uuid].latched == ()


async def test_a_fresh_state_file_does_not_replay_old_kernel_log_xids(rig: Rig) -> None:
    """A first install (no state file) starts at the kernel log's tail: an old Xid 119 already
    in the buffer, cleared long ago, is not replayed; one appended later still counts."""
    view = await rig.until(lambda v: bool(v.snapshots))
    pci = next(s.pci_bus_id for s in view.snapshots if s.index == GPU)[4:-2]
    await rig.monitor.stop()
    rig.config.state_path.unlink(missing_ok=True)
    rig.kmsg.write_text(f"3,7,1000,-;NVRM: Xid (PCI:{pci}): 119, Timeout after 6s of waiting\n")
    rig.monitor = monitoring.Monitor(rig.config)
    await rig.monitor.start(loops=False)
    for _ in range(3):
        view = await rig.monitor.probe_once()
    assert gpu_verdict(view) == (health.Verdict.HEALTHY, A.NONE)
    ts = int(time.monotonic() * 1_000_000)
    with rig.kmsg.open("a") as fh:
        fh.write(f"3,8,{ts},-;NVRM: Xid (PCI:{pci}): 119, Timeout after 6s of waiting\n")
    await rig.until(lambda v: gpu_verdict(v) == (F, A.RESET_GPU))


async def test_kmsg_xids_from_before_the_restart_are_not_counted_twice(rig: Rig) -> None:
    """The kernel log is read back to boot, but a restart on the same boot skips what was folded."""
    view = await rig.until(lambda v: bool(v.snapshots))
    pci = next(s.pci_bus_id for s in view.snapshots if s.index == GPU)[4:-2]
    rig.kmsg.write_text(
        f"3,7,1000,-;NVRM: Xid (PCI:{pci}): 79, pid=1, GPU has fallen off the bus.\n"
    )
    await rig.until(lambda v: gpu_verdict(v) == (F, A.REBOOT_NODE))
    await rig.restart()
    view = await rig.until(lambda v: v.taken_at is not None and bool(v.verdicts))
    for _ in range(3):
        view = await rig.monitor.probe_once()
    uuid = next(v.uuid for v in view.verdicts if v.index == GPU)
    assert view.state.gpus[uuid].xid_counts == {79: 1}


async def test_event_thread_survives_a_lost_gpu(rig: Rig) -> None:
    """After one GPU is lost, Xids on another GPU still arrive through the event set."""
    await rig.registered()
    rig.control.lost(1)
    await rig.until(lambda v: gpu_verdict(v, 1)[0] == F)
    rig.control.xid(GPU, 95)
    await rig.until(lambda v: gpu_verdict(v) == (F, A.RESET_GPU))


@pytest.mark.parametrize(
    ("line", "after"),
    [
        pytest.param("149, NETIR_BER_EVENT Nonfatal XC0 i0 Link 00 (0x00000226 0x00000001)",
                     (health.Verdict.HEALTHY, health.Action.NONE),
                     id="a BER event the kernel log decodes as IGNORE clears the pending state"),
        pytest.param("149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 09 (0x025525c6 0x00000000)",
                     (F, A.RESET_GPU),
                     id="a link-down the kernel log decodes as RESET_GPU fails the GPU"),
    ],
)  # fmt: skip
async def test_an_nvlink5_xid_waits_for_its_kernel_log_decode(
    rig: Rig, line: str, after: tuple[health.Verdict, health.Action]
) -> None:
    """Xid 149 from NVML alone is Degraded/Inspect-pending; its kernel-log line decides it."""
    await rig.registered()
    rig.control.xid(GPU, 149)
    view = await rig.until(lambda v: gpu_verdict(v) == (health.Verdict.DEGRADED, A.INSPECT))
    pci = next(s.pci_bus_id for s in view.snapshots if s.index == GPU)[4:-2]
    ts = int(time.monotonic() * 1_000_000)
    with rig.kmsg.open("a") as fh:
        fh.write(f"4,201,{ts},-;NVRM: Xid (PCI:{pci}): {line}\n")
    view = await rig.until(lambda v: gpu_verdict(v) == after and v.state.kmsg_seq == 201)
    assert metric_value(view, "taugrid_gpu_xid_total", gpu=str(GPU), xid="149") == 1


@pytest.mark.parametrize(
    ("branch", "calls", "reserved", "used"),
    [
        pytest.param(570, {"memoryInfo": "v2", "clockReasons": "EventReasons",
                           "eventTypes": "0xc00a"}, 543.0, 0.0,
                     id="on R570 memory is v2: reserved apart, as DCGM reads it"),
        pytest.param(550, {"memoryInfo": "v2", "clockReasons": "EventReasons",
                           "eventTypes": "0xa"}, 543.0, 0.0,
                     id="on R550 only the Xid and ECC events are registered"),
        pytest.param(470, {"memoryInfo": "v1", "clockReasons": "ThrottleReasons",
                           "eventTypes": "0xa"}, None, 543.0,
                     id="on R470 memory falls back to v1 and clocks to the throttle call"),
    ],
)  # fmt: skip
async def test_an_older_driver_still_gives_xids_and_readings(
    rig: Rig, branch: int, calls: dict[str, str], reserved: float | None, used: float
) -> None:
    """The agent registers what the driver supports and falls back to the calls it has."""
    rig.control.driver_branch(branch)
    await rig.restart()
    view = await rig.until(lambda v: v.events_registered == 8 and bool(v.snapshots))
    assert calls == view.nvml_calls
    snap = next(s for s in view.snapshots if s.index == GPU)
    assert (reserved, used) == (snap.fb_reserved_mib, snap.fb_used_mib)
    assert (snap.recovery_action is None) == (branch < 565)
    rig.control.thermal(GPU, on=True)
    await rig.until(lambda v: not fixed(v))  # the slowdown is read through either call
    rig.control.xid(GPU, 79)
    await rig.until(lambda v: gpu_verdict(v) == (F, A.REBOOT_NODE))
