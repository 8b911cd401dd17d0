"""TauGrid itself on the dev cluster: the controller and one agent per fake GPU node.

They run as host processes. Each agent probes its own copy of the fake NVML library (a
different seed per node, so UUIDs differ) and authenticates exactly as a DaemonSet pod would:
its token is requested through the TokenRequest API, bound to an agent pod that KWOK runs on
that node, with audience `taugrid`. `taugrid dev inject` reaches an agent's fake library
through the Unix socket the library serves.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import secrets
import shutil
import sys
import time
from collections.abc import Mapping
from typing import Any

import yaml

from devcluster import build, chart, cluster, fakenvml, processes, tokens

NAMESPACE = "taugrid-system"
AGENT_SA = "taugrid-agent"
CONTROLLER_PORT = 8080
"""The dev controller's port, before `cluster.port_offset()` is added."""
AGENT_PORT_BASE = 9400
"""The first host-process agent's port, before `cluster.port_offset()` is added."""
AGENT_TOKEN_SECONDS = 24 * 3600
"""Tokens of the agents tests and benches start (`bound_token`) last a day."""
RESEARCHER_SA = "researcher"
ONCALL_SA = "oncall"
"""An on-call identity of the dev cluster: may get, list and patch nodes (quarantine by hand)."""
DEV_FLEET_SELECTOR = "taugrid.dev/dev-fleet=true"
"""The dev controller manages only the nodes `taugrid dev up` made, so tests that bring their
own nodes and controllers never share a fleet with it."""


def controller_url() -> str:
    """Where the dev controller listens (loopback only: the dev cluster serves plain HTTP)."""
    return f"http://127.0.0.1:{controller_port()}"


def controller_port() -> int:
    """The dev controller's loopback port."""
    return CONTROLLER_PORT + cluster.port_offset()


def agent_port(i: int) -> int:
    """The loopback port of the host-process agent of the i-th dev node."""
    return AGENT_PORT_BASE + cluster.port_offset() + i


agent_dir = tokens.agent_dir


def nvml_socket(c: cluster.Cluster, node: str) -> pathlib.Path:
    """The fake NVML library's control socket for one node's agent."""
    return agent_dir(c, node) / "nvml.sock"


def _bootstrap_objects() -> list[dict[str, Any]]:
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": RESEARCHER_SA, "namespace": "default"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "taugrid-researcher", "namespace": "default"},
         "rules": [
             {"apiGroups": ["taugrid.dev"], "resources": ["tauruns"],
              "verbs": ["create", "get", "list", "watch", "delete", "patch"]},
             {"apiGroups": [""], "resources": ["pods", "pods/log"], "verbs": ["get", "list"]},
         ]},
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": ONCALL_SA, "namespace": NAMESPACE}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": "taugrid-oncall"},
         "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "taugrid-oncall"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": "taugrid-oncall"},
         "subjects": [{"kind": "ServiceAccount", "name": ONCALL_SA, "namespace": NAMESPACE}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "taugrid-researcher", "namespace": "default"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                     "name": "taugrid-researcher"},
         "subjects": [{"kind": "ServiceAccount", "name": RESEARCHER_SA, "namespace": "default"}]},
    ]  # fmt: skip


def agent_pod(node: str, namespace: str = NAMESPACE) -> dict[str, Any]:
    """The pod KWOK runs for a node's agent; the host agent's token is bound to it."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"taugrid-agent-{node}",
            "namespace": namespace,
            "labels": {"app.kubernetes.io/name": "taugrid-agent"},
        },
        "spec": {
            "nodeName": node,
            "serviceAccountName": AGENT_SA,
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "agent", "image": "taugrid/agent:dev"}],
        },
    }


def _kubectl_json(c: cluster.Cluster, bin_dir: pathlib.Path, *args: str, stdin: str = "") -> Any:
    return json.loads(c.kubectl(bin_dir, *args, "-o", "json", stdin=stdin or None))


def _wait_running(
    c: cluster.Cluster, bin_dir: pathlib.Path, pod: str, namespace: str
) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while True:
        obj = _kubectl_json(c, bin_dir, "-n", namespace, "get", "pod", pod)
        if obj.get("status", {}).get("phase") == "Running":
            return dict(obj)
        if time.monotonic() > deadline:
            msg = f"agent pod {pod} did not start under KWOK"
            raise cluster.ClusterError(msg)
        time.sleep(0.2)


def bound_token(
    c: cluster.Cluster, bin_dir: pathlib.Path, node: str, namespace: str = NAMESPACE
) -> str:
    """Request a token for the agent ServiceAccount bound to the node's agent pod."""
    pod = _wait_running(c, bin_dir, f"taugrid-agent-{node}", namespace)
    return c.kubectl(
        bin_dir, "-n", namespace, "create", "token", AGENT_SA, "--audience=taugrid",
        f"--duration={AGENT_TOKEN_SECONDS}s", "--bound-object-kind=Pod",
        f"--bound-object-name={pod['metadata']['name']}",
        f"--bound-object-uid={pod['metadata']['uid']}",
    ).strip()  # fmt: skip


def researcher_token(c: cluster.Cluster, bin_dir: pathlib.Path) -> str:
    """A token for the dev cluster's `researcher` ServiceAccount (namespace `default`)."""
    return c.kubectl(bin_dir, "-n", "default", "create", "token", RESEARCHER_SA,
                     "--duration=24h").strip()  # fmt: skip


def _python_entry(module: str) -> list[str]:
    return [sys.executable, "-m", module]


def controller_env(
    c: cluster.Cluster, *, port: int, namespace: str, identity: str, node_selector: str = ""
) -> dict[str, str]:
    """Environment of a host-process controller replica on this dev cluster."""
    return {
        **os.environ,
        "KUBECONFIG": str(c.kubeconfig),
        "PYTHONUNBUFFERED": "1",
        "TAUGRID_CONTROLLER_HOST": "127.0.0.1",
        "TAUGRID_CONTROLLER_PORT": str(port),
        "TAUGRID_CONTROLLER_ADVERTISE_URL": f"http://127.0.0.1:{port}",
        "TAUGRID_CONTROLLER_KUBECONFIG": str(c.kubeconfig),
        "TAUGRID_CONTROLLER_NAMESPACE": namespace,
        "TAUGRID_CONTROLLER_IDENTITY": identity,
        "TAUGRID_CONTROLLER_NODE_SELECTOR": node_selector,
        "TAUGRID_CONTROLLER_PODS_READY_TIMEOUT_S": str(cluster.PODS_READY_TIMEOUT_S),
    }


def agent_env(
    c: cluster.Cluster,
    *,
    node: str,
    port: int,
    controller: str,
    token: str | None,
    state_dir: pathlib.Path,
    lib_dir: pathlib.Path,
) -> dict[str, str]:
    """Environment of a host-process agent for one fake node (a given token is written to
    state_dir; None leaves the token the renewer keeps there)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    sock = state_dir / "nvml.sock"
    sock.unlink(missing_ok=True)
    if token is not None:
        (state_dir / "token").write_text(token)
    boot = state_dir / "boot_id"
    if not boot.exists():
        boot.write_text(secrets.token_hex(16) + "\n")
    kmsg = state_dir / "kmsg"
    kmsg.touch()
    return {
        **os.environ,
        "KUBECONFIG": str(c.kubeconfig),
        "PYTHONUNBUFFERED": "1",
        **fakenvml.agent_env(lib_dir, sock, seed=node),
        "TAUGRID_AGENT_NODE_NAME": node,
        "TAUGRID_AGENT_LISTEN_HOST": "127.0.0.1",
        "TAUGRID_AGENT_PORT": str(port),
        "TAUGRID_AGENT_AGENT_URL": f"http://127.0.0.1:{port}",
        "TAUGRID_AGENT_CONTROLLER_URL": controller,
        "TAUGRID_AGENT_TOKEN_PATH": str(state_dir / "token"),
        "TAUGRID_AGENT_BOOT_ID_PATH": str(boot),
        "TAUGRID_AGENT_STATE_PATH": str(state_dir / "state.json"),
        "TAUGRID_AGENT_KMSG_PATH": str(kmsg),
        # The fake GPUs are on no PCI bus; a real GPU of this host must not read as missing.
        "TAUGRID_AGENT_PCI_DEVICES_PATH": str(state_dir / "pci-devices"),
        "TAUGRID_AGENT_DCGM_ENABLED": "false",
    }


RELEASE = "taugrid"
"""The dev cluster's Helm release of TauGrid (in NAMESPACE)."""


@dataclasses.dataclass(frozen=True)
class RealNode:
    """What the chart needs to know about the dev cluster's real node (`devcluster.node`)."""

    name: str
    images: Mapping[str, str]
    """Image name (`controller`, `agent`) → the reference imported into its containerd."""
    host_ip: str
    """The host end of the node's link: the API server and the controller are relayed there."""
    apiserver_port: int
    controller_port: int
    agent_state: pathlib.Path
    controller_addr: pathlib.Path
    """The file the relay reads the controller pod's `ip:port` from."""
    pod_resources_dir: pathlib.Path
    """The directory of the kubelet's PodResources socket."""
    fakenvml_lib: pathlib.Path
    agents_dir: pathlib.Path
    taint_key: str
    label: str

    @property
    def controller_url(self) -> str:
        """Where pods on the real node reach the controller (through the relay)."""
        return f"http://{self.host_ip}:{self.controller_port}"

    def api_env(self) -> list[dict[str, str]]:
        """Dev only: the API server for in-cluster clients (no kube-proxy on the node)."""
        return [
            {"name": "KUBERNETES_SERVICE_HOST", "value": self.host_ip},
            {"name": "KUBERNETES_SERVICE_PORT", "value": str(self.apiserver_port)},
        ]


def _image(ref: str) -> dict[str, str]:
    repository, _, tag = ref.rpartition(":")
    return {"repository": repository, "tag": tag, "pullPolicy": "Never"}


def real_node_values(real: RealNode) -> dict[str, Any]:
    """Dev-only chart values with a real node: one controller replica as a real pod there,
    and the agent DaemonSet's pod there on the fake NVML (KWOK keeps "running" the others)."""
    toleration = {"key": real.taint_key, "operator": "Exists", "effect": "NoSchedule"}
    # The controller's one node is a GPU node it may quarantine: a controller pod replaced
    # then (an upgrade) must still land there, or the dev cluster would have none.
    quarantined = [
        {"key": key, "operator": "Exists", "effect": "NoSchedule"}
        for key in ("taugrid.dev/gpu-unhealthy", "node.kubernetes.io/unschedulable")
    ]
    return {
        "controller": {
            "replicas": 1,
            "image": _image(real.images["controller"]),
            "nodeSelector": {real.label: "true"},
            "tolerations": [toleration, *quarantined],
            "runControllerUrl": real.controller_url,
            "extraEnv": real.api_env(),
            "podDisruptionBudget": {"enabled": False},
        },
        "agent": {
            "image": _image(real.images["agent"]),
            "tolerations": [toleration],
            "controllerUrl": real.controller_url,
            "stateHostPath": str(real.agent_state),
            "fakeNvml": {"libHostPath": str(real.fakenvml_lib),
                         "socketHostPath": str(real.agents_dir)},
            "dcgm": {"enabled": False},
            # The real kubelet's PodResources socket lives under the state directory.
            "podResources": {"hostPath": str(real.pod_resources_dir)},
            "extraEnv": real.api_env(),
        },
    }  # fmt: skip


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def chart_values(
    nodes: int, real: RealNode | None = None, *, operators: bool = False
) -> dict[str, Any]:
    """The chart's values on the dev cluster: everything but the processes is the chart's.

    KWOK "runs" the controller Deployment's and the agent DaemonSet's pods on the dev fleet's
    nodes; the processes that stand in for them run on the host, with tokens bound to those
    pods. The dev queues are the chart's optional queues, gated by its AdmissionCheck. With a
    real node and `operators`, Kueue and the KubeRay operator come with the chart too
    (`operator_values`): the one install's path, which the main dev cluster takes.
    """
    dev_fleet = dict([DEV_FLEET_SELECTOR.split("=", 1)])
    quota = {"cpu": str(96 * nodes), "memory": f"{nodes}Ti", "nvidia.com/gpu": str(8 * nodes)}
    # KWOK's nodes pull no image: `Never` tells the chart so (it refuses its unpublished
    # default images otherwise); the real node's images are loaded there (real_node_values).
    local = {"pullPolicy": "Never"}
    values = {
        "fullnameOverride": RELEASE,
        "tls": {"enabled": False},
        "controller": {"nodeSelector": dev_fleet, "managedNodeSelector": DEV_FLEET_SELECTOR,
                       "podsReadyTimeoutS": cluster.PODS_READY_TIMEOUT_S, "image": local},
        "agent": {"nodeSelector": dev_fleet, "controllerUrl": controller_url(), "image": local},
        "admissionCheck": {"name": cluster.ADMISSION_CHECK},
        "resumePriorityClass": {"name": cluster.RESUME_PRIORITY_CLASS},
        "queues": {
            "enabled": True,
            "resourceFlavor": {"name": cluster.FLAVOR,
                               "nodeLabels": {"nvidia.com/gpu.product": cluster.GPU_PRODUCT}},
            "clusterQueue": {"name": cluster.CLUSTER_QUEUE, "nominalQuota": quota,
                             "useAdmissionCheck": True},
            "localQueue": {"name": cluster.LOCAL_QUEUE, "namespaces": ["default"]},
        },
    }  # fmt: skip
    if real is None:
        return values
    values = _merge(values, real_node_values(real))
    return _merge(values, operator_values(real)) if operators else values


def kueue_config() -> str:
    """Kueue's Configuration as the chart's pod runs it on the dev cluster: the chart's own
    (values.yaml) with the dev cluster's settings (`cluster.kueue_dev_settings`, the same as
    the host process gets). In a pod, Kueue's visibility server works, so it is on."""
    defaults = yaml.safe_load((chart.CHART_DIR / "values.yaml").read_text())
    cfg = yaml.safe_load(defaults["kueue"]["managerConfig"]["controllerManagerConfigYaml"])
    cfg.update(cluster.kueue_dev_settings(build.kueue_version(), visibility=True))
    return yaml.safe_dump(cfg, sort_keys=False)


def operator_values(real: RealNode) -> dict[str, Any]:
    """Kueue and the KubeRay operator from the chart's own dependencies (kueue.enabled,
    kuberay.enabled), their controllers pods of the real node, in the images the real node
    imported (`taugrid dev images` builds them from the binaries the control-plane build
    made); Kueue configured as `kueue_config` says."""
    where = {"nodeSelector": {real.label: "true"},
             "tolerations": [{"key": real.taint_key, "operator": "Exists",
                              "effect": "NoSchedule"}]}  # fmt: skip
    small = {"requests": {"cpu": "50m", "memory": "128Mi"}}
    return {
        "kueue": {"enabled": True,
                  "controllerManager": {"manager": {
                      "image": _image(real.images["kueue"]),
                      "resources": {**small, "limits": {"cpu": "2", "memory": "1Gi"}}},
                      **where},
                  "managerConfig": {"controllerManagerConfigYaml": kueue_config()}},
        "kuberay": {"enabled": True, "image": _image(real.images["kuberay"]),
                    "resources": small, **where},
    }  # fmt: skip


OPERATOR_DEPLOYMENTS = {"kueue": "taugrid-kueue-controller-manager", "kuberay": "kuberay-operator"}
"""The chart's Deployments of Kueue and the KubeRay operator (release `taugrid`)."""


def operator_status(c: cluster.Cluster, bin_dir: pathlib.Path) -> list[tuple[str, str, str]]:
    """`taugrid dev status` rows for Kueue and KubeRay when they are the chart's pods."""
    try:
        items = _kubectl_json(c, bin_dir, "-n", NAMESPACE, "get", "deployments")["items"]
    except cluster.ClusterError as err:
        return [(name, "unknown", str(err)) for name in OPERATOR_DEPLOYMENTS]
    found = {d["metadata"]["name"]: d for d in items}
    rows = []
    for name, deployment in OPERATOR_DEPLOYMENTS.items():
        d = found.get(deployment)
        if d is None:
            rows.append((name, "absent", f"no Deployment {NAMESPACE}/{deployment}"))
            continue
        ready, want = d.get("status", {}).get("readyReplicas", 0), d["spec"].get("replicas", 1)
        state = "healthy" if ready >= want else "starting"
        rows.append((name, state, f"pod of the chart: {NAMESPACE}/{deployment} {ready}/{want}"))
    return rows


def one_install_values(nodes: int, real: RealNode) -> dict[str, Any]:
    """The chart's values for the one install on a bare dev cluster (`up --bare`): TauGrid,
    Kueue and KubeRay as on the main dev cluster with its real node.

    TauGrid manages the real node alone (its agent runs only there; no host-process agents
    stand in for the KWOK nodes), so the KWOK nodes are capacity outside the fleet. The
    ClusterQueue does not wait on TauGrid's AdmissionCheck: Kueue, KubeRay and the chart are
    what the one install proves; the check has its own tests on the main dev cluster, whose
    operators come from the chart the same way."""
    return _merge(chart_values(nodes, real, operators=True), {
        "controller": {"managedNodeSelector": f"{real.label}=true"},
        "agent": {"nodeSelector": {real.label: "true"}},
        "queues": {"clusterQueue": {"useAdmissionCheck": False}},
    })  # fmt: skip


ADOPTED_KINDS = frozenset(
    {"ServiceAccount", "AdmissionCheck", "WorkloadPriorityClass", "ResourceFlavor",
     "ClusterQueue", "LocalQueue"}
)  # fmt: skip
"""Kinds of chart objects an earlier `dev up` (or `up --no-taugrid`) may have made by hand."""


def _adopt(c: cluster.Cluster, bin_dir: pathlib.Path, values: dict[str, Any]) -> None:
    """Make objects an earlier `dev up` made with kubectl exactly what the chart renders,
    marked as the release's, before installing it. Helm takes over an existing object only
    when it carries the release's marks, and it never corrects one it takes over (it diffs
    manifests, not the live object), so the live object must already be right. The agent
    pods an earlier `dev up` ran by hand go: the DaemonSet runs them now."""
    marks = {"meta.helm.sh/release-name": RELEASE, "meta.helm.sh/release-namespace": NAMESPACE}
    docs = []
    for doc in chart.template(values, release=RELEASE, namespace=NAMESPACE, bin_dir=bin_dir):
        hook = "helm.sh/hook" in (doc.get("metadata", {}).get("annotations") or {})
        if doc.get("kind") in ADOPTED_KINDS and not hook:  # `helm test`'s own come and go
            meta = doc.setdefault("metadata", {})
            meta["annotations"] = {**meta.get("annotations", {}), **marks}
            docs.append(doc)
    for batch in ([d for d in docs if d["kind"] != "ClusterQueue"],
                  [d for d in docs if d["kind"] == "ClusterQueue"]):  # fmt: skip
        if batch:  # with kueue.enabled, the Kueue objects are hooks: none to adopt
            c.apply(bin_dir, batch)
    c.kubectl(bin_dir, "-n", NAMESPACE, "delete", "pod", "--ignore-not-found", "--wait=false",
              "-l", "app.kubernetes.io/name=taugrid-agent")  # fmt: skip


def values_file(c: cluster.Cluster) -> pathlib.Path:
    """The chart values `up` installed with (tests that change a setting start from them)."""
    return c.state / "chart-values.yaml"


def start(
    c: cluster.Cluster,
    bin_dir: pathlib.Path,
    nodes: list[str],
    real: RealNode | None = None,
    *,
    operators: bool = False,
) -> None:
    """Install the chart, then start the controller, one agent per node and the token
    renewer, each recorded by PID.

    With a real node the controller is the chart's own pod there (one replica), reached from
    the host at `controller_url()` and from the node's pods at `real.controller_url` through
    a relay; the agent DaemonSet's pod there is real too. The host-process agents stand in
    for the KWOK nodes' pods only. With `operators` (a real node, and a control plane that
    `up(operators_in_chart=True)` started) the chart brings Kueue and KubeRay as pods there
    as well, and the install waits for them: the chart's Kueue objects are made once Kueue
    answers."""
    c.apply(bin_dir, _bootstrap_objects())
    operators = operators and real is not None
    values = chart_values(len(nodes), real, operators=operators)
    _adopt(c, bin_dir, values)
    chart.install(c.kubeconfig, RELEASE, NAMESPACE, values, create_namespace=True,
                  wait=operators, timeout_s=300, bin_dir=bin_dir)  # fmt: skip
    values_file(c).write_text(yaml.safe_dump(values, sort_keys=False))
    tokens.issue(c, bin_dir, NAMESPACE, RELEASE, nodes)
    renew = [sys.executable, "-m", "devcluster.cli", "dev", "renew-tokens", *nodes]
    if real is not None:
        c.apply(bin_dir, real_node_queues(real))
        start_controller_relay(c, bin_dir, real)
        renew.append(f"--controller-addr={real.controller_addr}")
    c.table.start("token-renewer", renew, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lib_dir = fakenvml.build()
    if real is None:
        env = controller_env(
            c, port=controller_port(), namespace=NAMESPACE, identity="dev-controller-0",
            node_selector=DEV_FLEET_SELECTOR,
        )  # fmt: skip
        kubeconfig = str(tokens.controller_dir(c) / "kubeconfig")
        env.update(KUBECONFIG=kubeconfig, TAUGRID_CONTROLLER_KUBECONFIG=kubeconfig)
        c.table.start("controller", _python_entry("controller"), env=env)
    for i, node in enumerate(nodes):
        env = agent_env(
            c, node=node, port=agent_port(i), controller=controller_url(), token=None,
            state_dir=agent_dir(c, node), lib_dir=lib_dir,
        )  # fmt: skip
        env["KUBECONFIG"] = str(agent_dir(c, node) / "kubeconfig")
        c.table.start(f"agent-{node}", _python_entry("agent"), env=env)
    wait_http(c, "controller-relay" if real else "controller", f"{controller_url()}/readyz",
              timeout_s=120)  # fmt: skip
    for i, node in enumerate(nodes):
        wait_http(c, f"agent-{node}", f"http://127.0.0.1:{agent_port(i)}/healthz")
    if real is not None:
        tokens.wait_ready_pod(c, bin_dir, NAMESPACE, RELEASE, component="agent", node=real.name)


def start_controller_relay(c: cluster.Cluster, bin_dir: pathlib.Path, real: RealNode) -> None:
    """The recorded process `controller-relay`: the controller pod's port on the host
    (`controller_url()`) and on the host end of the real node's link (`real.controller_url`,
    where the node's pods, its agent's heartbeats included, reach it: no kube-proxy runs
    there), following the pod's address in `real.controller_addr`, written here first."""
    tokens.write_controller_addr(c, bin_dir, NAMESPACE, RELEASE, real.controller_addr)
    port = controller_port()
    c.table.start(
        "controller-relay",
        [sys.executable, "-m", "devcluster.relay", f"127.0.0.1:{port}=@{real.controller_addr}",
         f"{real.host_ip}:{port}=@{real.controller_addr}"],
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip


REAL_NODE_QUEUE = "real-node"
"""The LocalQueue (namespace `default`) whose runs land on the real node."""
REAL_NODE_FLAVOR = "real-node"


def real_node_queues(real: RealNode, namespace: str = "default") -> list[dict[str, Any]]:
    """A flavor for the real node (its label; its taint tolerated, which Kueue adds to the pods
    it admits), a ClusterQueue gated by TauGrid's AdmissionCheck, and a LocalQueue: a run with
    `queue: real-node` runs for real."""
    return [
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
         "metadata": {"name": REAL_NODE_FLAVOR},
         "spec": {"nodeLabels": {real.label: "true"},
                  "tolerations": [{"key": real.taint_key, "operator": "Exists",
                                   "effect": "NoSchedule"}]}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
         "metadata": {"name": f"taugrid-{REAL_NODE_QUEUE}"},
         "spec": {"namespaceSelector": {}, "queueingStrategy": "BestEffortFIFO",
                  "admissionChecksStrategy": {"admissionChecks": [
                      {"name": cluster.ADMISSION_CHECK}]},
                  "resourceGroups": [{
                      "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                      "flavors": [{"name": REAL_NODE_FLAVOR, "resources": [
                          {"name": "cpu", "nominalQuota": "2"},
                          {"name": "memory", "nominalQuota": "8Gi"},
                          {"name": "nvidia.com/gpu", "nominalQuota": "8"}]}]}]}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
         "metadata": {"name": REAL_NODE_QUEUE, "namespace": namespace},
         "spec": {"clusterQueue": f"taugrid-{REAL_NODE_QUEUE}"}},
    ]  # fmt: skip


def wait_http(c: cluster.Cluster, name: str, url: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if c.probe(url)[0]:
            return
        rec = c.table.get(name)
        if rec is not None and not processes.is_alive(rec):
            break
        time.sleep(0.25)
    msg = f"{name} did not become ready at {url}; log tail:\n{c.log_tail(name)}"
    raise cluster.ClusterError(msg)


def inject(c: cluster.Cluster, node: str, gpu: int, command: str, *args: str) -> str:
    """Drive one node's fake NVML library (`xid 79`, `lost`, `reset`, `clear` …)."""
    sock = nvml_socket(c, node)
    if not sock.exists():
        agents = c.state / "agents"
        known = sorted(p.name for p in agents.glob("*")) if agents.exists() else []
        msg = (
            f"no agent for node {node!r} on this dev cluster (agents: {', '.join(known) or 'none'})"
        )
        raise cluster.ClusterError(msg)
    control = fakenvml.SocketControl(sock)
    line = " ".join([command, str(gpu), *args])
    control.send(line)
    return line


def stop_agents_state(c: cluster.Cluster) -> None:
    """Forget per-node agent state (latched faults) with the cluster's etcd data."""
    shutil.rmtree(c.state / "agents", ignore_errors=True)
