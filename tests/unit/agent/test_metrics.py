"""`/metrics` against a golden file of dcgm-exporter-format lines, and the text parser."""

from __future__ import annotations

import datetime as dt
import pathlib

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent import attribution, latching, metrics, readings, snapshots, verdicts
from shared import health

GOLDEN = pathlib.Path(__file__).parents[2] / "fixtures" / "metrics" / "agent_metrics.prom"
T0 = dt.datetime(2026, 5, 1, 12, 0, tzinfo=dt.UTC)
UUIDS = ("GPU-11111111-2222-3333-4444-555555555555", "GPU-66666666-7777-8888-9999-000000000000")


TRAINER = attribution.PodRef(namespace="team-a", pod="train-0", container="trainer")


def view() -> snapshots.View:
    """Two GPUs with fixed readings; GPU 0 runs a pod's container, GPU 1 has a latched Xid 79
    and an Xid 13 count. Memory is NVML's v2 struct, as DCGM reads it: 543 MiB reserved."""
    snaps = tuple(
        readings.GpuSnapshot(
            index=i,
            uuid=UUIDS[i],
            name="NVIDIA H100 80GB HBM3",
            pci_bus_id=f"00000000:{0x18 + i:02X}:00.0",
            taken_at=T0,
            temperature_c=35 + i,
            memory_temperature_c=40,
            power_w=72.5,
            utilization_gpu_pct=0,
            utilization_memory_pct=0,
            encoder_util_pct=0,
            decoder_util_pct=0,
            sm_clock_mhz=1980,
            mem_clock_mhz=2619,
            fb_free_mib=81015,
            fb_used_mib=0,
            fb_reserved_mib=543,
            energy_mj=123456789,
            pcie_replay_count=0,
            remapped_rows_correctable=0,
            remapped_rows_uncorrectable=i,
            remap_failure=False,
        )
        for i in range(2)
    )
    fault = latching.LatchedFault(
        code="XidFallenOffBus",
        verdict=health.Verdict.FAILED,
        action=health.Action.REBOOT_NODE,
        since=T0,
        last_seen=T0,
        boot_id="b",
        clears_when=latching.ClearingCondition.NEW_BOOT_ID,
        xid=79,
    )
    state = latching.NodeState(
        boot_id="b",
        gpus={
            UUIDS[0]: latching.GpuState(uuid=UUIDS[0], index=0),
            UUIDS[1]: latching.GpuState(
                uuid=UUIDS[1], index=1, latched=(fault,), xid_counts={13: 2, 79: 1}
            ),
        },
    )
    return snapshots.View(
        node_name="gpu-node-1",
        boot_id="b",
        taken_at=T0,
        driver_version="570.148.08",
        nvml_available=True,
        snapshots=snaps,
        verdicts=(
            verdicts.GpuVerdict(UUIDS[0], 0, health.Verdict.HEALTHY, health.Action.NONE, ()),
            verdicts.GpuVerdict(UUIDS[1], 1, health.Verdict.FAILED, health.Action.REBOOT_NODE, ()),
        ),
        state=state,
        last_xid={1: 79},
        probe_seconds={"gauges": 0.0015},
        probe_errors={"gauges:NotSupported": 3},
        pods=attribution.Attribution(pods={UUIDS[0]: TRAINER}, sharing={UUIDS[0]: (TRAINER,)}),
    )


def test_metrics_match_the_golden_file() -> None:
    """The rendered text is byte-for-byte the golden file, `# TYPE` lines included."""
    assert metrics.render(view()) == GOLDEN.read_text()


def test_metrics_parse_with_prometheus_client() -> None:
    """prometheus_client parses every family; dcgm-exporter counters keep names without _total."""
    families = {f.name: f for f in text_string_to_metric_families(metrics.render(view()))}
    assert families["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"].type == "counter"
    assert families["DCGM_FI_DEV_GPU_TEMP"].type == "gauge"
    fb = {f: families[f"DCGM_FI_DEV_FB_{f}"].samples[1].value for f in ("USED", "RESERVED")}
    assert fb == {"USED": 0.0, "RESERVED": 543.0}  # v2: reserved apart, as DCGM reports
    xid = {(s.labels["gpu"], s.labels["xid"]): s.value for s in families["taugrid_gpu_xid"].samples}
    assert xid == {("1", "13"): 2.0, ("1", "79"): 1.0}
    sample = families["DCGM_FI_DEV_GPU_TEMP"].samples[1]
    assert sample.labels == {
        "gpu": "1",
        "UUID": UUIDS[1],
        "pci_bus_id": "00000000:19:00.0",
        "device": "nvidia1",
        "modelName": "NVIDIA H100 80GB HBM3",
        "Hostname": "gpu-node-1",
        "DCGM_FI_DRIVER_VERSION": "570.148.08",
    }


def test_dcgm_families_can_be_turned_off() -> None:
    """With dcgm-exporter on the node, only our taugrid_* families remain."""
    names = {
        f.name for f in text_string_to_metric_families(metrics.render(view(), export_dcgm=False))
    }
    assert not {n for n in names if n.startswith("DCGM_")}
    assert "taugrid_gpu_verdict" in names


def xid_lines(text: str) -> list[str]:
    """The DCGM_FI_DEV_XID_ERRORS sample lines."""
    return [line for line in text.splitlines() if line.startswith("DCGM_FI_DEV_XID_ERRORS{")]


def test_the_xid_family_carries_err_code_and_err_msg_as_dcgm_exporter() -> None:
    """err_code is the value, err_msg dcgm-exporter's text for it, after the labels."""
    lines = xid_lines(metrics.render(view()))
    tail = ',DCGM_FI_DRIVER_VERSION="570.148.08",container="trainer",err_code="0",'
    assert lines[0].endswith(f'{tail}err_msg="No Error",namespace="team-a",pod="train-0"}} 0'), (
        lines[0]
    )
    assert lines[1].endswith(
        ',DCGM_FI_DRIVER_VERSION="570.148.08",err_code="79",'
        'err_msg="GPU has fallen off the bus"} 79'
    ), lines[1]


@pytest.mark.parametrize(
    ("options", "present", "absent"),
    [
        pytest.param({}, {"Hostname", "pod", "namespace", "container"}, {"hostname"},
                     id="by default the release's Hostname and the pod labels"),
        pytest.param({"host_label": "hostname"}, {"hostname"}, {"Hostname"},
                     id="the host label's name is a setting (dcgm-exporter main says hostname)"),
        pytest.param({"hostname_label": False}, set(), {"Hostname", "hostname"},
                     id="the host label can be dropped like --no-hostname"),
        pytest.param({"pod_labels": False}, {"Hostname"}, {"pod", "namespace", "container"},
                     id="pod attribution can be turned off"),
    ],
)  # fmt: skip
def test_label_settings(options: dict[str, object], present: set[str], absent: set[str]) -> None:
    """The host label's name and presence, and the pod labels, follow the settings."""
    text = metrics.render(view(), **options)  # type: ignore[arg-type]
    families = {f.name: f for f in text_string_to_metric_families(text)}
    labels = set(families["DCGM_FI_DEV_GPU_TEMP"].samples[0].labels)
    assert present <= labels
    assert not absent & labels


def test_an_unallocated_gpu_has_no_pod_labels() -> None:
    """Only GPUs the kubelet reports as allocated carry pod, namespace and container."""
    families = {f.name: f for f in text_string_to_metric_families(metrics.render(view()))}
    by_gpu = {s.labels["gpu"]: s.labels for s in families["DCGM_FI_DEV_GPU_UTIL"].samples}
    assert tuple(by_gpu["0"][k] for k in ("pod", "namespace", "container")) == (
        "train-0",
        "team-a",
        "trainer",
    )
    assert "pod" not in by_gpu["1"]


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        pytest.param("host name", "not a Prometheus label name", id="a space"),
        pytest.param("hostname\n", "not a Prometheus label name", id="a trailing newline"),
        pytest.param("UUID", "already one of", id="a label the series already carry"),
    ],
)
def test_a_bad_host_label_name_is_refused_naming_the_setting(name: str, problem: str) -> None:
    """The host label's name must be a label name the series do not carry already."""
    from agent import settings

    with pytest.raises(ValueError, match=f"host_label: .*{problem}"):
        settings.Settings(node_name="n", host_label=name)
