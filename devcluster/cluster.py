"""The local control plane: etcd, kube-apiserver, controller-manager, scheduler and KWOK, as
host processes on 127.0.0.1 (DESIGN.md section 8); Kueue and the KubeRay operator too where
the chart does not bring them as pods of the real node (`up(operators_in_chart=True)`).

Everything is real except the kubelet and the silicon: KWOK plays the kubelet for fake GPU
nodes (and serves container logs from files), so the API server, the scheduler, the Job
controller, Kueue's webhooks and KubeRay all run their own code. State lives outside the
repository, under `$TAUGRID_STATE` (default `~/.local/state/taugrid/dev`).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import datetime as dt
import json
import os
import pathlib
import re
import shutil
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal

import yaml

from devcluster import build, drapublisher, netns, pki, processes

STAGES_DIR = pathlib.Path(__file__).resolve().parent / "stages"

GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"
"""The `nvidia.com/gpu.product` label of fake nodes, as GPU feature discovery writes it."""

FLAVOR = "h100"
CLUSTER_QUEUE = "taugrid-dev"
LOCAL_QUEUE = "default"
FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node"

KCM_CONTROLLERS = (
    "job-controller",
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
    "replicaset-controller",
    "deployment-controller",
    "daemonset-controller",
    "statefulset-controller",
    "disruption-controller",
    "endpointslice-controller",
    "persistentvolume-binder-controller",
    "ttl-after-finished-controller",
    "pod-garbage-collector-controller",
    "resourceclaim-controller",
    "device-taint-eviction-controller",
    "validatingadmissionpolicy-status-controller",
)
"""The controllers DESIGN.md section 8 lists. node-lifecycle stays out: KWOK heartbeats nodes.
The volume binder binds the real run's checkpoint claim and the example claims (examples/ runs as
shipped) to their volumes. DRA needs the resource claim controller, which makes each pod's
ResourceClaim from its template and frees it afterwards, and the device-taint eviction
controller, which deletes pods holding a device with a NoExecute taint (DESIGN.md section 2);
the DRA feature gates are all on by default in Kubernetes 1.37. The ValidatingAdmissionPolicy
status controller type-checks the chart's policy (its `status.typeChecking`; the policy itself
is enforced by the API server, GA and on by default since 1.30, no flag needed)."""

KUEUE_WEBHOOKS_KEPT = ("batch-v1-job", "ray-io-v1-rayjob", "ray-io-v1-raycluster", "kueue-x-k8s-io")

OPERATORS = ("kueue", "kuberay")
"""The host processes a bare control plane (`up(bare=True)`) leaves out, and so does a
cluster whose operators are pods of the chart (`up(operators_in_chart=True)`)."""
BARE_MARKER = "bare"
"""A file in the state directory while the cluster there is a bare control plane."""
CHART_OPERATORS_MARKER = "operators-in-chart"
"""A file in the state directory while Kueue and KubeRay run as the chart's pods (the main dev
cluster with its real node: `taugrid dev up`), not as host processes."""
API_ENV_POLICY = "taugrid-dev-api-env"

START_ORDER = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
    "dra-publisher",
    "kueue",
    "kuberay",
)


DRA_NODE_PREFIX = "gpu-dra-node-"
"""`taugrid dev up --dra-nodes N` adds `gpu-dra-node-0..N-1` to the dev fleet."""
GpuDriver = Literal["device-plugin", "dra"]
"""How a fake node's GPUs are advertised (`fake_gpu_node`)."""


class ClusterError(Exception):
    """The dev cluster could not be started, reached or stopped; the message says why."""


def state_root() -> pathlib.Path:
    """Return the dev cluster's state directory (outside any checkout)."""
    env = os.environ.get("TAUGRID_STATE")
    return (
        pathlib.Path(env) if env else pathlib.Path.home() / ".local" / "state" / "taugrid" / "dev"
    )


def port_offset() -> int:
    """Return `$TAUGRID_PORT_OFFSET` (default 0), added to every loopback port of the cluster.

    Two dev clusters can then run side by side on one machine (each with its own
    `$TAUGRID_STATE`), e.g. one for a long benchmark and one for the test tiers.
    """
    raw = os.environ.get("TAUGRID_PORT_OFFSET", "") or "0"
    if not re.fullmatch(r"[0-9]{1,5}", raw) or int(raw) > 20000:
        msg = f"TAUGRID_PORT_OFFSET must be a whole number from 0 to 20000, not {raw!r}"
        raise ClusterError(msg)
    return int(raw)


@dataclasses.dataclass(frozen=True)
class Ports:
    """Loopback ports of every component; the defaults follow each project's own defaults."""

    etcd_client: int = 2379
    etcd_peer: int = 2380
    apiserver: int = 6443
    kcm: int = 10257
    scheduler: int = 10259
    kwok: int = 10250
    kueue_webhook: int = 9443
    kueue_health: int = 8081
    kueue_visibility: int = 8082
    kuberay_metrics: int = 18080
    kuberay_health: int = 18082
    dra_publisher: int = 18090

    @classmethod
    def from_env(cls) -> Ports:
        """Return the default ports shifted by `port_offset()`."""
        offset = port_offset()
        return cls(**{f.name: getattr(cls(), f.name) + offset for f in dataclasses.fields(cls)})


@dataclasses.dataclass(frozen=True)
class Component:
    """A running component: how to check it and where its log is."""

    name: str
    health_url: str


class Cluster:
    """One dev cluster rooted at a state directory."""

    def __init__(self, state: pathlib.Path | None = None, ports: Ports | None = None) -> None:
        self.state = state or state_root()
        self.ports = ports or Ports.from_env()
        self.pki = self.state / "pki"
        self.kubeconfig = self.state / "kubeconfig"
        self.table = processes.ProcessTable(self.state)
        self.podlogs = self.state / "podlogs"

    # ------------------------------------------------------------------ helpers
    @property
    def server(self) -> str:
        """The API server URL."""
        return f"https://127.0.0.1:{self.ports.apiserver}"

    @property
    def bare(self) -> bool:
        """True when this state directory's cluster is a bare control plane (`up(bare=True)`)."""
        return (self.state / BARE_MARKER).exists()

    @property
    def operators_in_chart(self) -> bool:
        """True when Kueue and KubeRay run as pods of the chart, not as host processes."""
        return (self.state / CHART_OPERATORS_MARKER).exists()

    def _host_operators(self) -> bool:
        return not (self.bare or self.operators_in_chart)

    def components(self) -> list[Component]:
        """Every component with the URL that tells whether it is healthy (a bare control plane,
        and one whose operators are the chart's pods, have no Kueue and KubeRay processes)."""
        host = self._host_operators()
        return [c for c in self._all_components() if host or c.name not in OPERATORS]

    def _all_components(self) -> list[Component]:
        p = self.ports
        return [
            Component("etcd", f"http://127.0.0.1:{p.etcd_client}/health"),
            Component("kube-apiserver", f"{self.server}/readyz"),
            Component("kube-controller-manager", f"https://127.0.0.1:{p.kcm}/healthz"),
            Component("kube-scheduler", f"https://127.0.0.1:{p.scheduler}/healthz"),
            Component("kwok", f"http://127.0.0.1:{p.kwok}/healthz"),
            Component("dra-publisher", f"http://127.0.0.1:{p.dra_publisher}/healthz"),
            Component("kueue", f"http://127.0.0.1:{p.kueue_health}/readyz"),
            Component("kuberay", f"http://127.0.0.1:{p.kuberay_health}/readyz"),
        ]

    def _ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        return ctx

    def probe(self, url: str, timeout_s: float = 2.0) -> tuple[bool, str]:
        """GET a health URL; return (healthy, short detail)."""
        ctx: ssl.SSLContext | None = None
        if url.startswith("https://"):
            ctx = self._ssl_context()
            if not url.startswith(self.server):
                # Component serving certificates are self-signed by each component.
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
        try:
            with urllib.request.urlopen(url, timeout=timeout_s, context=ctx) as resp:  # noqa: S310
                body = resp.read(200).decode(errors="replace").strip()
                return resp.status == 200, body or str(resp.status)
        except urllib.error.HTTPError as err:
            return False, f"HTTP {err.code}"
        except (urllib.error.URLError, OSError) as err:
            return False, str(getattr(err, "reason", err))

    def wait_healthy(self, comp: Component, timeout_s: float = 120.0) -> None:
        """Poll a component's health URL until it answers 200, or fail with its log tail."""
        deadline = time.monotonic() + timeout_s
        detail = ""
        while time.monotonic() < deadline:
            ok, detail = self.probe(comp.health_url)
            if ok:
                return
            rec = self.table.get(comp.name)
            if rec is not None and not processes.is_alive(rec):
                break
            time.sleep(0.25)
        msg = (
            f"{comp.name} did not become healthy ({detail}); log tail:\n{self.log_tail(comp.name)}"
        )
        raise ClusterError(msg)

    def log_tail(self, name: str, lines: int = 25) -> str:
        """Return the last lines of a component's log."""
        log = self.table.logs / f"{name}.log"
        if not log.exists():
            return "(no log)"
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])

    def kubectl(self, bin_dir: pathlib.Path, *args: str, stdin: str | None = None) -> str:
        """Run the built kubectl against this cluster; raise with its stderr on failure."""
        proc = subprocess.run(
            [str(bin_dir / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args],
            input=stdin,
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            msg = f"kubectl {' '.join(args[:3])} failed: {proc.stderr.strip()}"
            raise ClusterError(msg)
        return proc.stdout

    def apply(self, bin_dir: pathlib.Path, docs: Sequence[dict[str, Any]]) -> None:
        """Server-side apply objects (CRDs are too large for client-side apply)."""
        text = yaml.safe_dump_all(list(docs), sort_keys=False)
        self.kubectl(bin_dir, "apply", "--server-side", "--force-conflicts",
                     "--field-manager=taugrid-dev", "-f", "-", stdin=text)  # fmt: skip

    # ------------------------------------------------------------------ state
    def running(self) -> list[processes.Record]:
        """The recorded processes that are still alive."""
        return [r for r in self.table.records() if processes.is_alive(r)]

    def is_up(self) -> bool:
        """True when every component is recorded, alive and the API server is ready."""
        names = {r.name for r in self.running()}
        host = self._host_operators()
        wanted = {n for n in START_ORDER if host or n not in OPERATORS}
        return wanted <= names and self.probe(f"{self.server}/readyz")[0]

    def status(self) -> list[tuple[str, str, str]]:
        """Return (component, state, detail) for each component."""
        recs = {r.name: r for r in self.table.records()}
        out = []
        for comp in self.components():
            rec = recs.get(comp.name)
            if rec is None:
                out.append((comp.name, "stopped", ""))
            elif not processes.is_alive(rec):
                out.append((comp.name, "dead", f"pid {rec.pid} gone; log {rec.log}"))
            else:
                ok, detail = self.probe(comp.health_url)
                state = "healthy" if ok else "unhealthy"
                out.append((comp.name, state, f"pid {rec.pid} {comp.health_url} {detail[:60]}"))
        known = {comp.name for comp in self.components()}
        for rec in self.table.records():
            if rec.name in known:
                continue
            alive = processes.is_alive(rec)
            out.append((rec.name, "running" if alive else "dead", f"pid {rec.pid} log {rec.log}"))
        return out

    # ------------------------------------------------------------------ up
    def write_kubeconfig(self) -> None:
        """Write an admin kubeconfig with absolute paths."""
        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "taugrid-dev", "cluster": {
                "server": self.server, "certificate-authority": str(self.pki / "ca.crt")}}],
            "users": [{"name": "admin", "user": {
                "client-certificate": str(self.pki / "admin.crt"),
                "client-key": str(self.pki / "admin.key")}}],
            "contexts": [{"name": "taugrid-dev", "context": {
                "cluster": "taugrid-dev", "user": "admin", "namespace": "default"}}],
            "current-context": "taugrid-dev",
        }  # fmt: skip
        self.kubeconfig.write_text(yaml.safe_dump(cfg, sort_keys=False))

    def up(
        self,
        nodes: int = 4,
        out: Callable[[str], None] = print,
        root: pathlib.Path | None = None,
        *,
        dra_nodes: int = 0,
        bare: bool = False,
        operators_in_chart: bool = False,
    ) -> None:
        """Start the whole control plane in the documented order and bootstrap it, with
        `nodes` device-plugin GPU nodes and `dra_nodes` DRA GPU nodes (`dra_node_names`).

        `bare` leaves out everything of Kueue and KubeRay (processes, CRDs, webhooks, queues):
        the one install (`helm install` with kueue.enabled and kuberay.enabled) brings them as
        pods of the real node. `operators_in_chart` leaves out the same for the main dev
        cluster, whose chart install (`stack.start`) brings them the same way; should the real
        node not start, `start_operators` runs them as host processes after all. Either gets
        the dev-only policy that tells pods where the API server is (`api_env_policy`): the
        subcharts' pods have no knob for it."""
        stale = self.table.clean_stale()
        if stale:
            out(f"cleaned stale PID records: {', '.join(sorted(stale))}")
        if self.is_up():
            msg = f"a dev cluster is already running from {self.state}; see `taugrid dev status`"
            raise AlreadyRunningError(msg)
        if self.running():
            names = ", ".join(r.name for r in self.running())
            msg = (
                f"a dev cluster is partly running from {self.state} ({names}); "
                "run `taugrid dev down` first"
            )
            raise ClusterError(msg)
        built = build.built_dir(root)
        bin_dir = built / "bin"
        assets = built / "assets"
        self.state.mkdir(parents=True, exist_ok=True)
        for marker, on in ((BARE_MARKER, bare), (CHART_OPERATORS_MARKER, operators_in_chart)):
            if on:
                (self.state / marker).touch()
            else:
                (self.state / marker).unlink(missing_ok=True)
        in_pods = bare or operators_in_chart
        # The real node reaches the API server at the host end of its link: the serving
        # certificate covers that address too.
        pki.ensure(self.pki, extra_ips=(netns.plan(self.state).host_ip,))
        self.write_kubeconfig()
        self.podlogs.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        try:
            self._start_etcd(bin_dir)
            self._start_apiserver(bin_dir)
            self._install_crds(bin_dir)
            if in_pods:
                link = netns.plan(self.state)
                self.apply(bin_dir, api_env_policy(link.host_ip, self.ports.apiserver))
            self._start_kcm(bin_dir)
            self._start_scheduler(bin_dir)
            self._start_kwok(bin_dir, assets)
            self._start_dra_publisher(bin_dir)
            self.ensure_nodes(bin_dir, nodes, labels={"taugrid.dev/dev-fleet": "true"})
            if dra_nodes:
                self.ensure_nodes(bin_dir, dra_nodes, prefix=DRA_NODE_PREFIX, gpu_driver="dra",
                                  labels={"taugrid.dev/dev-fleet": "true"})  # fmt: skip
            if not in_pods:
                self.start_operators(bin_dir, nodes + dra_nodes)
            self.apply(bin_dir, example_volumes(self.state / "volumes"))
            example_volume_dirs(self.state / "volumes")
        except BaseException:
            out("start failed; stopping what was started")
            self.table.stop_all()
            raise
        out(f"dev cluster up in {time.monotonic() - started:.1f}s")

    def _start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.table.start(name, argv, env={**os.environ, **(env or {})})
        comp = next(c for c in self.components() if c.name == name)
        self.wait_healthy(comp)

    def _start_etcd(self, bin_dir: pathlib.Path) -> None:
        p = self.ports
        data = self.state / "etcd"
        if data.exists():
            shutil.rmtree(data)  # a dev cluster starts empty; nothing survives `down`
        self._start("etcd", [
            str(bin_dir / "etcd"), "--name=taugrid", f"--data-dir={data}",
            f"--listen-client-urls=http://127.0.0.1:{p.etcd_client}",
            f"--advertise-client-urls=http://127.0.0.1:{p.etcd_client}",
            f"--listen-peer-urls=http://127.0.0.1:{p.etcd_peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{p.etcd_peer}",
            f"--initial-cluster=taugrid=http://127.0.0.1:{p.etcd_peer}",
            "--unsafe-no-fsync=true", "--log-level=warn",
        ])  # fmt: skip

    def _start_apiserver(self, bin_dir: pathlib.Path) -> None:
        k, p = self.pki, self.ports
        self._start("kube-apiserver", [
            str(bin_dir / "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{p.etcd_client}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
            # The endpoint reconciler refuses a loopback address, and nothing in this cluster
            # reaches the API server through the `kubernetes` Service; so no reconciler.
            "--endpoint-reconciler-type=none",
            # New nodes get a not-ready taint that only the node lifecycle controller removes;
            # that controller stays off (KWOK keeps nodes Ready), so the taint must not appear.
            "--disable-admission-plugins=TaintNodesByCondition",
            f"--secure-port={p.apiserver}", f"--cert-dir={self.state / 'apiserver'}",
            f"--tls-cert-file={k / 'serving.crt'}", f"--tls-private-key-file={k / 'serving.key'}",
            f"--client-ca-file={k / 'ca.crt'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={k / 'sa.pub'}",
            f"--service-account-signing-key-file={k / 'sa.key'}",
            # The API server's own audience only, as on a real cluster: a token minted for the
            # API server (a default `kubectl create token`) is not valid for heartbeats, which
            # need audience `taugrid` (DESIGN.md section 10).
            "--api-audiences=https://kubernetes.default.svc.cluster.local",
            "--authorization-mode=RBAC", "--service-cluster-ip-range=10.96.0.0/16",
            "--allow-privileged=true",
            # KWOK plays the kubelet on 127.0.0.1 (logs, exec); reach it by that address.
            "--kubelet-preferred-address-types=InternalIP",
            f"--kubelet-certificate-authority={k / 'ca.crt'}",
            f"--kubelet-client-certificate={k / 'admin.crt'}",
            f"--kubelet-client-key={k / 'admin.key'}",
            # Aggregated APIs (Kueue's visibility server) authenticate the front proxy.
            f"--requestheader-client-ca-file={k / 'ca.crt'}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-username-headers=X-Remote-User",
            f"--proxy-client-cert-file={k / 'front-proxy-client.crt'}",
            f"--proxy-client-key-file={k / 'front-proxy-client.key'}",
            "--enable-aggregator-routing=true",
            "--profiling=false", "--v=1",
        ])  # fmt: skip

    def _kubeconfig_flags(self) -> list[str]:
        kc = str(self.kubeconfig)
        return [
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
        ]

    def _start_kcm(self, bin_dir: pathlib.Path) -> None:
        k = self.pki
        self._start("kube-controller-manager", [
            str(bin_dir / "kube-controller-manager"), *self._kubeconfig_flags(),
            "--leader-elect=false", "--bind-address=127.0.0.1", f"--secure-port={self.ports.kcm}",
            f"--cert-dir={self.state / 'kcm'}",
            "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
            f"--service-account-private-key-file={k / 'sa.key'}", f"--root-ca-file={k / 'ca.crt'}",
            "--use-service-account-credentials=false",
            f"--controllers={','.join(KCM_CONTROLLERS)}",
            "--concurrent-job-syncs=20", "--kube-api-qps=200", "--kube-api-burst=400",
        ])  # fmt: skip

    def _start_scheduler(self, bin_dir: pathlib.Path) -> None:
        self._start("kube-scheduler", [
            str(bin_dir / "kube-scheduler"), *self._kubeconfig_flags(),
            "--leader-elect=false", "--bind-address=127.0.0.1",
            f"--secure-port={self.ports.scheduler}", f"--cert-dir={self.state / 'scheduler'}",
            "--kube-api-qps=200", "--kube-api-burst=400",
        ])  # fmt: skip

    def _install_crds(self, bin_dir: pathlib.Path, *, operators: bool = False) -> None:
        """KWOK's CRDs and the extra ones; with `operators`, Kueue's and KubeRay's instead."""
        assets = bin_dir.parent / "assets"
        docs: list[dict[str, Any]] = []
        if operators:
            docs.append(
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kueue-system"}}
            )
            files = sorted((assets / "kueue" / "crd").glob("*.yaml"))
            files += sorted((assets / "kuberay" / "crd").glob("*.yaml"))
        else:
            files = [
                assets / "kwok" / "crd" / "kwok.x-k8s.io_logs.yaml",
                assets / "kwok" / "crd" / "kwok.x-k8s.io_clusterlogs.yaml",
                *self.extra_crds(),
            ]
        for f in files:
            docs.extend(d for d in yaml.safe_load_all(f.read_text()) if d)
        self.apply(bin_dir, docs)
        self._wait_crds_established(bin_dir)

    def start_operators(self, bin_dir: pathlib.Path, nodes: int) -> None:
        """Kueue and the KubeRay operator as host processes: their CRDs, the processes, Kueue's
        webhooks (called on 127.0.0.1) and the dev queues for `nodes` GPU nodes. `up` runs
        this unless the chart brings them; `taugrid dev up` runs it after `up` when it meant
        the chart to, but the real node their pods need did not start."""
        self._install_crds(bin_dir, operators=True)
        self._start_kueue(bin_dir, bin_dir.parent / "assets")
        self._start_kuberay(bin_dir)
        self._bootstrap_queues(bin_dir, nodes)
        (self.state / CHART_OPERATORS_MARKER).unlink(missing_ok=True)

    def _wait_crds_established(self, bin_dir: pathlib.Path, timeout_s: float = 60.0) -> None:
        # `kubectl wait` errors out on a CRD whose status has no conditions yet; poll instead.
        deadline = time.monotonic() + timeout_s
        pending: list[str] = []
        while time.monotonic() < deadline:
            crds = json.loads(self.kubectl(bin_dir, "get", "crd", "-o", "json"))["items"]
            pending = [
                c["metadata"]["name"]
                for c in crds
                if not any(
                    cond.get("type") == "Established" and cond.get("status") == "True"
                    for cond in (c.get("status") or {}).get("conditions") or []
                )
            ]
            if not pending:
                return
            time.sleep(0.2)
        msg = f"CRDs not established: {', '.join(pending)}"
        raise ClusterError(msg)

    def extra_crds(self) -> list[pathlib.Path]:
        """Our own CRDs from deploy/, when the checkout has them."""
        crds = pathlib.Path(__file__).resolve().parent.parent / "deploy" / "crds"
        return sorted(crds.glob("*.yaml")) if crds.exists() else []

    def _start_kwok(self, bin_dir: pathlib.Path, assets: pathlib.Path) -> None:
        stage = assets / "kwok" / "stage"
        docs = [
            (
                "apiVersion: config.kwok.x-k8s.io/v1alpha1\nkind: KwokConfiguration\n"
                "options: {cidr: 10.244.0.0/16, nodeLeaseDurationSeconds: 40,\n"
                "  podPlayStageParallelism: 8, nodePlayStageParallelism: 4,\n"
                "  nodeLeaseParallelism: 4, podsOnNodeSyncParallelism: 2,\n"
                "  enableDebuggingHandlers: true}\n"
            ),
            (stage / "node" / "fast" / "node-initialize.yaml").read_text(),
            (
                stage / "node" / "heartbeat-with-lease" / "node-heartbeat-with-lease.yaml"
            ).read_text(),
            (stage / "pod" / "fast" / "pod-ready.yaml").read_text(),
            *(f.read_text() for f in sorted(STAGES_DIR.glob("*.yaml"))),
        ]
        cfg = self.state / "kwok.yaml"
        cfg.write_text("\n---\n".join(d.strip() for d in docs) + "\n")
        k, p = self.pki, self.ports
        self._start("kwok", [
            str(bin_dir / "kwok"), f"--kubeconfig={self.kubeconfig}", f"--config={cfg}",
            f"--manage-nodes-with-annotation-selector={FAKE_NODE_ANNOTATION}=fake",
            "--node-ip=127.0.0.1", f"--node-port={p.kwok}",
            f"--server-address=127.0.0.1:{p.kwok}",
            f"--tls-cert-file={k / 'serving.crt'}", f"--tls-private-key-file={k / 'serving.key'}",
            "--enable-crds=Logs,ClusterLogs",
        ])  # fmt: skip

    def _start_dra_publisher(self, bin_dir: pathlib.Path) -> None:
        """NVIDIA's DeviceClass, then our stand-in for its kubelet plugin (one ResourceSlice
        per fake DRA node; `devcluster.drapublisher`)."""
        self.apply(bin_dir, [drapublisher.device_class()])
        self._start("dra-publisher", [
            sys.executable, "-m", "devcluster.cli", "dev", "dra-publisher",
            f"--port={self.ports.dra_publisher}",
        ], env={"KUBECONFIG": str(self.kubeconfig), "PYTHONUNBUFFERED": "1"})  # fmt: skip

    def ensure_nodes(
        self,
        bin_dir: pathlib.Path,
        count: int,
        prefix: str = "gpu-node-",
        labels: dict[str, str] | None = None,
        *,
        gpu_driver: GpuDriver = "device-plugin",
    ) -> list[str]:
        """Create `count` fake GPU nodes (idempotent) and wait until they are Ready; DRA
        nodes also until the publisher has written their ResourceSlice."""
        names = [f"{prefix}{i}" for i in range(count)]
        self.apply(bin_dir, [fake_gpu_node(n, labels=labels, gpu_driver=gpu_driver)
                             for n in names])  # fmt: skip
        self.kubectl(bin_dir, "wait", "--for=condition=Ready", "--timeout=60s",
                     *(f"node/{n}" for n in names))  # fmt: skip
        if gpu_driver == "dra":
            self.wait_slices(bin_dir, names)
        return names

    def wait_slices(
        self, bin_dir: pathlib.Path, nodes: Sequence[str], timeout_s: float = 60.0
    ) -> None:
        """Wait until every named DRA node's ResourceSlice exists (and names the node)."""
        deadline = time.monotonic() + timeout_s
        missing = list(nodes)
        while time.monotonic() < deadline:
            raw = self.kubectl(bin_dir, "get", "resourceslices.resource.k8s.io", "-o", "json")
            have = {s["spec"].get("nodeName") for s in json.loads(raw)["items"]}
            missing = [n for n in nodes if n not in have]
            if not missing:
                return
            time.sleep(0.2)
        tail = self.log_tail("dra-publisher")
        msg = f"no ResourceSlice for {', '.join(missing)}; log tail:\n{tail}"
        raise ClusterError(msg)

    def _start_kueue(self, bin_dir: pathlib.Path, assets: pathlib.Path) -> None:
        certs = self.state / "kueue-certs"
        certs.mkdir(exist_ok=True)
        shutil.copy(self.pki / "serving.crt", certs / "tls.crt")
        shutil.copy(self.pki / "serving.key", certs / "tls.key")
        p = self.ports
        # Kueue's on-demand visibility server only works in a pod: it takes its delegated
        # authentication from the in-cluster ServiceAccount and serves from a fixed /visibility.
        # Off the cluster it cannot start, so it stays off and queue positions are computed from
        # the pending Workloads in Kueue's order (docs/researcher.md says which a response used).
        visibility = False
        cfg = {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2",
            "kind": "Configuration",
            "namespace": "kueue-system",
            "health": {"healthProbeBindAddress": f"127.0.0.1:{p.kueue_health}"},
            "metrics": {"bindAddress": "0"},
            "webhook": {"host": "127.0.0.1", "port": p.kueue_webhook, "certDir": str(certs)},
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            **kueue_dev_settings(build.kueue_version(), visibility=visibility),
        }
        cfg_path = self.state / "kueue.yaml"
        cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        self._start(
            "kueue",
            [str(bin_dir / "kueue"), f"--config={cfg_path}", "--zap-log-level=info"],
            env={"KUEUE_METRICS_CERT_DIR": str(certs), "KUBECONFIG": str(self.kubeconfig)},
        )
        self._wait_port(p.kueue_webhook)
        self.apply(bin_dir, kueue_webhooks(assets, self.pki / "ca.crt", p.kueue_webhook))

    def _wait_port(self, port: int, timeout_s: float = 60.0) -> None:
        import socket  # noqa: PLC0415  (only needed here)

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                return
            time.sleep(0.2)
        msg = f"nothing listens on 127.0.0.1:{port}"
        raise ClusterError(msg)

    def _start_kuberay(self, bin_dir: pathlib.Path) -> None:
        p = self.ports
        self._start(
            "kuberay",
            [
                str(bin_dir / "ray-operator"),
                f"--metrics-addr=127.0.0.1:{p.kuberay_metrics}",
                f"--health-probe-bind-address=127.0.0.1:{p.kuberay_health}",
                "--enable-leader-election=false",
                "--log-stdout-encoder=console",
            ],
            env={"KUBECONFIG": str(self.kubeconfig)},
        )

    def _bootstrap_queues(self, bin_dir: pathlib.Path, nodes: int) -> None:
        deadline = time.monotonic() + 60
        while True:  # the webhooks answer a moment after Kueue's readiness probe
            try:
                self.apply(bin_dir, default_queues(nodes))
                return
            except ClusterError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    # ------------------------------------------------------------------ down
    def down(self) -> list[str]:
        """Stop exactly the recorded processes; return their names."""
        stopped = self.table.stop_all()
        (self.state / BARE_MARKER).unlink(missing_ok=True)
        return stopped


class AlreadyRunningError(ClusterError):
    """`up` was asked for while a dev cluster runs from the same state directory."""


def api_env_policy(host: str, port: int, namespace: str = "taugrid-system") -> list[dict[str, Any]]:
    """Dev only: a MutatingAdmissionPolicy (and its binding) that sets KUBERNETES_SERVICE_HOST
    and KUBERNETES_SERVICE_PORT on the first container of every new pod in `namespace` (the
    release's, where the chart runs Kueue and KubeRay) to the API server at `host:port`. The
    real node runs no kube-proxy, so the `kubernetes` Service leads nowhere; TauGrid's own pods
    get the same two variables from the chart (`extraEnv`, as the main dev cluster sets them),
    but Kueue's and KubeRay's charts have no such knob. Pods elsewhere (the users') are left
    exactly as they were made."""
    keep = '!(e.name in ["KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"])'
    api = (
        f'[Object.spec.containers.env{{name: "KUBERNETES_SERVICE_HOST", value: "{host}"}}, '
        f'Object.spec.containers.env{{name: "KUBERNETES_SERVICE_PORT", value: "{port}"}}]'
    )
    current = "(has(object.spec.containers[0].env) ? object.spec.containers[0].env : [])"
    expression = (
        'object.spec.containers.size() > 0 ? [JSONPatch{op: "add", '
        f'path: "/spec/containers/0/env", value: {current}.filter(e, {keep}) + {api}}}] : []'
    )
    return [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingAdmissionPolicy",
            "metadata": {"name": API_ENV_POLICY},
            "spec": {
                "matchConstraints": {
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": namespace}
                    },
                    "resourceRules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE"],
                            "resources": ["pods"],
                        }
                    ],
                },
                "failurePolicy": "Fail",
                "reinvocationPolicy": "Never",
                "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression": expression}}],
            },
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingAdmissionPolicyBinding",
            "metadata": {"name": API_ENV_POLICY},
            "spec": {"policyName": API_ENV_POLICY},
        },
    ]


def fake_gpu_node(
    name: str,
    gpus: int = 8,
    labels: dict[str, str] | None = None,
    *,
    gpu_driver: GpuDriver = "device-plugin",
) -> dict[str, Any]:
    """A KWOK-managed node with 8 H100-like GPUs, labelled as GPU feature discovery would.

    A `device-plugin` node advertises them as `nvidia.com/gpu` in its allocatable; a `dra`
    node advertises none there: the DRA publisher lists them in a ResourceSlice instead.
    """
    resources = {"cpu": "96", "memory": "1Ti", "pods": "110"}
    if gpu_driver == "device-plugin":
        resources["nvidia.com/gpu"] = str(gpus)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {FAKE_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": GPU_PRODUCT,
                "nvidia.com/gpu.count": str(gpus),
                drapublisher.DRIVER_LABEL: gpu_driver,
                **(labels or {}),
            },
        },
        "status": {"capacity": resources, "allocatable": resources},
    }


PODS_READY_TIMEOUT_S = 300
"""Kueue's waitForPodsReady timeout on the dev cluster: an admitted Workload whose pods are
not ready this long after admission loses its quota and is queued again (with backoff)."""
ADMISSION_CHECK = "taugrid-gpu-health"
"""TauGrid's AdmissionCheck on the dev cluster (made by the chart)."""
RESUME_PRIORITY_CLASS = "taugrid-resume"
"""The WorkloadPriorityClass of resumed attempts (made by the chart)."""
HELM_RELEASE = ("taugrid", "taugrid-system")
"""(release, namespace) of TauGrid's chart on the dev cluster, which adopts the queues."""


def default_queues(nodes: int, namespace: str = "default") -> list[dict[str, Any]]:
    """The ResourceFlavor, ClusterQueue and LocalQueue of the dev cluster.

    They exist from the start (so `up --no-taugrid` has queues), labelled for TauGrid's Helm
    release, which takes them over when `up` installs the chart: the chart's ClusterQueue then
    waits on TauGrid's AdmissionCheck, which only works while TauGrid's controller runs.
    """
    helm = {
        "labels": {"app.kubernetes.io/managed-by": "Helm"},
        "annotations": {
            "meta.helm.sh/release-name": HELM_RELEASE[0],
            "meta.helm.sh/release-namespace": HELM_RELEASE[1],
        },
    }
    return [
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": FLAVOR, **helm},
            "spec": {"nodeLabels": {"nvidia.com/gpu.product": GPU_PRODUCT}},
        },
        {**_dev_cluster_queue(nodes), "metadata": {"name": CLUSTER_QUEUE, **helm}},
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": LOCAL_QUEUE, "namespace": namespace, **helm},
            "spec": {"clusterQueue": CLUSTER_QUEUE},
        },
    ]


EXAMPLE_CLAIMS = {"datasets": "1Ti", "checkpoints": "1Ti"}
"""The PersistentVolumeClaims examples/pytorch.yaml names, in namespace `default`."""


def example_volumes(root: pathlib.Path, namespace: str = "default") -> list[dict[str, Any]]:
    """A PersistentVolume and a claim bound to it for each claim the examples name: host
    directories (KWOK's pods never mount them; a kubelet's would), ReadWriteMany, each claim
    pre-bound to its volume so the volume binder binds exactly these two."""
    out: list[dict[str, Any]] = []
    for claim, size in EXAMPLE_CLAIMS.items():
        volume = f"dev-{namespace}-{claim}"
        out.append({
            "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": volume},
            "spec": {"capacity": {"storage": size}, "accessModes": ["ReadWriteMany"],
                     "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                     "hostPath": {"path": str(root / namespace / claim),
                                  "type": "DirectoryOrCreate"},
                     "claimRef": {"namespace": namespace, "name": claim}},
        })  # fmt: skip
        out.append({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": claim, "namespace": namespace},
            "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "",
                     "volumeName": volume, "resources": {"requests": {"storage": size}}},
        })  # fmt: skip
    return out


def example_volume_dirs(root: pathlib.Path, namespace: str = "default") -> None:
    """Make the example volumes' host directories writable by anyone: on the real node a run
    image's user (65532) writes its checkpoints there (examples/real-node.yaml), and a
    directory the kubelet creates for `DirectoryOrCreate` is root's, mode 0755."""
    for claim in EXAMPLE_CLAIMS:
        path = root / namespace / claim
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(0o777)


def _dev_cluster_queue(nodes: int) -> dict[str, Any]:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": CLUSTER_QUEUE},
        "spec": {
            "namespaceSelector": {},
            "queueingStrategy": "BestEffortFIFO",
            "resourceGroups": [
                {
                    "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                    "flavors": [
                        {
                            "name": FLAVOR,
                            "resources": [
                                {"name": "cpu", "nominalQuota": str(96 * nodes)},
                                {"name": "memory", "nominalQuota": f"{nodes}Ti"},
                                {"name": "nvidia.com/gpu", "nominalQuota": str(8 * nodes)},
                            ],
                        }
                    ],
                }
            ],
        },
    }


def kueue_dev_settings(version: str, *, visibility: bool) -> dict[str, Any]:
    """What the dev cluster sets in Kueue's Configuration, as a host process or as the chart's
    pod: only Workloads naming a queue, the pods-ready timeout, the integrations TauGrid runs
    on, the feature gates, and the DRA device class mapping."""
    return {
        "manageJobsWithoutQueueName": False,
        "waitForPodsReady": {"timeout": f"{PODS_READY_TIMEOUT_S}s", "blockAdmission": False},
        "integrations": {"frameworks": ["batch/job", "ray.io/rayjob", "ray.io/raycluster"]},
        # Kueue counts DRA devices only behind its gate, and only for the device classes
        # mapped to a quota name here: NVIDIA's class counts as nvidia.com/gpu, the name
        # device-plugin GPUs have, so one quota covers both kinds of node.
        "featureGates": kueue_feature_gates(version, visibility=visibility),
        "resources": {
            "deviceClassMappings": [
                {"name": "nvidia.com/gpu", "deviceClassNames": [drapublisher.DEVICE_CLASS]},
            ]
        },
    }


def kueue_feature_gates(version: str, *, visibility: bool) -> dict[str, bool]:
    """Kueue's feature gates for a version: DRA quota counting is the alpha gate
    `DynamicResourceAllocation` up to v0.17; v0.18 renamed it `KueueDRAIntegration` (Beta, on
    by default) and locks the old name off, and v0.19 removed the old name (an unknown gate
    stops Kueue at start), so the name follows the version."""
    parts = version.removeprefix("v").split(".")
    minor = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
    dra = "DynamicResourceAllocation" if minor < 18 else "KueueDRAIntegration"
    return {"VisibilityOnDemand": visibility, dra: True}


def kueue_webhooks(assets: pathlib.Path, ca_file: pathlib.Path, port: int) -> list[dict[str, Any]]:
    """Kueue's webhook configurations, rewritten to call it on 127.0.0.1 with our CA."""
    ca = base64.b64encode(ca_file.read_bytes()).decode()
    out = []
    for d in yaml.safe_load_all((assets / "kueue" / "webhook" / "manifests.yaml").read_text()):
        if not d:
            continue
        d["metadata"] = {"name": "kueue-" + d["metadata"]["name"]}
        hooks = []
        for w in d.get("webhooks", []):
            path = w["clientConfig"]["service"]["path"]
            if any(k in path for k in KUEUE_WEBHOOKS_KEPT):
                w["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca}
                hooks.append(w)
        d["webhooks"] = hooks
        if hooks:
            out.append(d)
    return out


@contextlib.contextmanager
def pod_log_file(
    cluster: Cluster, namespace: str, pod: str, container: str
) -> Iterator[pathlib.Path]:
    """Yield the host file that KWOK serves as one container's log (creates the directory)."""
    path = cluster.podlogs / namespace / pod / f"{container}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    yield path


def cri_log_line(text: str, stream: str = "stdout", now: dt.datetime | None = None) -> str:
    """One line in the CRI log format a kubelet writes (and KWOK serves): `TIME STREAM F TEXT`."""
    when = (now or dt.datetime.now(dt.UTC)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return f"{when} {stream} F {text}\n"


def append_log(path: pathlib.Path, *lines: str) -> None:
    """Append lines to a fake container's log file, as the container would print them."""
    with path.open("a") as fh:
        fh.writelines(cri_log_line(line) for line in lines)


def kwok_logs_object(
    namespace: str, pod: str, container: str, path: pathlib.Path
) -> dict[str, Any]:
    """A KWOK `Logs` object telling its kubelet endpoint which file is this container's log."""
    return {
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "Logs",
        "metadata": {"name": pod, "namespace": namespace},
        "spec": {"logs": [{"containers": [container], "logsFile": str(path), "follow": True}]},
    }


def summary(cluster: Cluster) -> str:
    """What runs where, for people and for the README."""
    built = build.Builder()
    lines = [
        f"kubeconfig:   {cluster.kubeconfig}",
        f"API server:   {cluster.server}",
        f"state:        {cluster.state}  (logs in {cluster.table.logs})",
        f"binaries:     {built.bin}",
        "",
        f"{'component':<24} {'pid':>8}  log",
    ]
    lines.extend(f"{rec.name:<24} {rec.pid:>8}  {rec.log}" for rec in cluster.running())
    if cluster.operators_in_chart:
        lines.append(f"{'kueue, kuberay':<24} {'pods':>8}  of the chart in taugrid-system "
                     "(`taugrid dev status`; kubectl -n taugrid-system logs)")  # fmt: skip
    lines += [
        "",
        f"try: KUBECONFIG={cluster.kubeconfig} {built.bin / 'kubectl'} get nodes",
    ]
    return "\n".join(lines)


def json_status(cluster: Cluster) -> str:
    """The status as JSON for scripts."""
    return json.dumps([{"component": c, "state": s, "detail": d} for c, s, d in cluster.status()])
