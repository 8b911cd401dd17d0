"""The dev cluster's one real node: containerd, the kubelet and a fake device plugin.

Beside the KWOK GPU nodes runs one node whose pods really run (DESIGN.md section 8): a
kubelet from the Kubernetes module (cgroupfs driver, `failCgroupV1: false` because these
machines boot cgroup v1), containerd 2.x with its runc shim from their Go module, Debian's
runc and CNI plugins, our own pause image pinned as containerd's sandbox image (nothing is
ever pulled: every image is built locally and imported). The kubelet and containerd run in a
network namespace of ours (`devcluster.netns`), whose host end a relay process joins to the
API server on 127.0.0.1. The node carries a taint of its own, so tests written for KWOK nodes
never land there, and a fake device plugin (`devcluster.deviceplugin`) advertises
`nvidia.com/gpu` with the fake NVML's UUIDs as device IDs.

Everything lives under `<state>/node/`: containerd's root and state and socket, the kubelet's
root (its PodResources and device-plugin sockets included), CNI configuration and IPAM, runc's
state, the configs. Host-global names derive from the state directory: the veth pair, the
cgroup parent (`/taugrid-<hash>` in every cgroup v1 hierarchy) and the slot of addresses. What
containerd's code fixes itself stays outside: its shims' sockets under /run/containerd/s
(one per container, named by a hash of our socket address and the container, removed with it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import pathlib
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from typing import Any

import yaml

from devcluster import build, cluster, fakenvml, images, netns, pki, processes, stack

NODE_NAME = "real-node"
TAINT_KEY = "taugrid.dev/real-node"
RUN_IMAGE_ALIAS = "docker.io/taugrid/run:dev"
"""A second name of the run image in the node's containerd, so a tau.yaml can name it
without the build's hash (examples/real-node.yaml); nothing is ever pulled."""
TAINT = {"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}
"""KWOK-shaped tests never land here: only what tolerates this taint does."""
NODE_LABEL = TAINT_KEY
KUBELET_PORT = 10250
"""Inside the node's namespace, so it never collides with KWOK's port on the host."""
RUNC = pathlib.Path("/usr/sbin/runc")
DEVICE_PLUGIN_DIR = pathlib.Path("/var/lib/kubelet/device-plugins")
"""Hard-coded in the kubelet (its registration socket and device checkpoint live here)."""
SHIM_SOCKETS = pathlib.Path("/run/containerd/s")
"""Fixed in containerd's code (pkg/shim `defaults.DefaultStateDir`/s, as root): one socket per
running container, named by a hash of our socket and the container; gone with the container."""
OWNER_FILE = DEVICE_PLUGIN_DIR / ".taugrid-owner"
"""The state directory of the dev cluster whose kubelet uses DEVICE_PLUGIN_DIR now."""
CNI_BIN = pathlib.Path("/usr/lib/cni")
CNI_PLUGINS = ("bridge", "host-local", "loopback")
CONTROLLERS_V1 = ("cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "blkio", "pids",
                  "systemd", "hugetlb", "net_cls", "net_prio", "perf_event", "rdma")  # fmt: skip
"""cgroup v1 hierarchies the kubelet's cgroup parent is made in (those that are mounted)."""
PROCESS_ORDER = ("node-relay", "containerd", "kubelet", "device-plugin")


class NodeError(cluster.ClusterError):
    """The real node could not start; the message says which component and why."""


@dataclasses.dataclass(frozen=True)
class Paths:
    """Where one dev cluster's node keeps everything (all under its state directory)."""

    root: pathlib.Path
    cgroup_parent: str

    @classmethod
    def of(cls, state: pathlib.Path) -> Paths:
        """The node paths of the dev cluster rooted at `state`."""
        return cls(state / "node", f"/taugrid-{netns.state_hash(state)}")

    @property
    def containerd_root(self) -> pathlib.Path:
        """containerd's persistent root (content, snapshots, metadata)."""
        return self.root / "containerd" / "root"

    @property
    def containerd_state(self) -> pathlib.Path:
        """containerd's state (tasks, pod network namespaces)."""
        return self.root / "containerd" / "state"

    @property
    def socket(self) -> pathlib.Path:
        """containerd's gRPC socket (the kubelet's runtime endpoint)."""
        return self.root / "containerd" / "containerd.sock"

    @property
    def kubelet_root(self) -> pathlib.Path:
        """The kubelet's --root-dir."""
        return self.root / "kubelet"

    @property
    def device_plugins(self) -> pathlib.Path:
        """The kubelet's device-plugin directory: fixed by the kubelet's code
        (k8s.io/kubelet `DevicePluginPath`), the one path of the node outside the state
        directory, which is why one machine runs one real node at a time."""
        return DEVICE_PLUGIN_DIR

    @property
    def pod_resources(self) -> pathlib.Path:
        """The kubelet's PodResources socket."""
        return self.kubelet_root / "pod-resources" / "kubelet.sock"

    @property
    def cni_conf(self) -> pathlib.Path:
        """CNI configuration directory."""
        return self.root / "cni" / "net.d"

    @property
    def cni_ipam(self) -> pathlib.Path:
        """host-local IPAM's allocations."""
        return self.root / "cni" / "ipam"

    @property
    def runc_root(self) -> pathlib.Path:
        """runc's state (its default is /run/containerd/runc)."""
        return self.root / "runc"

    @property
    def controller_addr(self) -> pathlib.Path:
        """The controller pod's `ip:port`, which the relay reads for each connection."""
        return self.root / "controller.addr"

    @property
    def images(self) -> pathlib.Path:
        """The references of the images imported into the node (JSON: name → reference)."""
        return self.root / "images.json"

    @property
    def agent_state(self) -> pathlib.Path:
        """The agent pod's latched-fault state directory (the chart's stateHostPath)."""
        return self.root / "agent-state"


# ---------------------------------------------------------------------- configs (pure)
def containerd_config(paths: Paths, pause_ref: str) -> str:
    """containerd's configuration: every path under the state directory, our pause image
    pinned, runc from Debian with its state under ours, CNI from Debian's plugins."""
    runtime = "plugins.'io.containerd.cri.v1.runtime'"
    lines = [
        "version = 3",
        f"root = '{paths.containerd_root}'",
        f"state = '{paths.containerd_state}'",
        "imports = []",
        "disabled_plugins = ['io.containerd.nri.v1.nri', 'io.containerd.internal.v1.tracing',",
        "  'io.containerd.snapshotter.v1.devmapper', 'io.containerd.snapshotter.v1.zfs',",
        "  'io.containerd.snapshotter.v1.btrfs', 'io.containerd.snapshotter.v1.blockfile',",
        "  'io.containerd.snapshotter.v1.erofs', 'io.containerd.image-verifier.v1.bindir']",
        "[grpc]",
        f"  address = '{paths.socket}'",
        "[ttrpc]",
        f"  address = '{paths.socket}.ttrpc'",
        "[debug]",
        "  address = ''",
        "[metrics]",
        "  address = ''",
        "[plugins]",
        "  [plugins.'io.containerd.internal.v1.opt']",
        f"    path = '{paths.root / 'containerd' / 'opt'}'",
        "  [plugins.'io.containerd.cri.v1.images']",
        "    snapshotter = 'overlayfs'",
        "    [plugins.'io.containerd.cri.v1.images'.pinned_images]",
        f"      sandbox = '{pause_ref}'",
        f"  [{runtime}]",
        "    netns_mounts_under_state_dir = true",
        # Lowering an OOM score needs CAP_SYS_RESOURCE, which root lacks on these machines
        # (runc fails "failed to update /proc/self/oom_score_adj: Permission denied"):
        # keep every container at or above containerd's own score instead.
        "    restrict_oom_score_adj = true",
        f"    cdi_spec_dirs = ['{paths.root / 'cdi'}']",
        "    enable_criu = false",
        f"    [{runtime}.containerd]",
        "      default_runtime_name = 'runc'",
        f"      [{runtime}.containerd.runtimes.runc]",
        "        runtime_type = 'io.containerd.runc.v2'",
        f"        [{runtime}.containerd.runtimes.runc.options]",
        f"          BinaryName = '{RUNC}'",
        f"          Root = '{paths.runc_root}'",
        "          SystemdCgroup = false",
        f"    [{runtime}.cni]",
        f"      bin_dirs = ['{CNI_BIN}']",
        f"      conf_dir = '{paths.cni_conf}'",
        "      max_conf_num = 1",
        "  [plugins.'io.containerd.grpc.v1.cri']",
        "    stream_server_address = '127.0.0.1'",
        "    stream_server_port = '0'",
    ]
    return "\n".join(lines) + "\n"


def cni_config(link: netns.Link, paths: Paths) -> dict[str, Any]:
    """A bridge in the node's namespace; pods get addresses of the pod CIDR and one route,
    to 198.18.0.0/15 (the link's host end): no default route, so nothing leaves the machine."""
    return {
        "cniVersion": "1.0.0",
        "name": "taugrid",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "tg0",
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": link.pod_cidr, "gateway": link.pod_gateway}]],
                    "routes": [{"dst": netns.ROUTED}],
                    "dataDir": str(paths.cni_ipam),
                },
            },
        ],
    }


def kubelet_config(
    paths: Paths, link: netns.Link, pki_dir: pathlib.Path, serving: str
) -> dict[str, Any]:
    """The kubelet's configuration: cgroup v1 accepted, cgroupfs under our own parent, TLS
    from our CA (the API server checks the kubelet's certificate), our taint at registration,
    no image garbage collection (images are imported, never pulled), no nameserver for pods."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": paths.cgroup_parent,
        "address": link.node_ip,
        "port": KUBELET_PORT,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "tlsCertFile": str(pki_dir / f"{serving}.crt"),
        "tlsPrivateKeyFile": str(pki_dir / f"{serving}.key"),
        "authentication": {
            "x509": {"clientCAFile": str(pki_dir / "ca.crt")},
            "webhook": {"enabled": True},
            "anonymous": {"enabled": False},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{paths.socket}",
        "registerWithTaints": [TAINT],
        "resolvConf": str(paths.root / "resolv.conf"),
        "failSwapOn": False,
        "maxPods": 30,
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
        "shutdownGracePeriod": "0s",
        "staticPodPath": "",
        "volumePluginDir": str(paths.root / "volume-plugins"),
        "containerLogMaxSize": "10Mi",
        "nodeStatusReportFrequency": "10s",
        "syncFrequency": "10s",
    }


def node_labels() -> dict[str, str]:
    """The real node's labels: ours, plus what GPU feature discovery would write, so the dev
    fleet's flavor and the controller treat it as a GPU node."""
    return {
        NODE_LABEL: "true",
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": cluster.GPU_PRODUCT,
        "taugrid.dev/dev-fleet": "true",
    }


def kubelet_kubeconfig(server: str, pki_dir: pathlib.Path, client: str) -> dict[str, Any]:
    """The kubelet's credentials: its own client certificate (group system:nodes)."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "taugrid-dev", "cluster": {
            "server": server, "certificate-authority": str(pki_dir / "ca.crt")}}],
        "users": [{"name": NODE_NAME, "user": {
            "client-certificate": str(pki_dir / f"{client}.crt"),
            "client-key": str(pki_dir / f"{client}.key")}}],
        "contexts": [{"name": NODE_NAME, "context": {"cluster": "taugrid-dev", "user": NODE_NAME}}],
        "current-context": NODE_NAME,
    }  # fmt: skip


NODE_RBAC: list[dict[str, Any]] = [
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "taugrid-dev-nodes"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "system:node"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                      "name": "system:nodes"}],
    },
]  # fmt: skip
"""The API server authorises with RBAC alone (no Node authorizer): kubelets get `system:node`."""


def shim_socket_name(address: str, namespace: str, shim_id: str, *, debug: bool = False) -> str:
    """The name of a runc shim's socket in SHIM_SOCKETS, as containerd's `pkg/shim`
    (`CreateSocketAddress`) makes it: sha256 of `<containerd address>/<namespace>/<id>`."""
    path = pathlib.PurePosixPath(address, namespace, shim_id)  # cleaned, as filepath.Join
    if debug:
        path = path / "debug"
    return hashlib.sha256(str(path).encode()).hexdigest()


def mounted_cgroup_hierarchies(mountinfo: str) -> list[pathlib.Path]:
    """The cgroup hierarchies mounted under /sys/fs/cgroup (from /proc/self/mountinfo): every
    v1 controller, and the hybrid layout's v2 tree (`unified`), where runc makes its cgroups
    too."""
    out = []
    for line in mountinfo.splitlines():
        fields = line.split()
        hierarchy = " - cgroup " in line or " - cgroup2 " in line
        if hierarchy and len(fields) > 4 and fields[4].startswith("/sys/fs/cgroup/"):
            out.append(pathlib.Path(fields[4]))
    return sorted(set(out))


def mounts_under(mountinfo: str, root: pathlib.Path) -> list[pathlib.Path]:
    """Mount points at or under `root`, deepest first (the order to unmount them in)."""
    prefix = str(root).rstrip("/") + "/"
    points = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) > 4:
            point = fields[4].replace("\\040", " ")
            if point.startswith(prefix):
                points.append(pathlib.Path(point))
    return sorted(set(points), key=lambda p: (-len(p.parts), str(p)))


# ---------------------------------------------------------------------- preflight
def preflight(bin_dir: pathlib.Path, mountinfo: str | None = None) -> list[str]:
    """What keeps the real node from running on this machine, each with why (empty: none)."""
    problems = []
    if os.geteuid() != 0:
        problems.append("not root: the kubelet, containerd and runc need root here")
    binaries = ("kubelet", "containerd", "containerd-shim-runc-v2", "ctr", "pause")
    problems.extend(
        f"{b} not built: run `taugrid dev build`" for b in binaries if not (bin_dir / b).exists()
    )
    if not RUNC.exists():
        problems.append(f"{RUNC} missing: apt-get install runc (scripts/test installs it)")
    missing_cni = [p for p in CNI_PLUGINS if not (CNI_BIN / p).exists()]
    if missing_cni:
        problems.append(
            f"CNI plugins {', '.join(missing_cni)} missing in {CNI_BIN}: "
            "apt-get install containernetworking-plugins"
        )
    for tool, package in (("mmdebstrap", "mmdebstrap"), ("ip", "iproute2"), ("sysctl", "procps"),
                          ("nsenter", "util-linux"), ("unshare", "util-linux")):  # fmt: skip
        if shutil.which(tool) is None:
            problems.append(f"{tool} missing: apt-get install {package}")
    filesystems = pathlib.Path("/proc/filesystems").read_text()
    if "overlay" not in filesystems:
        problems.append("the kernel has no overlay file system (containerd's snapshotter)")
    info = mountinfo if mountinfo is not None else pathlib.Path("/proc/self/mountinfo").read_text()
    unified = "cgroup2" in info and not mounted_cgroup_hierarchies(info)
    v1 = [h for h in mounted_cgroup_hierarchies(info) if h.name != "unified"]
    if not unified and not any(h.name == "memory" for h in v1):
        problems.append("no cgroup memory hierarchy mounted: the kubelet cannot run pods")
    return problems


# ---------------------------------------------------------------------- the node
class RealNode:
    """Start, check and stop the real node of one dev cluster."""

    def __init__(self, c: cluster.Cluster, bin_dir: pathlib.Path | None = None) -> None:
        self.cluster = c
        self.bin_dir = bin_dir
        self.paths = Paths.of(c.state)
        self.link = netns.plan(c.state)

    @property
    def bin(self) -> pathlib.Path:
        """The built binaries."""
        return self.bin_dir or build.built_dir() / "bin"

    def _say(self, out: Callable[[str], None], msg: str, started: float) -> None:
        out(f"[real node {time.monotonic() - started:5.1f}s] {msg}")

    def start(
        self, out: Callable[[str], None] = print, *, operators: bool = False
    ) -> dict[str, str]:
        """Bring the node up (network, relay, containerd, images, kubelet, device plugin) and
        wait until it is Ready with its GPUs allocatable; return the imported image refs.
        With `operators`, Kueue's and KubeRay's operators are imported too, as images of one
        static binary each (`images.OPERATOR_BINARIES`), for the one install (`up --bare`)."""
        started = time.monotonic()
        problems = preflight(self.bin)
        if problems:
            msg = "the real node cannot run on this machine:\n" + "\n".join(
                f"  - {p}" for p in problems
            )
            raise NodeError(msg)
        self._clean_leftovers()
        netns.ensure(self.link)
        self._say(out, f"network namespace {self.link.netns} ({self.link.host_if} "
                  f"{self.link.host_ip} <-> {self.link.node_ip}, pods {self.link.pod_cidr})",
                  started)  # fmt: skip
        self._make_cgroup_parent()
        self._write_configs()
        self._start_relay()
        built = self._images(out, operators=operators)
        self._start_containerd(built["pause"])
        self._say(out, "containerd ready", started)
        present = set(self._ctr("images", "ls", "-q").stdout.split())
        wanted = [archive for ref, archive in built.values() if ref not in present]
        images.import_archives(self.bin / "ctr", self.paths.socket, wanted)
        self._ctr("images", "tag", "--force", built["run"][0], RUN_IMAGE_ALIAS)
        self._say(out, f"imported {len(wanted)} images ({len(built) - len(wanted)} present)",
                  started)  # fmt: skip
        self.cluster.apply(self.bin, NODE_RBAC)
        self._claim_device_plugin_dir()
        self._start_kubelet()
        self._wait_ready()
        self._say(out, f"node {NODE_NAME} Ready", started)
        self._start_device_plugin()
        self._wait_gpus()
        self._say(out, "fake device plugin registered: nvidia.com/gpu allocatable", started)
        refs = {name: ref for name, (ref, _) in built.items()}
        self.paths.images.write_text(json.dumps(refs, indent=2) + "\n")
        return refs

    # ------------------------------------------------------------------ steps
    def _images(
        self, out: Callable[[str], None], *, operators: bool = False
    ) -> dict[str, tuple[str, pathlib.Path]]:
        builder = images.Builder(out=out)
        built = builder.build()
        built["pause"] = builder.pause(self.bin / "pause")
        if operators:
            for name, binary in images.OPERATOR_BINARIES.items():
                built[name] = builder.static_binary(name, self.bin / binary)
        return built

    def _make_cgroup_parent(self) -> None:
        info = pathlib.Path("/proc/self/mountinfo").read_text()
        for hierarchy in mounted_cgroup_hierarchies(info):
            (hierarchy / self.paths.cgroup_parent.lstrip("/")).mkdir(exist_ok=True)

    def _write_configs(self) -> None:
        p, link = self.paths, self.link
        for d in (p.root, p.cni_conf, p.cni_ipam, p.kubelet_root, p.runc_root, p.agent_state):
            d.mkdir(parents=True, exist_ok=True)
        (p.root / "resolv.conf").write_text("nameserver 127.0.0.1\n")
        (p.cni_conf / "10-taugrid.conflist").write_text(json.dumps(cni_config(link, p), indent=2))
        client, serving = pki.ensure_node(self.cluster.pki, NODE_NAME, link.node_ip)
        (p.root / "kubelet.yaml").write_text(
            yaml.safe_dump(kubelet_config(p, link, self.cluster.pki, serving), sort_keys=False)
        )
        server = f"https://{link.host_ip}:{self.cluster.ports.apiserver}"
        (p.root / "kubelet.kubeconfig").write_text(
            yaml.safe_dump(kubelet_kubeconfig(server, self.cluster.pki, client), sort_keys=False)
        )

    def _start_relay(self) -> None:
        api = self.cluster.ports.apiserver
        rules = [f"{self.link.host_ip}:{api}=127.0.0.1:{api}"]
        self.cluster.table.start("node-relay", [*_python("devcluster.relay"), *rules], env=_env())

    def _start_containerd(self, pause: tuple[str, pathlib.Path]) -> None:
        cfg = self.paths.root / "containerd.toml"
        cfg.write_text(containerd_config(self.paths, pause[0]))
        self.paths.socket.unlink(missing_ok=True)
        binary = self.bin / "containerd"
        env = {**_env(), "PATH": f"{self.bin}:{os.environ.get('PATH', '')}"}
        self.cluster.table.start(
            "containerd",
            netns.in_netns(self.link, [str(binary), f"--config={cfg}", "--log-level=info"]),
            env=env,
            exe=str(binary),
        )
        self._wait(
            "containerd",
            lambda: self.paths.socket.exists() and self._ctr("version").returncode == 0,
            60,
        )

    def _ctr(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.bin / "ctr"), "--address", str(self.paths.socket), "-n", "k8s.io", *args],
            capture_output=True, text=True, check=False,
        )  # fmt: skip

    def _claim_device_plugin_dir(self) -> None:
        """Take the kubelet's fixed device-plugin directory, unless another dev cluster's
        running kubelet has it (checked by that cluster's PID record)."""
        other = owner()
        if other is not None and other != self.cluster.state:
            rec = processes.ProcessTable(other).get("kubelet")
            if rec is not None and processes.is_alive(rec):
                msg = (
                    f"the dev cluster at {other} runs a real node: its kubelet holds "
                    f"{DEVICE_PLUGIN_DIR}, a path the kubelet's code fixes, so one machine runs "
                    "one real node at a time (`taugrid dev down` there, or `up --no-real-node`)"
                )
                raise NodeError(msg)
        shutil.rmtree(DEVICE_PLUGIN_DIR, ignore_errors=True)
        DEVICE_PLUGIN_DIR.mkdir(parents=True)
        OWNER_FILE.write_text(str(self.cluster.state) + "\n")

    def _release_device_plugin_dir(self) -> None:
        if owner() == self.cluster.state:
            shutil.rmtree(DEVICE_PLUGIN_DIR, ignore_errors=True)
            with contextlib.suppress(OSError):
                DEVICE_PLUGIN_DIR.parent.rmdir()  # /var/lib/kubelet, when nothing else is there

    def _start_kubelet(self) -> None:
        binary = self.bin / "kubelet"
        labels = ",".join(f"{k}={v}" for k, v in node_labels().items())
        self.cluster.table.start(
            "kubelet",
            netns.in_netns(self.link, [
                str(binary), f"--config={self.paths.root / 'kubelet.yaml'}",
                f"--kubeconfig={self.paths.root / 'kubelet.kubeconfig'}",
                f"--root-dir={self.paths.kubelet_root}", f"--node-ip={self.link.node_ip}",
                f"--hostname-override={NODE_NAME}", f"--node-labels={labels}", "--v=1",
                f"--cert-dir={self.paths.root / 'kubelet-pki'}",
            ]),
            env={**_env(), "PATH": f"{self.bin}:{os.environ.get('PATH', '')}"},
            exe=str(binary),
        )  # fmt: skip

    def _node(self) -> dict[str, Any] | None:
        try:
            raw = self.cluster.kubectl(self.bin, "get", "node", NODE_NAME, "-o", "json")
        except cluster.ClusterError:
            return None
        return dict(json.loads(raw))

    def _wait_ready(self) -> None:
        def ready() -> bool:
            node = self._node()
            conds = ((node or {}).get("status") or {}).get("conditions") or []
            return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)

        self._wait("kubelet", ready, 120)

    def _start_device_plugin(self) -> None:
        self.cluster.table.start(
            "device-plugin",
            [*_python("devcluster.deviceplugin"), "--node", NODE_NAME,
             "--plugin-dir", str(self.paths.device_plugins),
             "--proto", str(self.bin.parent / "assets" / "deviceplugin" / "api.proto")],
            env={**_env(), **fakenvml.agent_env(fakenvml.build(), None, seed=NODE_NAME)},
        )  # fmt: skip

    def _wait_gpus(self) -> None:
        def allocatable() -> bool:
            node = self._node() or {}
            return int(((node.get("status") or {}).get("allocatable") or {}).get(
                "nvidia.com/gpu", "0")) > 0  # fmt: skip

        self._wait("device-plugin", allocatable, 60)

    def _wait(self, name: str, ok: Callable[[], bool], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if ok():
                return
            rec = self.cluster.table.get(name)
            if rec is not None and not processes.is_alive(rec):
                break
            time.sleep(0.5)
        msg = f"{name} did not become ready; log tail:\n{self.cluster.log_tail(name, 30)}"
        raise NodeError(msg)

    # ------------------------------------------------------------------ down
    def stop(self) -> list[str]:
        """Stop the node's processes and pods, unmount and remove what `start` made."""
        table = self.cluster.table
        stopped = [name for name in ("device-plugin", "kubelet") if table.stop(name)]
        self._kill_pods()
        stopped += [name for name in ("containerd", "node-relay") if table.stop(name)]
        self._kill_shims()
        self._clean_leftovers()
        self._release_device_plugin_dir()
        for d in (SHIM_SOCKETS, SHIM_SOCKETS.parent):  # containerd's code makes them
            with contextlib.suppress(OSError):
                d.rmdir()  # only when empty: another containerd may use them
        return stopped

    def _kill_pods(self) -> None:
        """Kill every container of the node (their shims outlive containerd otherwise)."""
        if not self.paths.socket.exists() or self.cluster.table.get("containerd") is None:
            return
        tasks = self._ctr("tasks", "ls", "-q")
        for task in tasks.stdout.split():
            self._ctr("tasks", "kill", "-s", "SIGKILL", task)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            left = self._ctr("tasks", "ls", "-q").stdout.split()
            if not left:
                break
            for task in left:
                self._ctr("tasks", "delete", "--force", task)
            time.sleep(0.2)
        # The image content stays (the next `up` imports only what changed); what ran goes.
        for kind in ("containers", "sandboxes"):
            ids = self._ctr(kind, "ls", "-q").stdout.split()
            if ids:
                self._ctr(kind, "rm", *ids)

    def _kill_shims(self) -> None:
        """Kill the runc shims of *this* node (their command line names our socket)."""
        shim = str(self.bin / "containerd-shim-runc-v2") if self.bin_dir or _built() else ""
        for proc in pathlib.Path("/proc").glob("[0-9]*"):
            try:
                argv = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            words = [w.decode(errors="replace") for w in argv if w]
            ours = words and words[0].endswith("containerd-shim-runc-v2")
            if ours and str(self.paths.socket) in words and (not shim or words[0] == shim):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(proc.name), signal.SIGKILL)
                # A killed shim leaves its socket behind: remove the ones it would have.
                flags = dict(zip(words[1::2], words[2::2], strict=False))
                for debug in (False, True):
                    name = shim_socket_name(
                        flags.get("-address", ""), flags.get("-namespace", ""),
                        flags.get("-id", ""), debug=debug,
                    )  # fmt: skip
                    (SHIM_SOCKETS / name).unlink(missing_ok=True)

    def _clean_leftovers(self) -> None:
        """Unmount everything under the node's directory, empty its cgroup parent, remove the
        namespace and link (a crashed run leaves these; a clean `down` too)."""
        info = pathlib.Path("/proc/self/mountinfo").read_text()
        for point in mounts_under(info, self.paths.root):
            if point == self.link.netns:
                continue
            subprocess.run(["umount", "-l", str(point)], capture_output=True, check=False)
        self._remove_cgroup_parent(info)
        netns.remove(self.link)
        for d in (self.paths.containerd_state, self.paths.runc_root, self.paths.cni_ipam,
                  self.paths.kubelet_root):  # fmt: skip
            shutil.rmtree(d, ignore_errors=True)

    def _remove_cgroup_parent(self, info: str) -> None:
        for hierarchy in mounted_cgroup_hierarchies(info):
            top = hierarchy / self.paths.cgroup_parent.lstrip("/")
            if not top.exists():
                continue
            dirs = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
            for d in [*dirs, top]:
                with contextlib.suppress(OSError):
                    for pid in (d / "cgroup.procs").read_text().split():
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(int(pid), signal.SIGKILL)
                with contextlib.suppress(OSError):
                    d.rmdir()

    def stack_view(self, refs: dict[str, str]) -> stack.RealNode:
        """What the chart needs to know about this node (`stack.start`)."""
        return stack.RealNode(
            name=NODE_NAME,
            images=refs,
            host_ip=self.link.host_ip,
            apiserver_port=self.cluster.ports.apiserver,
            controller_port=stack.controller_port(),
            agent_state=self.paths.agent_state,
            controller_addr=self.paths.controller_addr,
            pod_resources_dir=self.paths.pod_resources.parent,
            fakenvml_lib=fakenvml.build(),
            agents_dir=self.cluster.state / "agents",
            taint_key=TAINT_KEY,
            label=NODE_LABEL,
        )

    # ------------------------------------------------------------------ status
    def status(self) -> list[tuple[str, str, str]]:
        """(what, state, detail) of the node: its processes and the Node object."""
        out = []
        node = self._node()
        if node is None:
            out.append((f"node {NODE_NAME}", "absent", "no Node object"))
        else:
            conds = {c["type"]: c["status"] for c in node["status"].get("conditions", [])}
            gpus = node["status"].get("allocatable", {}).get("nvidia.com/gpu", "0")
            state = "ready" if conds.get("Ready") == "True" else "not-ready"
            out.append(
                (f"node {NODE_NAME}", state, f"{self.link.node_ip}, {gpus} GPUs allocatable")
            )
        return out


def recorded(c: cluster.Cluster) -> bool:
    """True when this dev cluster has a real node's process recorded, or its namespace."""
    return any(c.table.get(n) for n in PROCESS_ORDER) or Paths.of(c.state).root.exists()


def owner() -> pathlib.Path | None:
    """The state directory of the dev cluster that last took the device-plugin directory."""
    try:
        text = OWNER_FILE.read_text().strip()
    except OSError:
        return None
    return pathlib.Path(text) if text else None


def _built() -> bool:
    try:
        build.built_dir()
    except build.BuildError:
        return False
    return True


def _python(module: str) -> list[str]:
    import sys  # noqa: PLC0415  (the interpreter that runs us runs the helpers)

    return [sys.executable, "-m", module]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1"}


def running(c: cluster.Cluster) -> bool:
    """True when this dev cluster runs a real node (its kubelet is recorded and alive)."""
    rec = c.table.get("kubelet")
    return rec is not None and processes.is_alive(rec)
