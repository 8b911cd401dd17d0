"""Mapping the kubelet's device ids and DRA claims to this node's GPUs (pure)."""

from __future__ import annotations

import pytest

from agent import attribution

U0 = "GPU-0aa0a0a0-1111-2222-3333-444444444444"
U1 = "GPU-1bb1b1b1-1111-2222-3333-444444444444"
GPUS = (attribution.Gpu(0, U0), attribution.Gpu(1, U1))
TRAIN = attribution.PodRef("team-a", "train-0", "trainer")
SIDE = attribution.PodRef("team-a", "train-0", "sidecar")
OTHER = attribution.PodRef("team-b", "eval-7", "eval")


def device(
    device_id: str, ref: attribution.PodRef = TRAIN, resource: str = "nvidia.com/gpu"
) -> attribution.DeviceGrant:
    """A device-plugin grant."""
    return attribution.DeviceGrant(ref, resource, device_id)


@pytest.mark.parametrize(
    ("device_id", "uuid"),
    [
        pytest.param(U1, U1, id="NVIDIA's plugin names the GPU by UUID"),
        pytest.param("GPU-1BB1B1B1-1111-2222-3333-444444444444", U1, id="UUIDs match case-blind"),
        pytest.param(f"{U1}::3", U1, id="a time-slicing replica names its GPU"),
        pytest.param(f"MIG-{U1}/1/0", U1, id="an old-style MIG id names its parent"),
        pytest.param("MIG-5c0ffee0-1111-2222-3333-444444444444", U0,
                     id="a MIG UUID is resolved through NVML"),
        pytest.param("nvidia1", U1, id="GKE's plugin names the GPU by index"),
        pytest.param("nvidia1/gi2", U1, id="GKE's MIG partitions name their GPU"),
        pytest.param("nvidia0/vgpu3", U0, id="GKE's shared GPUs name their GPU"),
        pytest.param("1", U1, id="the index strategy names the GPU by index"),
        pytest.param("GPU-99999999-1111-2222-3333-444444444444", None,
                     id="another node's GPU is unmatched"),
        pytest.param("MIG-6c0ffee0-1111-2222-3333-444444444444", None,
                     id="a MIG UUID NVML cannot resolve is unmatched"),
        pytest.param("nvidia9", None, id="an index this node lacks is unmatched"),
        pytest.param("GPU-1bb1b1b1\n", None, id="junk is unmatched, never partly parsed"),
    ],
)  # fmt: skip
def test_device_ids_name_the_gpu(device_id: str, uuid: str | None) -> None:
    """Every form NVIDIA's and GKE's device plugins write maps to the physical GPU's UUID."""
    out = attribution.attribute(
        [device(device_id)], [], GPUS,
        mig_parents={"MIG-5c0ffee0-1111-2222-3333-444444444444": U0},
    )  # fmt: skip
    expected = {uuid: TRAIN} if uuid else {}
    assert expected == out.pods
    assert (() if uuid else (device_id,)) == out.unmatched


@pytest.mark.parametrize(
    ("claim", "table", "uuid"),
    [
        pytest.param(("gpu.nvidia.com", "node-a", "gpu-1"), {}, U1,
                     id="NVIDIA's DRA driver names whole GPUs gpu-<index>"),
        pytest.param(("gpu.nvidia.com", "node-a", "h100-a"), {"h100-a": U0}, U0,
                     id="a table maps other device names to UUIDs"),
        pytest.param(("gpu.nvidia.com", "node-a", "gpu-1"), {"node-a/gpu-1": U0}, U0,
                     id="a pool-qualified table entry wins"),
        pytest.param(("gpu.nvidia.com", "node-a", "gpu-1-mig-1g.10gb-0"), {}, None,
                     id="a MIG partition without a table entry is unmatched"),
        pytest.param(("nic.example.com", "node-a", "gpu-1"), {}, None,
                     id="another driver's devices are not GPUs"),
    ],
)  # fmt: skip
def test_dra_claims_name_the_gpu(
    claim: tuple[str, str, str], table: dict[str, str], uuid: str | None
) -> None:
    """DRA devices map by the configured table, then by NVIDIA's gpu-<index> names."""
    out = attribution.attribute([], [attribution.ClaimGrant(TRAIN, *claim)], GPUS, dra_table=table)
    assert ({uuid: TRAIN} if uuid else {}) == out.pods


def test_other_resources_are_ignored_and_mig_resources_count() -> None:
    """Only NVIDIA GPU resources (and nvidia.com/mig-*) are read, like dcgm-exporter."""
    out = attribution.attribute(
        [device(U0, resource="example.com/fpga"), device(U1, resource="nvidia.com/mig-1g.10gb")],
        [],
        GPUS,
    )
    assert out.pods == {U1: TRAIN}
    assert out.unmatched == ()


def test_a_configured_resource_name_counts() -> None:
    """dcgm-exporter's --nvidia-resource-names: a renamed resource is read too."""
    grant = device(U0, resource="acme.com/gpu")
    out = attribution.attribute([grant], [], GPUS, resources=("acme.com/gpu",))
    assert out.pods == {U0: TRAIN}


def test_a_shared_gpu_names_one_pod_and_counts_the_rest() -> None:
    """Time-sliced GPUs: one series, labelled with the first pod by name; all are listed."""
    out = attribution.attribute(
        [device(f"{U0}::0", OTHER), device(f"{U0}::1", TRAIN), device(f"{U0}::2", SIDE)], [], GPUS
    )
    assert out.pods == {U0: SIDE}  # team-a/train-0/sidecar sorts first
    assert out.sharing[U0] == (SIDE, TRAIN, OTHER)


def test_mig_ids_lists_what_nvml_must_resolve() -> None:
    """Only new-style MIG UUIDs of GPU resources need NVML."""
    grants = [
        device("MIG-5c0ffee0-1111-2222-3333-444444444444::2"),
        device(f"MIG-{U1}/1/0"),
        device("MIG-7c0ffee0-1111-2222-3333-444444444444", resource="example.com/x"),
    ]
    assert {"MIG-5c0ffee0-1111-2222-3333-444444444444"} == attribution.mig_ids(
        grants, attribution.DEFAULT_RESOURCES
    )
