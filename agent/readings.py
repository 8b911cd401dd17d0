"""What the probes saw: per-GPU snapshots, Xid events, DCGM health and diagnostic results.

These are the inputs of the pure verdict core (`agent.verdicts`) and what `/v1/gpus` shows. Every
reading is optional: `None` means the GPU or driver does not support it (NVML NOT_SUPPORTED), which
is an absence, never an error.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
from typing import Literal

from agent import wire


class NvmlErrorKind(enum.StrEnum):
    """The NVML failures the verdict core tells apart (nvml.h `nvmlReturn_t`, go-nvml 2f9e261).

    Most say something about the GPU. `HOST_SIDE` says the agent cannot see: the driver is not
    loaded, library and driver differ, the OS or a cgroup blocks the device, the host is out of
    memory; no GPU reset fixes any of those, so it is reported Unknown and never latched.
    """

    GPU_IS_LOST = "GpuIsLost"
    GPU_NOT_FOUND = "GpuNotFound"
    RESET_REQUIRED = "ResetRequired"
    INSUFFICIENT_POWER = "InsufficientPower"
    """nvml.h: "A device's external power cables are not properly attached" (8)."""
    IRQ_ISSUE = "IrqIssue"
    """nvml.h: "NVIDIA Kernel detected an interrupt issue with a GPU" (11)."""
    CORRUPTED_INFOROM = "CorruptedInforom"
    """nvml.h: "infoROM is corrupted" (14)."""
    HOST_SIDE = "HostSide"
    UNKNOWN = "Unknown"


class MissingGpu(wire.WireModel):
    """A GPU the node has that NVML does not give the agent: it failed at
    `nvmlDeviceGetHandleByIndex`, or the PCI bus (or the device plugin's count) has more NVIDIA
    GPUs than NVML enumerates, or NVML cannot be used at all and the PCI bus lists it."""

    index: int | None = None
    """NVML's index when the enumeration error names one."""
    pci_bus_id: str = ""
    """The PCI address (`0000:07:00.0`) when the PCI bus names one."""
    error: NvmlErrorKind | None = None
    """What NVML said; None when NVML does not list the GPU at all."""
    detail: str = ""
    expected: bool = False
    """Counted only from the expected GPU count: not even the PCI bus shows it."""


class XidSource(enum.StrEnum):
    """Where an Xid was seen; the same Xid from both sources counts once."""

    NVML = "Nvml"
    KMSG = "Kmsg"


class GpuSnapshot(wire.WireModel):
    """One probe pass over one GPU. Units are in the field names."""

    index: int
    uuid: str
    name: str = ""
    pci_bus_id: str = ""
    serial: str = ""
    taken_at: dt.datetime
    nvml_error: NvmlErrorKind | None = None
    nvml_error_detail: str = ""
    # Cheap gauges (1 s tier).
    temperature_c: float | None = None
    memory_temperature_c: float | None = None
    power_w: float | None = None
    utilization_gpu_pct: float | None = None
    utilization_memory_pct: float | None = None
    encoder_util_pct: float | None = None
    decoder_util_pct: float | None = None
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    fb_total_mib: float | None = None
    fb_used_mib: float | None = None
    fb_free_mib: float | None = None
    fb_reserved_mib: float | None = None
    clock_event_reasons: int | None = None
    # Counters (10-30 s tier, nvmlDeviceGetFieldValues batches).
    energy_mj: int | None = None
    ecc_sbe_volatile: int | None = None
    ecc_dbe_volatile: int | None = None
    ecc_sbe_aggregate: int | None = None
    ecc_dbe_aggregate: int | None = None
    retired_pages_sbe: int | None = None
    retired_pages_dbe: int | None = None
    retired_pages_pending: bool | None = None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    pcie_replay_count: int | None = None
    nvlink_up: dict[int, bool] | None = None
    nvlink_crc_flit_errors: int | None = None
    nvlink_crc_data_errors: int | None = None
    nvlink_replay_errors: int | None = None
    nvlink_recovery_errors: int | None = None
    recovery_action: int | None = None
    counters_at: dt.datetime | None = None


class XidEvent(wire.WireModel):
    """One Xid, from the NVML event set or a kernel-log line."""

    xid: int
    at: dt.datetime
    source: XidSource
    gpu_index: int | None = None
    pci_bus_id: str = ""
    message: str = ""
    kmsg_seq: int | None = None
    unit: str = ""
    """Xid 144-150: the subcode unit the kernel-log line names (`NETIR_LINK_EVT`)."""
    intr_info: int | None = None
    """Xid 144-150: the IntrInfo register of the kernel-log line (NVML's event lacks it)."""
    error_status: int | None = None
    """Xid 144-150: the error-status register of the kernel-log line."""
    recovery_action: int | None = None
    """Xid 154: the recovery action the kernel-log line says it changed to."""


class SxidEvent(wire.WireModel):
    """One NVSwitch SXid kernel-log line: `nvidia-nvswitchN: SXid (PCI:…): NNNNN, Fatal, Link L`."""

    sxid: int
    fatal: bool
    at: dt.datetime
    switch: int | None = None
    pci_bus_id: str = ""
    link: int | None = None
    message: str = ""
    kmsg_seq: int | None = None


class DiagStatus(enum.StrEnum):
    """A DCGM diagnostic outcome for one GPU (DCGM's own strings, normalised)."""

    PASS = "Pass"  # noqa: S105 - a test outcome, not a password
    WARN = "Warn"
    FAIL = "Fail"
    SKIP = "Skip"


class DiagFinding(wire.WireModel):
    """One failed or warned test for one GPU (or for the node: see `DiagResult.node_findings`)."""

    test: str
    status: DiagStatus
    message: str = ""
    error_id: int | None = None
    severity: int | None = None
    """DCGM error severity: MONITOR=1, ISOLATE=2, UNKNOWN=3, TRIAGE=4, CONFIG=5, RESET=6; the one
    that decides among `severities` by DCGM's order (`agent.dcgmerrors.precedence`)."""
    severities: tuple[int, ...] = ()
    """Every error's severity as `dcgmi` judges it (an ISOLATE-row code is ISOLATE)."""
    error_ids: tuple[int, ...] = ()
    """Every error's `DCGM_FR_*` code, in the order printed."""
    category: int | None = None
    """DCGM error category (`DCGM_FR_EC_*`), when the layout prints one (3.3 on)."""


class GpuDiag(wire.WireModel):
    """The result of one diagnostic for one GPU."""

    gpu_index: int
    status: DiagStatus
    findings: tuple[DiagFinding, ...] = ()


class DiagResult(wire.WireModel):
    """One `dcgmi diag -r N -j` run."""

    level: int
    started_at: dt.datetime
    finished_at: dt.datetime
    overall: DiagStatus
    gpus: tuple[GpuDiag, ...] = ()
    error: str = ""
    """Set when the run itself failed (timeout, dcgmi error, runtime_error); no GPU verdict then."""
    dcgm_version: str = ""
    node_findings: tuple[DiagFinding, ...] = ()
    """Failures tied to no GPU: the software/deployment checks of 3.x, results without an
    entity or of another entity group (CPU) and errors only in a 4.x `test_summary`. They
    concern every GPU of the run, never GPU 0 in particular."""
    layout: str = ""
    """Which dcgmi JSON layout was read: `4.x`, `3.3` (gpu_id, warning objects) or `3.0-3.2`
    (gpu_ids, warnings as one string)."""


HealthValue = Literal["Healthy", "Warning", "Failure", "Unknown"]
"""DCGM's health strings; `Unknown` stands for its "Internal error"."""


class GpuHealth(wire.WireModel):
    """`dcgmi health -c -j` for one GPU."""

    gpu_index: int
    value: HealthValue
    incidents: tuple[str, ...] = ()


class EntityHealth(wire.WireModel):
    """`dcgmi health -c -j` for an entity that is not a GPU (an NVSwitch, a CPU)."""

    entity: str
    """`<group> <id>`, as DCGM names it (`Switch 0`)."""
    value: HealthValue
    incidents: tuple[str, ...] = ()


class HealthCheck(wire.WireModel):
    """One `dcgmi health -c -j` run."""

    at: dt.datetime
    overall: HealthValue
    gpus: tuple[GpuHealth, ...] = ()
    others: tuple[EntityHealth, ...] = ()
    """Entities that are not GPUs; a failure there concerns the whole node."""


@dataclasses.dataclass(frozen=True, slots=True)
class DcgmStatus:
    """What `/v1/gpus` says about DCGM."""

    available: bool
    detail: str
    hostengine: str
    failures: int = 0
    """dcgmi calls that failed in a row."""
    retry_at: dt.datetime | None = None
    """When the next attempt is due while DCGM is unavailable."""
    rearmed: int = 0
    """How often the health watches were set again (a host-engine restart, a failed check)."""
    last_check_at: dt.datetime | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class AttributionStatus:
    """What `/v1/gpus` says about pod attribution."""

    enabled: bool
    detail: str
    socket: str = ""
    refreshed_at: dt.datetime | None = None
    client: dict[str, str] = dataclasses.field(default_factory=dict)
    """Where the generated client came from (module, version, go.sum hash, proto digest)."""
