"""NVML errors as NVIDIA's nvml.h means them, and GPUs NVML never enumerates (G7, G8).

Host-side errors say the agent cannot see: Unknown, never a reset, never latched. A GPU that
is gone before the agent starts (an enumeration error, a PCI function or an expected GPU NVML
does not count) is a finding of its own, which the controller sees like any other GPU's.
"""

from __future__ import annotations

import datetime as dt
import pathlib

import pynvml
import pytest

from agent import latching, readings, settings, snapshots, verdicts
from agent.probing import nvml, pci
from controller.fleet import state as fleet_state
from shared import fastheartbeat, health

T0 = dt.datetime(2026, 5, 1, 12, 0, tzinfo=dt.UTC)
H, D, F, U = (health.Verdict.HEALTHY, health.Verdict.DEGRADED, health.Verdict.FAILED,
              health.Verdict.UNKNOWN)  # fmt: skip
A = health.Action
K = readings.NvmlErrorKind
POLICY = verdicts.Policy()
PCI = [f"0000:{bus:02x}:00.0" for bus in (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)]
"""An HGX board's eight GPU functions, as sysfs names them."""


def snapshot(index: int, **fields: object) -> readings.GpuSnapshot:
    """GPU `index` of the HGX board, healthy unless `fields` say otherwise."""
    return readings.GpuSnapshot.model_validate(
        {"index": index, "uuid": f"GPU-{index}", "pci_bus_id": "0000" + PCI[index],
         "taken_at": T0, **fields}
    )  # fmt: skip


def evaluate(
    snaps: tuple[readings.GpuSnapshot, ...],
    *,
    state: latching.NodeState | None = None,
    missing: tuple[readings.MissingGpu, ...] = (),
    nvml_available: bool = True,
    nvml_detail: str = "",
) -> tuple[latching.NodeState, dict[int, verdicts.GpuVerdict]]:
    """One pass on a fresh (or given) state; the verdicts by index."""
    inputs = verdicts.Inputs(
        boot_id="b", snapshots=snaps, missing=missing, nvml_available=nvml_available,
        nvml_detail=nvml_detail,
    )  # fmt: skip
    new, out = verdicts.evaluate_node(state or latching.NodeState(), inputs, POLICY, T0)
    return new, {v.index: v for v in out}


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        pytest.param(pynvml.NVML_ERROR_OPERATING_SYSTEM, (U, A.NONE, "NvmlHostError"),
                     id="17 OPERATING_SYSTEM (cgroups block the device) is Unknown, no reset"),
        pytest.param(pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, (U, A.NONE, "NvmlHostError"),
                     id="18 LIB_RM_VERSION_MISMATCH is Unknown, no reset"),
        pytest.param(pynvml.NVML_ERROR_MEMORY, (U, A.NONE, "NvmlHostError"),
                     id="20 MEMORY (host memory) is Unknown, no reset"),
        pytest.param(pynvml.NVML_ERROR_DRIVER_NOT_LOADED, (U, A.NONE, "NvmlHostError"),
                     id="9 DRIVER_NOT_LOADED is Unknown, no reset"),
        pytest.param(pynvml.NVML_ERROR_UNINITIALIZED, (U, A.NONE, "NvmlHostError"),
                     id="1 UNINITIALIZED is Unknown, no reset"),
        pytest.param(pynvml.NVML_ERROR_INSUFFICIENT_POWER, (F, A.INSPECT, "GpuInsufficientPower"),
                     id="8 INSUFFICIENT_POWER is a mechanical Inspect (power cables)"),
        pytest.param(pynvml.NVML_ERROR_CORRUPTED_INFOROM, (F, A.INSPECT, "GpuInforomCorrupted"),
                     id="14 CORRUPTED_INFOROM is Inspect"),
        pytest.param(pynvml.NVML_ERROR_IRQ_ISSUE, (F, A.REBOOT_NODE, "GpuIrqIssue"),
                     id="11 IRQ_ISSUE is a reboot"),
        pytest.param(pynvml.NVML_ERROR_GPU_IS_LOST, (F, A.REBOOT_NODE, "GpuLost"),
                     id="15 GPU_IS_LOST is still a reboot"),
        pytest.param(pynvml.NVML_ERROR_UNKNOWN, (F, A.RESET_GPU, "NvmlError"),
                     id="999 UNKNOWN is still a reset"),
    ],
)  # fmt: skip
def test_an_nvml_reading_error_says_what_nvml_h_says(
    code: int, expected: tuple[health.Verdict, health.Action, str]
) -> None:
    """A reading that fails with `code` gives the verdict nvml.h's meaning of it calls for."""
    kind = nvml.classify(pynvml.NVMLError(code))
    assert kind is not None
    _, out = evaluate((snapshot(0, nvml_error=kind, nvml_error_detail=f"code {code}"),))
    assert (out[0].verdict, out[0].action, out[0].reasons[0].code) == expected


def test_a_host_side_error_latches_nothing() -> None:
    """A driver/library mismatch is shown while it lasts and leaves nothing behind."""
    state, _ = evaluate((snapshot(0, nvml_error=K.HOST_SIDE),))
    state, out = evaluate((snapshot(0),), state=state)
    assert (state.gpus["GPU-0"].latched, out[0].verdict) == ((), H)


def test_a_host_side_error_ending_is_no_gpu_reset() -> None:
    """A latched ResetGPU fault does not take the driver coming back for a reset."""
    fault = latching.LatchedFault(
        code="XidUncontainedEcc", verdict=F, action=A.RESET_GPU, since=T0, last_seen=T0,
        boot_id="b", clears_when=latching.ClearingCondition.RESET_THEN_DIAG,
    )  # fmt: skip
    start = latching.NodeState(
        boot_id="b", gpus={"GPU-0": latching.GpuState(uuid="GPU-0", index=0, latched=(fault,))}
    )
    state, _ = evaluate((snapshot(0, nvml_error=K.HOST_SIDE),), state=start)
    state, out = evaluate((snapshot(0),), state=state)
    assert (out[0].action, state.gpus["GPU-0"].latched[0].reset_observed_at) == (
        A.RESET_GPU, None
    )  # fmt: skip


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        pytest.param(pynvml.NVML_ERROR_GPU_IS_LOST, K.GPU_IS_LOST, id="GPU_IS_LOST"),
        pytest.param(pynvml.NVML_ERROR_INSUFFICIENT_POWER, K.INSUFFICIENT_POWER,
                     id="INSUFFICIENT_POWER"),
        pytest.param(pynvml.NVML_ERROR_IRQ_ISSUE, K.IRQ_ISSUE, id="IRQ_ISSUE"),
        pytest.param(pynvml.NVML_ERROR_NO_PERMISSION, K.HOST_SIDE,
                     id="NO_PERMISSION at a handle means the agent cannot see: host-side"),
        pytest.param(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, K.HOST_SIDE,
                     id="FUNCTION_NOT_FOUND at a handle is host-side"),
        pytest.param(pynvml.NVML_ERROR_UNKNOWN, K.UNKNOWN, id="UNKNOWN stays unknown"),
    ],
)  # fmt: skip
def test_an_enumeration_error_is_classified_by_nvml_h(
    code: int, kind: readings.NvmlErrorKind
) -> None:
    """nvml.h:4653-4656 lists what nvmlDeviceGetHandleByIndex_v2 returns; each reads so."""
    assert nvml.classify_enumeration(pynvml.NVMLError(code)) == kind


def test_the_unavailable_text_names_the_cause() -> None:
    """NVML that cannot start says why, in nvml.h's words, and that no reset fixes it."""
    text = nvml.unavailable_why("initialisation", pynvml.NVMLError(18))
    assert ("version" in text, text.endswith("no GPU reset fixes this")) == (True, True)


SEVEN = [(i, "0000" + PCI[i]) for i in range(7)]


@pytest.mark.parametrize(
    ("missing", "expected"),
    [
        pytest.param(
            verdicts.missing_gpus(SEVEN, {7: (K.GPU_IS_LOST, "GPU is lost")}, PCI),
            (7, "unenumerated-index-7", F, A.REBOOT_NODE, "GpuLost"),
            id="GPU 7 lost at nvmlDeviceGetHandleByIndex is GPU 7's finding, a reboot",
        ),
        pytest.param(
            verdicts.missing_gpus(SEVEN, {7: (K.INSUFFICIENT_POWER, "Insufficient Power")}, PCI),
            (7, "unenumerated-index-7", F, A.INSPECT, "GpuInsufficientPower"),
            id="GPU 7 without power at enumeration is an Inspect, not a reboot",
        ),
        pytest.param(
            verdicts.missing_gpus(SEVEN, {}, PCI),
            (7, "unenumerated-" + PCI[7], F, A.REBOOT_NODE, "GpuMissing"),
            id="the PCI bus lists eight GPUs, NVML counts seven: the eighth is missing",
        ),
        pytest.param(
            verdicts.missing_gpus(SEVEN, {}, PCI[:7], expected=8),
            (7, "unenumerated-index-7", F, A.INSPECT, "GpuMissing"),
            id="the device plugin expects eight, neither NVML nor PCI sees one: Inspect",
        ),
    ],
)  # fmt: skip
def test_a_gpu_gone_before_the_agent_starts_is_a_fault(
    missing: tuple[readings.MissingGpu, ...],
    expected: tuple[int, str, health.Verdict, health.Action, str],
) -> None:
    """With a fresh state file, seven healthy GPUs and one that NVML does not give us."""
    _, out = evaluate(tuple(snapshot(i) for i in range(7)), missing=missing)
    v = out[7]
    assert (v.index, v.uuid, v.verdict, v.action, v.reasons[0].code) == expected
    assert {out[i].verdict for i in range(7)} == {H}


def test_a_known_gpu_that_fails_enumeration_keeps_its_cause() -> None:
    """A GPU the state file knows, now without power at enumeration, is Inspect, not GpuLost."""
    state, _ = evaluate(tuple(snapshot(i) for i in range(8)))
    missing = verdicts.missing_gpus(SEVEN, {7: (K.INSUFFICIENT_POWER, "Insufficient Power")}, PCI)
    _, out = evaluate(tuple(snapshot(i) for i in range(7)), state=state, missing=missing)
    assert (len(out), out[7].uuid, out[7].action, out[7].reasons[0].code) == (
        8, "GPU-7", A.INSPECT, "GpuInsufficientPower"
    )  # fmt: skip


def test_nvml_down_on_a_fresh_node_is_unknown_per_pci_gpu() -> None:
    """Driver not loaded and no state file: every PCI GPU is Unknown, naming the cause."""
    why = nvml.unavailable_why("initialisation", pynvml.NVMLError(9))
    missing = verdicts.missing_gpus([], {}, PCI, unavailable=why)
    state, out = evaluate((), missing=missing, nvml_available=False, nvml_detail=why)
    assert {(v.verdict, v.action) for v in out.values()} == {(U, A.NONE)}
    assert (len(out), "driver is not loaded" in out[0].reasons[0].message) == (8, True)
    assert state.gpus == {}


def test_nvml_down_knowing_no_gpu_still_reports_unknown() -> None:
    """No state file and no PCI listing: one Unknown report naming the cause, not a node with
    no GPUs (which the controller would call healthy)."""
    why = nvml.unavailable_why("initialisation", pynvml.NVMLError(18))
    _, out = evaluate((), nvml_available=False, nvml_detail=why)
    assert [(v.uuid, v.verdict, v.action) for v in out.values()] == [
        ("unenumerated-nvml", U, A.NONE)
    ]
    assert "version" in out[0].reasons[0].message


def test_nvml_down_names_the_cause_on_known_gpus() -> None:
    """A known GPU reads Unknown with the reason NVML cannot start, not a generic text."""
    state, _ = evaluate((snapshot(0),))
    why = nvml.unavailable_why("initialisation", pynvml.NVMLError(18))
    missing = verdicts.missing_gpus([], {}, PCI[:1], unavailable=why)
    _, out = evaluate((), state=state, missing=missing, nvml_available=False, nvml_detail=why)
    assert (len(out), out[0].uuid, out[0].verdict) == (1, "GPU-0", U)
    assert "version" in out[0].reasons[-1].message


@pytest.mark.parametrize(
    ("missing", "expected"),
    [
        pytest.param(verdicts.missing_gpus(SEVEN, {7: (K.GPU_IS_LOST, "GPU is lost")}, PCI),
                     fleet_state.NodeState.FAILED, id="a lost GPU makes the node Failed"),
        pytest.param(verdicts.missing_gpus([], {}, PCI, unavailable="driver not loaded"),
                     fleet_state.NodeState.UNKNOWN, id="an agent that cannot see makes it Unknown"),
    ],
)  # fmt: skip
def test_the_controller_sees_the_node_as_not_healthy(
    missing: tuple[readings.MissingGpu, ...], expected: fleet_state.NodeState
) -> None:
    """The heartbeat carries the finding as a GPU report, and the controller's fleet state
    judges the node by it (no node-level channel is needed)."""
    available = not any(m.error is K.HOST_SIDE for m in missing)
    snaps = tuple(snapshot(i) for i in range(7)) if available else ()
    _, out = evaluate(snaps, missing=missing, nvml_available=available)
    view = snapshots.View(node_name="gpu-node-1", boot_id="b", verdicts=tuple(out.values()),
                          snapshots=snaps)  # fmt: skip
    hb = snapshots.build_heartbeat(view, interval_s=5.0, agent_url="", sequence=1, now=T0)
    report = fastheartbeat.decode(fastheartbeat.encode(fastheartbeat.decode(
        fastheartbeat.encode(hb))))  # fmt: skip
    fleet = fleet_state.FleetState(leader_since=T0 - dt.timedelta(hours=1))
    fleet.ingest(report, T0)
    assert fleet.assess("gpu-node-1", T0, default_interval_s=5.0).state is expected


def write_function(
    root: pathlib.Path, address: str, vendor: str, klass: str, driver: str | None = None
) -> None:
    """One PCI function as sysfs lays it out (vendor, class, driver link)."""
    entry = root / address
    entry.mkdir(parents=True)
    (entry / "vendor").write_text(vendor + "\n")
    (entry / "class").write_text(klass + "\n")
    if driver is not None:
        target = root.parent / "drivers" / driver
        target.mkdir(parents=True, exist_ok=True)
        (entry / "driver").symlink_to(target)


def test_the_pci_bus_lists_nvidia_gpus_only(tmp_path: pathlib.Path) -> None:
    """3D and VGA controllers of vendor 0x10de on nvidia or no driver count; NVSwitches, other
    vendors and a GPU passed to a VM (vfio-pci) do not."""
    root = tmp_path / "devices"
    write_function(root, PCI[0], "0x10de", "0x030200", "nvidia")
    write_function(root, PCI[1], "0x10de", "0x030000")
    write_function(root, PCI[2], "0x10de", "0x030200", "vfio-pci")
    write_function(root, "0000:05:00.0", "0x10de", "0x068000", "nvidia-nvswitch")
    write_function(root, "0000:06:00.0", "0x8086", "0x030000", "i915")
    assert pci.nvidia_gpus(root) == (PCI[0], PCI[1])


def test_an_unreadable_pci_bus_is_no_finding(tmp_path: pathlib.Path) -> None:
    """No sysfs (a container without it) gives None: the check is off, nothing is missing."""
    assert pci.nvidia_gpus(tmp_path / "absent") is None


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        pytest.param("", None, id="an empty variable turns the PCI check off, not the cwd"),
        pytest.param("/host/sys/bus/pci/devices", pathlib.Path("/host/sys/bus/pci/devices"),
                     id="a path is where the PCI functions are read"),
    ],
)  # fmt: skip
def test_the_pci_path_setting(
    monkeypatch: pytest.MonkeyPatch, raw: str, expected: pathlib.Path | None
) -> None:
    """`TAUGRID_AGENT_PCI_DEVICES_PATH` is a path or off."""
    monkeypatch.setenv("TAUGRID_AGENT_PCI_DEVICES_PATH", raw)
    assert settings.Settings(node_name="n").pci_devices_path == expected
