"""`/metrics`: dcgm-exporter's default families that NVML can supply, plus our own.

Rendered by hand in the Prometheus text format 0.0.4 from the last probe `View` (never NVML at
scrape time), because prometheus_client appends `_total` to counter families and dcgm-exporter
does not (`# TYPE DCGM_FI_DEV_PCIE_REPLAY_COUNTER counter`). Names, HELP strings, types and
labels are dcgm-exporter's (etc/default-counters.csv; `render_metrics.go` of its 4.5.3-4.8.2
release): `gpu, UUID, pci_bus_id, device, modelName`, the host label, `DCGM_FI_DRIVER_VERSION`,
then its attributes in name order, as Go's template prints a map: `container`, `err_code` and
`err_msg` (the Xid family only, `gpu_collector.go` toMetric), `namespace`, `pod` (GPUs allocated
to a pod, `transformation/kubernetes.go`). Left out: `DCGM_FI_PROF_*` (DCGM's profiling module;
NVML's GPM has analogues on Hopper+, in other units), `DCGM_FI_DEV_VGPU_LICENSE_STATUS` and
`DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL` (which NVML could supply: not done yet).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from agent import attribution, readings, snapshots
from shared import health, xid

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclasses.dataclass(frozen=True, slots=True)
class Family:
    """One dcgm-exporter family and how to read it from a snapshot."""

    name: str
    kind: str
    help: str
    read: Callable[[readings.GpuSnapshot], float | int | bool | None]


DCGM_FAMILIES: tuple[Family, ...] = (
    Family("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).",
           lambda s: s.sm_clock_mhz),
    Family("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).",
           lambda s: s.mem_clock_mhz),
    Family("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C).",
           lambda s: s.memory_temperature_c),
    Family("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", lambda s: s.temperature_c),
    Family("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", lambda s: s.power_w),
    Family("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter",
           "Total energy consumption since boot (in mJ).", lambda s: s.energy_mj),
    Family("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries.",
           lambda s: s.pcie_replay_count),
    Family("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).",
           lambda s: s.utilization_gpu_pct),
    Family("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).",
           lambda s: s.utilization_memory_pct),
    Family("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %).",
           lambda s: s.encoder_util_pct),
    Family("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %).",
           lambda s: s.decoder_util_pct),
    Family("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).",
           lambda s: s.fb_free_mib),
    Family("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).",
           lambda s: s.fb_used_mib),
    Family("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB).",
           lambda s: s.fb_reserved_mib),
    Family("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter",
           "Number of remapped rows for uncorrectable errors",
           lambda s: s.remapped_rows_uncorrectable),
    Family("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter",
           "Number of remapped rows for correctable errors",
           lambda s: s.remapped_rows_correctable),
    Family("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed",
           lambda s: s.remap_failure),
)  # fmt: skip

XID_FAMILY = ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.")


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(pairs: list[tuple[str, str]]) -> str:
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in pairs) + "}"


def _number(value: float | bool) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int) or float(value).is_integer():
        return str(int(value))
    return repr(float(value))


def _pod_attributes(ref: attribution.PodRef | None) -> list[tuple[str, str]]:
    if ref is None:
        return []
    return [("container", ref.container), ("namespace", ref.namespace), ("pod", ref.pod)]


def render(
    view: snapshots.View,
    *,
    export_dcgm: bool = True,
    hostname_label: bool = True,
    host_label: str = "Hostname",
    pod_labels: bool = True,
) -> str:
    """Render the whole `/metrics` body from one view."""
    lines: list[str] = []
    snapshots = sorted(view.snapshots, key=lambda s: s.index)
    pods = view.pods.pods if pod_labels else {}

    def gpu_labels(
        s: readings.GpuSnapshot, extra: list[tuple[str, str]] | None = None
    ) -> list[tuple[str, str]]:
        pairs = [
            ("gpu", str(s.index)),
            ("UUID", s.uuid),
            ("pci_bus_id", s.pci_bus_id),
            ("device", f"nvidia{s.index}"),
            ("modelName", s.name),
        ]
        if hostname_label:
            pairs.append((host_label, view.node_name))
        pairs.append(("DCGM_FI_DRIVER_VERSION", view.driver_version))
        attributes = [*_pod_attributes(pods.get(s.uuid)), *(extra or [])]
        return pairs + sorted(attributes)

    if export_dcgm:
        for family in DCGM_FAMILIES:
            samples = [(s, family.read(s)) for s in snapshots]
            present = [(s, v) for s, v in samples if v is not None]
            if not present:
                continue
            lines.append(f"# HELP {family.name} {family.help}")
            lines.append(f"# TYPE {family.name} {family.kind}")
            lines.extend(f"{family.name}{_labels(gpu_labels(s))} {_number(v)}" for s, v in present)
        healthy = [s for s in snapshots if s.nvml_error is None]
        if healthy:
            name, kind, text = XID_FAMILY
            lines.append(f"# HELP {name} {text}")
            lines.append(f"# TYPE {name} {kind}")
            for s in healthy:
                code = view.last_xid.get(s.index, 0)
                extra = [("err_code", str(code)), ("err_msg", xid.exporter_err_msg(code))]
                lines.append(f"{name}{_labels(gpu_labels(s, extra))} {code}")

    by_uuid = {s.uuid: s for s in snapshots}
    verdict_rows = sorted(view.verdicts, key=lambda v: v.index)

    def own_labels(uuid: str, index: int) -> list[tuple[str, str]]:
        snap = by_uuid.get(uuid)
        return [
            ("gpu", str(index)),
            ("UUID", uuid),
            ("pci_bus_id", snap.pci_bus_id if snap else ""),
            ("device", f"nvidia{index}"),
            ("modelName", snap.name if snap else ""),
        ]

    lines.append(
        "# HELP taugrid_gpu_verdict The agent's verdict per GPU: 1 for the current one, "
        "0 for the others."
    )
    lines.append("# TYPE taugrid_gpu_verdict gauge")
    for v in verdict_rows:
        for verdict in health.Verdict:
            value = 1 if v.verdict is verdict else 0
            labels = [*own_labels(v.uuid, v.index), ("verdict", str(verdict))]
            lines.append(f"taugrid_gpu_verdict{_labels(labels)} {value}")
    lines.append(
        "# HELP taugrid_gpu_action The action the agent asks for per GPU: 1 for the current one."
    )
    lines.append("# TYPE taugrid_gpu_action gauge")
    for v in verdict_rows:
        for action in health.Action:
            value = 1 if v.action is action else 0
            labels = [*own_labels(v.uuid, v.index), ("action", str(action))]
            lines.append(f"taugrid_gpu_action{_labels(labels)} {value}")
    lines.append(
        "# HELP taugrid_gpu_latched_faults Latched faults per GPU awaiting their clearing."
    )
    lines.append("# TYPE taugrid_gpu_latched_faults gauge")
    for v in verdict_rows:
        count = len(view.state.gpus[v.uuid].latched) if v.uuid in view.state.gpus else 0
        lines.append(f"taugrid_gpu_latched_faults{_labels(own_labels(v.uuid, v.index))} {count}")

    lines.append(
        "# HELP taugrid_gpu_xid_total Xids seen per GPU and Xid, cumulative (kernel log and "
        "NVML events counted once)."
    )
    lines.append("# TYPE taugrid_gpu_xid_total counter")
    for gpu in sorted(view.state.gpus.values(), key=lambda g: g.index):
        for code, count in sorted(gpu.xid_counts.items()):
            labels = [*own_labels(gpu.uuid, gpu.index), ("xid", str(code))]
            lines.append(f"taugrid_gpu_xid_total{_labels(labels)} {count}")

    lines.append(
        "# HELP taugrid_nvswitch_sxid_total NVSwitch SXids seen in the kernel log per SXid, "
        "cumulative (fatal and non-fatal)."
    )
    lines.append("# TYPE taugrid_nvswitch_sxid_total counter")
    for code, count in sorted(view.state.sxid_counts.items()):
        lines.append(f"taugrid_nvswitch_sxid_total{_labels([('sxid', str(code))])} {count}")

    lines.append(
        "# HELP taugrid_gpu_probe_duration_seconds Duration of the last probe pass per tier."
    )
    lines.append("# TYPE taugrid_gpu_probe_duration_seconds gauge")
    lines.extend(
        f"taugrid_gpu_probe_duration_seconds{_labels([('tier', tier)])} {seconds!r}"
        for tier, seconds in sorted(view.probe_seconds.items())
    )
    lines.append("# HELP taugrid_gpu_probe_errors_total NVML calls that failed, by tier and error.")
    lines.append("# TYPE taugrid_gpu_probe_errors_total counter")
    for key, count in sorted(view.probe_errors.items()):
        tier, _, error = key.partition(":")
        labels = [("tier", tier), ("error", error)]
        lines.append(f"taugrid_gpu_probe_errors_total{_labels(labels)} {count}")
    lines.append("# HELP taugrid_agent_dcgm_available 1 when dcgmi reaches an nv-hostengine.")
    lines.append("# TYPE taugrid_agent_dcgm_available gauge")
    lines.append(f"taugrid_agent_dcgm_available {1 if view.dcgm_status.available else 0}")
    lines.append("# HELP taugrid_agent_nvml_available 1 when NVML initialised.")
    lines.append("# TYPE taugrid_agent_nvml_available gauge")
    lines.append(f"taugrid_agent_nvml_available {1 if view.nvml_available else 0}")
    return "\n".join(lines) + "\n"
