"""Build the agent's kubelet PodResources client from the kubelet's published `api.proto`.

The proto is `pkg/apis/podresources/v1/api.proto` of the Go module `k8s.io/kubelet` at the
version that matches our Kubernetes (v1.37.2 → v0.37.2), fetched through the Go module proxy
(`go mod download -json`, checked against the module's go.sum hash by the go tool). Older
releases imported gogo-protobuf options, which are stripped (they only shape Go code). The
Python modules are generated into a build directory outside the source tree
(`~/.cache/taugrid/podresources/<key>/taugrid_podresources/`) by grpcio-tools' protoc with
three outputs: `api_pb2.py` (the messages, protobuf's own generator), `api_grpc.py` (the
client the agent uses, grpclib's protoc plugin `protoc-gen-grpclib_python`) and
`api_pb2_grpc.py` (grpcio's, for the tests' stand-in kubelet below; the agent never imports
it). `SOURCE.json` records the module, version, go.sum hash, proto digest and the generators'
versions. Nothing fetched or generated is committed.

    python devcluster/podresources.py build [--out DIR] [--proto FILE]

prints the directory to give the agent (`TAUGRID_AGENT_PODRESOURCES_CLIENT_DIR`). It needs
only the standard library, `go` (or `--proto`), `grpc_tools` and `grpclib`, so an image build
can copy this one file into its builder stage and run it there.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import importlib.util
import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

MODULE = "k8s.io/kubelet"
VERSION = "v0.37.2"
"""k8s.io/kubelet for Kubernetes v1.37.2 (staging modules are v0.<minor>.<patch>)."""
PROTO_PATH = "pkg/apis/podresources/v1/api.proto"
PACKAGE = "taugrid_podresources"
"""The Python package the generated modules live in (`taugrid_podresources.api_pb2`)."""
ENV_DIR = "TAUGRID_AGENT_PODRESOURCES_CLIENT_DIR"


class BuildError(Exception):
    """The proto could not be fetched or the client not generated."""


def default_cache_dir() -> pathlib.Path:
    """Where generated clients are kept: `$XDG_CACHE_HOME/taugrid/podresources`."""
    base = os.environ.get("XDG_CACHE_HOME") or str(pathlib.Path.home() / ".cache")
    return pathlib.Path(base) / "taugrid" / "podresources"


def fetch_proto(version: str = VERSION) -> tuple[str, dict[str, str]]:
    """Download the module through the Go proxy; return the proto text and where it came from."""
    go = shutil.which("go")
    if go is None:
        msg = "go not found: install Go (https://go.dev/doc/install) or pass --proto FILE"
        raise BuildError(msg)
    with tempfile.TemporaryDirectory(prefix="podresources-") as tmp:
        # Outside any module, so `go mod download` fetches exactly this version.
        done = subprocess.run(
            [go, "mod", "download", "-json", f"{MODULE}@{version}"],
            capture_output=True,
            text=True,
            check=False,
            cwd=tmp,
            env={**os.environ, "GOFLAGS": "-mod=mod", "GO111MODULE": "on"},
        )
    if done.returncode != 0:
        msg = f"go mod download {MODULE}@{version} failed: {done.stderr.strip() or done.stdout}"
        raise BuildError(msg)
    info = json.loads(done.stdout)
    proto = pathlib.Path(info["Dir"]) / PROTO_PATH
    if not proto.is_file():
        msg = f"{MODULE}@{version} has no {PROTO_PATH}"
        raise BuildError(msg)
    return proto.read_text(), {
        "module": MODULE,
        "version": info.get("Version", version),
        "go_sum": info.get("Sum", ""),
        "path": PROTO_PATH,
    }


_GOGO = re.compile(
    r"^\s*import\s+\"github\.com/gogo/protobuf/[^\"]+\";\s*$|^\s*option\s+\(gogoproto\.[^;]*;\s*$",
    re.MULTILINE,
)
_FIELD_OPTIONS = re.compile(r"\s*\[\s*\(gogoproto\.[^\]]*\]")


def sanitize(proto: str) -> str:
    """Drop gogo-protobuf imports and options, which only shape the Go code."""
    return _FIELD_OPTIONS.sub("", _GOGO.sub("", proto))


def _version(distribution: str) -> str:
    try:
        from importlib import metadata  # noqa: PLC0415 - only when generating

        return metadata.version(distribution)
    except Exception:  # noqa: BLE001 - recorded as unknown, never fatal
        return "unknown"


GENERATORS = ("grpcio-tools", "grpclib")
"""The distributions whose code writes the modules: protoc and its plugins."""


def build_key(proto: str, version: str) -> str:
    """The cache key: the proto, this builder and the generators' versions."""
    digest = hashlib.sha256()
    versions = [_version(d) for d in GENERATORS]
    for part in (proto, version, pathlib.Path(__file__).read_text(), *versions):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def _grpclib_plugin(directory: pathlib.Path) -> pathlib.Path:
    """Write `protoc-gen-grpclib_python` running grpclib's plugin on this interpreter.

    protoc looks plugins up on PATH, where a venv's console scripts may not be; the wrapper
    pins the plugin to the interpreter that runs protoc, whatever PATH says.
    """
    if importlib.util.find_spec("grpclib") is None:
        msg = "grpclib not importable: install it (uv sync installs it)"
        raise BuildError(msg)
    plugin = directory / "protoc-gen-grpclib_python"
    code = "from grpclib.plugin.main import main; main()"
    plugin.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -c {shlex.quote(code)}\n")
    plugin.chmod(0o755)
    return plugin


_GENCODE = re.compile(r"^# Protobuf Python Version: (\S+)$", re.MULTILINE)


def generate(out_dir: pathlib.Path, proto: str, source: dict[str, str]) -> pathlib.Path:
    """Run grpcio-tools' protoc and grpclib's plugin; return `out_dir` (which holds the package)."""
    try:
        from grpc_tools import protoc  # noqa: PLC0415 - a build-time dependency only
    except ImportError as err:
        msg = "grpc_tools not importable: install grpcio-tools (uv sync installs it)"
        raise BuildError(msg) from err
    out_dir.mkdir(parents=True, exist_ok=True)
    work = pathlib.Path(tempfile.mkdtemp(prefix=".gen-", dir=out_dir))
    try:
        package = work / PACKAGE
        package.mkdir()
        clean = sanitize(proto)
        (package / "api.proto").write_text(clean)
        include = pathlib.Path(protoc.__file__).parent / "_proto"
        rc = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{work}",
                f"-I{include}",
                f"--plugin=protoc-gen-grpclib_python={_grpclib_plugin(work)}",
                f"--python_out={work}",
                f"--grpclib_python_out={work}",
                f"--grpc_python_out={work}",
                str(package / "api.proto"),
            ]
        )
        if rc != 0:
            msg = f"protoc failed on {source.get('module')}@{source.get('version')} (exit {rc})"
            raise BuildError(msg)
        (package / "__init__.py").write_text(
            '"""Generated by devcluster/podresources.py from the kubelet\'s api.proto."""\n'
        )
        gencode = _GENCODE.search((package / "api_pb2.py").read_text())
        record = {
            **source,
            "proto_sha256": hashlib.sha256(clean.encode()).hexdigest(),
            "grpcio_tools": _version("grpcio-tools"),
            "protobuf_gencode": gencode.group(1) if gencode else "unknown",
            "grpclib": _version("grpclib"),
            "client": "grpclib (api_grpc.py; api_pb2_grpc.py is grpcio's, for tests)",
        }
        (package / "SOURCE.json").write_text(json.dumps(record, indent=2) + "\n")
        target = out_dir / PACKAGE
        if target.exists():
            shutil.rmtree(target)
        package.replace(target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out_dir


def build(
    cache_dir: pathlib.Path | None = None,
    *,
    proto_file: pathlib.Path | None = None,
    version: str = VERSION,
) -> pathlib.Path:
    """Fetch (or read) the proto and generate the client once; return the directory to use.

    The directory holds the `taugrid_podresources` package; an existing build of the same key
    is reused without running anything but `go mod download` (which reads its module cache).
    """
    if proto_file is not None:
        proto = proto_file.read_text()
        source = {"module": MODULE, "version": version, "go_sum": "", "path": str(proto_file)}
    else:
        proto, source = fetch_proto(version)
    out_dir = (cache_dir or default_cache_dir()) / build_key(proto, source["version"])
    if (out_dir / PACKAGE / "SOURCE.json").is_file():
        return out_dir
    return generate(out_dir, proto, source)


def main(argv: Sequence[str] | None = None) -> int:
    """`build [--out DIR] [--proto FILE]`: print the directory of the generated client."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    sub = parser.add_subparsers(dest="command", required=True)
    cmd = sub.add_parser("build", help="fetch the proto and generate the client")
    cmd.add_argument("--out", type=pathlib.Path, help="directory (default: the user cache)")
    cmd.add_argument("--proto", type=pathlib.Path, help="use this api.proto, not the Go proxy")
    cmd.add_argument("--version", default=VERSION, help=f"k8s.io/kubelet version ({VERSION})")
    args = parser.parse_args(argv)
    try:
        if args.out is not None:
            proto, source = (
                (args.proto.read_text(), {"module": MODULE, "version": args.version,
                                          "go_sum": "", "path": str(args.proto)})
                if args.proto is not None
                else fetch_proto(args.version)
            )  # fmt: skip
            out = generate(args.out, proto, source)
        else:
            out = build(proto_file=args.proto, version=args.version)
    except (BuildError, OSError, json.JSONDecodeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(out)
    return 0


def source_of(client_dir: pathlib.Path) -> dict[str, Any]:
    """The SOURCE.json a build recorded."""
    data: dict[str, Any] = json.loads((client_dir / PACKAGE / "SOURCE.json").read_text())
    return data


if __name__ == "__main__":
    raise SystemExit(main())


# ---------------------------------------------------------------- a kubelet stand-in for tests


class FakeKubelet:
    """A `PodResourcesLister` server on a Unix socket (grpc.aio) answering what it is told.

    It speaks the kubelet's proto with the messages the agent uses and grpcio's service stubs
    from the same build, so a test exercises the real gRPC path between two implementations
    (grpcio serving, the agent's grpclib calling), as on a node where grpc-go serves.
    `pods` is a list of (namespace, pod, containers), each container (name, devices, claims)
    with devices as (resource, [device ids]) and claims as (driver, pool, device).
    """

    def __init__(self, client_dir: pathlib.Path, socket: pathlib.Path) -> None:
        if str(client_dir) not in sys.path:
            sys.path.insert(0, str(client_dir))
        self._pb2: Any = importlib.import_module(f"{PACKAGE}.api_pb2")
        self._stubs: Any = importlib.import_module(f"{PACKAGE}.api_pb2_grpc")
        self.socket = socket
        self.pods: list[tuple[str, str, list[tuple[str, list[Any], list[Any]]]]] = []
        self.calls = 0
        self.answering = asyncio.Event()
        """Cleared, List waits for it: a kubelet that accepts the call and never answers."""
        self.answering.set()
        self.error: tuple[str, str] | None = None
        """(gRPC status name, details) to answer with instead of the pods."""
        self._server: Any = None

    def _response(self) -> Any:
        pb2 = self._pb2
        out = pb2.ListPodResourcesResponse()
        for namespace, name, containers in self.pods:
            pod = out.pod_resources.add(name=name, namespace=namespace)
            for cname, devices, claims in containers:
                container = pod.containers.add(name=cname)
                for resource, ids in devices:
                    container.devices.add(resource_name=resource, device_ids=list(ids))
                if claims:
                    dynamic = container.dynamic_resources.add(
                        claim_name=f"{name}-gpu", claim_namespace=namespace
                    )
                    for driver, pool, device in claims:
                        dynamic.claim_resources.add(
                            driver_name=driver, pool_name=pool, device_name=device
                        )
        return out

    async def start(self) -> None:
        """Serve on the socket (replacing a stale file)."""
        import grpc  # noqa: PLC0415 - a dev dependency: only tests and benches serve

        fake = self

        class Lister(self._stubs.PodResourcesListerServicer):  # type: ignore[misc, name-defined]
            async def List(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC name
                del request
                fake.calls += 1
                await fake.answering.wait()
                if fake.error is not None:
                    code, details = fake.error
                    await context.abort(grpc.StatusCode[code], details)
                return fake._response()

        self.socket.unlink(missing_ok=True)
        self._server = grpc.aio.server()
        self._stubs.add_PodResourcesListerServicer_to_server(Lister(), self._server)
        self._server.add_insecure_port(f"unix://{self.socket}")
        await self._server.start()

    async def stop(self) -> None:
        """Stop serving and remove the socket."""
        if self._server is not None:
            await self._server.stop(grace=None)
            self._server = None
        self.socket.unlink(missing_ok=True)
