"""GPUs lost before or while the agent runs, through the real pynvml against the fake NVML.

- A GPU that fails `nvmlDeviceGetHandleByIndex_v2` at start (GPU_IS_LOST, INSUFFICIENT_POWER)
  is a verdict of its own on a fresh state file, not a node of seven healthy GPUs.
- NVML that cannot start (driver not loaded) makes every GPU the PCI bus lists Unknown, naming
  the cause; nothing latches.
- The event wait answers GPU_IS_LOST for the whole set once a GPU is lost (nvml.h:9994); the
  event thread reports it and keeps delivering the other GPUs' events.

The fake is loaded once for this module (pynvml keeps one global library handle) and reset
before every test.
"""

from __future__ import annotations

import asyncio
import pathlib
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pynvml
import pytest

from agent import monitoring, readings, settings, snapshots
from agent.probing import nvml
from devcluster import fakenvml
from shared import health

DEADLINE_S = 30.0
F, U = health.Verdict.FAILED, health.Verdict.UNKNOWN
A = health.Action


@pytest.fixture(scope="module")
def fake() -> Iterator[fakenvml.InProcessControl]:
    """Build and load the fake library once for the module."""
    control = fakenvml.InProcessControl(fakenvml.build())
    yield control
    control.reset_all()


def pci_fixture(root: pathlib.Path, count: int) -> pathlib.Path:
    """A sysfs `devices` directory listing `count` NVIDIA 3D controllers (hand-made)."""
    devices = root / "pci-devices"
    for index in range(count):
        entry = devices / fakenvml.default_bus_id(index).lower().removeprefix("0000")
        entry.mkdir(parents=True)
        (entry / "vendor").write_text("0x10de\n")
        (entry / "class").write_text("0x030200\n")
    return devices


@pytest.fixture
def config(tmp_path: pathlib.Path) -> settings.Settings:
    """Settings on temporary files, no DCGM, no kernel log, the PCI bus of an 8-GPU board."""
    boot = tmp_path / "boot_id"
    boot.write_text("boot-1\n")
    return settings.Settings(
        node_name="gpu-node-1",
        boot_id_path=boot,
        state_path=tmp_path / "state.json",
        kmsg_path=None,
        pci_devices_path=pci_fixture(tmp_path, 8),
        dcgm_enabled=False,
        counter_interval_s=0.01,
        event_wait_ms=50,
        auth_enabled=False,
    )


@pytest.fixture
async def start(
    fake: fakenvml.InProcessControl, config: settings.Settings
) -> AsyncIterator[Callable[[], Any]]:
    """Start a monitor on a fresh state file once the test has set the fake up."""
    fake.reset_all()
    monitors: list[monitoring.Monitor] = []

    async def started() -> monitoring.Monitor:
        monitor = monitoring.Monitor(config)
        await monitor.start(loops=False)
        monitors.append(monitor)
        return monitor

    yield started
    for monitor in monitors:
        await monitor.stop()
    fake.reset_all()


async def until(
    monitor: monitoring.Monitor, check: Callable[[snapshots.View], bool]
) -> snapshots.View:
    """Step probe passes until `check(view)` holds, against a generous deadline."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        view = await monitor.probe_once()
        if check(view):
            return view
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met before the deadline; last view: {view.verdicts}")
        await asyncio.sleep(0.02)


def summary(view: snapshots.View, index: int) -> tuple[str, health.Verdict, health.Action, str]:
    """(uuid, verdict, action, first reason) of the GPU at `index`."""
    v = next(v for v in view.verdicts if v.index == index)
    return v.uuid, v.verdict, v.action, v.reasons[0].code if v.reasons else ""


@pytest.mark.parametrize(
    ("inject", "expected"),
    [
        pytest.param(lambda c: c.lost(7), (F, A.REBOOT_NODE, "GpuLost"),
                     id="GPU 7 lost before start is GPU 7's GpuLost, a reboot"),
        pytest.param(lambda c: c.set_rc("nvmlDeviceGetHandleByIndex_v2", 7,
                                        pynvml.NVML_ERROR_INSUFFICIENT_POWER),
                     (F, A.INSPECT, "GpuInsufficientPower"),
                     id="GPU 7 without power at enumeration is an Inspect of its cables"),
    ],
)  # fmt: skip
async def test_a_gpu_lost_before_start_is_reported(
    fake: fakenvml.InProcessControl,
    start: Callable[[], Any],
    inject: Callable[[fakenvml.InProcessControl], None],
    expected: tuple[health.Verdict, health.Action, str],
) -> None:
    """Fresh state file, GPU 7 fails enumeration: eight GPU reports, the eighth not healthy."""
    inject(fake)
    monitor = await start()
    view = await until(monitor, lambda v: len(v.verdicts) == 8)
    hb = snapshots.build_heartbeat(
        view, interval_s=5.0, agent_url="", sequence=1, now=monitoring.utcnow()
    )
    assert summary(view, 7) == ("unenumerated-index-7", *expected)
    assert (len(hb.gpus), hb.gpus[7].verdict) == (8, expected[0])


async def test_nvml_without_a_driver_reports_every_pci_gpu_unknown(
    fake: fakenvml.InProcessControl, start: Callable[[], Any]
) -> None:
    """nvmlInit answering DRIVER_NOT_LOADED: eight Unknown GPUs naming it, no latch."""
    fake.set_rc("nvmlInitWithFlags", "*", pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    monitor = await start()
    view = await until(monitor, lambda v: len(v.verdicts) == 8)
    assert {(v.verdict, v.action) for v in view.verdicts} == {(U, A.NONE)}
    assert "driver is not loaded" in view.verdicts[0].reasons[0].message
    assert view.state.gpus == {}


async def test_a_gpu_lost_while_running_fails_the_whole_wait_not_the_thread(
    fake: fakenvml.InProcessControl,
) -> None:
    """GPU 2 falls off the bus: the wait answers GPU_IS_LOST for the set, the thread says so
    and makes a set without GPU 2, and GPU 0's next Xid still arrives through NVML."""
    fake.reset_all()
    probe = nvml.Probe()
    probe.start()
    events: list[nvml.NvmlEvent] = []
    watcher = nvml.EventWatcher(probe.devices, events.append, wait_ms=50)
    watcher.start()
    try:
        await wait_for(lambda: len(watcher.registered) == 8, "every GPU registered")
        fake.lost(2)
        await wait_for(
            lambda: any(e.error is readings.NvmlErrorKind.GPU_IS_LOST for e in events),
            "the set-wide GPU_IS_LOST",
        )
        await wait_for(lambda: 2 not in watcher.registered, "a set without GPU 2")
        fake.xid(0, 13)
        await wait_for(
            lambda: any(e.gpu_index == 0 and e.data == 13 for e in events), "GPU 0's Xid 13"
        )
    finally:
        watcher.stop()
        probe.shutdown()
        fake.reset_all()
    lost = next(e for e in events if e.error is readings.NvmlErrorKind.GPU_IS_LOST)
    assert (lost.gpu_index, lost.detail.startswith("wait:"), watcher.alive) == (None, True, False)


async def wait_for(check: Callable[[], bool], what: str) -> None:
    """Poll `check` against a generous deadline."""
    deadline = time.monotonic() + DEADLINE_S
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not seen before the deadline")
        await asyncio.sleep(0.02)
