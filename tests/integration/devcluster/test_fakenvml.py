"""The fake ``libnvidia-ml.so.1`` driven through the real, unmodified pynvml.

pynvml keeps one global library handle, so every in-process test shares one
module-scoped fake (reloaded to its defaults before each test); the tests of the
socket and ``LD_LIBRARY_PATH`` paths run the library in child processes.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import pathlib
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pynvml
import pytest

from devcluster import fakenvml

DEADLINE_S = 30.0

Reader = Callable[[Any], object]


@pytest.fixture(scope="module")
def lib_dir() -> pathlib.Path:
    """Build the fake once (cached across runs in the user cache directory)."""
    return fakenvml.build()


@pytest.fixture(scope="module")
def control(lib_dir: pathlib.Path) -> Iterator[fakenvml.InProcessControl]:
    """Load the fake into this process, point pynvml at it and initialise NVML."""
    ctl = fakenvml.InProcessControl(lib_dir)
    ctl.load(None)
    pynvml.nvmlInit()
    yield ctl
    pynvml.nvmlShutdown()


@pytest.fixture
def fake(control: fakenvml.InProcessControl) -> Iterator[fakenvml.InProcessControl]:
    """Give each test the built-in default state, and leave it behind afterwards."""
    control.load(None)
    yield control
    control.load(None)


@pytest.fixture
def event_set(fake: fakenvml.InProcessControl) -> Iterator[Any]:
    """Create an NVML event set for one test and free it afterwards."""
    es = pynvml.nvmlEventSetCreate()
    yield es
    pynvml.nvmlEventSetFree(es)


def handle(index: int) -> Any:
    """Return the pynvml handle of GPU ``index``."""
    return pynvml.nvmlDeviceGetHandleByIndex(index)


def poll(condition: Callable[[], bool], what: str) -> None:
    """Wait until ``condition`` holds, failing after a generous deadline."""
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.01)


# ---------------------------------------------------------------- ABI


STRUCTS = [
    pytest.param(pynvml.nvmlPciInfo_t, "nvmlPciInfo_t", id="PCI info matches pynvml"),
    pytest.param(pynvml.c_nvmlMemory_t, "nvmlMemory_t", id="memory v1 matches pynvml"),
    pytest.param(pynvml.c_nvmlMemory_v2_t, "nvmlMemory_v2_t", id="memory v2 matches pynvml"),
    pytest.param(pynvml.c_nvmlUtilization_t, "nvmlUtilization_t", id="utilization matches"),
    pytest.param(pynvml.c_nvmlViolationTime_t, "nvmlViolationTime_t", id="violation time matches"),
    pytest.param(pynvml.c_nvmlValue_t, "nvmlValue_t", id="field value union matches"),
    pytest.param(pynvml.c_nvmlFieldValue_t, "nvmlFieldValue_t", id="field value matches"),
    pytest.param(pynvml.c_nvmlEventData_t, "nvmlEventData_t", id="event data matches"),
    pytest.param(
        pynvml.c_nvmlTemperature_v1_t, "nvmlTemperature_v1_t", id="temperature v1 matches"
    ),
]


@pytest.mark.parametrize(("py_struct", "c_name"), STRUCTS)
def test_struct_layout_matches_pynvml(
    control: fakenvml.InProcessControl, py_struct: Any, c_name: str
) -> None:
    """Every struct the fake writes has pynvml's size and member offsets."""
    expected = {c_name: ctypes.sizeof(py_struct)}
    actual = {c_name: control.layout(c_name)}
    if issubclass(py_struct, ctypes.Structure):
        for field in py_struct._fields_:
            key = f"{c_name}.{field[0]}"
            expected[key] = getattr(py_struct, field[0]).offset
            actual[key] = control.layout(key)
    assert expected == actual


def test_pynvml_resolves_every_symbol_the_agent_needs(fake: fakenvml.InProcessControl) -> None:
    """Each versioned C symbol the agent's pynvml calls is exported by the fake."""
    names = [
        "nvmlInitWithFlags", "nvmlInit_v2", "nvmlShutdown", "nvmlErrorString",
        "nvmlSystemGetDriverVersion", "nvmlSystemGetNVMLVersion",
        "nvmlSystemGetCudaDriverVersion", "nvmlSystemGetCudaDriverVersion_v2",
        "nvmlDeviceGetCount_v2", "nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByUUID",
        "nvmlDeviceGetHandleByPciBusId_v2", "nvmlDeviceGetUUID", "nvmlDeviceGetName",
        "nvmlDeviceGetIndex", "nvmlDeviceGetMinorNumber", "nvmlDeviceGetSerial",
        "nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetTemperature", "nvmlDeviceGetTemperatureV",
        "nvmlDeviceGetTemperatureThreshold", "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetTotalEnergyConsumption",
        "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetEncoderUtilization",
        "nvmlDeviceGetDecoderUtilization", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMemoryInfo_v2",
        "nvmlDeviceGetEccMode", "nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetMemoryErrorCounter",
        "nvmlDeviceGetRetiredPages", "nvmlDeviceGetRetiredPages_v2",
        "nvmlDeviceGetRetiredPagesPendingStatus", "nvmlDeviceGetRemappedRows",
        "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons",
        "nvmlDeviceGetViolationStatus", "nvmlDeviceGetClockInfo", "nvmlDeviceGetPcieReplayCounter",
        "nvmlDeviceGetCurrPcieLinkGeneration", "nvmlDeviceGetCurrPcieLinkWidth",
        "nvmlDeviceGetMaxPcieLinkGeneration", "nvmlDeviceGetMaxPcieLinkWidth",
        "nvmlDeviceGetNvLinkState", "nvmlDeviceGetNvLinkErrorCounter", "nvmlDeviceGetFieldValues",
        "nvmlEventSetCreate", "nvmlDeviceRegisterEvents", "nvmlDeviceGetSupportedEventTypes",
        "nvmlEventSetWait_v2", "nvmlEventSetWait", "nvmlEventSetFree",
    ]  # fmt: skip
    missing = [name for name in names if not hasattr(pynvml.nvmlLib, name)]
    assert missing == []


# ---------------------------------------------------------------- readings


def test_defaults_describe_an_hgx_h100_board(fake: fakenvml.InProcessControl) -> None:
    """Without a scenario there are 8 H100s on an R570 driver, unique UUIDs, 18 NVLinks."""
    count = pynvml.nvmlDeviceGetCount()
    uuids = [pynvml.nvmlDeviceGetUUID(handle(i)) for i in range(count)]
    expected = {
        "count": 8,
        "driver": "570.148.08",
        "cuda": 12080,
        "names": {"NVIDIA H100 80GB HBM3"},
        "bus0": "00000000:18:00.0",
        "indexes": list(range(8)),
        "unique_uuids": 8,
        "uuid_format": True,
        "links_up": 18,
        "link_18": "invalid argument",
    }
    try:
        pynvml.nvmlDeviceGetNvLinkState(handle(0), 18)
        link_18 = "up"
    except pynvml.NVMLError_InvalidArgument:
        link_18 = "invalid argument"
    actual = {
        "count": count,
        "driver": pynvml.nvmlSystemGetDriverVersion(),
        "cuda": pynvml.nvmlSystemGetCudaDriverVersion_v2(),
        "names": {pynvml.nvmlDeviceGetName(handle(i)) for i in range(count)},
        "bus0": pynvml.nvmlDeviceGetPciInfo(handle(0)).busId,
        "indexes": [pynvml.nvmlDeviceGetIndex(handle(i)) for i in range(count)],
        "unique_uuids": len(set(uuids)),
        "uuid_format": all(
            re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", u)
            for u in uuids
        ),
        "links_up": sum(pynvml.nvmlDeviceGetNvLinkState(handle(0), link) for link in range(18)),
        "link_18": link_18,
    }
    assert expected == actual


@pytest.mark.parametrize("seed", ["", "gpu-node-0", "dra-n-7"], ids=lambda s: f"seed {s!r}")
def test_python_derives_the_uuids_and_bus_ids_the_library_reports(
    fake: fakenvml.InProcessControl, tmp_path: pathlib.Path, seed: str
) -> None:
    """`default_uuid` and `default_bus_id` give what NVML answers for each GPU under a seed,
    so the dev cluster's DRA publisher lists the GPUs a node's agent reports."""
    scenario = tmp_path / "s.txt"
    scenario.write_text(fakenvml.render_scenario(gpus=10, seed=seed or None))
    fake.load(scenario)
    expected = [(fakenvml.default_uuid(seed, i), fakenvml.default_bus_id(i)) for i in range(10)]
    actual = [
        (pynvml.nvmlDeviceGetUUID(handle(i)), pynvml.nvmlDeviceGetPciInfo(handle(i)).busId)
        for i in range(10)
    ]
    assert expected == actual


@pytest.mark.parametrize(
    "lookup",
    [
        pytest.param(lambda: pynvml.nvmlDeviceGetUUID(handle(5)), id="by UUID"),
        pytest.param(lambda: pynvml.nvmlDeviceGetPciInfo(handle(5)).busId, id="by PCI bus id"),
    ],
)
def test_handle_lookup_finds_the_same_gpu(
    fake: fakenvml.InProcessControl, lookup: Callable[[], str]
) -> None:
    """Looking a GPU up by its UUID or PCI bus id yields the handle of that GPU."""
    key = lookup()
    found = (
        pynvml.nvmlDeviceGetHandleByUUID(key)
        if key.startswith("GPU-")
        else pynvml.nvmlDeviceGetHandleByPciBusId(key)
    )
    assert pynvml.nvmlDeviceGetIndex(found) == 5


T = pynvml
READBACKS = [
    ("temperature", 71, lambda h: T.nvmlDeviceGetTemperature(h, T.NVML_TEMPERATURE_GPU)),
    ("temperature", 72, lambda h: T.nvmlDeviceGetTemperatureV(h, T.NVML_TEMPERATURE_GPU)),
    (
        "temperature_slowdown",
        85,
        lambda h: T.nvmlDeviceGetTemperatureThreshold(h, T.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
    ),
    (
        "temperature_shutdown",
        95,
        lambda h: T.nvmlDeviceGetTemperatureThreshold(h, T.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN),
    ),
    ("power_mw", 350_000, T.nvmlDeviceGetPowerUsage),
    ("power_limit_mw", 650_000, T.nvmlDeviceGetEnforcedPowerLimit),
    ("energy_mj", 2**40, T.nvmlDeviceGetTotalEnergyConsumption),
    ("util_gpu", 87, lambda h: T.nvmlDeviceGetUtilizationRates(h).gpu),
    ("util_memory", 45, lambda h: T.nvmlDeviceGetUtilizationRates(h).memory),
    ("util_encoder", 12, lambda h: T.nvmlDeviceGetEncoderUtilization(h)[0]),
    ("util_decoder", 13, lambda h: T.nvmlDeviceGetDecoderUtilization(h)[0]),
    ("memory_total", 2**36, lambda h: T.nvmlDeviceGetMemoryInfo(h).total),
    ("memory_reserved", 2**30, lambda h: T.nvmlDeviceGetMemoryInfo(h, T.nvmlMemory_v2).reserved),
    ("memory_used", 2**33, lambda h: T.nvmlDeviceGetMemoryInfo(h, T.nvmlMemory_v2).used),
    ("ecc_mode", 0, lambda h: T.nvmlDeviceGetEccMode(h)[0]),
    (
        "ecc_corrected_volatile",
        7,
        lambda h: T.nvmlDeviceGetTotalEccErrors(
            h, T.NVML_MEMORY_ERROR_TYPE_CORRECTED, T.NVML_VOLATILE_ECC
        ),
    ),
    (
        "ecc_uncorrected_aggregate",
        3,
        lambda h: T.nvmlDeviceGetTotalEccErrors(
            h, T.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, T.NVML_AGGREGATE_ECC
        ),
    ),
    (
        "ecc_uncorrected_volatile",
        2,
        lambda h: T.nvmlDeviceGetMemoryErrorCounter(
            h,
            T.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            T.NVML_VOLATILE_ECC,
            T.NVML_MEMORY_LOCATION_DRAM,
        ),
    ),
    (
        "retired_dbe",
        3,
        lambda h: len(
            T.nvmlDeviceGetRetiredPages(h, T.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
        ),
    ),
    (
        "retired_sbe",
        2,
        lambda h: len(
            T.nvmlDeviceGetRetiredPages_v2(
                h, T.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
            )
        ),
    ),
    ("retired_pending", 1, T.nvmlDeviceGetRetiredPagesPendingStatus),
    ("remapped_correctable", 4, lambda h: T.nvmlDeviceGetRemappedRows(h)[0]),
    ("remapped_uncorrectable", 5, lambda h: T.nvmlDeviceGetRemappedRows(h)[1]),
    ("remap_pending", 1, lambda h: T.nvmlDeviceGetRemappedRows(h)[2]),
    ("remap_failure", 1, lambda h: T.nvmlDeviceGetRemappedRows(h)[3]),
    ("clock_event_reasons", 0x44, T.nvmlDeviceGetCurrentClocksEventReasons),
    ("clock_event_reasons", 0x20, T.nvmlDeviceGetCurrentClocksThrottleReasons),
    (
        "violation_thermal_ns",
        5000,
        lambda h: T.nvmlDeviceGetViolationStatus(h, T.NVML_PERF_POLICY_THERMAL).violationTime,
    ),
    ("sm_clock", 1410, lambda h: T.nvmlDeviceGetClockInfo(h, T.NVML_CLOCK_SM)),
    ("mem_clock", 1593, lambda h: T.nvmlDeviceGetClockInfo(h, T.NVML_CLOCK_MEM)),
    ("pcie_replay", 9, T.nvmlDeviceGetPcieReplayCounter),
    ("pcie_gen", 4, T.nvmlDeviceGetCurrPcieLinkGeneration),
    ("pcie_width", 8, T.nvmlDeviceGetCurrPcieLinkWidth),
    ("pcie_max_gen", 6, T.nvmlDeviceGetMaxPcieLinkGeneration),
    ("pcie_max_width", 32, T.nvmlDeviceGetMaxPcieLinkWidth),
    ("nvlink_state.5", 0, lambda h: T.nvmlDeviceGetNvLinkState(h, 5)),
    (
        "nvlink_crc_flit.4",
        11,
        lambda h: T.nvmlDeviceGetNvLinkErrorCounter(h, 4, T.NVML_NVLINK_ERROR_DL_CRC_FLIT),
    ),
    (
        "nvlink_replay.0",
        6,
        lambda h: T.nvmlDeviceGetNvLinkErrorCounter(h, 0, T.NVML_NVLINK_ERROR_DL_REPLAY),
    ),
    ("supported_events", 0xB, T.nvmlDeviceGetSupportedEventTypes),
    ("name", "NVIDIA A100-SXM4-80GB", T.nvmlDeviceGetName),
    ("serial", "1320000000001", T.nvmlDeviceGetSerial),
    ("uuid", "GPU-00000000-1111-2222-3333-444444444444", T.nvmlDeviceGetUUID),
    ("pci_bus_id", "00000000:07:00.0", lambda h: T.nvmlDeviceGetPciInfo(h).busId),
    ("minor", 5, T.nvmlDeviceGetMinorNumber),
]


@pytest.mark.parametrize(
    ("key", "value", "read"),
    [
        pytest.param(key, value, read, id=f"{key} set to {value!r} is read back")
        for key, value, read in READBACKS
    ],
)
def test_set_value_is_read_back_through_pynvml(
    fake: fakenvml.InProcessControl, key: str, value: int | str, read: Reader
) -> None:
    """A value set on one GPU comes back through the matching pynvml call, on that GPU only."""
    before_other = read(handle(1))
    fake.set_value(2, key, value)
    assert (value, before_other) == (read(handle(2)), read(handle(1)))


# ---------------------------------------------------------------- return codes and faults


@pytest.mark.parametrize(
    ("rc", "error"),
    [
        pytest.param(3, pynvml.NVMLError_NotSupported, id="3 raises NotSupported"),
        pytest.param(15, pynvml.NVMLError_GpuIsLost, id="15 raises GpuIsLost"),
        pytest.param(16, pynvml.NVMLError_ResetRequired, id="16 raises ResetRequired"),
        pytest.param(999, pynvml.NVMLError_Unknown, id="999 raises Unknown"),
    ],
)
def test_return_code_override_hits_one_function_on_one_gpu(
    fake: fakenvml.InProcessControl, rc: int, error: type[Exception]
) -> None:
    """An override makes one function fail on one GPU; other GPUs and functions still answer."""
    fake.set_rc("nvmlDeviceGetTemperature", 2, rc)
    with pytest.raises(error):
        pynvml.nvmlDeviceGetTemperature(handle(2), pynvml.NVML_TEMPERATURE_GPU)
    untouched = (
        pynvml.nvmlDeviceGetTemperature(handle(1), pynvml.NVML_TEMPERATURE_GPU),
        pynvml.nvmlDeviceGetPowerUsage(handle(2)),
    )
    assert untouched == (35, 72000)


def test_return_code_override_after_n_calls(fake: fakenvml.InProcessControl) -> None:
    """With ``after 2`` the first two calls succeed and later ones fail."""
    fake.set_rc("nvmlDeviceGetPowerUsage", 0, 3, after=2)
    outcomes = []
    for _ in range(4):
        try:
            outcomes.append(pynvml.nvmlDeviceGetPowerUsage(handle(0)))
        except pynvml.NVMLError_NotSupported:
            outcomes.append("not supported")
    assert outcomes == [72000, 72000, "not supported", "not supported"]


def test_removing_an_override_restores_the_call(fake: fakenvml.InProcessControl) -> None:
    """Setting return code 0 removes the override."""
    fake.set_rc("nvmlDeviceGetPowerUsage", "*", 3)
    fake.set_rc("nvmlDeviceGetPowerUsage", "*", 0)
    assert pynvml.nvmlDeviceGetPowerUsage(handle(4)) == 72000


def test_system_level_override_hits_calls_without_a_gpu(fake: fakenvml.InProcessControl) -> None:
    """An override for ``*`` also applies to calls that take no device, such as the count."""
    fake.set_rc("nvmlDeviceGetCount_v2", "*", pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        pynvml.nvmlDeviceGetCount()


def test_c_control_export_runs_several_lines(fake: fakenvml.InProcessControl) -> None:
    """``fake_nvml_control`` runs newline-separated commands and returns EINVAL on a bad one."""
    control = pynvml.nvmlLib.fake_nvml_control
    codes = (
        control(b"set 0 temperature 60\nset 0 power_mw 1000"),
        control(b"set 0 temperature 61\nset 0 bogus 1\nset 0 power_mw 2000"),
    )
    readings = (
        pynvml.nvmlDeviceGetTemperature(handle(0), pynvml.NVML_TEMPERATURE_GPU),
        pynvml.nvmlDeviceGetPowerUsage(handle(0)),
    )
    assert (codes, readings) == ((0, errno.EINVAL), (61, 1000))


DEVICE_CALLS = [
    pytest.param(pynvml.nvmlDeviceGetUUID, True, id="UUID"),
    pytest.param(pynvml.nvmlDeviceGetIndex, True, id="index"),
    pytest.param(pynvml.nvmlDeviceGetPciInfo, True, id="PCI info"),
    pytest.param(pynvml.nvmlDeviceGetSupportedEventTypes, True, id="supported event types"),
    pytest.param(
        lambda h: pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU), False, id="temp"
    ),
    pytest.param(pynvml.nvmlDeviceGetMemoryInfo, False, id="memory"),
    pytest.param(pynvml.nvmlDeviceGetRemappedRows, False, id="remapped rows"),
    pytest.param(lambda h: pynvml.nvmlDeviceGetFieldValues(h, [3]), False, id="field values"),
    pytest.param(lambda h: pynvml.nvmlDeviceGetNvLinkState(h, 0), False, id="NVLink state"),
]


@pytest.mark.parametrize(("call", "identity"), DEVICE_CALLS)
def test_lost_gpu_answers_gpu_is_lost_to_every_call(
    fake: fakenvml.InProcessControl, call: Reader, identity: bool
) -> None:
    """A GPU that fell off the bus raises GpuIsLost from every per-device call."""
    h = handle(1)
    fake.lost(1)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        call(h)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetHandleByIndex(1)


@pytest.mark.parametrize(("call", "identity"), DEVICE_CALLS)
def test_reset_required_answers_every_call(
    fake: fakenvml.InProcessControl, call: Reader, identity: bool
) -> None:
    """A GPU needing a reset still answers identity and readings alike: nvml.h documents
    RESET_REQUIRED only for a few setters (nvml.h:11401, 11631), never for a reading."""
    fake.reset_required(3)
    try:
        call(handle(3))
        outcome = "answered"
    except pynvml.NVMLError as err:
        outcome = type(err).__name__
    assert (outcome, identity) == ("answered", identity)


def test_reset_required_reads_as_recovery_action_gpu_reset(fake: fakenvml.InProcessControl) -> None:
    """A GPU needing a reset says so where R565+ drivers do: field 230 reads GPU_RESET (1),
    and a reset brings it back to NONE (0)."""
    fake.reset_required(3)
    before = pynvml.nvmlDeviceGetFieldValues(handle(3), [230])[0]
    fake.reset(3)
    after = pynvml.nvmlDeviceGetFieldValues(handle(3), [230])[0]
    assert (before.nvmlReturn, before.value.uiVal, after.value.uiVal) == (0, 1, 0)


def test_reset_brings_a_faulted_gpu_back(fake: fakenvml.InProcessControl) -> None:
    """After a reset the GPU answers again, volatile counters are zero and links are up."""
    h = handle(4)
    fake.ecc_uncorrected(4, 3)
    fake.remap(4, "pending")
    fake.nvlink_down(4, 7)
    fake.recovery_action(4, pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET)
    fake.lost(4)
    fake.reset(4)
    unc, vol, agg = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, 0, 1
    expected = {
        "volatile": 0,
        "aggregate": 3,
        "remap": (0, 1, 0, 0),
        "link7": 1,
        "recovery": 0,
        "reset_count": 1,
    }
    actual = {
        "volatile": pynvml.nvmlDeviceGetTotalEccErrors(h, unc, vol),
        "aggregate": pynvml.nvmlDeviceGetTotalEccErrors(h, unc, agg),
        "remap": pynvml.nvmlDeviceGetRemappedRows(h),
        "link7": pynvml.nvmlDeviceGetNvLinkState(h, 7),
        "recovery": pynvml.nvmlDeviceGetFieldValues(h, [230])[0].value.uiVal,
        "reset_count": fake.reset_count(4),
    }
    assert expected == actual


def test_thermal_sets_hardware_slowdown_and_heat(fake: fakenvml.InProcessControl) -> None:
    """Thermal slowdown raises the temperature past slowdown and sets the HW reason bits."""
    h = handle(0)
    bits = pynvml.nvmlClocksEventReasonHwThermalSlowdown | pynvml.nvmlClocksEventReasonHwSlowdown
    fake.thermal(0)
    hot = (
        pynvml.nvmlDeviceGetCurrentClocksEventReasons(h) & bits,
        pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
        > pynvml.nvmlDeviceGetTemperatureThreshold(h, pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
    )
    fake.thermal(0, on=False)
    cool = (
        pynvml.nvmlDeviceGetCurrentClocksEventReasons(h) & bits,
        pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
    )
    assert (hot, cool) == ((bits, True), (0, 35))


def test_clear_restores_the_scenario_state(
    fake: fakenvml.InProcessControl, tmp_path: pathlib.Path
) -> None:
    """``clear`` puts one GPU back to its scenario values and overrides, leaving others alone."""
    scenario = tmp_path / "scenario.txt"
    scenario.write_text(
        fakenvml.render_scenario(
            gpus=4,
            values={1: {"temperature": 50}},
            return_codes=[("nvmlDeviceGetPowerUsage", 1, 3)],
        )
    )
    fake.load(scenario)
    fake.set_value(1, "temperature", 90)
    fake.set_rc("nvmlDeviceGetPowerUsage", 1, 0)
    fake.set_value(2, "temperature", 91)
    fake.clear(1)
    temps = [pynvml.nvmlDeviceGetTemperature(handle(i), 0) for i in (1, 2)]
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetPowerUsage(handle(1))
    assert (pynvml.nvmlDeviceGetCount(), temps) == (4, [50, 91])


def test_bad_scenario_line_is_named(
    fake: fakenvml.InProcessControl, tmp_path: pathlib.Path
) -> None:
    """A scenario with an unknown key fails to load with its file, line and key in the error."""
    scenario = tmp_path / "bad.txt"
    scenario.write_text("gpus 2\nset 0 temprature 50\n")
    with pytest.raises(fakenvml.FakeNvmlError) as info:
        fake.load(scenario)
    assert f"scenario {scenario} line 2: unknown key 'temprature'" == str(info.value)


@pytest.mark.parametrize(
    ("command", "message"),
    [
        pytest.param("set 0 nosuch 1", "unknown key 'nosuch'", id="an unknown key is named"),
        pytest.param("xid 9 79", "gpu 9 out of range: 8 GPUs", id="a GPU out of range is named"),
        pytest.param("thermal 0 hot", "bad thermal state 'hot'", id="a bad state is named"),
        pytest.param(
            "set 0 temperature -1", "expected a non-negative integer", id="a negative is refused"
        ),
        pytest.param("frobnicate 1", "unknown command 'frobnicate'", id="an unknown command"),
        pytest.param("gpus 4", "only allowed in a scenario file", id="gpus only in scenarios"),
        pytest.param("nvlink_down 0 18", "gpu 0 has links 0..17", id="a missing link is named"),
        pytest.param("rc nvmlDeviceGetName 0", "usage: rc FUNCTION", id="rc usage is shown"),
    ],
)
def test_bad_command_is_refused_with_a_reason(
    fake: fakenvml.InProcessControl, command: str, message: str
) -> None:
    """A malformed command raises FakeNvmlError whose message names what is wrong."""
    with pytest.raises(fakenvml.FakeNvmlError, match=re.escape(message)):
        fake.send(command)


# ---------------------------------------------------------------- field values


def test_field_values_batch_reports_per_entry_status(fake: fakenvml.InProcessControl) -> None:
    """Each entry carries its own value and nvmlReturn; unknown ids are NOT_SUPPORTED."""
    for command in [
        "set 6 ecc_uncorrected_volatile 4",
        "set 6 retired_pending 1",
        "set 6 nvlink_crc_flit.0 2",
        "set 6 nvlink_crc_flit.17 3",
        "set 6 memory_temperature 61",
        "set 6 pcie_replay 8",
        "set 6 remap_failure 1",
        "set 6 power_mw 123456",
        "nvlink_down 6 3",
        "recovery_action 6 2",
        "rc field.83 6 15",
    ]:
        fake.send(command)
    requested = [4, 31, 38, 82, 83, 94, 145, (165, 3), (165, 4), (165, 40), 186, 230, 9999]
    values = pynvml.nvmlDeviceGetFieldValues(handle(6), requested)
    actual = [
        (f.fieldId, f.scopeId, f.nvmlReturn, f.value.ullVal if f.valueType == 3 else f.value.uiVal)
        for f in values
    ]
    expected = [
        (4, 0, 0, 4),
        (31, 0, 0, 1),
        (38, 0, 0, 5),
        (82, 0, 0, 61),
        (83, 0, 15, 0),
        (94, 0, 0, 8),
        (145, 0, 0, 1),
        (165, 3, 0, 0),
        (165, 4, 0, 1),
        (165, 40, pynvml.NVML_ERROR_INVALID_ARGUMENT, 0),
        (186, 0, 0, 123456),
        (230, 0, 0, 2),
        (9999, 0, pynvml.NVML_ERROR_NOT_SUPPORTED, 0),
    ]
    assert expected == actual


# ---------------------------------------------------------------- events


def test_event_wait_times_out_when_nothing_arrives(event_set: Any) -> None:
    """With nothing queued, the wait raises NVMLError_Timeout."""
    pynvml.nvmlDeviceRegisterEvents(handle(0), pynvml.nvmlEventTypeXidCriticalError, event_set)
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(event_set, 1)


def test_xid_from_another_thread_wakes_the_waiter(
    fake: fakenvml.InProcessControl, event_set: Any
) -> None:
    """An Xid injected while a thread blocks in nvmlEventSetWait_v2 wakes it with the event."""
    pynvml.nvmlDeviceRegisterEvents(handle(3), pynvml.nvmlEventTypeXidCriticalError, event_set)
    got: list[tuple[int, int, int]] = []

    def wait() -> None:
        data = pynvml.nvmlEventSetWait_v2(event_set, 120_000)
        got.append((pynvml.nvmlDeviceGetIndex(data.device), data.eventType, data.eventData))

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    poll(lambda: fake.waiters() == 1, "the thread to block in nvmlEventSetWait_v2")
    fake.xid(3, 79)
    waiter.join(DEADLINE_S)
    assert got == [(3, pynvml.nvmlEventTypeXidCriticalError, 79)]


def address(device: Any) -> int | None:
    """Return the address behind a device handle, to match event devices to GPUs."""
    return ctypes.cast(device, ctypes.c_void_p).value


def drain(es: Any, gpus: dict[int | None, int]) -> list[tuple[int, int, int]]:
    """Return every queued event as (gpu index, type, data), using a handle map made earlier.

    A lost GPU refuses nvmlDeviceGetIndex, so events are matched by handle address, as an
    agent that keeps its handles would. A set holding a lost GPU ends with GPU_IS_LOST
    instead of a timeout (nvml.h:9994).
    """
    events: list[tuple[int, int, int]] = []
    while True:
        try:
            data = pynvml.nvmlEventSetWait_v2(es, 0)
        except (pynvml.NVMLError_Timeout, pynvml.NVMLError_GpuIsLost):
            return events
        events.append((gpus[address(data.device)], data.eventType, data.eventData))


def gpu_map() -> dict[int | None, int]:
    """Map each GPU's handle address to its index, while every GPU still answers."""
    return {address(handle(i)): i for i in range(pynvml.nvmlDeviceGetCount())}


def test_only_registered_event_types_are_delivered(
    fake: fakenvml.InProcessControl, event_set: Any
) -> None:
    """Events arrive only for the device and types the set registered, in order."""
    xid, dbe = pynvml.nvmlEventTypeXidCriticalError, pynvml.nvmlEventTypeDoubleBitEccError
    pynvml.nvmlDeviceRegisterEvents(handle(0), xid | dbe, event_set)
    pynvml.nvmlDeviceRegisterEvents(handle(2), xid, event_set)
    gpus = gpu_map()
    fake.xid(1, 48)  # GPU 1 is not registered
    fake.ecc_uncorrected(2, 1)  # GPU 2 registered Xid only
    fake.ecc_uncorrected(0, 2)
    fake.xid(2, 63)
    fake.recovery_action(0, 1)  # not registered anywhere
    fake.xid(0, 94)
    assert drain(event_set, gpus) == [(0, dbe, 0), (2, xid, 63), (0, xid, 94)]


def test_lost_gpu_queues_xid_79(fake: fakenvml.InProcessControl, event_set: Any) -> None:
    """Falling off the bus queues Xid 79 for the sets watching that GPU's Xids."""
    pynvml.nvmlDeviceRegisterEvents(handle(5), pynvml.nvmlEventTypeXidCriticalError, event_set)
    gpus = gpu_map()
    fake.lost(5)
    assert drain(event_set, gpus) == [(5, pynvml.nvmlEventTypeXidCriticalError, 79)]


def test_a_set_holding_a_lost_gpu_waits_with_gpu_is_lost(
    fake: fakenvml.InProcessControl, event_set: Any
) -> None:
    """nvml.h:9994: once the queued Xid 79 is taken, the wait answers GPU_IS_LOST (at once, not
    after the timeout) until the GPU is reset; then it times out as usual."""
    pynvml.nvmlDeviceRegisterEvents(handle(5), pynvml.nvmlEventTypeXidCriticalError, event_set)
    fake.lost(5)
    first = pynvml.nvmlEventSetWait_v2(event_set, 0)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlEventSetWait_v2(event_set, 120_000)
    fake.reset(5)
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(event_set, 0)
    assert (first.eventType, first.eventData) == (pynvml.nvmlEventTypeXidCriticalError, 79)


def test_a_waiter_blocked_on_a_set_wakes_when_its_gpu_is_lost(
    fake: fakenvml.InProcessControl, event_set: Any
) -> None:
    """A GPU lost while a thread blocks wakes it even where the set did not ask for Xids."""
    pynvml.nvmlDeviceRegisterEvents(handle(2), pynvml.nvmlEventTypeDoubleBitEccError, event_set)
    outcome: list[str] = []

    def wait() -> None:
        try:
            pynvml.nvmlEventSetWait_v2(event_set, 120_000)
            outcome.append("event")
        except pynvml.NVMLError as err:
            outcome.append(type(err).__name__)

    thread = threading.Thread(target=wait)
    thread.start()
    poll(lambda: fake.waiters() == 1, "the thread to block in nvmlEventSetWait_v2")
    fake.lost(2)
    thread.join(30)
    assert outcome == ["NVMLError_GpuIsLost"]


def test_registering_an_unsupported_type_is_refused(
    fake: fakenvml.InProcessControl, event_set: Any
) -> None:
    """Registering a type outside the GPU's supported mask raises NotSupported."""
    fake.set_value(0, "supported_events", pynvml.nvmlEventTypeXidCriticalError)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceRegisterEvents(handle(0), pynvml.nvmlEventTypeDoubleBitEccError, event_set)


# ---------------------------------------------------------------- child processes


CHILD_WAITS_FOR_XID = """
import json, pynvml
pynvml.nvmlInit()
es = pynvml.nvmlEventSetCreate()
for i in range(pynvml.nvmlDeviceGetCount()):
    pynvml.nvmlDeviceRegisterEvents(
        pynvml.nvmlDeviceGetHandleByIndex(i), pynvml.nvmlEventTypeXidCriticalError, es)
print("ready", flush=True)
data = pynvml.nvmlEventSetWait_v2(es, 120000)
print(json.dumps({"gpu": pynvml.nvmlDeviceGetIndex(data.device), "xid": data.eventData}))
"""

CHILD_DESCRIBES_GPUS = """
import json, pynvml
try:
    pynvml.nvmlInit()
except pynvml.NVMLError as err:
    print(json.dumps({"init": type(err).__name__}))
    raise SystemExit(0)
n = pynvml.nvmlDeviceGetCount()
handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
print(json.dumps({
    "uuids": [pynvml.nvmlDeviceGetUUID(h) for h in handles],
    "temps": [pynvml.nvmlDeviceGetTemperature(h, 0) for h in handles],
}))
"""


def child(snippet: str, env: dict[str, str]) -> subprocess.Popen[str]:
    """Start a Python child running ``snippet`` with ``env`` over the current environment."""
    return subprocess.Popen(
        [sys.executable, "-c", snippet],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run_child(snippet: str, env: dict[str, str]) -> tuple[dict[str, Any], str]:
    """Run a child to completion and return its JSON line and its stderr."""
    proc = child(snippet, env)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return json.loads(out), err


def test_child_on_ld_library_path_sees_an_xid_sent_over_the_socket(
    lib_dir: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    """A process started with agent_env loads the fake by LD_LIBRARY_PATH and gets the Xid."""
    sock = tmp_path / "nvml.sock"
    with child(CHILD_WAITS_FOR_XID, fakenvml.agent_env(lib_dir, sock)) as proc:
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline() == "ready\n"
            fakenvml.SocketControl(sock).xid(3, 79)
            out, err = proc.communicate(timeout=120)
        finally:
            proc.kill()
    assert json.loads(out) == {"gpu": 3, "xid": 79}, err


def test_socket_answers_values_and_errors(lib_dir: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """Over the socket ``get`` returns a value and a bad command raises FakeNvmlError."""
    sock = tmp_path / "nvml.sock"
    with child(CHILD_WAITS_FOR_XID, fakenvml.agent_env(lib_dir, sock)) as proc:
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline() == "ready\n"
            ctl = fakenvml.SocketControl(sock)
            ctl.set_value(1, "temperature", 66)
            ctl.reset(1)
            values = (ctl.get(1, "temperature"), ctl.reset_count(1))
            with pytest.raises(fakenvml.FakeNvmlError, match="unknown key 'warmth'"):
                ctl.set_value(1, "warmth", 1)
        finally:
            proc.kill()
    assert values == ("66", 1)


def test_socket_control_reports_a_missing_socket(tmp_path: pathlib.Path) -> None:
    """A socket nobody serves makes SocketControl raise after its timeout, naming the path."""
    sock = tmp_path / "nobody.sock"
    with pytest.raises(fakenvml.FakeNvmlError, match=re.escape(str(sock))):
        fakenvml.SocketControl(sock, timeout_s=0.2).xid(0, 79)


def test_scenario_and_seed_shape_the_child_gpus(
    lib_dir: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    """The scenario sets the count and values; different seeds give different UUIDs."""
    scenario = tmp_path / "scenario.txt"
    scenario.write_text(fakenvml.render_scenario(gpus=3, values={"*": {"temperature": 44}}))
    node_a, _ = run_child(
        CHILD_DESCRIBES_GPUS, fakenvml.agent_env(lib_dir, None, scenario, seed="node-a")
    )
    node_b, _ = run_child(
        CHILD_DESCRIBES_GPUS, fakenvml.agent_env(lib_dir, None, scenario, seed="node-b")
    )
    again_a, _ = run_child(
        CHILD_DESCRIBES_GPUS, fakenvml.agent_env(lib_dir, None, scenario, seed="node-a")
    )
    assert (node_a["temps"], len(set(node_a["uuids"]) | set(node_b["uuids"])), again_a) == (
        [44, 44, 44],
        6,
        node_a,
    )


def test_bad_scenario_fails_nvml_init_in_the_child(
    lib_dir: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    """A broken scenario makes nvmlInit fail and the reason is printed on stderr."""
    scenario = tmp_path / "scenario.txt"
    scenario.write_text("gpus 2\n\nthermal 1 warm\n")
    result, err = run_child(CHILD_DESCRIBES_GPUS, fakenvml.agent_env(lib_dir, None, scenario))
    assert (result, f"scenario {scenario} line 3: bad thermal state 'warm'" in err) == (
        {"init": "NVMLError_Unknown"},
        True,
    )


# ---------------------------------------------------------------- build


def test_build_is_cached(tmp_path: pathlib.Path) -> None:
    """A second build with the same source and flags reuses the library without recompiling."""
    first = fakenvml.build(tmp_path)
    library = first / fakenvml.SONAME
    mtime = library.stat().st_mtime_ns
    second = fakenvml.build(tmp_path)
    assert (second, library.stat().st_mtime_ns, first.name) == (
        first,
        mtime,
        fakenvml.source_digest(),
    )


def test_build_without_gcc_says_how_to_install_it(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no gcc on PATH, build raises an error that says how to install it."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(fakenvml.FakeNvmlError, match=re.escape("apt-get install gcc")):
        fakenvml.build(tmp_path / "cache")


# ---------------------------------------------------------------- older drivers


def _try(call: Any) -> Any:
    try:
        return call()
    except pynvml.NVMLError as err:
        return type(err).__name__


@pytest.mark.parametrize(
    ("branch", "expected"),
    [
        pytest.param(570, {"driver": "570.148.08", "events": 0xFE1F, "field_230": 0,
                           "memory_v2": "reserved", "event_reasons": 0},
                     id="R570 has every event type, the recovery action and both calls"),
        pytest.param(560, {"driver": "560.35.03", "events": 0x3E1F,
                           "field_230": pynvml.NVML_ERROR_NOT_SUPPORTED,
                           "memory_v2": "reserved", "event_reasons": 0},
                     id="R560 lacks GpuUnavailable and GpuRecoveryAction and field 230"),
        pytest.param(530, {"driver": "530.00.00", "events": 0x1F,
                           "field_230": pynvml.NVML_ERROR_NOT_SUPPORTED,
                           "memory_v2": "reserved", "event_reasons": "NVMLError_FunctionNotFound"},
                     id="R530 also lacks the clock event-reasons call"),
        pytest.param(470, {"driver": "470.256.02", "events": 0x1F,
                           "field_230": pynvml.NVML_ERROR_NOT_SUPPORTED,
                           "memory_v2": "NVMLError_FunctionNotFound",
                           "event_reasons": "NVMLError_FunctionNotFound"},
                     id="R470 also lacks nvmlMemory_v2"),
    ],
)  # fmt: skip
def test_the_library_pretends_to_be_an_older_driver(
    fake: fakenvml.InProcessControl, branch: int, expected: dict[str, Any]
) -> None:
    """`driver_branch N` takes away what drivers before that branch did not have."""
    fake.driver_branch(branch)
    h = handle(0)
    (field,) = pynvml.nvmlDeviceGetFieldValues(h, [230])
    memory = _try(lambda: pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2))
    actual = {
        "driver": pynvml.nvmlSystemGetDriverVersion(),
        "events": pynvml.nvmlDeviceGetSupportedEventTypes(h),
        "field_230": field.nvmlReturn or field.value.uiVal,
        "memory_v2": memory if isinstance(memory, str) else "reserved" * (memory.reserved > 0),
        "event_reasons": _try(lambda: pynvml.nvmlDeviceGetCurrentClocksEventReasons(h)),
    }
    assert expected == actual
    assert pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h) == 0
    fake.reset_all()
    assert pynvml.nvmlSystemGetDriverVersion() == "570.148.08"
