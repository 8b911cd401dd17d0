"""The PodResources client builder: the pinned kubelet module and the gogo-option stripping."""

from __future__ import annotations

import pathlib
import re
from importlib import metadata

import pytest

from devcluster import build, podresources

GOGO_PROTO = """syntax = "proto3";

package v1;
option go_package = "v1";

import "github.com/gogo/protobuf/gogoproto/gogo.proto";

option (gogoproto.goproto_stringer_all) = false;
option (gogoproto.stringer_all) =  true;

message ContainerDevices {
    string resource_name = 1;
    repeated string device_ids = 2 [(gogoproto.customname) = "DeviceIDs"];
}
"""


def test_the_kubelet_module_matches_our_kubernetes() -> None:
    """k8s.io/kubelet v0.X.Y is the staging module of Kubernetes v1.X.Y."""
    match = re.fullmatch(r"v1\.(\d+\.\d+)", build.K8S_VERSION)
    assert match is not None
    assert f"v0.{match.group(1)}" == podresources.VERSION


def test_gogo_imports_and_options_are_stripped() -> None:
    """Older api.proto releases import gogo options; they shape Go code only and go away."""
    clean = podresources.sanitize(GOGO_PROTO)
    assert "gogo" not in clean
    assert "repeated string device_ids = 2;" in clean
    assert 'option go_package = "v1";' in clean


def test_a_clean_proto_is_unchanged() -> None:
    """v0.37.2's proto has no gogo options: sanitizing leaves it as published."""
    proto = 'syntax = "proto3";\nmessage A {\n    string name = 1;\n}\n'
    assert proto == podresources.sanitize(proto)


SERVICE_PROTO = """syntax = "proto3";

package v1;

message ListPodResourcesRequest {}
message ListPodResourcesResponse {
    repeated string names = 1;
}
service PodResourcesLister {
    rpc List(ListPodResourcesRequest) returns (ListPodResourcesResponse) {}
}
"""


def test_the_client_is_generated_with_grpclib_whatever_path_says(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """protoc runs grpclib's plugin through the builder's wrapper: a venv's bin need not be on PATH.

    The three modules are written and SOURCE.json names the generators' versions.
    """
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    out = podresources.generate(tmp_path, SERVICE_PROTO, {"module": "m", "version": "v0"})
    package = out / podresources.PACKAGE
    modules = sorted(p.name for p in package.glob("api*.py"))
    assert modules == ["api_grpc.py", "api_pb2.py", "api_pb2_grpc.py"]
    assert "class PodResourcesListerStub" in (package / "api_grpc.py").read_text()
    source = podresources.source_of(out)
    assert source["grpclib"] == metadata.version("grpclib")
    assert source["grpcio_tools"] == metadata.version("grpcio-tools")
    assert re.fullmatch(r"\d+\.\d+\.\d+", source["protobuf_gencode"]), source
