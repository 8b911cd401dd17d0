"""The real node's configuration: every path under the state directory, cgroup v1 accepted,
our taint, our pause image, no route off the machine; and what `down` unmounts."""

from __future__ import annotations

import hashlib
import pathlib
import re

import pytest

from devcluster import netns, node

STATE = pathlib.Path("/root/.local/state/taugrid/node")
MOUNTINFO = (pathlib.Path(__file__).parents[2] / "fixtures" / "node" / "mountinfo.txt").read_text()
PATHS = node.Paths.of(STATE)
LINK = netns.plan(STATE, slot=56)
PAUSE = "docker.io/taugrid/pause:dev-0123456789abcdef"
OUTSIDE_ALLOWED = {str(node.RUNC), str(node.CNI_BIN)}
"""Debian's runc and CNI plugins are read, never written."""


def _quoted_paths(text: str) -> list[str]:
    return re.findall(r"'(/[^']*)'", text)


def test_containerd_keeps_everything_under_the_state_directory() -> None:
    """Root, state, sockets, runc's state, CNI configuration and containerd's `opt` are ours;
    only the Debian binaries it runs live elsewhere."""
    paths = _quoted_paths(node.containerd_config(PATHS, PAUSE))
    assert paths, "no paths in the config"
    outside = {p for p in paths if not p.startswith(f"{STATE}/")} - OUTSIDE_ALLOWED
    assert set() == outside


@pytest.mark.parametrize(
    "line",
    [
        f"      sandbox = '{PAUSE}'",
        "    netns_mounts_under_state_dir = true",
        "    restrict_oom_score_adj = true",
        "          SystemdCgroup = false",
        "imports = []",
    ],
    ids=[
        "our pause image is pinned as the sandbox image",
        "pod network namespaces are mounted under the state directory",
        "no OOM score below containerd's own (root lacks CAP_SYS_RESOURCE here)",
        "cgroupfs, as the kubelet",
        "no host configuration is imported",
    ],
)
def test_the_containerd_config_says(line: str) -> None:
    """Each line that makes containerd work here and stay in its own directory is there."""
    assert line in node.containerd_config(PATHS, PAUSE).splitlines()


def test_the_kubelet_accepts_cgroup_v1_under_a_parent_of_its_own() -> None:
    """failCgroupV1 off, cgroupfs, a cgroup parent named after the state directory (two dev
    clusters never share one), the node's taint at registration, TLS from our CA."""
    cfg = node.kubelet_config(PATHS, LINK, STATE / "pki", "kubelet-serving-real-node")
    assert cfg["failCgroupV1"] is False
    assert cfg["cgroupDriver"] == "cgroupfs"
    assert cfg["cgroupRoot"] == f"/taugrid-{netns.state_hash(STATE)}"
    assert cfg["registerWithTaints"] == [node.TAINT]
    assert cfg["address"] == LINK.node_ip
    assert cfg["authentication"]["anonymous"]["enabled"] is False
    assert cfg["tlsCertFile"] == str(STATE / "pki" / "kubelet-serving-real-node.crt")
    assert cfg["containerRuntimeEndpoint"] == f"unix://{PATHS.socket}"
    assert str(cfg["volumePluginDir"]).startswith(f"{STATE}/")


def test_two_state_directories_get_two_cgroup_parents_and_links() -> None:
    """Host-global names derive from the state directory."""
    other = pathlib.Path("/root/.local/state/taugrid/lead")
    assert node.Paths.of(other).cgroup_parent != PATHS.cgroup_parent
    assert netns.plan(other, slot=57).host_if != LINK.host_if


def test_pods_get_one_route_and_it_stays_on_this_machine() -> None:
    """The CNI bridge hands out the pod CIDR and routes only 198.18.0.0/15: no default route,
    no masquerade, so a pod can send nothing off the machine."""
    cfg = node.cni_config(LINK, PATHS)
    (bridge,) = cfg["plugins"]
    assert bridge["ipMasq"] is False
    assert bridge["ipam"]["routes"] == [{"dst": "198.18.0.0/15"}]
    assert bridge["ipam"]["ranges"] == [[{"subnet": "198.19.56.0/24", "gateway": "198.19.56.1"}]]
    assert bridge["ipam"]["dataDir"] == str(PATHS.cni_ipam)


def test_the_cgroup_v1_hierarchies_are_read_from_mountinfo() -> None:
    """Every mounted v1 controller (captured on this machine) gets the kubelet's parent, and
    the hybrid layout's v2 tree is cleaned too (runc makes cgroups there)."""
    names = [p.name for p in node.mounted_cgroup_hierarchies(MOUNTINFO)]
    assert {"cpu", "memory", "devices", "pids", "systemd", "unified"} <= set(names)
    assert "cgroup" not in names  # the tmpfs at /sys/fs/cgroup itself is no hierarchy


def test_down_unmounts_the_deepest_first() -> None:
    """Pod volumes, rootfs and netns mounts under the node's directory, children before the
    kubelet directory's own bind mount; nothing outside the state directory."""
    points = node.mounts_under(MOUNTINFO, PATHS.root)
    assert points, "the captured mountinfo has node mounts"
    assert all(str(p).startswith(f"{PATHS.root}/") for p in points)
    kubelet = points.index(PATHS.kubelet_root)
    assert all(points.index(p) < kubelet for p in points if PATHS.kubelet_root in p.parents)


def test_the_node_is_labelled_for_the_dev_fleet_and_a_gpu_node() -> None:
    """The dev controller manages it and the h100 flavor's label is on it, like a KWOK node."""
    labels = node.node_labels()
    assert labels[node.NODE_LABEL] == "true"
    assert labels["taugrid.dev/dev-fleet"] == "true"
    assert labels["nvidia.com/gpu.present"] == "true"


def test_a_shim_socket_is_named_as_containerd_names_it() -> None:
    """sha256 of `<address>/<namespace>/<id>` (containerd v2.3.7 pkg/shim/util_unix.go), so
    `down` removes exactly the sockets of the shims it killed."""
    address = str(PATHS.socket)
    expected = hashlib.sha256(f"{address}/k8s.io/abc".encode()).hexdigest()
    assert expected == node.shim_socket_name(address, "k8s.io", "abc")
    assert expected != node.shim_socket_name(address, "k8s.io", "abc", debug=True)
