"""What one probe pass publishes, and the heartbeat built from it (pure).

The probe loop (`agent.monitoring`) publishes a frozen `View` after each pass; metrics,
`/v1/gpus` and the reporter read it and never NVML. `build_heartbeat` turns a view into the
wire heartbeat, so the reporter's I/O module holds no decisions of its own.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

from agent import attribution, latching, readings, verdicts
from shared import heartbeat


@dataclasses.dataclass(frozen=True)
class View:
    """The last probe pass, as everything that serves data reads it."""

    node_name: str
    boot_id: str
    taken_at: dt.datetime | None = None
    driver_version: str = ""
    nvml_available: bool = False
    nvml_detail: str = "not started"
    snapshots: tuple[readings.GpuSnapshot, ...] = ()
    verdicts: tuple[verdicts.GpuVerdict, ...] = ()
    state: latching.NodeState = dataclasses.field(default_factory=latching.NodeState)
    recent_events: dict[int, tuple[readings.XidEvent, ...]] = dataclasses.field(
        default_factory=dict
    )
    last_xid: dict[int, int] = dataclasses.field(default_factory=dict)
    last_diag: readings.DiagResult | None = None
    last_health: readings.HealthCheck | None = None
    dcgm_status: readings.DcgmStatus = dataclasses.field(
        default_factory=lambda: readings.DcgmStatus(False, "not started", "")
    )
    diag_running: int | None = None
    probe_seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    probe_errors: dict[str, int] = dataclasses.field(default_factory=dict)
    kmsg_detail: str = ""
    events_registered: int = 0
    """GPUs whose NVML event registration succeeded (Xid events before that are kmsg-only)."""
    nvml_calls: dict[str, str] = dataclasses.field(default_factory=dict)
    """Which NVML variants this driver answers: `memoryInfo` (v2/v1), `clockReasons`
    (EventReasons/ThrottleReasons), `eventTypes` (the mask registered, per GPU 0)."""
    enumeration_errors: dict[int, str] = dataclasses.field(default_factory=dict)
    """GPU index -> why NVML could not enumerate it (retried every counter pass)."""
    state_detail: str = ""
    """What is wrong with the state file (set aside at start, or not writable); '' when fine."""
    pods: attribution.Attribution = dataclasses.field(default_factory=attribution.Attribution)
    """Which pod each GPU is allocated to (the kubelet's PodResources, its own tier)."""
    attribution_status: readings.AttributionStatus = dataclasses.field(
        default_factory=lambda: readings.AttributionStatus(False, "not started")
    )


def build_heartbeat(
    view: View,
    *,
    interval_s: float,
    agent_url: str,
    sequence: int,
    now: dt.datetime,
) -> heartbeat.Heartbeat:
    """Turn a view into the wire heartbeat (pure)."""
    by_index = {s.index: s for s in view.snapshots}
    gpus: list[heartbeat.GpuReport] = []
    for v in view.verdicts:
        s = by_index.get(v.index)
        readings = heartbeat.GpuReadings()
        if s is not None and s.nvml_error is None:
            down = (
                sum(1 for up in s.nvlink_up.values() if not up) if s.nvlink_up is not None else None
            )
            readings = heartbeat.GpuReadings(
                temperature_c=s.temperature_c,
                power_w=s.power_w,
                utilization_pct=s.utilization_gpu_pct,
                memory_used_mib=s.fb_used_mib,
                ecc_uncorrected_volatile=s.ecc_dbe_volatile,
                ecc_corrected_volatile=s.ecc_sbe_volatile,
                remapped_rows_pending=s.remap_pending,
                remapped_rows_failure=s.remap_failure,
                pcie_replay_count=s.pcie_replay_count,
                nvlinks_down=down,
            )
        gpus.append(
            heartbeat.GpuReport(
                index=v.index,
                uuid=v.uuid,
                name=s.name if s else "",
                pci_bus_id=s.pci_bus_id if s else v.pci_bus_id,
                verdict=v.verdict,
                action=v.action,
                reasons=list(v.reasons),
                readings=readings,
            )
        )
    return heartbeat.Heartbeat(
        schema_version=heartbeat.SCHEMA_VERSION,
        node_name=view.node_name,
        boot_id=view.boot_id[:64],
        agent_url=agent_url,
        interval_s=interval_s,
        sequence=sequence,
        sent_at=now,
        driver_version=view.driver_version,
        dcgm_available=view.dcgm_status.available,
        gpus=gpus,
    )
