"""NVML through the real `nvidia-ml-py` bindings (module `pynvml`).

Readings come in tiers: cheap gauges every second through individual calls, counters every
10-30 s through one `nvmlDeviceGetFieldValues` batch per GPU (NVLink state included, one scope
per link), and Xid / ECC events continuously through an NVML event set waited on in a thread
(`EventWatcher`). A NOT_SUPPORTED reading is absent; GPU lost, reset required or an unknown
NVML error is recorded on the snapshot and makes the GPU Failed in the verdict core.

Everything here is synchronous and blocking (NVML calls can stall on a sick GPU); the
monitor runs it in worker threads.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import datetime as dt
import threading
from collections.abc import Callable
from typing import Any

import pynvml

from agent import errors, readings


def _abi(name: str, value: int) -> int:
    """An NVML constant: pynvml's when it defines it, else nvml.h's value.

    The numbers are the C library's ABI, fixed by nvml.h; an older nvidia-ml-py only lacks the
    name. Looking them up this way keeps the agent importable down to the floor pyproject.toml
    declares (tests/integration/agent/test_pynvml_floor.py installs that version and checks).
    """
    return int(getattr(pynvml, name, value))


NVML_ERROR_NO_DATA = _abi("NVML_ERROR_NO_DATA", 21)
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = _abi("NVML_ERROR_ARGUMENT_VERSION_MISMATCH", 25)
NVML_ERROR_DEPRECATED = _abi("NVML_ERROR_DEPRECATED", 26)
NVML_ERROR_NOT_READY = _abi("NVML_ERROR_NOT_READY", 27)
NVML_ERROR_GPU_NOT_FOUND = _abi("NVML_ERROR_GPU_NOT_FOUND", 28)
NVML_ERROR_INVALID_STATE = _abi("NVML_ERROR_INVALID_STATE", 29)
NVML_VALUE_TYPE_SIGNED_INT = _abi("NVML_VALUE_TYPE_SIGNED_INT", 5)
NVML_VALUE_TYPE_UNSIGNED_SHORT = _abi("NVML_VALUE_TYPE_UNSIGNED_SHORT", 6)
EVENT_GPU_UNAVAILABLE = _abi("nvmlEventTypeGpuUnavailableError", 0x4000)
EVENT_GPU_RECOVERY_ACTION = _abi("nvmlEventTypeGpuRecoveryAction", 0x8000)
NVLINK_MAX_LINKS = 36
"""NVML_NVLINK_MAX_LINKS of nvml.h today; older pynvml releases say 12 or 18."""
MEMORY_V2: int = pynvml.nvmlMemory_v2
"""nvmlMemory_v2's version word (nvml.h: sizeof(nvmlMemory_v2_t) | 2 << 24). Taken from pynvml
on purpose: reading memory the way DCGM does needs pynvml's `version=` argument (11.510+), so
an older pynvml fails here, at import, naming what it lacks (the declared floor)."""

# Errors that mean "this reading is not available here", not "the GPU is unhealthy".
_ABSENT = frozenset(
    {
        pynvml.NVML_ERROR_NOT_SUPPORTED,
        pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
        NVML_ERROR_NO_DATA,
        pynvml.NVML_ERROR_NO_PERMISSION,
        pynvml.NVML_ERROR_NOT_FOUND,
        pynvml.NVML_ERROR_INVALID_ARGUMENT,
        NVML_ERROR_NOT_READY,
        pynvml.NVML_ERROR_INSUFFICIENT_SIZE,
        NVML_ERROR_DEPRECATED,
        NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
        pynvml.NVML_ERROR_TIMEOUT,
        NVML_ERROR_INVALID_STATE,
    }
)
# A call this driver (or this pynvml) does not have: use the older one instead.
_NO_SUCH_CALL = frozenset(
    {
        pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
        pynvml.NVML_ERROR_NOT_SUPPORTED,
        NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
    }
)
NVML_ERROR_OPERATING_SYSTEM = _abi("NVML_ERROR_OPERATING_SYSTEM", 17)
NVML_ERROR_LIB_RM_VERSION_MISMATCH = _abi("NVML_ERROR_LIB_RM_VERSION_MISMATCH", 18)
NVML_ERROR_MEMORY = _abi("NVML_ERROR_MEMORY", 20)
NVML_ERROR_INSUFFICIENT_RESOURCES = _abi("NVML_ERROR_INSUFFICIENT_RESOURCES", 23)

HOST_SIDE_CAUSES: dict[int, str] = {
    pynvml.NVML_ERROR_UNINITIALIZED: "NVML was not initialised",
    pynvml.NVML_ERROR_NO_PERMISSION: "the agent lacks the permission (run it privileged)",
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED: "the NVIDIA driver is not loaded",
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: "libnvidia-ml.so could not be found or loaded",
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND: "this NVML library lacks a function the agent needs",
    NVML_ERROR_OPERATING_SYSTEM: "the operating system or a cgroup blocks the GPU device",
    NVML_ERROR_LIB_RM_VERSION_MISMATCH: (
        "the NVML library and the loaded driver differ in version (a driver upgrade without "
        "a reboot or a reload of the kernel module)"
    ),
    NVML_ERROR_MEMORY: "the host is out of memory",
    NVML_ERROR_INSUFFICIENT_RESOURCES: "the host ran out of a critical resource",
}
"""NVML errors that say the agent cannot see, not that a GPU is bad (nvml.h:1306-1336, go-nvml
2f9e261 `pkg/nvml/nvml.h`): no GPU reset fixes them. NO_PERMISSION and FUNCTION_NOT_FOUND
count here only where they stop the agent from seeing a GPU at all (initialisation,
enumeration); for one reading they mean that reading is absent."""

_KINDS = {
    pynvml.NVML_ERROR_GPU_IS_LOST: readings.NvmlErrorKind.GPU_IS_LOST,
    NVML_ERROR_GPU_NOT_FOUND: readings.NvmlErrorKind.GPU_NOT_FOUND,
    pynvml.NVML_ERROR_RESET_REQUIRED: readings.NvmlErrorKind.RESET_REQUIRED,
    pynvml.NVML_ERROR_INSUFFICIENT_POWER: readings.NvmlErrorKind.INSUFFICIENT_POWER,
    pynvml.NVML_ERROR_IRQ_ISSUE: readings.NvmlErrorKind.IRQ_ISSUE,
    pynvml.NVML_ERROR_CORRUPTED_INFOROM: readings.NvmlErrorKind.CORRUPTED_INFOROM,
    **dict.fromkeys(HOST_SIDE_CAUSES, readings.NvmlErrorKind.HOST_SIDE),
}
# Severity order when several calls in one pass fail differently.
_KIND_RANK = {
    readings.NvmlErrorKind.HOST_SIDE: 0,
    readings.NvmlErrorKind.UNKNOWN: 1,
    readings.NvmlErrorKind.CORRUPTED_INFOROM: 2,
    readings.NvmlErrorKind.RESET_REQUIRED: 3,
    readings.NvmlErrorKind.INSUFFICIENT_POWER: 4,
    readings.NvmlErrorKind.IRQ_ISSUE: 5,
    readings.NvmlErrorKind.GPU_NOT_FOUND: 6,
    readings.NvmlErrorKind.GPU_IS_LOST: 7,
}

FI_ECC_SBE_VOL = 3
FI_ECC_DBE_VOL = 4
FI_ECC_SBE_AGG = 5
FI_ECC_DBE_AGG = 6
FI_RETIRED_SBE = 29
FI_RETIRED_DBE = 30
FI_RETIRED_PENDING = 31
FI_NVLINK_CRC_FLIT = 38
FI_NVLINK_CRC_DATA = 45
FI_NVLINK_REPLAY = 52
FI_NVLINK_RECOVERY = 59
FI_MEMORY_TEMP = 82
FI_TOTAL_ENERGY = 83
FI_PCIE_REPLAY = 94
FI_REMAP_COR = 142
FI_REMAP_UNC = 143
FI_REMAP_PENDING = 144
FI_REMAP_FAILURE = 145
FI_NVLINK_STATE = 165
FI_RECOVERY_ACTION = 230

COUNTER_FIELDS: tuple[int, ...] = (
    FI_ECC_SBE_VOL,
    FI_ECC_DBE_VOL,
    FI_ECC_SBE_AGG,
    FI_ECC_DBE_AGG,
    FI_RETIRED_SBE,
    FI_RETIRED_DBE,
    FI_RETIRED_PENDING,
    FI_NVLINK_CRC_FLIT,
    FI_NVLINK_CRC_DATA,
    FI_NVLINK_REPLAY,
    FI_NVLINK_RECOVERY,
    FI_MEMORY_TEMP,
    FI_TOTAL_ENERGY,
    FI_PCIE_REPLAY,
    FI_REMAP_COR,
    FI_REMAP_UNC,
    FI_REMAP_PENDING,
    FI_REMAP_FAILURE,
    FI_RECOVERY_ACTION,
)
_COUNTER_NAMES: dict[int, str] = {
    FI_ECC_SBE_VOL: "ecc_sbe_volatile",
    FI_ECC_DBE_VOL: "ecc_dbe_volatile",
    FI_ECC_SBE_AGG: "ecc_sbe_aggregate",
    FI_ECC_DBE_AGG: "ecc_dbe_aggregate",
    FI_RETIRED_SBE: "retired_pages_sbe",
    FI_RETIRED_DBE: "retired_pages_dbe",
    FI_NVLINK_CRC_FLIT: "nvlink_crc_flit_errors",
    FI_NVLINK_CRC_DATA: "nvlink_crc_data_errors",
    FI_NVLINK_REPLAY: "nvlink_replay_errors",
    FI_NVLINK_RECOVERY: "nvlink_recovery_errors",
    FI_TOTAL_ENERGY: "energy_mj",
    FI_PCIE_REPLAY: "pcie_replay_count",
    FI_REMAP_COR: "remapped_rows_correctable",
    FI_REMAP_UNC: "remapped_rows_uncorrectable",
    FI_RECOVERY_ACTION: "recovery_action",
}
_BOOL_FIELDS: dict[int, str] = {
    FI_RETIRED_PENDING: "retired_pages_pending",
    FI_REMAP_PENDING: "remap_pending",
    FI_REMAP_FAILURE: "remap_failure",
}

EVENT_MASK = (
    pynvml.nvmlEventTypeXidCriticalError
    | pynvml.nvmlEventTypeDoubleBitEccError
    | EVENT_GPU_UNAVAILABLE
    | EVENT_GPU_RECOVERY_ACTION
)
"""What the agent registers for, masked by what each GPU supports: a driver before R565 has
neither GpuUnavailableError nor GpuRecoveryAction, and then Xids and ECC events still come."""

EVENT_XID: int = pynvml.nvmlEventTypeXidCriticalError
EVENTS_NEEDING_COUNTERS: int = pynvml.nvmlEventTypeDoubleBitEccError | EVENT_GPU_RECOVERY_ACTION
"""Events after which the counter tier is read at once (ECC, remap, recovery action)."""

MIB = 1024 * 1024


FALLBACK = object()
"""What `Probe._read` returns when the driver lacks the call (use the older one)."""


class NvmlUnavailableError(errors.AgentError):
    """NVML could not be initialised (no driver, no library); the agent reports GPUs Unknown."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        """The NVML error code, when NVML answered with one."""


@dataclasses.dataclass
class Device:
    """One enumerated GPU and what does not change while the driver is loaded."""

    index: int
    handle: Any
    uuid: str
    name: str
    pci_bus_id: str
    serial: str
    nvlinks: tuple[int, ...] = ()
    address: int = 0


@dataclasses.dataclass
class Probe:
    """The NVML side of the agent: enumerate, read the tiers, classify errors."""

    errors: dict[str, int] = dataclasses.field(default_factory=dict)
    """Probe errors by `<tier>:<NVML error name>` since start (`taugrid_gpu_probe_errors`)."""
    devices: list[Device] = dataclasses.field(default_factory=list)
    driver_version: str = ""
    enumeration_errors: dict[int, str] = dataclasses.field(default_factory=dict)
    """GPU index -> why it could not be enumerated at start."""
    enumeration_kinds: dict[int, readings.NvmlErrorKind] = dataclasses.field(default_factory=dict)
    """GPU index -> what its enumeration error says (`classify_enumeration`)."""
    memory_version: int | None = None
    """Which nvmlMemory struct the driver answers (2, or 1 on a driver/pynvml without v2)."""
    clock_reasons_call: str = ""
    """Which clock-event call answers (`EventReasons` from R535, else `ThrottleReasons`)."""
    _started: bool = False

    def start(self) -> None:
        """Initialise NVML and enumerate the GPUs."""
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as err:
            raise NvmlUnavailableError(unavailable_why("initialisation", err), err.value) from err
        self._started = True
        try:
            self.driver_version = _text(pynvml.nvmlSystemGetDriverVersion())
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as err:
            # Initialised but unable to count GPUs (a driver/library mismatch answers here):
            # the agent cannot see, and says why, rather than dying.
            self.shutdown()
            raise NvmlUnavailableError(unavailable_why("GPU count", err), err.value) from err
        self.devices = []
        self.enumeration_errors = {}
        self.enumeration_kinds = {}
        for index in range(count):
            try:
                self.devices.append(self._device(index))
            except pynvml.NVMLError as err:
                # A GPU that cannot even be enumerated (GPU_IS_LOST, INSUFFICIENT_POWER,
                # IRQ_ISSUE at nvmlDeviceGetHandleByIndex, nvml.h:4653-4656) is a finding of
                # its own, keyed by its index (`verdicts.missing_gpus`).
                self._count("identity", err)
                self.enumeration_errors[index] = str(err)
                self.enumeration_kinds[index] = classify_enumeration(err)

    def rediscover(self) -> list[Device]:
        """Try again to enumerate the GPUs that failed at start; return those that now answer.

        A GPU that was off the bus when the agent started answers again after a reset; without
        this it would stay invisible until the agent restarts.
        """
        found: list[Device] = []
        for index in sorted(self.enumeration_errors):
            try:
                device = self._device(index)
            except pynvml.NVMLError as err:
                self.enumeration_errors[index] = str(err)
                self.enumeration_kinds[index] = classify_enumeration(err)
                continue
            del self.enumeration_errors[index]
            self.enumeration_kinds.pop(index, None)
            found.append(device)
        if found:
            self.devices = sorted([*self.devices, *found], key=lambda d: d.index)
        return found

    def _device(self, index: int) -> Device:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        device = Device(
            index=index,
            handle=handle,
            uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
            name=_text(self._read("identity", pynvml.nvmlDeviceGetName, handle) or ""),
            pci_bus_id=_text(pynvml.nvmlDeviceGetPciInfo(handle).busId),
            serial=_text(self._read("identity", pynvml.nvmlDeviceGetSerial, handle) or ""),
            address=ctypes.cast(handle, ctypes.c_void_p).value or 0,
        )
        # Discover which NVLinks exist once; counters then ask only for those.
        scopes = [(FI_NVLINK_STATE, link) for link in range(NVLINK_MAX_LINKS)]
        try:
            values = pynvml.nvmlDeviceGetFieldValues(handle, scopes)
        except pynvml.NVMLError:
            return device
        device.nvlinks = tuple(v.scopeId for v in values if v.nvmlReturn == pynvml.NVML_SUCCESS)
        return device

    def mig_parent(self, mig_uuid: str) -> str | None:
        """The UUID of the GPU a MIG device (`MIG-…`) belongs to, or None when NVML cannot say."""
        parent_of = getattr(pynvml, "nvmlDeviceGetDeviceHandleFromMigDeviceHandle", None)
        if parent_of is None:
            return None
        try:
            handle = pynvml.nvmlDeviceGetHandleByUUID(mig_uuid)
            return _text(pynvml.nvmlDeviceGetUUID(parent_of(handle)))
        except pynvml.NVMLError:
            return None

    def shutdown(self) -> None:
        """Release NVML."""
        if self._started:
            self._started = False
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlShutdown()

    def _count(self, tier: str, err: pynvml.NVMLError) -> None:
        key = f"{tier}:{_error_name(err)}"
        self.errors[key] = self.errors.get(key, 0) + 1

    def _read(
        self,
        tier: str,
        fn: Callable[..., Any],
        *args: Any,
        fallback_on: frozenset[int] = frozenset(),
    ) -> Any:
        """Call NVML; return None for an absent reading, raise `_GpuError` for a sick GPU.

        An error in `fallback_on` (the driver has no such call) returns `FALLBACK` instead,
        uncounted, so the caller can use the older call.
        """
        try:
            return fn(*args)
        except pynvml.NVMLError as err:
            if int(err.value) in fallback_on:
                return FALLBACK
            self._count(tier, err)
            kind = classify(err)
            if kind is None:
                return None
            raise _GpuError(kind, f"{fn.__name__}: {err}") from err

    def gauges(self, device: Device) -> dict[str, Any]:
        """Read the 1 s tier for one GPU."""
        h = device.handle
        out: dict[str, Any] = {}
        out["temperature_c"] = self._read(
            "gauges", pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU
        )
        power_mw = self._read("gauges", pynvml.nvmlDeviceGetPowerUsage, h)
        out["power_w"] = None if power_mw is None else power_mw / 1000.0
        util = self._read("gauges", pynvml.nvmlDeviceGetUtilizationRates, h)
        if util is not None:
            out["utilization_gpu_pct"] = float(util.gpu)
            out["utilization_memory_pct"] = float(util.memory)
        enc = self._read("gauges", pynvml.nvmlDeviceGetEncoderUtilization, h)
        out["encoder_util_pct"] = None if enc is None else float(enc[0])
        dec = self._read("gauges", pynvml.nvmlDeviceGetDecoderUtilization, h)
        out["decoder_util_pct"] = None if dec is None else float(dec[0])
        mem = self._memory(h)
        if mem is not None:
            # DCGM floors each to whole MiB (DcgmCacheManager ReadAndCacheFBMemoryInfo).
            out["fb_total_mib"] = float(mem.total // MIB)
            out["fb_used_mib"] = float(mem.used // MIB)
            out["fb_free_mib"] = float(mem.free // MIB)
            reserved = getattr(mem, "reserved", None)
            out["fb_reserved_mib"] = None if reserved is None else float(reserved // MIB)
        out["sm_clock_mhz"] = self._read(
            "gauges", pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_SM
        )
        out["mem_clock_mhz"] = self._read(
            "gauges", pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_MEM
        )
        out["clock_event_reasons"] = self._clock_reasons(h)
        return out

    def _memory(self, handle: Any) -> Any:
        """nvmlMemory_v2 as DCGM reads it (used excludes reserved), else the v1 struct.

        v2 exists from R510; v1 counts the driver's reserved memory as used and has no
        `reserved`. The first NOT_SUPPORTED / FUNCTION_NOT_FOUND / version mismatch (a driver
        before R510) switches this probe to v1 for good.
        """
        if self.memory_version != 1:
            mem = self._read(
                "gauges", pynvml.nvmlDeviceGetMemoryInfo, handle, MEMORY_V2,
                fallback_on=_NO_SUCH_CALL,
            )  # fmt: skip
            if mem is not FALLBACK:
                self.memory_version = 2
                return mem
        self.memory_version = 1
        return self._read("gauges", pynvml.nvmlDeviceGetMemoryInfo, handle)

    def _clock_reasons(self, handle: Any) -> int | None:
        """The clock-event reasons: `...EventReasons` (R535+), else `...ThrottleReasons`."""
        newer = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        if newer is not None and self.clock_reasons_call != "ThrottleReasons":
            value = self._read(
                "gauges", newer, handle,
                fallback_on=frozenset({pynvml.NVML_ERROR_FUNCTION_NOT_FOUND}),
            )  # fmt: skip
            if value is not FALLBACK:
                self.clock_reasons_call = "EventReasons"
                return None if value is None else int(value)
        self.clock_reasons_call = "ThrottleReasons"
        value = self._read("gauges", pynvml.nvmlDeviceGetCurrentClocksThrottleReasons, handle)
        return None if value is None else int(value)

    def counters(self, device: Device) -> dict[str, Any]:
        """Read the counter tier for one GPU in a single field-values batch."""
        ids: list[int | tuple[int, int]] = list(COUNTER_FIELDS)
        ids += [(FI_NVLINK_STATE, link) for link in device.nvlinks]
        values = self._read("counters", pynvml.nvmlDeviceGetFieldValues, device.handle, ids)
        out: dict[str, Any] = {}
        if values is None:
            return out
        links: dict[int, bool] = {}
        worst: tuple[readings.NvmlErrorKind, str] | None = None
        for v in values:
            if v.nvmlReturn != pynvml.NVML_SUCCESS:
                err = pynvml.NVMLError(v.nvmlReturn)
                self._count("counters", err)
                kind = classify(err)
                if kind is not None and (worst is None or _KIND_RANK[kind] > _KIND_RANK[worst[0]]):
                    worst = (kind, f"field {v.fieldId}: {err}")
                continue
            value = _field_value(v)
            if v.fieldId == FI_NVLINK_STATE:
                links[int(v.scopeId)] = bool(value)
            elif v.fieldId == FI_MEMORY_TEMP:
                out["memory_temperature_c"] = float(value)
            elif v.fieldId in _BOOL_FIELDS:
                out[_BOOL_FIELDS[v.fieldId]] = bool(value)
            elif v.fieldId in _COUNTER_NAMES:
                out[_COUNTER_NAMES[v.fieldId]] = int(value)
        if worst is not None:
            raise _GpuError(*worst)
        if links:
            out["nvlink_up"] = links
        return out

    def snapshot(
        self,
        device: Device,
        now: dt.datetime,
        *,
        counters: dict[str, Any] | None,
        counters_at: dt.datetime | None,
    ) -> tuple[readings.GpuSnapshot, dict[str, Any] | None]:
        """Read the gauges (and counters when given none cached) into a snapshot.

        Returns the snapshot and the counter readings to cache until the next counter pass.
        """
        base: dict[str, Any] = {
            "index": device.index,
            "uuid": device.uuid,
            "name": device.name,
            "pci_bus_id": device.pci_bus_id,
            "serial": device.serial,
            "taken_at": now,
        }
        try:
            if counters is None:
                counters = self.counters(device)
                counters_at = now
            fields = self.gauges(device)
        except _GpuError as err:
            return readings.GpuSnapshot(
                **base, nvml_error=err.kind, nvml_error_detail=err.detail
            ), None
        return readings.GpuSnapshot(**base, **fields, **counters, counters_at=counters_at), counters


class _GpuError(Exception):
    def __init__(self, kind: readings.NvmlErrorKind, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind
        self.detail = detail


def classify(err: pynvml.NVMLError) -> readings.NvmlErrorKind | None:
    """Map an NVML error to a GPU fault kind, or None when the reading is merely absent."""
    code = int(err.value)
    if code in _ABSENT:
        return None
    return _KINDS.get(code, readings.NvmlErrorKind.UNKNOWN)


def classify_enumeration(err: pynvml.NVMLError) -> readings.NvmlErrorKind:
    """Map an error of enumerating a GPU (handle, UUID, PCI info) to what it says.

    Unlike a reading, an absent answer here is no answer at all: NO_PERMISSION and
    FUNCTION_NOT_FOUND mean the agent cannot see the GPU (host-side), anything unlisted is
    UNKNOWN.
    """
    code = int(err.value)
    if code in HOST_SIDE_CAUSES:
        return readings.NvmlErrorKind.HOST_SIDE
    return _KINDS.get(code, readings.NvmlErrorKind.UNKNOWN)


def unavailable_why(step: str, err: pynvml.NVMLError) -> str:
    """Say why NVML cannot be used, naming the cause nvml.h gives for the code."""
    cause = HOST_SIDE_CAUSES.get(int(err.value))
    text = f"NVML {step} failed: {err} (NVML error {int(err.value)})"
    return f"{text}: {cause}; no GPU reset fixes this" if cause else text


def _error_name(err: pynvml.NVMLError) -> str:
    return type(err).__name__.removeprefix("NVMLError_") or f"Code{err.value}"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _field_value(v: Any) -> float | int:
    kind = v.valueType
    if kind == pynvml.NVML_VALUE_TYPE_DOUBLE:
        return float(v.value.dVal)
    if kind == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT:
        return int(v.value.uiVal)
    if kind == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG:
        return int(v.value.ulVal)
    if kind == pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG:
        return int(v.value.sllVal)
    if kind == NVML_VALUE_TYPE_SIGNED_INT:
        return int(v.value.siVal)
    if kind == NVML_VALUE_TYPE_UNSIGNED_SHORT:
        return int(v.value.usVal)
    return int(v.value.ullVal)


@dataclasses.dataclass(frozen=True, slots=True)
class NvmlEvent:
    """What the event thread hands to the monitor."""

    gpu_index: int | None
    event_type: int
    data: int
    at: dt.datetime
    error: readings.NvmlErrorKind | None = None
    detail: str = ""


class EventWatcher:
    """Wait on an NVML event set in a thread; hand each event to `deliver` (thread-safe).

    The thread survives a lost GPU: a wait that fails with a GPU-level error is reported as an
    `NvmlEvent` carrying the error kind, and the thread keeps waiting (re-creating the set after
    repeated failures), so the other GPUs' events keep flowing.
    """

    def __init__(
        self,
        devices: list[Device],
        deliver: Callable[[NvmlEvent], None],
        *,
        wait_ms: int = 500,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self._devices = list(devices)
        self._deliver = deliver
        self._wait_ms = wait_ms
        self._clock = clock
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._retry = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nvml-events", daemon=True)
        self.registered: dict[int, int] = {}
        """GPU index -> event mask actually registered (a GPU may not support every type)."""
        self.unsupported: set[int] = set()
        """GPUs that support none of the event types we watch (nothing to register)."""

    def add_devices(self, devices: list[Device]) -> None:
        """Watch GPUs enumerated after start (thread-safe); they register on the next wait."""
        with self._lock:
            known = {d.index for d in self._devices}
            self._devices.extend(d for d in devices if d.index not in known)
        self._retry.set()

    def retry_registration(self) -> None:
        """Register again the GPUs whose registration failed (thread-safe), e.g. after a reset.

        A GPU that was lost when the set was created has no events registered; once it answers
        again the monitor asks for this, so its Xids arrive through NVML without a restart.
        """
        self._retry.set()

    def missing(self) -> set[int]:
        """Return the GPUs that should have events registered but do not."""
        with self._lock:
            indexes = {d.index for d in self._devices}
        return indexes - set(self.registered) - self.unsupported

    def start(self) -> None:
        """Start waiting."""
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Ask the thread to stop and wait for it (one wait period at most)."""
        self._stop.set()
        self._thread.join(timeout_s)

    @property
    def alive(self) -> bool:
        """Say whether the thread is still running."""
        return self._thread.is_alive()

    def _register(self) -> Any:
        event_set = pynvml.nvmlEventSetCreate()
        self.registered = {}
        self._register_missing(event_set)
        return event_set

    def _register_missing(self, event_set: Any) -> None:
        """Register every watched GPU that is not registered yet on `event_set`."""
        with self._lock:
            devices = list(self._devices)
        for device in devices:
            if device.index in self.registered or device.index in self.unsupported:
                continue
            try:
                supported = pynvml.nvmlDeviceGetSupportedEventTypes(device.handle)
            except pynvml.NVMLError:
                supported = EVENT_MASK
            mask = EVENT_MASK & supported
            if not mask:
                self.unsupported.add(device.index)
                continue
            try:
                pynvml.nvmlDeviceRegisterEvents(device.handle, mask, event_set)
            except pynvml.NVMLError as err:
                kind = classify(err)
                if kind is not None:
                    self._deliver(
                        NvmlEvent(device.index, 0, 0, self._clock(), kind, f"register: {err}")
                    )
                continue
            self.registered = {**self.registered, device.index: mask}

    def _addresses(self) -> dict[int, int]:
        with self._lock:
            return {d.address: d.index for d in self._devices}

    def _run(self) -> None:
        by_address = self._addresses()
        event_set = None
        failures = 0
        while not self._stop.is_set():
            if event_set is None:
                self._retry.clear()
                try:
                    event_set = self._register()
                except pynvml.NVMLError as err:
                    self._deliver(
                        NvmlEvent(None, 0, 0, self._clock(), classify(err), f"event set: {err}")
                    )
                    self._stop.wait(1.0)
                    continue
                by_address = self._addresses()
            elif self._retry.is_set():
                self._retry.clear()
                self._register_missing(event_set)
                by_address = self._addresses()
            try:
                data = pynvml.nvmlEventSetWait_v2(event_set, self._wait_ms)
            except pynvml.NVMLError as err:
                if int(err.value) == pynvml.NVML_ERROR_TIMEOUT:
                    failures = 0
                    continue
                failures += 1
                self._deliver(NvmlEvent(None, 0, 0, self._clock(), classify(err), f"wait: {err}"))
                if failures >= 3:
                    _free(event_set)
                    event_set = None
                    failures = 0
                self._stop.wait(min(0.1 * 2**failures, 2.0))
                continue
            failures = 0
            address = ctypes.cast(data.device, ctypes.c_void_p).value or 0
            self._deliver(
                NvmlEvent(
                    gpu_index=by_address.get(address),
                    event_type=int(data.eventType),
                    data=int(data.eventData),
                    at=self._clock(),
                )
            )
        if event_set is not None:
            _free(event_set)


def _free(event_set: Any) -> None:
    with contextlib.suppress(pynvml.NVMLError):
        pynvml.nvmlEventSetFree(event_set)
