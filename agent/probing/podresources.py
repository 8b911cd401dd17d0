"""The kubelet's PodResources API (gRPC `v1.PodResourcesLister/List` over a Unix socket).

The client modules are generated from the kubelet's published `api.proto` by
`devcluster/podresources.py` into a build directory (a setting; the image puts them in
/opt/taugrid/podresources): nothing generated is in the source tree, and without them, or
without the socket, the agent runs on with attribution off and says why in `/v1/gpus`.

The calls go through grpclib (asyncio-native gRPC in pure Python over h2), imported only where
attribution runs: with the generated modules and protobuf it adds about 3.6 MiB of RSS, where
grpcio's client added 15 MiB, most of it the pages of its native library (docs/benchmarks.md).
"""

from __future__ import annotations

import importlib
import json
import pathlib
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any

from agent import attribution, errors

if TYPE_CHECKING:
    from grpclib import client as grpclib_client
    from grpclib.encoding import base as grpclib_codec

PACKAGE = "taugrid_podresources"
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""The limit clients of the kubelet give PodResources answers (16 MiB: its node e2e tests' and
its usual consumers'), over gRPC's usual 4 MiB."""


class PodResourcesError(errors.AgentError):
    """The client is missing, or the kubelet did not answer."""


def load_stubs(directory: pathlib.Path) -> tuple[ModuleType, ModuleType, dict[str, Any]]:
    """Import the generated `api_pb2` / `api_grpc` (grpclib's) from `directory`; return its SOURCE.

    A build of an older builder has grpcio's `api_pb2_grpc` only: it is not a client we use.
    """
    package = directory / PACKAGE
    if not (package / "api_grpc.py").is_file():
        msg = (
            f"no generated PodResources client (grpclib) in {directory} "
            "(build it: python devcluster/podresources.py build --out DIR)"
        )
        raise PodResourcesError(msg)
    if str(directory) not in sys.path:
        sys.path.insert(0, str(directory))
    try:
        pb2 = importlib.import_module(f"{PACKAGE}.api_pb2")
        stubs = importlib.import_module(f"{PACKAGE}.api_grpc")
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


class _TooLargeError(Exception):
    """An answer over the message cap (raised inside grpclib's read, caught by `Client.list`)."""

    def __init__(self, size: int, cap: int) -> None:
        super().__init__(f"an answer of {size} bytes, over the {cap}-byte cap")


def capped_codec(max_message_bytes: int) -> grpclib_codec.CodecBase:
    """grpclib's protobuf codec, refusing a message over `max_message_bytes`.

    grpclib has no receive limit (grpcio's `grpc.max_receive_message_length`): this is it. It
    sees the message once grpclib has read it, so an oversized answer costs its size in memory
    for the call before it is refused; grpcio refused it at its length prefix.
    """
    from grpclib.encoding import proto  # noqa: PLC0415 - grpclib only where attribution runs

    class CappedProtoCodec(proto.ProtoCodec):
        def decode(self, data: bytes, message_type: Any) -> Any:
            if len(data) > max_message_bytes:
                raise _TooLargeError(len(data), max_message_bytes)
            return super().decode(data, message_type)

    return CappedProtoCodec()


class Client:
    """One connection to the kubelet's socket; `list()` is one List call."""

    def __init__(
        self,
        directory: pathlib.Path,
        socket: pathlib.Path,
        *,
        timeout_s: float,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
    ) -> None:
        self._pb2, self._stubs, self.source = load_stubs(directory)
        # grpclib is loaded only where attribution runs (the stubs above import it too).
        from grpclib import client, exceptions  # noqa: PLC0415

        self._grpclib_client = client
        self._grpclib_exceptions = exceptions
        self._socket = socket
        self._timeout_s = timeout_s
        self._codec = capped_codec(max_message_bytes)
        self._channel: grpclib_client.Channel | None = None

    async def list(self) -> tuple[list[attribution.DeviceGrant], list[attribution.ClaimGrant]]:
        """Ask the kubelet which devices each container holds.

        Any failure (no socket, refused, timed out, reset, an answer over the cap or not the
        proto) closes the connection, so the next call dials again: a restarted kubelet has a
        new socket.
        """
        if self._channel is None:
            self._channel = self._grpclib_client.Channel(path=str(self._socket), codec=self._codec)
        stub = self._stubs.PodResourcesListerStub(self._channel)
        try:
            response = await stub.List(self._pb2.ListPodResourcesRequest(), timeout=self._timeout_s)
        except Exception as err:  # whatever the peer does, attribution goes on (and says why)
            await self.close()
            msg = f"PodResources List on {self._socket}: {self._why(err)}"
            raise PodResourcesError(msg) from err
        return grants(response)

    def _why(self, err: Exception) -> str:
        """Say a failed call in gRPC's status names, as grpcio (and the kubelet's logs) do."""
        if isinstance(err, self._grpclib_exceptions.GRPCError):
            return f"{err.status.name} {err.message or ''}".strip()
        if isinstance(err, TimeoutError):  # grpclib's deadline (an OSError: tested first)
            return f"DEADLINE_EXCEEDED (no answer within {self._timeout_s:g} s)"
        if isinstance(err, _TooLargeError):
            return f"RESOURCE_EXHAUSTED ({err})"
        if isinstance(err, OSError):
            return f"UNAVAILABLE ({err.strerror or err})"
        return f"UNAVAILABLE ({type(err).__name__}: {err})"

    async def close(self) -> None:
        """Close the connection (a new one is dialled on the next call)."""
        channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()
