"""Tokens of the dev cluster's host processes, bound to the pods KWOK runs for them.

On a real cluster the kubelet projects each pod's ServiceAccount tokens and renews them. The
dev cluster's controller and agents run on the host instead, standing in for the pods the Helm
chart's Deployment and DaemonSet make (KWOK "runs" those pods). So this module does the
kubelet's part: it requests each token through the TokenRequest API, bound to the pod the
process stands in for (an agent's to the DaemonSet pod on its node, so the controller's
node-name check holds), writes it to a file the process re-reads, and renews it well before it
expires. A recorded host process (`taugrid dev renew-tokens`) keeps renewing while the dev
cluster runs; when a pod is replaced, the next renewal binds to the new one.

Files, under the dev state directory:
- `controller/token` and `controller/kubeconfig` (the controller's API access: its
  ServiceAccount's RBAC from the chart, not the admin's);
- `agents/<node>/token` (audience `taugrid`: heartbeats) and `agents/<node>/api-token` with
  `agents/<node>/kubeconfig` (the agent's TokenReviews for its own endpoints).
"""

from __future__ import annotations

import json
import pathlib
import time
from collections.abc import Callable, Sequence
from typing import Any

import yaml

from devcluster import cluster

TOKEN_SECONDS = 3600
"""Lifetime of every token issued (an hour, as the kubelet's projected tokens)."""
RENEW_EVERY_S = 1200.0
"""How often the renewer issues fresh tokens: a third of their lifetime."""


def controller_dir(c: cluster.Cluster) -> pathlib.Path:
    """The dev controller's token and kubeconfig."""
    return c.state / "controller"


def agent_dir(c: cluster.Cluster, node: str) -> pathlib.Path:
    """A node's agent state: tokens, kubeconfig, boot ID, latched faults, NVML socket."""
    return c.state / "agents" / node


def _write(path: pathlib.Path, text: str) -> None:
    """Replace a file atomically, so a reader never sees half a token."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.chmod(0o600)
    tmp.replace(path)


def kubeconfig_for(admin: pathlib.Path, token_file: pathlib.Path, user: str) -> str:
    """A kubeconfig for the admin kubeconfig's cluster that authenticates with `token_file`."""
    doc = yaml.safe_load(admin.read_text())
    cluster_entry = doc["clusters"][0]
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [cluster_entry],
            "users": [{"name": user, "user": {"tokenFile": str(token_file)}}],
            "contexts": [
                {"name": user, "context": {"cluster": cluster_entry["name"], "user": user}}
            ],
            "current-context": user,
        },
        sort_keys=False,
    )


def running_pods(
    c: cluster.Cluster, bin_dir: pathlib.Path, namespace: str, release: str, component: str
) -> list[dict[str, Any]]:
    """The Running pods of one component of a chart release."""
    raw = c.kubectl(
        bin_dir, "-n", namespace, "get", "pods", "-o", "json", "-l",
        f"app.kubernetes.io/instance={release},app.kubernetes.io/component={component}",
    )  # fmt: skip
    items = json.loads(raw).get("items") or []
    return [
        p
        for p in items
        if (p.get("status") or {}).get("phase") == "Running"
        and not p["metadata"].get("deletionTimestamp")
    ]


def _bound_token(
    c: cluster.Cluster, bin_dir: pathlib.Path, pod: dict[str, Any], audience: str | None
) -> str:
    meta = pod["metadata"]
    argv = [
        "-n", meta["namespace"], "create", "token", pod["spec"]["serviceAccountName"],
        f"--duration={TOKEN_SECONDS}s", "--bound-object-kind=Pod",
        f"--bound-object-name={meta['name']}", f"--bound-object-uid={meta['uid']}",
    ]  # fmt: skip
    if audience:
        argv.append(f"--audience={audience}")
    return c.kubectl(bin_dir, *argv).strip()


def wait_for_pods(
    c: cluster.Cluster,
    bin_dir: pathlib.Path,
    namespace: str,
    release: str,
    nodes: Sequence[str],
    *,
    timeout_s: float = 120.0,
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Wait until KWOK runs an agent pod on every node and a controller pod; return them."""
    deadline = time.monotonic() + timeout_s
    while True:
        agents = {
            p["spec"]["nodeName"]: p
            for p in running_pods(c, bin_dir, namespace, release, "agent")
        }  # fmt: skip
        controllers = running_pods(c, bin_dir, namespace, release, "controller")
        missing = [n for n in nodes if n not in agents]
        if not missing and controllers:
            return agents, controllers[0]
        if time.monotonic() > deadline:
            what = f"agent pods on {', '.join(missing)}" if missing else "a controller pod"
            msg = f"the chart's {what} did not start under KWOK within {timeout_s:.0f}s"
            raise cluster.ClusterError(msg)
        time.sleep(0.3)


def issue(
    c: cluster.Cluster,
    bin_dir: pathlib.Path,
    namespace: str,
    release: str,
    nodes: Sequence[str],
    *,
    audience: str = "taugrid",
) -> None:
    """Issue fresh tokens for the controller and every node's agent, bound to their pods."""
    agents, controller = wait_for_pods(c, bin_dir, namespace, release, nodes)
    cdir = controller_dir(c)
    _write(cdir / "token", _bound_token(c, bin_dir, controller, None))
    _write(cdir / "kubeconfig", kubeconfig_for(c.kubeconfig, cdir / "token", "taugrid-controller"))
    for node in nodes:
        adir = agent_dir(c, node)
        pod = agents[node]
        _write(adir / "token", _bound_token(c, bin_dir, pod, audience))
        _write(adir / "api-token", _bound_token(c, bin_dir, pod, None))
        config = kubeconfig_for(c.kubeconfig, adir / "api-token", f"taugrid-agent-{node}")
        _write(adir / "kubeconfig", config)


def controller_addr(pod: dict[str, Any], port: int) -> str:
    """`ip:port` of a controller pod (what the controller relay forwards to)."""
    ip = (pod.get("status") or {}).get("podIP") or ""
    if not ip:
        msg = f"controller pod {pod['metadata']['name']} has no IP yet"
        raise cluster.ClusterError(msg)
    return f"{ip}:{port}"


CONTROLLER_POD_PORT = 8080
"""The chart's controller.port, which the dev values keep."""


def write_controller_addr(
    c: cluster.Cluster, bin_dir: pathlib.Path, namespace: str, release: str, path: pathlib.Path
) -> str:
    """Write the running controller pod's `ip:port` for the relay; return it."""
    pods = running_pods(c, bin_dir, namespace, release, "controller")
    if not pods:
        msg = "no running controller pod"
        raise cluster.ClusterError(msg)
    addr = controller_addr(pods[0], CONTROLLER_POD_PORT)
    if not path.exists() or path.read_text().strip() != addr:
        _write(path, addr + "\n")
    return addr


def wait_ready_pod(
    c: cluster.Cluster,
    bin_dir: pathlib.Path,
    namespace: str,
    release: str,
    *,
    component: str,
    node: str,
    timeout_s: float = 120.0,
) -> dict[str, Any]:
    """Wait until the component's pod on `node` is Ready (its probes pass); return it."""
    deadline = time.monotonic() + timeout_s
    while True:
        for pod in running_pods(c, bin_dir, namespace, release, component):
            conds = (pod.get("status") or {}).get("conditions") or []
            ready = any(x.get("type") == "Ready" and x.get("status") == "True" for x in conds)
            if pod["spec"].get("nodeName") == node and ready:
                return pod
        if time.monotonic() > deadline:
            msg = f"the chart's {component} pod on {node} was not Ready within {timeout_s:.0f}s"
            raise cluster.ClusterError(msg)
        time.sleep(0.5)


def renew_forever(
    c: cluster.Cluster,
    bin_dir: pathlib.Path,
    namespace: str,
    release: str,
    nodes: Sequence[str],
    *,
    every_s: float = RENEW_EVERY_S,
    controller_addr_file: pathlib.Path | None = None,
    tick_s: float = 5.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    log: Callable[[str], None] = print,
) -> None:
    """Renew every token each `every_s` until stopped; a failed round is retried sooner.

    With `controller_addr_file` (a real node runs the controller's pod), every `tick_s` the
    file is brought up to date with the controller pod's address, so the relay follows a
    replaced pod."""
    due = clock()
    while True:
        if clock() >= due:
            try:
                issue(c, bin_dir, namespace, release, nodes)
            except (cluster.ClusterError, OSError, ValueError) as err:
                log(f"token renewal failed, retrying in 30s: {err}")
                due = clock() + 30.0
            else:
                log(f"renewed tokens for the controller and {len(nodes)} agents")
                due = clock() + every_s
        if controller_addr_file is not None:
            try:
                write_controller_addr(c, bin_dir, namespace, release, controller_addr_file)
            except (cluster.ClusterError, OSError, ValueError) as err:
                log(f"controller address not updated: {err}")
        sleep(tick_s if controller_addr_file is not None else max(0.0, due - clock()))
