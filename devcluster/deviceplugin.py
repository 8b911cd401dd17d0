"""A fake device plugin for the dev cluster's real node: `nvidia.com/gpu` from the fake NVML.

It speaks the kubelet's device-plugin API (v1beta1, gRPC over Unix sockets in the kubelet's
`device-plugins/` directory): it registers with the kubelet, lists one device per GPU of the
node's fake NVML library with the GPU's UUID as the device ID (the very UUIDs the node's agent
reports, since both load the library with the node's name as seed), and answers Allocate with
`NVIDIA_VISIBLE_DEVICES=<uuids>`, as NVIDIA's plugin does with its envvar strategy. So the
kubelet's PodResources API reports real device assignments for pods on the real node.

The gRPC stubs are generated at build time from the published `api.proto` (the k8s.io/kubelet
module, copied into the control plane's assets by `taugrid dev build`), into
`$TAUGRID_CACHE/deviceplugin/<digest>/`, never into the checkout: the step is
"device-plugin stubs". When the kubelet restarts it removes every socket in its directory;
the plugin notices its own socket gone and serves and registers again.

    python -m devcluster.deviceplugin --node real-node --plugin-dir DIR --proto API_PROTO
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import importlib
import pathlib
import shutil
import signal
import sys
import threading
import time
import types
from collections.abc import Iterator, Sequence
from typing import Any

from devcluster import build

RESOURCE = "nvidia.com/gpu"
API_VERSION = "v1beta1"
SOCKET_NAME = "taugrid-fake-gpu.sock"
MODULE = "deviceplugin_v1beta1"
"""The generated modules' base name (`<MODULE>_pb2`, `<MODULE>_pb2_grpc`): distinct from any
other generated kubelet API (the agent's PodResources stubs)."""


class PluginError(Exception):
    """The stubs could not be generated or the kubelet refused the registration."""


def stubs_dir(proto: pathlib.Path, root: pathlib.Path | None = None) -> pathlib.Path:
    """Where the stubs of this proto live (keyed by its digest and grpcio-tools' version)."""
    import grpc_tools  # noqa: PLC0415  (a dev dependency, needed only here)

    version = getattr(grpc_tools, "__version__", "") or _dist_version("grpcio-tools")
    digest = hashlib.sha256(proto.read_bytes() + version.encode()).hexdigest()[:16]
    return (root or build.cache_root()) / "deviceplugin" / digest


def _dist_version(name: str) -> str:
    from importlib import metadata  # noqa: PLC0415

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return ""


def generate(proto: pathlib.Path, root: pathlib.Path | None = None) -> pathlib.Path:
    """The device-plugin stubs step: run protoc (grpcio-tools) over the published api.proto
    unless the stubs of this proto exist; return their directory."""
    out = stubs_dir(proto, root)
    if (out / f"{MODULE}_pb2_grpc.py").exists():
        return out
    from grpc_tools import protoc  # noqa: PLC0415

    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    shutil.copy(proto, tmp / f"{MODULE}.proto")
    include = pathlib.Path(protoc.__file__).parent / "_proto"
    code = protoc.main(
        ["protoc", f"-I{tmp}", f"-I{include}", f"--python_out={tmp}", f"--grpc_python_out={tmp}",
         str(tmp / f"{MODULE}.proto")]
    )  # fmt: skip
    if code != 0:
        msg = f"device-plugin stubs: protoc failed on {proto} (exit {code})"
        raise PluginError(msg)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def load(proto: pathlib.Path) -> tuple[types.ModuleType, types.ModuleType]:
    """Generate (if needed) and import the stubs: (messages, services)."""
    directory = generate(proto)
    if str(directory) not in sys.path:
        sys.path.insert(0, str(directory))
    return importlib.import_module(f"{MODULE}_pb2"), importlib.import_module(f"{MODULE}_pb2_grpc")


def fake_uuids() -> list[str]:
    """The GPU UUIDs of the fake NVML this process loads (LD_LIBRARY_PATH and the seed come
    from its environment, as the node's agent has them)."""
    import pynvml  # noqa: PLC0415

    pynvml.nvmlInit()
    try:
        return [
            str(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i)))
            for i in range(pynvml.nvmlDeviceGetCount())
        ]
    finally:
        pynvml.nvmlShutdown()


def allocate_envs(device_ids: Sequence[str]) -> dict[str, str]:
    """The environment a container gets for its devices (NVIDIA's envvar strategy)."""
    return {"NVIDIA_VISIBLE_DEVICES": ",".join(device_ids)}


class Plugin:
    """The DevicePlugin service and its registration with the kubelet."""

    def __init__(self, pb2: Any, pb2_grpc: Any, plugin_dir: pathlib.Path, uuids: Sequence[str]):
        self.pb2 = pb2
        self.pb2_grpc = pb2_grpc
        self.plugin_dir = plugin_dir
        self.uuids = list(uuids)
        self.stopping = threading.Event()
        self.server: Any = None

    @property
    def socket(self) -> pathlib.Path:
        """Our socket in the kubelet's directory."""
        return self.plugin_dir / SOCKET_NAME

    # ------------------------------------------------------------------ service
    def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:  # noqa: N802  (gRPC)
        """No pre-start hook, no preferred allocation."""
        return self.pb2.DevicePluginOptions()

    def ListAndWatch(self, request: Any, context: Any) -> Iterator[Any]:  # noqa: N802
        """Send the devices, then keep the stream open until we stop or the kubelet leaves."""
        devices = [self.pb2.Device(ID=u, health="Healthy") for u in self.uuids]
        yield self.pb2.ListAndWatchResponse(devices=devices)
        while not self.stopping.wait(1.0) and context.is_active():
            pass

    def GetPreferredAllocation(self, request: Any, context: Any) -> Any:  # noqa: N802
        """Not offered (GetDevicePluginOptions says so); answer empty."""
        return self.pb2.PreferredAllocationResponse()

    def Allocate(self, request: Any, context: Any) -> Any:  # noqa: N802
        """Give each container its devices' UUIDs in NVIDIA_VISIBLE_DEVICES."""
        return self.pb2.AllocateResponse(
            container_responses=[
                self.pb2.ContainerAllocateResponse(envs=allocate_envs(list(c.devices_ids)))
                for c in request.container_requests
            ]
        )

    def PreStartContainer(self, request: Any, context: Any) -> Any:  # noqa: N802
        """Nothing to do before a container starts."""
        return self.pb2.PreStartContainerResponse()

    # ------------------------------------------------------------------ lifecycle
    def serve(self) -> None:
        """Serve on our socket (replacing a stale one)."""
        import grpc  # noqa: PLC0415

        self.socket.unlink(missing_ok=True)
        server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=4))
        self.pb2_grpc.add_DevicePluginServicer_to_server(self, server)
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        self.server = server

    def register(self) -> None:
        """Tell the kubelet our socket and resource."""
        import grpc  # noqa: PLC0415

        kubelet = self.plugin_dir / "kubelet.sock"
        with grpc.insecure_channel(f"unix://{kubelet}") as channel:
            stub = self.pb2_grpc.RegistrationStub(channel)
            try:
                stub.Register(
                    self.pb2.RegisterRequest(
                        version=API_VERSION, endpoint=SOCKET_NAME, resource_name=RESOURCE,
                        options=self.pb2.DevicePluginOptions(),
                    ),
                    timeout=10,
                )  # fmt: skip
            except grpc.RpcError as err:
                msg = f"the kubelet refused the registration: {err}"
                raise PluginError(msg) from err

    def run(self) -> None:
        """Serve and register; do both again whenever the kubelet removed our socket."""
        while not self.stopping.is_set():
            kubelet = self.plugin_dir / "kubelet.sock"
            if not kubelet.exists():
                time.sleep(0.5)
                continue
            self.serve()
            try:
                self.register()
            except PluginError as err:
                print(err, file=sys.stderr, flush=True)
                self.server.stop(0)
                time.sleep(1.0)
                continue
            print(f"registered {len(self.uuids)} {RESOURCE} devices: {', '.join(self.uuids)}",
                  flush=True)  # fmt: skip
            while not self.stopping.wait(0.5) and self.socket.exists():
                pass
            self.server.stop(0)
            if not self.stopping.is_set():
                print("our socket is gone (kubelet restarted): registering again", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the fake device plugin until SIGTERM."""
    parser = argparse.ArgumentParser(prog="deviceplugin", description=__doc__)
    parser.add_argument("--node", required=True, help="the node (the fake NVML's seed)")
    parser.add_argument("--plugin-dir", required=True, type=pathlib.Path)
    parser.add_argument("--proto", required=True, type=pathlib.Path, help="the published api.proto")
    args = parser.parse_args(argv)
    pb2, pb2_grpc = load(args.proto)
    plugin = Plugin(pb2, pb2_grpc, args.plugin_dir, fake_uuids())
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: plugin.stopping.set())
    plugin.run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
