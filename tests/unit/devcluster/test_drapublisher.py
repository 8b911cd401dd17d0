"""The dev cluster's stand-in for NVIDIA's DRA kubelet plugin: what one slice says."""

from __future__ import annotations

import re

import pytest

from devcluster import cluster, drapublisher, fakenvml


def _node(name: str = "dra-0", **labels: str) -> dict[str, object]:
    return {"metadata": {"name": name, "uid": "u-1", "labels": labels}}


def test_a_slice_is_the_nodes_own_pool_owned_by_the_node() -> None:
    """Driver gpu.nvidia.com, pool named after the node, one slice in it, owned by the Node
    (so the garbage collector takes it with the node)."""
    found = drapublisher.resource_slice(_node())
    expected = {
        "name": "dra-0-gpu.nvidia.com",
        "owner": [{"apiVersion": "v1", "kind": "Node", "name": "dra-0", "uid": "u-1",
                   "controller": True}],
        "driver": "gpu.nvidia.com",
        "nodeName": "dra-0",
        "pool": {"name": "dra-0", "generation": 1, "resourceSliceCount": 1},
        "devices": [f"gpu-{i}" for i in range(8)],
    }  # fmt: skip
    actual = {
        "name": found["metadata"]["name"],
        "owner": found["metadata"]["ownerReferences"],
        "driver": found["spec"]["driver"],
        "nodeName": found["spec"]["nodeName"],
        "pool": found["spec"]["pool"],
        "devices": [d["name"] for d in found["spec"]["devices"]],
    }
    assert expected == actual


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        pytest.param({}, 8, id="eight GPUs by default"),
        pytest.param({"nvidia.com/gpu.count": "4"}, 4, id="the GPU count label decides"),
        pytest.param({"nvidia.com/gpu.count": "x"}, 8, id="an unreadable count means eight"),
    ],
)
def test_the_slice_lists_as_many_devices_as_the_node_has_gpus(
    labels: dict[str, str], expected: int
) -> None:
    """One device per GPU the node's label announces."""
    assert expected == len(drapublisher.resource_slice(_node(**labels))["spec"]["devices"])


def test_each_device_carries_nvidias_attributes_and_the_fake_nvml_identity() -> None:
    """The attributes NVIDIA's plugin sets (its DeviceClass selects `type == 'gpu'`), the
    UUID the node's fake NVML reports, and a pciBusID in the BDF form upstream validates."""
    device = drapublisher.device("dra-0", 3)
    attrs = device["attributes"]
    assert {
        "type", "uuid", "productName", "brand", "architecture", "cudaComputeCapability",
        "driverVersion", "cudaDriverVersion", "resource.kubernetes.io/pciBusID",
    } == set(attrs)  # fmt: skip
    expected = ("gpu", fakenvml.default_uuid("dra-0", 3), fakenvml.DEFAULT_GPU_NAME)
    actual = (attrs["type"]["string"], attrs["uuid"]["string"], attrs["productName"]["string"])
    assert expected == actual
    bus = attrs["resource.kubernetes.io/pciBusID"]["string"]
    assert re.fullmatch(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]", bus), bus


@pytest.mark.parametrize(
    ("driver", "gpu_resource", "dra"),
    [
        pytest.param(
            "device-plugin", "8", False, id="a device-plugin node advertises nvidia.com/gpu"
        ),
        pytest.param("dra", None, True, id="a DRA node advertises no nvidia.com/gpu"),
    ],
)
def test_fake_nodes_are_either_dra_or_device_plugin_nodes(
    driver: cluster.GpuDriver, gpu_resource: str | None, dra: bool
) -> None:
    """The driver label tells the publisher which nodes are its own."""
    node = cluster.fake_gpu_node("n", gpu_driver=driver)
    assert gpu_resource == node["status"]["allocatable"].get("nvidia.com/gpu")
    assert dra == drapublisher.is_dra_node(node)
