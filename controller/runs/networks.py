"""The NetworkPolicy that fences one attempt of a pytorch or ray run (pure; DESIGN §10).

A multi-node run opens ports: torchrun's rendezvous and NCCL's (any port) between its
workers, Ray's GCS, object manager and worker ports, and the Ray dashboard with its Jobs API,
which KubeRay binds to every address without a password. Without a policy every pod of the
cluster reaches them. Each attempt therefore gets a NetworkPolicy, named and labelled as the
attempt, created before its Job or RayJob (so no pod of it ever runs unfenced where policies
are enforced), that admits:

- the attempt's own pods, on every port (NCCL and Ray pick ports at run time);
- for a ray run, the dashboard port (8265) from the KubeRay operator's namespace (the operator
  polls the dashboard for the job's state) and from the attempt's submitter pod (KubeRay's
  `K8sJobMode` runs `ray job submit` in a Job named as the RayJob, whose pods the Job
  controller labels `batch.kubernetes.io/job-name`; a pod selector without a namespace
  selector matches pods of the run's own namespace only).

Everything else is refused, a stale attempt's pods included (they carry another attempt
number). Egress is left alone: pods reach the controller, storage and registries as the
platform allows. A plain job run opens nothing and gets no policy. Nothing here enforces
NetworkPolicy: the CNI does; `tests/netpolicy.py` evaluates these over a (from, to, port)
matrix, since the dev cluster's network does not.
"""

from __future__ import annotations

from typing import Any

from controller import marks
from controller.runs import objects
from shared import spec as specs

API_VERSION = "networking.k8s.io/v1"
KIND = "NetworkPolicy"
RAY_DASHBOARD_PORT = 8265
"""The Ray dashboard's HTTP port, which serves the Jobs API (KubeRay's default)."""
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
"""The label the Job controller puts on every pod of a Job (Kubernetes 1.27+)."""
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
"""The label the API server keeps on every Namespace, equal to its name (immutable)."""


def fenced(spec: specs.TauSpec) -> bool:
    """Whether runs of this kind get a NetworkPolicy (those whose pods open ports)."""
    return spec.kind in (specs.RunKind.PYTORCH, specs.RunKind.RAY)


def attempt_selector(run: objects.RunRef, attempt: int) -> dict[str, str]:
    """The labels that pick the pods of one attempt, and only them."""
    return {marks.RUN_LABEL: run.name, marks.ATTEMPT_LABEL: str(attempt)}


def render_policy(
    spec: specs.TauSpec,
    run: objects.RunRef,
    attempt: int,
    metadata: dict[str, Any],
    *,
    ray_operator_namespace: str,
) -> dict[str, Any]:
    """The NetworkPolicy of attempt `attempt` (see the module docstring); `metadata` is the
    attempt's (name, labels, owner reference), as its other objects carry."""
    own = attempt_selector(run, attempt)
    ingress: list[dict[str, Any]] = [{"from": [{"podSelector": {"matchLabels": own}}]}]
    if spec.kind == specs.RunKind.RAY:
        name = objects.attempt_name(run.name, attempt)
        peers: list[dict[str, Any]] = [
            {"podSelector": {"matchLabels": {JOB_NAME_LABEL: name}}},
        ]
        if ray_operator_namespace:
            selector = {"matchLabels": {NAMESPACE_NAME_LABEL: ray_operator_namespace}}
            peers.insert(0, {"namespaceSelector": selector})
        ingress.append({"from": peers, "ports": [{"protocol": "TCP", "port": RAY_DASHBOARD_PORT}]})
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": metadata,
        "spec": {
            "podSelector": {"matchLabels": own},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }
