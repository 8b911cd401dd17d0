"""The NetworkPolicies rendered for pytorch and ray runs, evaluated over a (from, to, port)
matrix with tests/netpolicy.py (nothing on the dev cluster enforces them; DESIGN §10)."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest

from controller.runs import networks, objects, rendering
from shared import spec as specs
from tests import netpolicy
from tests.netpolicy import Pod

FIXTURES = pathlib.Path(__file__).resolve().parents[3] / "fixtures" / "specs"
RUN = objects.RunRef(name="demo", namespace="team-a", uid="0b5e7c1e-uid")
OPERATOR_NS = "kuberay-system"
NAMESPACES = {ns: {networks.NAMESPACE_NAME_LABEL: ns} for ns in ("team-a", "team-b", OPERATOR_NS)}
PORTS = {
    "rendezvous": 29500, "nccl": 41234, "gcs": 6379, "dashboard": 8265, "ray-client": 10001,
}  # fmt: skip


def _settings(operator_ns: str = OPERATOR_NS) -> rendering.RenderSettings:
    return rendering.RenderSettings(
        controller_url="http://taugrid.taugrid-system:8080", ray_operator_namespace=operator_ns
    )


def _render(fixture: str, attempt: int, settings: rendering.RenderSettings) -> list[dict[str, Any]]:
    spec = specs.parse_spec((FIXTURES / fixture).read_bytes()).spec
    ctx = rendering.AttemptContext(run=RUN, attempt=attempt, checkpoint_configmap="demo-checkpoint")
    return rendering.render_attempt(spec, ctx, settings)


def _world(
    fixture: str, settings: rendering.RenderSettings
) -> tuple[list[dict[str, Any]], dict[str, Pod]]:
    """The policies of attempts 1 (ended, its policy kept) and 2 (running), and the pods
    around them: the attempt's own (labels as rendered, plus what the Job controller adds),
    a stale pod of attempt 1, and strangers."""
    policies: list[dict[str, Any]] = []
    pods: dict[str, Pod] = {}
    for attempt in (1, 2):
        rendered = _render(fixture, attempt, settings)
        policies += [o for o in rendered if o["kind"] == networks.KIND]
        workload = next(o for o in rendered if o["kind"] in ("Job", "RayJob"))
        job_name = objects.attempt_name(RUN.name, attempt)
        if workload["kind"] == "Job":  # an Indexed Job: one pod per completion index
            template = workload["spec"]["template"]
            templates = [template] * int(workload["spec"].get("completions") or 1)
            extra = {networks.JOB_NAME_LABEL: job_name}
        else:  # a RayJob: the head, then the workers
            templates, extra = rendering.pod_templates(workload), {}
        for i, template in enumerate(templates):
            labels = {**template["metadata"]["labels"], **extra}
            pods[f"a{attempt}-pod{i}"] = Pod(RUN.namespace, labels)
    # KubeRay's submitter Job is named as the RayJob; the Job controller labels its pods.
    pods["submitter"] = Pod(RUN.namespace, {networks.JOB_NAME_LABEL: "demo-a2"})
    pods["operator"] = Pod(OPERATOR_NS, {"app.kubernetes.io/name": "kuberay-operator"})
    pods["neighbour"] = Pod(RUN.namespace, {"app": "notebook"})
    pods["other-run"] = Pod(RUN.namespace, {"taugrid.dev/run": "other", "taugrid.dev/attempt": "2"})
    forged = dict(pods["a2-pod0"].labels)
    pods["forged-elsewhere"] = Pod("team-b", forged)
    pods["submitter-elsewhere"] = Pod("team-b", {networks.JOB_NAME_LABEL: "demo-a2"})
    return policies, pods


def _open_ports(policies: list[dict[str, Any]], src: Pod, dst: Pod) -> set[str]:
    return {
        name for name, port in PORTS.items()
        if netpolicy.allowed(policies, NAMESPACES, netpolicy.Connection(src, dst, port))
    }  # fmt: skip


ALL = set(PORTS)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        pytest.param("a2-pod1", ALL, id="the attempt's own worker: every port"),
        pytest.param("a1-pod0", set(), id="a stale attempt's pod: nothing"),
        pytest.param("neighbour", set(), id="another pod of the namespace: nothing"),
        pytest.param("other-run", set(), id="another run's pod: nothing"),
        pytest.param("operator", set(), id="the KubeRay operator: nothing (no dashboard here)"),
        pytest.param("forged-elsewhere", set(),
                     id="a pod of another namespace wearing the run's labels: nothing"),
    ],
)  # fmt: skip
def test_a_pytorch_attempt_admits_its_own_pods_only(source: str, expected: set[str]) -> None:
    """A pytorch attempt's workers reach each other on every port (rendezvous, NCCL); no one
    else reaches them, an earlier attempt's pods included."""
    policies, pods = _world("pytorch.yaml", _settings())
    assert expected == _open_ports(policies, pods[source], pods["a2-pod0"])


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        pytest.param("a2-pod1", ALL, id="the attempt's own worker: every port"),
        pytest.param("operator", {"dashboard"}, id="the KubeRay operator: the dashboard only"),
        pytest.param("submitter", {"dashboard"}, id="the run's submitter: the dashboard only"),
        pytest.param("submitter-elsewhere", set(),
                     id="a pod of another namespace named as the submitter: nothing"),
        pytest.param("a1-pod0", set(), id="a stale attempt's pod: nothing"),
        pytest.param("neighbour", set(), id="another pod of the namespace: nothing"),
        pytest.param("forged-elsewhere", set(),
                     id="a pod of another namespace wearing the run's labels: nothing"),
    ],
)  # fmt: skip
def test_a_ray_heads_dashboard_is_open_to_the_operator_and_submitter_only(
    source: str, expected: set[str]
) -> None:
    """The head's GCS and worker ports serve the attempt's pods; its dashboard (the Jobs
    API, which has no password) serves the operator's namespace and the submitter too."""
    policies, pods = _world("ray.yaml", _settings())
    assert expected == _open_ports(policies, pods[source], pods["a2-pod0"])


def test_without_an_operator_namespace_only_the_submitter_reaches_the_dashboard() -> None:
    """An empty `ray_operator_namespace` adds no namespace to the dashboard's peers."""
    policies, pods = _world("ray.yaml", _settings(""))
    head = pods["a2-pod0"]
    actual = (_open_ports(policies, pods["operator"], head),
              _open_ports(policies, pods["submitter"], head))  # fmt: skip
    assert (set(), {"dashboard"}) == actual


def test_a_plain_job_opens_nothing_and_gets_no_policy() -> None:
    """A job run's single pod listens on nothing of ours: it is rendered without a policy."""
    assert [o["kind"] for o in _render("job.yaml", 1, _settings())] == ["Job"]


def test_the_policy_is_the_attempts_owned_object() -> None:
    """The policy is named, labelled and owned as the attempt's other objects, so the
    TauRun's deletion takes it and a stale one is told apart by name."""
    (policy,) = [o for o in _render("ray.yaml", 3, _settings()) if o["kind"] == networks.KIND]
    meta = policy["metadata"]
    actual = (meta["name"], meta["namespace"], meta["labels"]["taugrid.dev/attempt"],
              meta["ownerReferences"][0]["uid"], policy["spec"]["policyTypes"])  # fmt: skip
    assert ("demo-a3", "team-a", "3", RUN.uid, ["Ingress"]) == actual


def test_ray_token_auth_is_rendered_when_set() -> None:
    """`ray_token_auth` asks KubeRay for Ray's token auth on the run's cluster."""
    settings = rendering.RenderSettings(controller_url="http://c", ray_version="2.52.0",
                                        ray_token_auth=True)  # fmt: skip
    (rayjob,) = [o for o in _render("ray.yaml", 1, settings) if o["kind"] == "RayJob"]
    (plain,) = [o for o in _render("ray.yaml", 1, _settings()) if o["kind"] == "RayJob"]
    actual = (rayjob["spec"]["rayClusterSpec"].get("authOptions"),
              plain["spec"]["rayClusterSpec"].get("authOptions"))  # fmt: skip
    assert actual == ({"mode": "token"}, None)
