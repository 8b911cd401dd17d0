"""The Helm chart `deploy/helm/taugrid`, rendered offline by the built Helm binary: lint, the
objects with defaults and with every option on, least-privilege RBAC (checked against the API
calls the controller's adapters actually make), the agent DaemonSet's privileges, and values
that stay documented."""

from __future__ import annotations

import ast
import json
import pathlib
import re
import shutil
from collections.abc import Iterator
from typing import Any, NamedTuple

import pytest
import yaml

from agent import settings as agent_settings
from controller import settings as controller_settings
from devcluster import build, chart

pytestmark = pytest.mark.cluster  # needs the built Helm binary, not a running cluster

RELEASE = "taugrid"
NAMESPACE = "taugrid-system"
TAINT_KEY = "taugrid.dev/gpu-unhealthy"
EVERY_API = (
    *chart.DEV_API_VERSIONS,
    "cert-manager.io/v1",
    "monitoring.coreos.com/v1",
)
EVERYTHING_ON: dict[str, Any] = {
    "prerequisites": {"check": "always"},
    "tls": {"certManager": {"enabled": True, "extraDnsNames": ["taugrid.example.com"]}},
    "queues": {"enabled": True},
    "serviceMonitor": {"enabled": True},
    "prometheusRule": {"enabled": True},
    "grafanaDashboard": {"enabled": True},
    "agent": {"service": {"enabled": True}, "runtimeClassName": "nvidia"},
    "controller": {"maxQuarantined": 3, "rayVersion": "2.41.0"},
    "userTokenAudiences": ["taugrid-api"],
}


IMAGES: dict[str, Any] = {
    "controller": {"image": {"repository": "registry.example.com/taugrid/controller"}},
    "agent": {"image": {"repository": "registry.example.com/taugrid/agent"}},
}
"""Published image repositories: the chart refuses its unpublished defaults
(test_chart_schema.py), so every rendering here names a registry."""


# ---------------------------------------------------------------------- rendering helpers
def merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """`extra` over `base`, maps merged key by key as Helm merges values files."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def with_images(values: dict[str, Any] | None) -> dict[str, Any]:
    """The values with published image repositories unless they name their own."""
    return merged(IMAGES, values or {})


def render(values: dict[str, Any] | None = None, **kwargs: Any) -> list[dict[str, Any]]:
    """Render the chart with these values (release `taugrid` in `taugrid-system`)."""
    kwargs.setdefault("release", RELEASE)
    kwargs.setdefault("namespace", NAMESPACE)
    return chart.template(with_images(values), **kwargs)


def hook(doc: dict[str, Any]) -> bool:
    """Whether an object is a Helm hook (`helm test`'s), made only when its hook runs."""
    return "helm.sh/hook" in (doc["metadata"].get("annotations") or {})


def objects(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """Every rendered object of one kind."""
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    """The single rendered object of a kind (and name); fail when there is not exactly one."""
    found = [d for d in objects(docs, kind) if name is None or d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind} {name or ''}: {[d['metadata']['name'] for d in found]}"
    return found[0]


def container(workload: dict[str, Any]) -> dict[str, Any]:
    """The one container of a Deployment's or DaemonSet's pod template."""
    containers = workload["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return dict(containers[0])


def env_of(workload: dict[str, Any]) -> dict[str, str]:
    """The literal (non-fieldRef) environment of a workload's container."""
    return {e["name"]: e["value"] for e in container(workload).get("env", []) if "value" in e}


@pytest.fixture(scope="module")
def defaults() -> list[dict[str, Any]]:
    """The chart rendered with its default values."""
    return render()


@pytest.fixture(scope="module")
def everything() -> list[dict[str, Any]]:
    """The chart rendered with every optional feature on, on a cluster serving every API."""
    return render(EVERYTHING_ON, api_versions=EVERY_API)


# ---------------------------------------------------------------------- RBAC model
class Right(NamedTuple):
    """One API permission: verb on group/resource (optionally one object by name)."""

    group: str
    resource: str
    verb: str
    name: str | None = None


AUTH_DELEGATOR_RULES = [
    {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
    {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"],
     "verbs": ["create"]},
]  # fmt: skip
"""Kubernetes' built-in `system:auth-delegator` ClusterRole."""


def _matches(values: list[str], wanted: str) -> bool:
    return "*" in values or wanted in values


def allows(rules: list[dict[str, Any]], right: Right) -> bool:
    """Whether any RBAC rule grants the right, as the API server's RBAC authorizer decides."""
    for rule in rules:
        names = rule.get("resourceNames") or []
        if (
            _matches(rule.get("apiGroups", []), right.group)
            and _matches(rule.get("resources", []), right.resource)
            and _matches(rule.get("verbs", []), right.verb)
            and (not names or right.name in names)
        ):
            return True
    return False


def rules_of(docs: list[dict[str, Any]], service_account: str) -> tuple[list[Any], set[str]]:
    """Every rule bound to a ServiceAccount of the release, and the names of the roles bound."""
    roles = {
        (d["kind"], d["metadata"]["name"]): d.get("rules", [])
        for d in docs
        if d["kind"] in ("ClusterRole", "Role")
    }
    roles[("ClusterRole", "system:auth-delegator")] = AUTH_DELEGATOR_RULES
    rules: list[Any] = []
    bound: set[str] = set()
    for binding in docs:
        if binding["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        subjects = binding.get("subjects") or []
        if not any(
            s["kind"] == "ServiceAccount"
            and s["name"] == service_account
            and s["namespace"] == NAMESPACE
            for s in subjects
        ):
            continue
        ref = binding["roleRef"]
        bound.add(ref["name"])
        rules.extend(roles[(ref["kind"], ref["name"])])
    return rules, bound


@pytest.fixture(scope="module")
def controller_rules(defaults: list[dict[str, Any]]) -> list[Any]:
    """The rules bound to the controller's ServiceAccount with default values."""
    return rules_of(defaults, "taugrid-controller")[0]


# ---------------------------------------------------------------------- lint and render
@pytest.mark.parametrize(
    "values",
    [{}, EVERYTHING_ON | {"prerequisites": {"check": "auto"}}, {"agent": {"privileged": True}}],
    ids=["with defaults", "with every option on", "with a privileged agent"],
)
def test_helm_lint_is_clean(values: dict[str, Any]) -> None:
    """`helm lint --strict` finds no error and no warning."""
    report = chart.lint(with_images(values))
    assert "[ERROR]" not in report
    assert "[WARNING]" not in report


def test_defaults_render_the_core_objects_and_nothing_optional(
    defaults: list[dict[str, Any]],
) -> None:
    """Defaults: the two components, their RBAC (the controller's cluster-wide role, its runs
    role bound in the runs namespace, its release-namespace role) and admission policy,
    Services (the API, the leader-only one and the headless one over the replicas), PDB,
    AdmissionCheck, priority class; besides them only `helm test`'s hooks
    (test_chart_helm_test.py)."""
    expected = {
        "ClusterRole": 2, "ClusterRoleBinding": 3, "DaemonSet": 1, "Deployment": 1,
        "PodDisruptionBudget": 1, "Role": 1, "RoleBinding": 2, "Service": 3,
        "ServiceAccount": 2, "AdmissionCheck": 1, "WorkloadPriorityClass": 1,
        "ValidatingAdmissionPolicy": 3, "ValidatingAdmissionPolicyBinding": 3,
    }  # fmt: skip
    kinds: dict[str, int] = {}
    for d in defaults:
        if not hook(d):
            kinds[d["kind"]] = kinds.get(d["kind"], 0) + 1
    assert expected == kinds


def test_every_option_on_renders_every_optional_object(everything: list[dict[str, Any]]) -> None:
    """With every option on: cert-manager chain, queues, agent Service, ServiceMonitors."""
    kinds = {d["kind"] for d in everything}
    for kind in (
        "Certificate",
        "Issuer",
        "ResourceFlavor",
        "ClusterQueue",
        "LocalQueue",
        "ServiceMonitor",
    ):
        assert kind in kinds, kind
    assert len(objects(everything, "ServiceMonitor")) == 2
    one(everything, "Service", "taugrid-agent")


@pytest.mark.parametrize("name", ["taurun.yaml", "taurunlog.yaml"])
def test_the_charts_crds_are_the_projects_crds(name: str) -> None:
    """crds/<name> is a byte-for-byte copy of deploy/crds/<name>, and the chart has no other."""
    ours = build.REPO / "deploy" / "crds" / name
    charted = chart.CHART_DIR / "crds" / name
    assert ours.read_bytes() == charted.read_bytes()
    assert sorted(p.name for p in (chart.CHART_DIR / "crds").glob("*.yaml")) == sorted(
        p.name for p in (build.REPO / "deploy" / "crds").glob("*.yaml")
    )


def test_the_crds_are_rendered_only_when_asked() -> None:
    """Helm installs crds/ itself; `--include-crds` shows the TauRun and TauRunLog CRDs."""
    assert objects(render(), "CustomResourceDefinition") == []
    crds = objects(render(include_crds=True), "CustomResourceDefinition")
    assert sorted(c["metadata"]["name"] for c in crds) == [
        "taurunlogs.taugrid.dev", "tauruns.taugrid.dev",
    ]  # fmt: skip


# ---------------------------------------------------------------------- prerequisites
@pytest.mark.parametrize(
    ("values", "apis", "message"),
    [
        ({}, (), "Kueue v0.17"),
        ({}, ("kueue.x-k8s.io/v1beta2",), "KubeRay v1.5"),
        ({"tls": {"certManager": {"enabled": True}}}, chart.DEV_API_VERSIONS, "cert-manager"),
        # values.schema.json refuses it before any template runs, naming the value.
        (
            {"prerequisites": {"check": "sometimes"}},
            chart.DEV_API_VERSIONS,
            r"/prerequisites/check'?: value must be one of 'auto', 'always', 'never'",
        ),
    ],
    ids=["without Kueue", "without KubeRay", "without cert-manager", "with a bad mode"],
)
def test_a_missing_prerequisite_fails_with_a_message_that_names_it(
    values: dict[str, Any], apis: tuple[str, ...], message: str
) -> None:
    """The check fails the rendering and says what to install."""
    with pytest.raises(chart.ChartError, match=message):
        render({"prerequisites": {"check": "always"}} | values, api_versions=apis)


@pytest.mark.parametrize(
    ("values", "apis"),
    [
        ({"prerequisites": {"check": "always"}}, chart.DEV_API_VERSIONS),
        ({"prerequisites": {"check": "always"}, "ray": {"enabled": False}},
         ("kueue.x-k8s.io/v1beta2",)),
        ({}, ()),
        ({"prerequisites": {"check": "never"}}, ()),
    ],
    ids=["with Kueue and KubeRay", "without KubeRay when ray is off",
         "offline in auto mode", "when the check is off"],
)  # fmt: skip
def test_the_prerequisite_check_passes_when_it_should(
    values: dict[str, Any], apis: tuple[str, ...]
) -> None:
    """Present APIs, a Ray-less install, offline rendering and `never` all render."""
    assert render(values, api_versions=apis)


# ---------------------------------------------------------------------- RBAC
def test_the_agent_may_not_patch_nodes_and_has_only_the_review_rights(
    defaults: list[dict[str, Any]],
) -> None:
    """The agent's only binding is system:auth-delegator; no node write, no eviction."""
    rules, bound = rules_of(defaults, "taugrid-agent")
    assert {"system:auth-delegator"} == bound
    for right in (
        Right("", "nodes", "patch"),
        Right("", "nodes/status", "patch"),
        Right("", "nodes", "update"),
        Right("", "pods/eviction", "create"),
        Right("", "secrets", "get"),
    ):
        assert not allows(rules, right), right
    assert allows(rules, Right("authentication.k8s.io", "tokenreviews", "create"))


def test_an_agent_without_auth_has_no_binding_and_no_api_token() -> None:
    """agent.auth.enabled=false: no binding at all and no automounted API token."""
    docs = render({"agent": {"auth": {"enabled": False}}})
    assert rules_of(docs, "taugrid-agent") == ([], set())
    pod = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert env_of(one(docs, "DaemonSet"))["TAUGRID_AGENT_AUTH_ENABLED"] == "false"


CONTROLLER_RIGHTS = [
    Right("", "nodes", "get"), Right("", "nodes", "list"), Right("", "nodes", "watch"),
    Right("", "nodes", "patch"), Right("", "nodes/status", "patch"),
    Right("", "pods/eviction", "create"), Right("", "pods", "list"), Right("", "pods/log", "get"),
    Right("", "pods", "patch"),
    Right("batch", "jobs", "create"), Right("batch", "jobs", "delete"),
    Right("ray.io", "rayjobs", "create"), Right("ray.io", "rayjobs/status", "patch"),
    Right("", "services", "create"), Right("", "services", "get"),
    Right("", "configmaps", "create"), Right("", "configmaps", "patch"),
    Right("", "configmaps", "get"), Right("", "pods", "get"),
    Right("networking.k8s.io", "networkpolicies", "create"),
    Right("", "persistentvolumeclaims", "get"),
    Right("events.k8s.io", "events", "create"), Right("events.k8s.io", "events", "patch"),
    Right("coordination.k8s.io", "leases", "create"),
    Right("coordination.k8s.io", "leases", "update", "taugrid-controller"),
    Right("kueue.x-k8s.io", "workloads", "watch"),
    Right("kueue.x-k8s.io", "workloads/status", "patch"),
    Right("kueue.x-k8s.io", "admissionchecks", "list"),
    Right("kueue.x-k8s.io", "admissionchecks/status", "patch"),
    Right("kueue.x-k8s.io", "localqueues", "list"), Right("kueue.x-k8s.io", "clusterqueues", "get"),
    Right("kueue.x-k8s.io", "resourceflavors", "list"),
    Right("kueue.x-k8s.io", "workloadpriorityclasses", "get"),
    Right("taugrid.dev", "tauruns", "create"), Right("taugrid.dev", "tauruns/status", "patch"),
    Right("taugrid.dev", "taurunlogs", "create"), Right("taugrid.dev", "taurunlogs", "update"),
    Right("visibility.kueue.x-k8s.io", "clusterqueues/pendingworkloads", "get"),
    Right("visibility.kueue.x-k8s.io", "localqueues/pendingworkloads", "get"),
    Right("authentication.k8s.io", "tokenreviews", "create"),
    Right("authorization.k8s.io", "subjectaccessreviews", "create"),
]  # fmt: skip


@pytest.mark.parametrize("right", CONTROLLER_RIGHTS, ids=lambda r: f"{r.verb} {r.resource}")
def test_the_controller_has_the_right(controller_rules: list[Any], right: Right) -> None:
    """Each right the controller's work needs is granted."""
    assert allows(controller_rules, right)


@pytest.mark.parametrize(
    "right",
    [
        Right("", "secrets", "get"), Right("", "secrets", "list"), Right("", "secrets", "watch"),
        Right("", "pods", "create"),
        Right("", "nodes", "delete"), Right("", "pods", "delete"), Right("", "namespaces", "get"),
        Right("coordination.k8s.io", "leases", "update", "someone-elses-lease"),
        Right("rbac.authorization.k8s.io", "clusterroles", "create"),
        Right("kueue.x-k8s.io", "clusterqueues", "patch"),
        # A rule's effect is never switched in place (it would reset timeAdded).
        Right("resource.k8s.io", "devicetaintrules", "update"),
        Right("resource.k8s.io", "devicetaintrules", "patch"),
        Right("resource.k8s.io", "resourceslices", "create"),
    ],
    ids=lambda r: f"{r.verb} {r.resource} {r.name or ''}".strip(),
)  # fmt: skip
def test_the_controller_lacks_the_right(controller_rules: list[Any], right: Right) -> None:
    """Rights the controller does not use are not granted (it never reads Secrets)."""
    assert not allows(controller_rules, right)


WRITES = [
    Right("batch", "jobs", "create"), Right("batch", "jobs", "delete"),
    Right("", "services", "create"), Right("", "configmaps", "create"),
    Right("", "configmaps", "patch"), Right("", "configmaps", "get"),
    Right("", "services", "get"), Right("networking.k8s.io", "networkpolicies", "create"),
    Right("networking.k8s.io", "networkpolicies", "get"),
    Right("taugrid.dev", "tauruns", "create"), Right("ray.io", "rayjobs", "create"),
    Right("", "pods/log", "get"), Right("", "persistentvolumeclaims", "get"),
    Right("taugrid.dev", "taurunlogs", "create"), Right("taugrid.dev", "taurunlogs", "update"),
]  # fmt: skip
"""The run-object rights: granted only where runs live."""


def test_run_object_writes_are_granted_only_in_the_runs_namespaces() -> None:
    """No cluster-wide binding grants a run-object write; the runs role is bound by one
    RoleBinding per `controller.runNamespaces` entry and nowhere else."""
    docs = render({"controller": {"runNamespaces": ["team-a", "team-b"]}})
    roles = {d["metadata"]["name"]: d.get("rules", []) for d in objects(docs, "ClusterRole")}
    wide = [r for b in objects(docs, "ClusterRoleBinding")
            for r in roles.get(b["roleRef"]["name"], [])]  # fmt: skip
    bound = sorted(
        b["metadata"]["namespace"] for b in objects(docs, "RoleBinding")
        if b["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": "taugrid-controller-runs"}
    )  # fmt: skip
    expected: tuple[list[Right], list[str], list[Right]] = ([], ["team-a", "team-b"], [])
    actual = (
        [w for w in WRITES if allows(wide, w)], bound,
        [w for w in WRITES if not allows(roles["taugrid-controller-runs"], w)],
    )  # fmt: skip
    assert expected == actual


@pytest.mark.parametrize(
    ("namespaces", "message"),
    [
        pytest.param(["kube-system"], "must not name kube-system", id="kube-system is refused"),
        pytest.param(["team-a", "kube-public"], "must not name kube-public",
                     id="any kube- namespace is refused"),
        pytest.param([], "at least one namespace", id="no runs namespace is refused"),
    ],
)  # fmt: skip
def test_runs_never_live_in_the_kube_namespaces(namespaces: list[str], message: str) -> None:
    """The rendering fails, naming the problem, rather than grant writes there."""
    with pytest.raises(chart.ChartError, match=message):
        render({"controller": {"runNamespaces": namespaces}})


def test_the_controller_touches_no_secret() -> None:
    """Run pods get projected tokens, so no role of the controller grants any verb on Secrets."""
    verbs = ("create", "patch", "update", "get", "list", "watch", "delete")
    rules = rules_of(render(), "taugrid-controller")[0]
    expected = [False] * len(verbs)
    assert expected == [allows(rules, Right("", "secrets", v)) for v in verbs]


def test_the_admission_policy_binds_the_controllers_service_account_and_denies() -> None:
    """The policy matches requests of the release's controller ServiceAccount only, fails
    closed, and its binding denies (not just warns or audits)."""
    docs = render(release="tg2", namespace="team-ops")
    policy = one(docs, "ValidatingAdmissionPolicy", "tg2-taugrid-controller")
    binding = one(docs, "ValidatingAdmissionPolicyBinding", "tg2-taugrid-controller")
    (condition,) = policy["spec"]["matchConditions"]
    user = "system:serviceaccount:team-ops:tg2-taugrid-controller"
    expected = (f"request.userInfo.username == {json.dumps(user)}", "Fail", ["Deny"],
                policy["metadata"]["name"])  # fmt: skip
    actual = (condition["expression"], policy["spec"]["failurePolicy"],
              binding["spec"]["validationActions"], binding["spec"]["policyName"])  # fmt: skip
    assert expected == actual


def test_without_ray_the_controller_gets_no_ray_rights() -> None:
    """ray.enabled=false drops the ray.io rules."""
    rules = rules_of(render({"ray": {"enabled": False}}), "taugrid-controller")[0]
    assert not allows(rules, Right("ray.io", "rayjobs", "create"))
    assert allows(rules, Right("batch", "jobs", "create"))


# The API calls in controller/kube/*.py, keyed by (receiver attribute, method, custom-object
# target), and the rights each needs (Kueue calls are read from their arguments instead). A
# call missing here fails the test below: add it here and grant it in the chart's
# templates/rbac-controller.yaml.
TAURUN, RAYJOB = ("taugrid.dev", "tauruns"), ("ray.io", "rayjobs")
DRA = ("resource.k8s.io",)
TAURUNLOG = ("taugrid.dev", "taurunlogs")
CALL_RIGHTS: dict[tuple[str, str, str], tuple[Right, ...]] = {
    ("_core", "list_node", ""): (Right("", "nodes", "list"), Right("", "nodes", "watch")),
    ("_core", "patch_node", ""): (Right("", "nodes", "patch"),),
    ("_core", "read_node", ""): (Right("", "nodes", "get"),),
    ("_core", "patch_node_status", ""): (Right("", "nodes/status", "patch"),),
    ("_core", "list_pod_for_all_namespaces", ""): (Right("", "pods", "list"),
                                                   Right("", "pods", "watch")),
    ("_core", "list_namespaced_pod", ""): (Right("", "pods", "list"),),
    ("_core", "create_namespaced_pod_eviction", ""): (Right("", "pods/eviction", "create"),),
    ("_core", "patch_namespaced_pod", ""): (Right("", "pods", "patch"),),
    ("_logs", "read_namespaced_pod_log", ""): (Right("", "pods/log", "get"),),
    ("_core", "read_namespaced_pod_log", ""): (Right("", "pods/log", "get"),),
    ("_core", "create_namespaced_service", ""): (Right("", "services", "create"),),
    ("_core", "delete_namespaced_service", ""): (Right("", "services", "delete"),),
    ("_core", "create_namespaced_config_map", ""): (Right("", "configmaps", "create"),),
    ("_core", "patch_namespaced_config_map", ""): (Right("", "configmaps", "patch"),),
    ("_core", "read_namespaced_pod", ""): (Right("", "pods", "get"),),
    ("_core", "read_namespaced_service", ""): (Right("", "services", "get"),),
    ("_core", "read_namespaced_config_map", ""): (Right("", "configmaps", "get"),),
    ("_batch", "read_namespaced_job", ""): (Right("batch", "jobs", "get"),),
    ("_networking", "read_namespaced_network_policy", ""): (
        Right("networking.k8s.io", "networkpolicies", "get"),),
    ("_custom", "get_namespaced_custom_object", "RAYJOB"): (Right(*RAYJOB, "get"),),
    ("_custom", "get_namespaced_custom_object", "CLAIM_TEMPLATES"): (
        Right(*DRA, "resourceclaimtemplates", "get"),),
    ("_core", "read_namespaced_persistent_volume_claim", ""): (
        Right("", "persistentvolumeclaims", "get"),),
    ("_events", "create_namespaced_event", ""): (Right("events.k8s.io", "events", "create"),),
    ("_networking", "create_namespaced_network_policy", ""): (
        Right("networking.k8s.io", "networkpolicies", "create"),),
    ("_networking", "delete_namespaced_network_policy", ""): (
        Right("networking.k8s.io", "networkpolicies", "delete"),),
    ("_batch", "create_namespaced_job", ""): (Right("batch", "jobs", "create"),),
    ("_batch", "delete_namespaced_job", ""): (Right("batch", "jobs", "delete"),),
    ("_batch", "list_job_for_all_namespaces", ""): (Right("batch", "jobs", "list"),),
    ("_api", "read_namespaced_lease", ""): (
        Right("coordination.k8s.io", "leases", "get", "taugrid-controller"),),
    ("_api", "create_namespaced_lease", ""): (Right("coordination.k8s.io", "leases", "create"),),
    ("_api", "replace_namespaced_lease", ""): (
        Right("coordination.k8s.io", "leases", "update", "taugrid-controller"),),
    ("_api", "patch_namespaced_lease", ""): (
        Right("coordination.k8s.io", "leases", "patch", "taugrid-controller"),),
    ("_authn", "create_token_review", ""): (
        Right("authentication.k8s.io", "tokenreviews", "create"),),
    ("_authz", "create_subject_access_review", ""): (
        Right("authorization.k8s.io", "subjectaccessreviews", "create"),),
    ("api", "call_api", ""): (  # the visibility API, the metadata-only node list and watch
        Right("visibility.kueue.x-k8s.io", "localqueues/pendingworkloads", "get"),
        Right("", "nodes", "list"), Right("", "nodes", "watch")),
    ("_custom", "create_namespaced_custom_object", "TAURUN"): (Right(*TAURUN, "create"),),
    ("_custom", "get_namespaced_custom_object", "TAURUN"): (Right(*TAURUN, "get"),),
    ("_custom", "list_namespaced_custom_object", "TAURUN"): (Right(*TAURUN, "list"),),
    ("_custom", "list_cluster_custom_object", "TAURUN"): (Right(*TAURUN, "list"),),
    ("_custom", "patch_namespaced_custom_object", "TAURUN"): (Right(*TAURUN, "patch"),),
    ("_custom", "patch_namespaced_custom_object_status", "TAURUN"): (
        Right("taugrid.dev", "tauruns/status", "patch"),),
    ("_custom", "create_namespaced_custom_object", "TAURUNLOG"): (Right(*TAURUNLOG, "create"),),
    ("_custom", "get_namespaced_custom_object", "TAURUNLOG"): (Right(*TAURUNLOG, "get"),),
    ("_custom", "list_namespaced_custom_object", "TAURUNLOG"): (Right(*TAURUNLOG, "list"),),
    ("_custom", "replace_namespaced_custom_object", "TAURUNLOG"): (Right(*TAURUNLOG, "update"),),
    ("_custom", "create_namespaced_custom_object", "RAYJOB"): (Right(*RAYJOB, "create"),),
    ("_custom", "delete_namespaced_custom_object", "RAYJOB"): (Right(*RAYJOB, "delete"),),
    ("_custom", "list_cluster_custom_object", "RAYJOB"): (Right(*RAYJOB, "list"),),
    ("_custom", "patch_namespaced_custom_object_status", "RAYJOB"): (
        Right("ray.io", "rayjobs/status", "patch"),),
    ("_custom", "list_cluster_custom_object", "RESOURCE"): (  # slices, rules, claims
        Right(*DRA, "resourceslices", "list"), Right(*DRA, "resourceslices", "watch"),
        Right(*DRA, "devicetaintrules", "list"), Right(*DRA, "devicetaintrules", "watch"),
        Right(*DRA, "resourceclaims", "list"), Right(*DRA, "resourceclaims", "watch")),
    ("_custom", "create_cluster_custom_object", "RESOURCE"): (
        Right(*DRA, "devicetaintrules", "create"),),
    ("_custom", "delete_cluster_custom_object", "RESOURCE"): (
        Right(*DRA, "devicetaintrules", "delete"),),
    ("_custom", "create_namespaced_custom_object", "CLAIM_TEMPLATES"): (
        Right(*DRA, "resourceclaimtemplates", "create"),),
    ("_custom", "delete_namespaced_custom_object", "CLAIM_TEMPLATES"): (
        Right(*DRA, "resourceclaimtemplates", "delete"),),
}  # fmt: skip
KUEUE_VERBS = {"get": "get", "list": "list", "create": "create", "patch": "patch",
               "delete": "delete", "replace": "update"}  # fmt: skip
"""The RBAC verb of a CustomObjectsApi method, by its first word (server-side apply is patch)."""


class Call(NamedTuple):
    """One API call in an adapter: `self.<receiver>.<method>(*<target>, …, "<plural>", …)`;
    `watched` when it is a list call bound into a watch-fed cache
    (`functools.partial(self.<receiver>.<method>, …)`), which lists and watches."""

    receiver: str
    method: str
    target: str = ""
    plural: str = ""
    watched: bool = False


def _custom_target(call: ast.Call) -> tuple[str, str]:
    """The group constant a CustomObjectsApi call starts with (`*TAURUN[:2]` → TAURUN) and the
    first string literal among its arguments (the plural of a Kueue call), if any."""
    target = ""
    if call.args and isinstance(call.args[0], ast.Starred):
        node = call.args[0].value
        if isinstance(node, ast.Subscript):
            node = node.value
        target = node.id if isinstance(node, ast.Name) else ""
    literals = [
        a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
    ]
    return target, (literals[0] if literals else "")


def _bound(node: ast.Call) -> ast.Call | None:
    """`functools.partial(self.x.method, *args)` as the call `self.x.method(*args)`."""
    func = node.func
    if not (isinstance(func, ast.Attribute) and func.attr == "partial" and node.args):
        return None
    if not isinstance(node.args[0], ast.Attribute):
        return None
    return ast.Call(func=node.args[0], args=node.args[1:], keywords=node.keywords)


def adapter_calls() -> Iterator[Call]:
    """Every API call on `self.<api>` in controller/kube/*.py."""
    for path in sorted((build.REPO / "controller" / "kube").glob("*.py")):
        for found in ast.walk(ast.parse(path.read_text())):
            if not isinstance(found, ast.Call):
                continue
            bound = _bound(found)
            node = bound or found
            if not isinstance(node.func, ast.Attribute):
                continue
            receiver = node.func.value
            if not (
                isinstance(receiver, ast.Attribute)
                and isinstance(receiver.value, ast.Name)
                and receiver.value.id == "self"
            ):
                continue
            if receiver.attr not in {
                "_core",
                "_logs",
                "_events",
                "_batch",
                "_custom",
                "_api",
                "_authn",
                "_authz",
                "api",
            }:
                continue
            watched = bound is not None
            if receiver.attr == "_custom":
                yield Call(receiver.attr, node.func.attr, *_custom_target(node), watched=watched)
            else:
                yield Call(receiver.attr, node.func.attr, watched=watched)


def kueue_plurals() -> set[str]:
    """The Kueue plurals the controller lists (`store.list_kueue("workloads")` …)."""
    text = "\n".join(p.read_text() for p in (build.REPO / "controller").rglob("*.py"))
    return set(re.findall(r"list_kueue\(\s*\"(\w+)\"", text))


def kueue_rights(call: Call, plurals: set[str]) -> tuple[Right, ...]:
    """The rights of a Kueue call: its verb on its literal plural, or on every plural the
    callers pass when the plural is a variable (`list_kueue(plural)`)."""
    verb = KUEUE_VERBS[call.method.split("_")[0]]
    suffix = "/status" if call.method.endswith("_status") else ""
    resources = {call.plural} if call.plural else (plurals if verb == "list" else set())
    assert resources, f"cannot tell which Kueue resource {call} touches"
    return tuple(Right("kueue.x-k8s.io", r + suffix, verb) for r in sorted(resources))


def test_the_controller_is_granted_every_api_call_its_adapters_make(
    controller_rules: list[Any],
) -> None:
    """Every call in controller/kube/*.py is known here and allowed by the chart's RBAC."""
    calls = set(adapter_calls())
    assert len(calls) > 20, "the adapter scan found too few calls; did the adapters move?"
    plurals = kueue_plurals()
    assert "workloads" in plurals
    unknown = []
    for call in sorted(calls):
        if call.target == "KUEUE":
            rights = kueue_rights(call, plurals)
        elif call[:3] in CALL_RIGHTS:
            rights = CALL_RIGHTS[call[:3]]
        else:
            unknown.append(call)
            continue
        if call.watched:  # a cache lists and watches
            rights = (*rights, *(r._replace(verb="watch") for r in rights if r.verb == "list"))
        for right in rights:
            assert allows(controller_rules, right), f"{call} needs {right}"
    assert unknown == [], "map these calls in CALL_RIGHTS and grant them in the chart"


def test_followers_reach_the_leader_through_the_leader_only_service_with_a_peer_token(
    everything: list[dict[str, Any]],
) -> None:
    """The leader-only Service selects the controller pods that carry the leader label; the
    replicas are told its https URL, the name of their own pod, and read a projected peer
    token of audience taugrid-peer; the certificate covers the Service's names."""
    service = one(everything, "Service", "taugrid-controller-leader")
    deploy = one(everything, "Deployment")
    pod_labels = deploy["spec"]["template"]["metadata"]["labels"]
    env = env_of(deploy)
    fields = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"]
              for e in container(deploy)["env"] if "valueFrom" in e}  # fmt: skip
    volumes = {v["name"]: v for v in deploy["spec"]["template"]["spec"]["volumes"]}
    (source,) = volumes["peer-token"]["projected"]["sources"]
    mount = next(m for m in container(deploy)["volumeMounts"] if m["name"] == "peer-token")
    names = one(everything, "Certificate", "taugrid-controller")["spec"]["dnsNames"]
    selector = service["spec"]["selector"]
    expected = (
        "true", True, "https://taugrid-controller-leader.taugrid-system.svc.cluster.local:8080",
        "metadata.name", "taugrid-peer",
        pathlib.PurePosixPath(env["TAUGRID_CONTROLLER_PEER_TOKEN_FILE"]), True,
    )  # fmt: skip
    actual = (
        selector.pop("taugrid.dev/leader"), selector.items() <= pod_labels.items(),
        env["TAUGRID_CONTROLLER_LEADER_URL"], fields["TAUGRID_CONTROLLER_POD_NAME"],
        source["serviceAccountToken"]["audience"],
        pathlib.PurePosixPath(mount["mountPath"], source["serviceAccountToken"]["path"]),
        "taugrid-controller-leader.taugrid-system.svc.cluster.local" in names,
    )  # fmt: skip
    assert expected == actual


def test_the_heartbeat_relay_values_become_the_controllers_settings() -> None:
    """controller.heartbeatRelay reaches the controller as the settings it reads (a large
    byte count renders as an integer, which the setting parses)."""
    relay = {"enabled": False, "batchIntervalS": 0.5, "batchMaxEntries": 2000,
             "fullRefreshS": 30, "unreachableAfterS": 3, "maxBodyBytes": 16777216}  # fmt: skip
    env = env_of(one(render({"controller": {"heartbeatRelay": relay}}), "Deployment"))
    prefix = "TAUGRID_CONTROLLER_"
    names = ("heartbeat_relay", "peer_batch_interval_s", "peer_batch_max_entries",
             "peer_full_refresh_s", "peer_unreachable_after_s", "peer_max_body_bytes")  # fmt: skip
    settings = controller_settings.ControllerSettings.model_validate(
        {name: env[prefix + name.upper()] for name in names}
    )
    expected = (False, 0.5, 2000, 30.0, 3.0, 16777216)
    assert expected == tuple(getattr(settings, name) for name in names)


def test_the_lease_rights_name_the_configured_lease() -> None:
    """controller.leaseName moves both the setting and the Role's resourceNames."""
    docs = render({"controller": {"leaseName": "my-lease"}})
    rules = rules_of(docs, "taugrid-controller")[0]
    assert allows(rules, Right("coordination.k8s.io", "leases", "update", "my-lease"))
    assert not allows(rules, Right("coordination.k8s.io", "leases", "update", "taugrid-controller"))
    assert env_of(one(docs, "Deployment"))["TAUGRID_CONTROLLER_LEASE_NAME"] == "my-lease"


# ---------------------------------------------------------------------- the agent DaemonSet
def test_the_agent_tolerates_quarantine_and_runs_on_gpu_nodes(
    defaults: list[dict[str, Any]],
) -> None:
    """A quarantined (tainted, cordoned) node keeps its agent; only GPU nodes get one."""
    pod = one(defaults, "DaemonSet")["spec"]["template"]["spec"]
    tolerations = {(t["key"], t.get("effect")) for t in pod["tolerations"]}
    assert (TAINT_KEY, "NoSchedule") in tolerations
    assert ("node.kubernetes.io/unschedulable", "NoSchedule") in tolerations
    assert ("node.kubernetes.io/not-ready", "NoExecute") in tolerations
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}


def test_the_agent_sends_a_projected_token_with_audience_taugrid(
    defaults: list[dict[str, Any]],
) -> None:
    """The token volume has audience taugrid and lies where TAUGRID_AGENT_TOKEN_PATH says."""
    ds = one(defaults, "DaemonSet")
    volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    (source,) = volumes["taugrid-token"]["projected"]["sources"]
    assert source["serviceAccountToken"]["audience"] == "taugrid"
    mount = next(m for m in container(ds)["volumeMounts"] if m["name"] == "taugrid-token")
    token_path = env_of(ds)["TAUGRID_AGENT_TOKEN_PATH"]
    assert pathlib.PurePosixPath(mount["mountPath"], source["serviceAccountToken"]["path"]) == (
        pathlib.PurePosixPath(token_path)
    )


def test_the_latched_fault_state_lives_on_a_host_path(defaults: list[dict[str, Any]]) -> None:
    """TAUGRID_AGENT_STATE_PATH is inside a hostPath mount, so latches survive restarts."""
    ds = one(defaults, "DaemonSet")
    volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    assert volumes["state"]["hostPath"]["path"] == "/var/lib/taugrid"
    mount = next(m for m in container(ds)["volumeMounts"] if m["name"] == "state")
    state = pathlib.PurePosixPath(env_of(ds)["TAUGRID_AGENT_STATE_PATH"])
    assert state.parent == pathlib.PurePosixPath(mount["mountPath"])
    assert not mount.get("readOnly", False)


def test_the_agent_is_not_privileged_by_default_but_can_be() -> None:
    """Default: NVIDIA toolkit env, CAP_SYSLOG and /dev/kmsg only; `privileged: true` on ask."""
    ds = one(render(), "DaemonSet")
    sc = container(ds)["securityContext"]
    assert "privileged" not in sc
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SYSLOG"]}
    assert sc["readOnlyRootFilesystem"] is True
    assert env_of(ds)["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env_of(ds)["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    assert volumes["kmsg"]["hostPath"] == {"path": "/dev/kmsg", "type": "CharDevice"}
    privileged = one(render({"agent": {"privileged": True}}), "DaemonSet")
    assert container(privileged)["securityContext"]["privileged"] is True


def test_the_agent_gets_only_the_ca_of_the_controllers_certificate(
    defaults: list[dict[str, Any]],
) -> None:
    """The agents trust the controller's CA; the TLS private key is never mounted on a node."""
    ds = one(defaults, "DaemonSet")
    volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    secret = volumes["controller-ca"]["secret"]
    assert secret["secretName"] == "taugrid-controller-tls"
    assert secret["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
    assert env_of(ds)["TAUGRID_AGENT_CA_PATH"] == "/etc/taugrid/controller-ca/ca.crt"
    url = "https://taugrid-controller.taugrid-system.svc.cluster.local:8080"
    assert env_of(ds)["TAUGRID_AGENT_CONTROLLER_URL"] == url


def test_the_dcgm_families_can_be_turned_off_where_dcgm_exporter_runs() -> None:
    """agent.exportDcgmFamilies=false reaches TAUGRID_AGENT_EXPORT_DCGM_FAMILIES."""
    ds = one(render({"agent": {"exportDcgmFamilies": False}}), "DaemonSet")
    assert env_of(ds)["TAUGRID_AGENT_EXPORT_DCGM_FAMILIES"] == "false"


@pytest.mark.parametrize(
    ("values", "mounted", "labels"),
    [
        pytest.param({}, True, "true", id="by default the socket directory is mounted read-only"),
        pytest.param({"agent": {"podResources": {"enabled": False}}}, False, "false",
                     id="attribution off: no mount and no pod labels"),
    ],
)  # fmt: skip
def test_the_agent_reads_the_kubelets_pod_resources_read_only(
    values: dict[str, Any], mounted: bool, labels: str
) -> None:
    """The kubelet's pod-resources directory is mounted read-only where the agent looks."""
    ds = one(render(values), "DaemonSet")
    mounts = {m["name"]: m for m in container(ds)["volumeMounts"]}
    volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    env = env_of(ds)
    assert labels == env["TAUGRID_AGENT_POD_LABELS"]
    assert mounted == ("pod-resources" in mounts)
    if mounted:
        assert {k: mounts["pod-resources"][k] for k in ("mountPath", "readOnly")} == {
            "mountPath": "/var/lib/kubelet/pod-resources",
            "readOnly": True,
        }
        assert volumes["pod-resources"]["hostPath"] == {"path": "/var/lib/kubelet/pod-resources"}
        socket = pathlib.Path(env["TAUGRID_AGENT_PODRESOURCES_SOCKET"])
        assert socket.parent == pathlib.Path(mounts["pod-resources"]["mountPath"])


@pytest.mark.parametrize("name", ["Hostname", "hostname"])
def test_the_host_label_name_reaches_the_agent(name: str) -> None:
    """agent.hostLabel reaches TAUGRID_AGENT_HOST_LABEL (dcgm-exporter releases vs main)."""
    ds = one(render({"agent": {"hostLabel": name}}), "DaemonSet")
    assert name == env_of(ds)["TAUGRID_AGENT_HOST_LABEL"]


# ---------------------------------------------------------------------- the controller
def test_the_controller_runs_two_probed_replicas_over_https(
    defaults: list[dict[str, Any]],
) -> None:
    """Two replicas spread by a preferred anti-affinity, probed on /healthz and /readyz."""
    deploy = one(defaults, "Deployment")
    pod = deploy["spec"]["template"]["spec"]
    assert deploy["spec"]["replicas"] == 2
    c = container(deploy)
    assert (c["livenessProbe"]["httpGet"]["path"], c["readinessProbe"]["httpGet"]["path"]) == (
        "/healthz",
        "/readyz",
    )
    assert c["livenessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    env = env_of(deploy)
    assert env["TAUGRID_CONTROLLER_TLS_CERT_FILE"] == "/etc/taugrid/tls/tls.crt"
    assert "TAUGRID_CONTROLLER_ALLOW_INSECURE_HTTP" not in env


def test_the_controller_runs_unprivileged(defaults: list[dict[str, Any]]) -> None:
    """Non-root, read-only root filesystem, every capability dropped."""
    deploy = one(defaults, "Deployment")
    assert deploy["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    sc = container(deploy)["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}


def test_the_pdb_keeps_one_controller_replica(defaults: list[dict[str, Any]]) -> None:
    """The PodDisruptionBudget selects the controller pods and keeps at least one."""
    pdb = one(defaults, "PodDisruptionBudget")
    labels = one(defaults, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_the_controller_knows_the_names_this_release_gives_things() -> None:
    """Namespace, agent ServiceAccount and port, AdmissionCheck and priority class reach the
    settings."""
    docs = render({
        "fullnameOverride": "tg2",
        "admissionCheck": {"name": "tg2-gpu-health"},
        "resumePriorityClass": {"name": "tg2-resume"},
        "controller": {"dryRun": True, "managedNodeSelector": "pool=a"},
    })  # fmt: skip
    env = env_of(one(docs, "Deployment"))
    assert env["TAUGRID_CONTROLLER_NAMESPACE"] == NAMESPACE
    assert env["TAUGRID_CONTROLLER_AGENT_SERVICE_ACCOUNT"] == "tg2-agent"
    assert env["TAUGRID_CONTROLLER_AGENT_PORT"] == "9400"
    assert env["TAUGRID_CONTROLLER_ADMISSION_CHECK"] == "tg2-gpu-health"
    assert env["TAUGRID_CONTROLLER_RESUME_PRIORITY_CLASS"] == "tg2-resume"
    assert env["TAUGRID_CONTROLLER_DRY_RUN"] == "true"
    assert env["TAUGRID_CONTROLLER_NODE_SELECTOR"] == "pool=a"
    one(docs, "ServiceAccount", "tg2-agent")


@pytest.mark.parametrize(
    ("kind", "settings_class", "prefix"),
    [
        ("Deployment", controller_settings.ControllerSettings, "TAUGRID_CONTROLLER_"),
        ("DaemonSet", agent_settings.Settings, "TAUGRID_AGENT_"),
    ],
    ids=["controller", "agent"],
)
def test_every_rendered_setting_exists_and_parses(
    everything: list[dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
    settings_class: type[Any],
    prefix: str,
) -> None:
    """Each TAUGRID_* variable names a real setting, and the process would accept its value."""
    env = {k: v for k, v in env_of(one(everything, kind)).items() if k.startswith(prefix)}
    names = {k.removeprefix(prefix).lower() for k in env}
    assert names - set(settings_class.model_fields) == set()
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings_class()  # raises pydantic.ValidationError on a value the process would refuse


def test_user_token_audiences_reach_the_controller_as_a_list(
    everything: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """userTokenAudiences becomes `user_audiences`; unset, the variable is not rendered, so
    the controller accepts the API server's own audience."""
    env = env_of(one(everything, "Deployment"))
    monkeypatch.setenv(
        "TAUGRID_CONTROLLER_USER_AUDIENCES", env["TAUGRID_CONTROLLER_USER_AUDIENCES"]
    )
    expected = (("taugrid-api",), False)
    actual = (
        controller_settings.ControllerSettings().user_audiences,
        "TAUGRID_CONTROLLER_USER_AUDIENCES" in env_of(one(render(), "Deployment")),
    )
    assert expected == actual


def test_extra_settings_become_environment_variables() -> None:
    """extraSettings: snake_case names → TAUGRID_* variables; maps are JSON."""
    docs = render({
        "controller": {"extraSettings": {"pass_interval_s": 0.5,
                                         "run_pod_annotations": {"a": "b"}}},
        "agent": {"extraSettings": {"gauge_interval_s": 2}},
    })  # fmt: skip
    controller_env = env_of(one(docs, "Deployment"))
    assert controller_env["TAUGRID_CONTROLLER_PASS_INTERVAL_S"] == "0.5"
    assert controller_env["TAUGRID_CONTROLLER_RUN_POD_ANNOTATIONS"] == '{"a":"b"}'
    assert env_of(one(docs, "DaemonSet"))["TAUGRID_AGENT_GAUGE_INTERVAL_S"] == "2"


def test_without_tls_the_controller_serves_plain_http_on_purpose() -> None:
    """tls.enabled=false: no certificate mount, insecure HTTP allowed, http:// URLs."""
    docs = render({"tls": {"enabled": False}})
    env = env_of(one(docs, "Deployment"))
    assert env["TAUGRID_CONTROLLER_ALLOW_INSECURE_HTTP"] == "true"
    assert "TAUGRID_CONTROLLER_TLS_CERT_FILE" not in env
    assert "TAUGRID_CONTROLLER_TLS_CA_FILE" not in env
    assert env_of(one(docs, "DaemonSet"))["TAUGRID_AGENT_CONTROLLER_URL"].startswith("http://")
    assert container(one(docs, "Deployment"))["livenessProbe"]["httpGet"]["scheme"] == "HTTP"


def test_cert_manager_issues_the_secret_the_controller_mounts(
    everything: list[dict[str, Any]],
) -> None:
    """The serving Certificate writes the Secret the Deployment mounts, for the Service name."""
    cert = one(everything, "Certificate", "taugrid-controller")
    assert cert["spec"]["secretName"] == "taugrid-controller-tls"
    assert "taugrid-controller.taugrid-system.svc" in cert["spec"]["dnsNames"]
    volumes = one(everything, "Deployment")["spec"]["template"]["spec"]["volumes"]
    assert {"taugrid-controller-tls"} == {
        v["secret"]["secretName"] for v in volumes if "secret" in v
    }


def test_the_certificate_covers_the_name_each_replica_advertises(
    everything: list[dict[str, Any]],
) -> None:
    """The wildcard under the headless Service is in the Certificate, and it is the domain the
    controller advertises its leader URL under (`<pod IP, dashed>.<domain>`)."""
    names = one(everything, "Certificate", "taugrid-controller")["spec"]["dnsNames"]
    domain = env_of(one(everything, "Deployment"))["TAUGRID_CONTROLLER_ADVERTISE_DOMAIN"]
    assert domain == "taugrid-controller-pods.taugrid-system.svc.cluster.local"
    assert {f"*.{domain}", "*.taugrid-controller-pods.taugrid-system.svc"} <= set(names)
    assert {"taugrid.example.com", "taugrid-controller"} <= set(names)


def test_a_headless_service_gives_every_replica_a_name(defaults: list[dict[str, Any]]) -> None:
    """`<fullname>-controller-pods`: headless, publishing not-ready pods (a leader that is not
    ready must stay reachable), selecting the controller pods, which read their IP from the
    downward API to build their name under it."""
    headless = one(defaults, "Service", "taugrid-controller-pods")
    deploy = one(defaults, "Deployment")
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    assert headless["spec"]["selector"] == deploy["spec"]["selector"]["matchLabels"]
    assert headless["spec"]["ports"][0]["targetPort"] == "api"
    env = {e["name"]: e for e in container(deploy)["env"]}
    assert env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    domain = env["TAUGRID_CONTROLLER_ADVERTISE_DOMAIN"]["value"]
    assert domain == "taugrid-controller-pods.taugrid-system.svc.cluster.local"


def test_the_service_monitor_scrapes_each_controller_pod_once(
    everything: list[dict[str, Any]],
) -> None:
    """The controller ServiceMonitor's selector matches the API Service, not the headless one
    over the same pods (which would scrape each pod twice)."""
    monitor = one(everything, "ServiceMonitor", "taugrid-controller")
    wanted = monitor["spec"]["selector"]["matchLabels"].items()
    matched = [s["metadata"]["name"] for s in objects(everything, "Service")
               if wanted <= s["metadata"]["labels"].items()]  # fmt: skip
    assert matched == ["taugrid-controller"]


@pytest.mark.parametrize(
    ("values", "secret", "key"),
    [
        ({}, "taugrid-controller-tls", "ca.crt"),
        ({"agent": {"controllerCA": {"secretName": "corp-ca", "key": "root.pem"}}}, "corp-ca",
         "root.pem"),
    ],
    ids=["from the TLS Secret by default", "from the CA Secret the values name"],
)  # fmt: skip
def test_the_controller_trusts_the_ca_of_its_own_certificate(
    values: dict[str, Any], secret: str, key: str
) -> None:
    """The replicas mount only the CA key of the CA Secret (as the agents do) and trust it for
    forwarding (TAUGRID_CONTROLLER_TLS_CA_FILE); run pods get it from there too."""
    deploy = one(render(values), "Deployment")
    path = env_of(deploy)["TAUGRID_CONTROLLER_TLS_CA_FILE"]
    assert path == "/etc/taugrid/controller-ca/ca.crt"
    mounts = {m["name"]: m["mountPath"] for m in container(deploy)["volumeMounts"]}
    assert mounts["controller-ca"] == "/etc/taugrid/controller-ca"
    volumes = {v["name"]: v for v in deploy["spec"]["template"]["spec"]["volumes"]}
    ca = volumes["controller-ca"]["secret"]
    assert (ca["secretName"], ca["items"]) == (secret, [{"key": key, "path": "ca.crt"}])
    ds = one(render(values), "DaemonSet")
    agent_ca = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}["controller-ca"]
    assert agent_ca["secret"] == {"secretName": secret, "items": ca["items"]}


# ---------------------------------------------------------------------- Kueue objects, names
def test_the_admission_check_and_priority_class_are_kueue_v1beta2(
    defaults: list[dict[str, Any]],
) -> None:
    """AdmissionCheck taugrid-gpu-health for taugrid.dev/gpu-health; taugrid-resume value 1."""
    check = one(defaults, "AdmissionCheck", "taugrid-gpu-health")
    assert check["apiVersion"] == "kueue.x-k8s.io/v1beta2"
    assert check["spec"] == {"controllerName": "taugrid.dev/gpu-health"}
    wpc = one(defaults, "WorkloadPriorityClass", "taugrid-resume")
    assert (wpc["apiVersion"], wpc["value"]) == ("kueue.x-k8s.io/v1beta2", 1)


@pytest.mark.parametrize(
    ("use", "expected"),
    [(True, [{"name": "taugrid-gpu-health"}]), (False, None)],
    ids=["by default", "when off"],
)
def test_the_cluster_queue_references_the_admission_check(
    use: bool, expected: list[dict[str, str]] | None
) -> None:
    """queues.clusterQueue.useAdmissionCheck decides admissionChecksStrategy."""
    docs = render({"queues": {"enabled": True, "clusterQueue": {"useAdmissionCheck": use}}})
    spec = one(docs, "ClusterQueue")["spec"]
    assert spec.get("admissionChecksStrategy", {}).get("admissionChecks") == expected
    assert one(docs, "LocalQueue")["spec"]["clusterQueue"] == "taugrid"


def test_the_cluster_scoped_objects_can_all_be_skipped() -> None:
    """Toggles skip the AdmissionCheck, the priority class and the queues."""
    docs = render({"admissionCheck": {"create": False}, "resumePriorityClass": {"create": False}})
    kinds = {d["kind"] for d in docs}
    assert not kinds & {
        "AdmissionCheck",
        "WorkloadPriorityClass",
        "ClusterQueue",
        "ResourceFlavor",
        "LocalQueue",
    }


def cluster_scoped_names(docs: list[dict[str, Any]]) -> set[tuple[str, str]]:
    """(kind, name) of every object without a namespace."""
    return {(d["kind"], d["metadata"]["name"]) for d in docs if "namespace" not in d["metadata"]}


def test_a_second_release_shares_no_cluster_scoped_name_with_the_first() -> None:
    """Two releases with different names (and their own check, class and queue names) can be
    installed side by side."""

    def release(name: str) -> list[dict[str, Any]]:
        return render(
            {
                "admissionCheck": {"name": f"{name}-gpu-health"},
                "resumePriorityClass": {"name": f"{name}-resume"},
                "queues": {
                    "enabled": True,
                    "resourceFlavor": {"name": f"{name}-gpu"},
                    "clusterQueue": {"name": name},
                },
            },
            release=name,
            namespace=name,
        )

    first, second = cluster_scoped_names(release("taugrid")), cluster_scoped_names(release("tg2"))
    assert len(first) >= 7
    assert first & second == set()


# ---------------------------------------------------------------------- optional files
@pytest.fixture
def chart_copy(tmp_path: pathlib.Path) -> pathlib.Path:
    """A copy of the chart without files/, so each test decides what files/ holds."""
    dest = tmp_path / "taugrid"
    shutil.copytree(chart.CHART_DIR, dest, ignore=shutil.ignore_patterns("files"))
    return dest


MONITORING = {"prometheusRule": {"enabled": True}, "grafanaDashboard": {"enabled": True}}
ALERT = {"alert": "A", "expr": "up == 0", "annotations": {"summary": "{{ $labels.node }}"}}
RULES = {"groups": [{"name": "g", "rules": [ALERT]}]}


def test_the_monitoring_templates_render_nothing_before_their_files_exist(
    chart_copy: pathlib.Path,
) -> None:
    """Without files/alerts.yaml and files/dashboard.json the chart still renders."""
    docs = chart.template(with_images(MONITORING), chart_dir=chart_copy, api_versions=EVERY_API)
    assert not {"PrometheusRule", "ConfigMap"} & {d["kind"] for d in docs}


@pytest.mark.parametrize(
    "alerts",
    [RULES, {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule", "spec": RULES}],
    ids=["as a rule file", "as a PrometheusRule"],
)
def test_the_monitoring_templates_load_their_files_verbatim(
    chart_copy: pathlib.Path, alerts: dict[str, Any]
) -> None:
    """The rules become the PrometheusRule's spec untouched (Prometheus templates included);
    the dashboard JSON becomes the ConfigMap's data."""
    (chart_copy / "files").mkdir()
    (chart_copy / "files" / "alerts.yaml").write_text(yaml.safe_dump(alerts))
    (chart_copy / "files" / "dashboard.json").write_text('{"title": "TauGrid"}')
    docs = chart.template(with_images(MONITORING), chart_dir=chart_copy, api_versions=EVERY_API)
    assert one(docs, "PrometheusRule")["spec"] == RULES
    assert one(docs, "ConfigMap")["data"] == {"taugrid.json": '{"title": "TauGrid"}'}
    without_api = chart.template(with_images(MONITORING), chart_dir=chart_copy)
    assert not objects(without_api, "PrometheusRule")


@pytest.mark.parametrize(
    ("values", "ttl_s", "keep_kib"),
    [({}, 86400.0, 256), ({"runTtlAfterFinishedS": 7200, "runLogKeepKiB": 512}, 7200.0, 512)],
    ids=["by default a run's logs live a day and 256 KiB of each is kept",
         "both are chart values the controller reads"],
)  # fmt: skip
def test_the_log_lifetimes_are_chart_values(
    values: dict[str, Any], ttl_s: float, keep_kib: int
) -> None:
    """controller.runTtlAfterFinishedS and controller.runLogKeepKiB reach the controller's
    settings through its environment (docs/researcher.md states the defaults)."""
    env = env_of(one(render({"controller": values}), "Deployment"))
    settings = controller_settings.ControllerSettings.model_validate(
        {"run_ttl_after_finished_s": env["TAUGRID_CONTROLLER_RUN_TTL_AFTER_FINISHED_S"],
         "run_log_keep_kib": env["TAUGRID_CONTROLLER_RUN_LOG_KEEP_KIB"]}
    )  # fmt: skip
    assert (settings.run_ttl_after_finished_s, settings.run_log_keep_kib) == (ttl_s, keep_kib)


CA_PEM = "-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n"


def test_the_ca_bundle_is_published_as_a_configmap_every_user_may_read() -> None:
    """tls.caBundle becomes ConfigMap `taugrid-ca` (ca.crt) in the release namespace, and the
    only grant made for it is `get` on that one ConfigMap to every authenticated user."""
    docs = render({"tls": {"caBundle": CA_PEM}})
    cm = one(docs, "ConfigMap", "taugrid-ca")
    role = one(docs, "Role", "taugrid-ca-reader")
    binding = one(docs, "RoleBinding", "taugrid-ca-reader")
    assert (cm["metadata"]["namespace"], cm["data"]) == (NAMESPACE, {"ca.crt": CA_PEM})
    assert role["rules"] == [{"apiGroups": [""], "resources": ["configmaps"],
                              "resourceNames": ["taugrid-ca"], "verbs": ["get"]}]  # fmt: skip
    assert binding["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                                    "name": "system:authenticated"}]  # fmt: skip
    assert binding["roleRef"]["name"] == "taugrid-ca-reader"


def test_without_a_ca_bundle_no_configmap_or_grant_is_made(
    defaults: list[dict[str, Any]],
) -> None:
    """By default nothing about the CA is rendered (GET /ca.crt serves it)."""
    names = {d["metadata"]["name"] for d in defaults}
    assert not {"taugrid-ca", "taugrid-ca-reader"} & names


@pytest.mark.parametrize(
    "bundle",
    [CA_PEM + "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n", "not a pem"],
    ids=["a private key in the bundle fails", "something that is no certificate fails"],
)
def test_a_ca_bundle_that_is_not_just_certificates_fails_the_install(bundle: str) -> None:
    """What every authenticated user could read must never carry a key."""
    with pytest.raises(chart.ChartError, match=r"tls\.caBundle"):
        render({"tls": {"caBundle": bundle}})


RUNBOOKS = "https://git.example.com/org/taugrid/blob/v0.1.0"


@pytest.mark.parametrize(
    ("base", "prefix"),
    [
        ("", "docs/oncall.md#"),
        (RUNBOOKS, f"{RUNBOOKS}/docs/oncall.md#"),
        (RUNBOOKS + "/", f"{RUNBOOKS}/docs/oncall.md#"),
    ],
    ids=["without a base the links stay relative",
         "with a base every runbook link is absolute",
         "a base with a trailing slash makes no double slash"],
)  # fmt: skip
def test_the_alert_runbook_links_use_the_runbook_base_url(base: str, prefix: str) -> None:
    """Each alert of the shipped files/alerts.yaml links its own section of docs/oncall.md,
    under prometheusRule.runbookBaseUrl when it is set (a pager cannot open a relative path);
    Prometheus' own templates in the rules stay untouched."""
    values = {"prometheusRule": {"enabled": True, "runbookBaseUrl": base}}
    rule = one(render(values, api_versions=EVERY_API), "PrometheusRule")
    alerts = [r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r]
    assert alerts
    links = {r["alert"]: r["annotations"]["runbook_url"] for r in alerts}
    assert links == {name: prefix + name.lower() for name in links}
    assert "{{ $labels." in json.dumps(rule["spec"])


@pytest.mark.parametrize("base", ["docs.example.com/taugrid", "/docs", "ftp://x/y"],
                         ids=["no scheme", "a path", "not http"])  # fmt: skip
def test_a_runbook_base_url_that_is_not_absolute_fails_the_install(base: str) -> None:
    """A base that would still give dead links fails the render, naming the value."""
    values = {"prometheusRule": {"enabled": True, "runbookBaseUrl": base}}
    with pytest.raises(chart.ChartError, match=r"prometheusRule\.runbookBaseUrl"):
        render(values, api_versions=EVERY_API)


def test_service_monitors_need_the_prometheus_operator() -> None:
    """serviceMonitor.enabled renders nothing on a cluster without monitoring.coreos.com/v1."""
    assert not objects(render({"serviceMonitor": {"enabled": True}}), "ServiceMonitor")


# ---------------------------------------------------------------------- documentation
def value_paths(tree: dict[str, Any], prefix: str = "") -> Iterator[str]:
    """Dotted paths of every leaf of values.yaml (an empty map is a leaf)."""
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            yield from value_paths(value, f"{path}.")
        else:
            yield path


def test_the_readme_documents_every_value() -> None:
    """Each value in values.yaml has a row in the README's table, and each row is a value
    (a free-form map such as a nodeSelector is documented as one row)."""
    values = yaml.safe_load((chart.CHART_DIR / "values.yaml").read_text())
    readme = (chart.CHART_DIR / "README.md").read_text()
    documented = set(re.findall(r"^\| `([A-Za-z0-9_.]+)` \|", readme, flags=re.MULTILINE))
    leaves = set(value_paths(values))
    undocumented = {
        p for p in leaves if not any(p == d or p.startswith(f"{d}.") for d in documented)
    }
    assert undocumented == set()
    unknown = {d for d in documented if not any(p == d or p.startswith(f"{d}.") for p in leaves)}
    assert unknown == set()


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        pytest.param("", "true", id="an empty selector manages every node"),
        pytest.param("pool=a", '("pool" in L && L["pool"] == "a")', id="equality"),
        pytest.param("pool==a,!spot", '("pool" in L && L["pool"] == "a") && !("spot" in L)',
                     id="double equals and a label that must be absent"),
        pytest.param("zone!=x,gpu", '(!("zone" in L) || L["zone"] != "x") && ("gpu" in L)',
                     id="inequality holds when the label is absent; a bare key must exist"),
        pytest.param("pool in (a, b),tier notin (spot)",
                     '("pool" in L && L["pool"] in ["a","b"]) && '
                     '(!("tier" in L) || !(L["tier"] in ["spot"]))', id="set-based terms"),
    ],
)  # fmt: skip
def test_the_managed_node_selector_becomes_the_policys_managed_node(
    selector: str, expected: str
) -> None:
    """Review 3, finding 2: the admission policy's "a node this release manages" is the
    controller's managedNodeSelector, term by term, and never labelled managed=false."""
    policy = one(render({"controller": {"managedNodeSelector": selector}}),
                 "ValidatingAdmissionPolicy", "taugrid-controller")  # fmt: skip
    (managed,) = [v["expression"] for v in policy["spec"]["variables"]
                  if v["name"] == "managedNode"]  # fmt: skip
    opt_out = 'variables.nodeLabels[?"taugrid.dev/managed"].orValue("").lowerAscii() != "false"'
    assert f"{opt_out} && ({expected})" == managed.replace("variables.nodeLabels", "L").replace(
        "L[?", "variables.nodeLabels[?"
    )


def test_a_selector_term_the_policy_cannot_say_fails_the_install() -> None:
    """A selector the chart cannot translate is refused rather than left unchecked."""
    with pytest.raises(chart.ChartError, match="managedNodeSelector"):
        render({"controller": {"managedNodeSelector": "a=b=c"}})
