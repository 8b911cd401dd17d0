"""A stand-in for NVIDIA's DRA kubelet plugin on KWOK nodes: one ResourceSlice per DRA node.

NVIDIA's driver (`kubernetes-sigs/dra-driver-nvidia-gpu`, `cmd/gpu-kubelet-plugin`) publishes
each node's GPUs in a pool named after the node (`driver.go`: `Pools: {nodeName: ...}`), one
device per GPU named `gpu-<minor>` (`deviceinfo.go`, `CanonicalName`), with the attributes
`GpuInfo.Attributes` sets: `type` (`gpu`, what NVIDIA's DeviceClass selects on), `uuid`,
`productName`, `brand`, `architecture`, `cudaComputeCapability`, `driverVersion`,
`cudaDriverVersion`, and the standard `resource.kubernetes.io/pciBusID`. It no longer
publishes an `index` attribute (removed upstream in 36fc80ab, "Remove GPU index for CDI spec
generation / attribute advertisement", first released in v25.8.0), so neither do we.

KWOK nodes have no kubelet, so this process watches the nodes labelled
`kwok.taugrid.dev/gpu-driver=dra` and applies their slices (server-side apply, owned by the
Node, so the garbage collector removes a slice with its node). The UUIDs are the ones the
node's agent reads from the fake NVML library, which is seeded with the node's name
(`devcluster.stack.agent_env`): a fault the agent reports names the device the slice lists.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import pathlib
from collections.abc import Mapping
from typing import Any

from aiohttp import web
from kubernetes_asyncio import client, config

from devcluster import fakenvml

DRIVER = "gpu.nvidia.com"
"""NVIDIA's DRA driver name (its DeviceClass and ResourceSlices)."""
DEVICE_CLASS = "gpu.nvidia.com"
"""The DeviceClass NVIDIA's chart installs for whole GPUs (`deviceclass-gpu.yaml`)."""
DRIVER_LABEL = "kwok.taugrid.dev/gpu-driver"
"""On a fake node: `dra` (GPUs are DRA devices in a ResourceSlice) or `device-plugin`
(`nvidia.com/gpu` in its allocatable, as the device plugin advertises them)."""
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
FIELD_MANAGER = "taugrid-dra-publisher"
RESOURCE = ("resource.k8s.io", "v1")
APPLY = "application/apply-patch+yaml"

ARCHITECTURE = "Hopper"
BRAND = "Nvidia"
CUDA_COMPUTE_CAPABILITY = "9.0.0"
DRIVER_VERSION = "570.148.8"
"""The fake library's default driver `570.148.08`, as semver prints it (`MustParse` drops
the leading zero)."""
CUDA_DRIVER_VERSION = "12.8.0"
"""The fake library's CUDA version 12080 as NVIDIA's plugin renders it."""


def device_class() -> dict[str, Any]:
    """NVIDIA's DeviceClass for whole GPUs, as its chart renders it for `resource.k8s.io/v1`
    minus `extendedResourceName: nvidia.com/gpu`: on the dev cluster a pod asking for the
    extended resource must land on a device-plugin node, never on a DRA node by way of the
    scheduler's DRA extended-resource path (docs/platform.md says what the field does)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": DEVICE_CLASS},
        "spec": {
            "selectors": [
                {
                    "cel": {
                        "expression": f"device.driver == '{DRIVER}' && "
                        f"device.attributes['{DRIVER}'].type == 'gpu'"
                    }
                }
            ]
        },
    }


def slice_name(node: str) -> str:
    """The ResourceSlice of a node (cluster-scoped, so named after the node)."""
    return f"{node}-{DRIVER}"[:253]


def gpu_count(node: Mapping[str, Any]) -> int:
    """How many GPUs a fake DRA node has (its `nvidia.com/gpu.count` label, else 8)."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    raw = str(labels.get(GPU_COUNT_LABEL, "8"))
    return int(raw) if raw.isdigit() else 8


def device(node: str, index: int) -> dict[str, Any]:
    """Device `gpu-<index>` of a node, with the attributes NVIDIA's plugin publishes and
    the UUID the node's fake NVML library reports for that GPU."""
    return {
        "name": f"gpu-{index}",
        "attributes": {
            "type": {"string": "gpu"},
            "uuid": {"string": fakenvml.default_uuid(node, index)},
            "productName": {"string": fakenvml.DEFAULT_GPU_NAME},
            "brand": {"string": BRAND},
            "architecture": {"string": ARCHITECTURE},
            "cudaComputeCapability": {"version": CUDA_COMPUTE_CAPABILITY},
            "driverVersion": {"version": DRIVER_VERSION},
            "cudaDriverVersion": {"version": CUDA_DRIVER_VERSION},
            "resource.kubernetes.io/pciBusID": {
                "string": fakenvml.default_bus_id(index)[4:].lower()
            },
        },
        "capacity": {"memory": {"value": str(fakenvml.DEFAULT_MEMORY_TOTAL)}},
    }


def resource_slice(node: Mapping[str, Any]) -> dict[str, Any]:
    """The one ResourceSlice of a fake DRA node, owned by the Node."""
    meta = node.get("metadata") or {}
    name = str(meta.get("name", ""))
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {
            "name": slice_name(name),
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": name,
                 "uid": str(meta.get("uid", "")), "controller": True}
            ],
        },
        "spec": {
            "driver": DRIVER,
            "nodeName": name,
            "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
            "devices": [device(name, i) for i in range(gpu_count(node))],
        },
    }  # fmt: skip


def is_dra_node(node: Mapping[str, Any]) -> bool:
    """Whether a node's GPUs are DRA devices (and it has not been deleted)."""
    meta = node.get("metadata") or {}
    return (meta.get("labels") or {}).get(DRIVER_LABEL) == "dra" and not meta.get(
        "deletionTimestamp"
    )


class Publisher:
    """Apply a ResourceSlice for every fake DRA node, once per node incarnation (UID)."""

    def __init__(self, api: client.ApiClient) -> None:
        self._core = client.CoreV1Api(api)
        self._custom = client.CustomObjectsApi(api)
        self._published: dict[str, str] = {}
        self.synced = asyncio.Event()

    async def publish(self, node: Mapping[str, Any]) -> None:
        """Apply the node's slice unless this incarnation of it already has one."""
        meta = node.get("metadata") or {}
        name, uid = str(meta.get("name", "")), str(meta.get("uid", ""))
        if self._published.get(name) == uid:
            return
        body = resource_slice(node)
        await self._custom.patch_cluster_custom_object(
            *RESOURCE, "resourceslices", body["metadata"]["name"], body,
            field_manager=FIELD_MANAGER, force=True, _content_type=APPLY,
        )  # fmt: skip
        self._published[name] = uid

    async def run(self) -> None:
        """List, publish, watch; relist after any watch error, until cancelled."""
        selector = f"{DRIVER_LABEL}=dra"
        while True:
            try:
                resp = await self._core.list_node(label_selector=selector, _preload_content=False)
                data = json.loads(await resp.read())
                for node in data.get("items") or []:
                    if is_dra_node(node):
                        await self.publish(node)
                self.synced.set()
                rv = data["metadata"]["resourceVersion"]
                await self._watch(selector, rv)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001  (any API failure: relist after a pause)
                print(f"dra-publisher: {err}; relisting", flush=True)
                await asyncio.sleep(1.0)

    async def _watch(self, selector: str, rv: str) -> None:
        resp = await self._core.list_node(
            label_selector=selector, watch=True, resource_version=rv, timeout_seconds=300,
            allow_watch_bookmarks=True, _preload_content=False,
        )  # fmt: skip
        try:
            while line := await resp.content.readline():
                event = json.loads(line)
                if event.get("type") == "ERROR":
                    return
                node = event.get("object") or {}
                name = str((node.get("metadata") or {}).get("name", ""))
                if event.get("type") == "DELETED":
                    self._published.pop(name, None)
                elif event.get("type") in ("ADDED", "MODIFIED") and is_dra_node(node):
                    await self.publish(node)
        finally:
            resp.release()


async def serve(kubeconfig: pathlib.Path, port: int) -> None:
    """Publish slices until cancelled, answering `/healthz` on 127.0.0.1:port once synced."""
    cfg = client.Configuration()
    await config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    async with client.ApiClient(configuration=cfg) as api:
        publisher = Publisher(api)

        async def healthz(_: web.Request) -> web.Response:
            if not publisher.synced.is_set():
                return web.Response(status=503, text="not synced")
            return web.Response(text="ok")

        app = web.Application()
        app.router.add_get("/healthz", healthz)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        task = asyncio.create_task(publisher.run())
        try:
            await asyncio.Event().wait()
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await runner.cleanup()
