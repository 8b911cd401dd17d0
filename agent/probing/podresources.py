"""The kubelet's PodResources API (gRPC `v1.PodResourcesLister/List` over a Unix socket).

The client modules are generated from the kubelet's published `api.proto` by
`devcluster/podresources.py` into a build directory (a setting; the image puts them in
/opt/taugrid/podresources): nothing generated is in the source tree, and without them, or
without the socket, the agent runs on with attribution off and says why in `/v1/gpus`.
"""

from __future__ import annotations

import importlib
import json
import pathlib
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any

from agent import attribution

if TYPE_CHECKING:
    import grpc

PACKAGE = "taugrid_podresources"
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""The kubelet's own limit for PodResources answers (16 MiB)."""


class PodResourcesError(Exception):
    """The client is missing, or the kubelet did not answer."""


def load_stubs(directory: pathlib.Path) -> tuple[ModuleType, ModuleType, dict[str, Any]]:
    """Import the generated `api_pb2` / `api_pb2_grpc` from `directory`; return its SOURCE too."""
    package = directory / PACKAGE
    if not (package / "api_pb2_grpc.py").is_file():
        msg = (
            f"no generated PodResources client in {directory} "
            "(build it: python devcluster/podresources.py build --out DIR)"
        )
        raise PodResourcesError(msg)
    if str(directory) not in sys.path:
        sys.path.insert(0, str(directory))
    try:
        pb2 = importlib.import_module(f"{PACKAGE}.api_pb2")
        stubs = importlib.import_module(f"{PACKAGE}.api_pb2_grpc")
    except Exception as err:
        msg = f"cannot import the PodResources client from {directory}: {err}"
        raise PodResourcesError(msg) from err
    try:
        source: dict[str, Any] = json.loads((package / "SOURCE.json").read_text())
    except (OSError, ValueError):
        source = {}
    return pb2, stubs, source


def grants(response: Any) -> tuple[list[attribution.DeviceGrant], list[attribution.ClaimGrant]]:
    """Flatten a `ListPodResourcesResponse` into device-plugin and DRA grants."""
    devices: list[attribution.DeviceGrant] = []
    claims: list[attribution.ClaimGrant] = []
    for pod in response.pod_resources:
        for container in pod.containers:
            ref = attribution.PodRef(pod.namespace, pod.name, container.name)
            for device in container.devices:
                devices.extend(
                    attribution.DeviceGrant(ref, device.resource_name, device_id)
                    for device_id in device.device_ids
                )
            for dynamic in container.dynamic_resources:
                claims.extend(
                    attribution.ClaimGrant(ref, c.driver_name, c.pool_name, c.device_name)
                    for c in dynamic.claim_resources
                )
    return devices, claims


class Client:
    """One channel to the kubelet's socket; `list()` is one List call."""

    def __init__(
        self,
        directory: pathlib.Path,
        socket: pathlib.Path,
        *,
        timeout_s: float,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
    ) -> None:
        self._pb2, self._stubs, self.source = load_stubs(directory)
        # grpcio costs ~9 MiB of RSS: loaded only where attribution runs.
        import grpc  # noqa: PLC0415

        self._grpc = grpc
        self._socket = socket
        self._timeout_s = timeout_s
        self._max_message_bytes = max_message_bytes
        self._channel: grpc.aio.Channel | None = None

    async def list(self) -> tuple[list[attribution.DeviceGrant], list[attribution.ClaimGrant]]:
        """Ask the kubelet which devices each container holds."""
        grpc = self._grpc
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(
                f"unix://{self._socket}",
                options=[("grpc.max_receive_message_length", self._max_message_bytes)],
            )
        stub = self._stubs.PodResourcesListerStub(self._channel)
        try:
            response = await stub.List(self._pb2.ListPodResourcesRequest(), timeout=self._timeout_s)
        except grpc.aio.AioRpcError as err:
            await self.close()
            msg = f"PodResources List on {self._socket}: {err.code().name} {err.details() or ''}"
            raise PodResourcesError(msg.strip()) from err
        return grants(response)

    async def close(self) -> None:
        """Close the channel (a new one is opened on the next call)."""
        channel, self._channel = self._channel, None
        if channel is not None:
            await channel.close()
