"""One install (docs/platform.md): the chart's optional Kueue and KubeRay operator dependencies,
rendered offline by the built Helm binary. Off by default they render nothing; on, the render
holds their controllers, CRDs and webhooks, with the images the values name; the pinned
versions agree with the dev cluster's build."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
import yaml

from devcluster import build, chart, cluster
from devcluster import stack as devstack
from tests.integration.deploy.test_chart import merged, objects, render

pytestmark = pytest.mark.cluster  # needs the built Helm binary and chart dependencies

STACK: dict[str, Any] = {"kueue": {"enabled": True}, "kuberay": {"enabled": True},
                         "queues": {"enabled": True}}  # fmt: skip
BARE: tuple[str, ...] = ()
"""A bare cluster's API versions: neither Kueue's nor KubeRay's."""


def names(docs: list[dict[str, Any]], kind: str) -> set[str]:
    """The names of the rendered objects of one kind."""
    return {d["metadata"]["name"] for d in objects(docs, kind)}


def hooks(doc: dict[str, Any]) -> str:
    """The object's Helm hook annotation ("" when it is an ordinary object)."""
    return str((doc["metadata"].get("annotations") or {}).get("helm.sh/hook", ""))


def image_of(deploy: dict[str, Any]) -> str:
    """The image of a Deployment's first container."""
    return str(deploy["spec"]["template"]["spec"]["containers"][0]["image"])


@pytest.fixture(scope="module")
def stack() -> list[dict[str, Any]]:
    """Kueue, KubeRay and TauGrid rendered together for a bare cluster, CRDs included."""
    return render(STACK, api_versions=BARE, include_crds=True)


def test_off_by_default_nothing_of_kueue_or_kuberay_renders() -> None:
    """The defaults render no CRD, webhook or Deployment but TauGrid's controller."""
    docs = render({}, include_crds=True)
    crds = names(docs, "CustomResourceDefinition")
    assert not {c for c in crds if c.endswith((".kueue.x-k8s.io", ".ray.io"))}
    assert names(docs, "Deployment") == {"taugrid-controller"}
    assert objects(docs, "MutatingWebhookConfiguration") == []
    assert objects(docs, "ValidatingWebhookConfiguration") == []


def test_the_stack_renders_kueue_kuberay_and_taugrid(stack: list[dict[str, Any]]) -> None:
    """Kueue's controller manager and webhooks, the KubeRay operator, both sets of CRDs and
    TauGrid's controller, in the release namespace."""
    assert names(stack, "Deployment") == {
        "taugrid-controller", "taugrid-kueue-controller-manager", "kuberay-operator",
    }  # fmt: skip
    crds = names(stack, "CustomResourceDefinition")
    wanted = {"workloads.kueue.x-k8s.io", "clusterqueues.kueue.x-k8s.io",
              "admissionchecks.kueue.x-k8s.io", "rayjobs.ray.io", "rayclusters.ray.io"}  # fmt: skip
    assert wanted <= crds
    mutating = {w["name"] for d in objects(stack, "MutatingWebhookConfiguration")
                for w in d["webhooks"]}  # fmt: skip
    validating = {w["name"] for d in objects(stack, "ValidatingWebhookConfiguration")
                  for w in d["webhooks"]}  # fmt: skip
    assert {"mjob.kb.io", "mrayjob.kb.io"} <= mutating
    assert {"vjob.kb.io", "vrayjob.kb.io", "vclusterqueue.kb.io"} <= validating
    services = {
        w["clientConfig"]["service"]["namespace"]
        for d in objects(stack, "ValidatingWebhookConfiguration")
        for w in d["webhooks"]
    }
    assert services == {"taugrid-system"}


def test_kueue_runs_only_the_integrations_taugrid_uses(stack: list[dict[str, Any]]) -> None:
    """Kueue's Configuration lists batch/job and the Ray kinds, so its Pod, Deployment and
    StatefulSet webhooks never block the cluster's other workloads (Kueue's chart makes their
    failure policy Ignore for an integration that is off)."""
    config_map = next(d for d in objects(stack, "ConfigMap")
                      if d["metadata"]["name"] == "taugrid-kueue-manager-config")  # fmt: skip
    config = yaml.safe_load(config_map["data"]["controller_manager_config.yaml"])
    assert config["integrations"]["frameworks"] == ["batch/job", "ray.io/rayjob",
                                                    "ray.io/raycluster"]  # fmt: skip
    assert config["internalCertManagement"]["enable"] is True
    policy = {w["name"]: w["failurePolicy"] for d in objects(stack, "MutatingWebhookConfiguration")
              for w in d["webhooks"]}  # fmt: skip
    assert (policy["mjob.kb.io"], policy["mrayjob.kb.io"]) == ("Fail", "Fail")
    assert (policy["mpod.kb.io"], policy["mdeployment.kb.io"]) == ("Ignore", "Ignore")


def test_the_images_are_pinned_and_can_be_overridden(stack: list[dict[str, Any]]) -> None:
    """Released images by default; the dev cluster points both at locally built ones."""
    deploys = {d["metadata"]["name"]: d for d in objects(stack, "Deployment")}
    assert image_of(deploys["taugrid-kueue-controller-manager"]) == (
        f"registry.k8s.io/kueue/kueue:{build.KUEUE_VERSION}"
    )
    assert image_of(deploys["kuberay-operator"]) == (
        f"quay.io/kuberay/operator:{build.KUBERAY_VERSION}"
    )
    local = {"repository": "docker.io/taugrid/kueue", "tag": "dev-1", "pullPolicy": "Never"}
    ray = {"repository": "docker.io/taugrid/kuberay", "tag": "dev-2", "pullPolicy": "Never"}
    values = merged(STACK, {"kueue": {"controllerManager": {"manager": {"image": local}}},
                            "kuberay": {"image": ray}})  # fmt: skip
    docs = {d["metadata"]["name"]: d for d in objects(render(values, api_versions=BARE),
                                                       "Deployment")}  # fmt: skip
    kueue = docs["taugrid-kueue-controller-manager"]["spec"]["template"]["spec"]["containers"][0]
    assert (kueue["image"], kueue["imagePullPolicy"]) == ("docker.io/taugrid/kueue:dev-1", "Never")
    operator = docs["kuberay-operator"]["spec"]["template"]["spec"]["containers"][0]
    assert (operator["image"], operator["imagePullPolicy"]) == (
        "docker.io/taugrid/kuberay:dev-2", "Never",
    )  # fmt: skip


def test_the_kuberay_operator_gets_the_modules_released_rbac(stack: list[dict[str, Any]]) -> None:
    """The operator's ClusterRole is the ray-operator module's config/rbac/role.yaml, bound to
    its ServiceAccount in the release namespace."""
    role = next(d for d in objects(stack, "ClusterRole")
                if d["metadata"]["name"] == "kuberay-operator")  # fmt: skip
    released = build.built_dir() / "assets" / "charts" / "kuberay" / "rbac" / "role.yaml"
    assert role["rules"] == yaml.safe_load(released.read_text())["rules"]
    binding = next(d for d in objects(stack, "ClusterRoleBinding")
                   if d["metadata"]["name"] == "kuberay-operator")  # fmt: skip
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "kuberay-operator",
                                    "namespace": "taugrid-system"}]  # fmt: skip


def test_on_a_bare_cluster_the_prerequisite_check_passes_with_the_dependencies() -> None:
    """`prerequisites.check: always` on a cluster without Kueue or KubeRay fails unless the
    release installs them."""
    checked = {"prerequisites": {"check": "always"}}
    with pytest.raises(chart.ChartError, match=r"needs Kueue"):
        render(checked, api_versions=BARE)
    with pytest.raises(chart.ChartError, match="KubeRay"):
        render(merged(checked, {"kueue": {"enabled": True}}), api_versions=BARE)
    assert render(merged(checked, STACK), api_versions=BARE)


def test_taugrids_kueue_objects_are_post_install_hooks_only_with_kueue(
    stack: list[dict[str, Any]],
) -> None:
    """With Kueue in the release, the AdmissionCheck, priority class and queues wait for it
    (post-install hooks, owned by the release for the first upgrade to adopt); without, they
    are ordinary objects."""
    kinds = ("AdmissionCheck", "WorkloadPriorityClass", "ResourceFlavor", "ClusterQueue",
             "LocalQueue")  # fmt: skip
    for kind in kinds:
        (doc,) = objects(stack, kind)
        assert hooks(doc) == "post-install", kind
        annotations = doc["metadata"]["annotations"]
        assert annotations["meta.helm.sh/release-name"] == "taugrid"
        assert annotations["meta.helm.sh/release-namespace"] == "taugrid-system"
        assert doc["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    plain = render({"queues": {"enabled": True}})
    for kind in kinds:
        (doc,) = objects(plain, kind)
        assert hooks(doc) == "", kind


def test_the_pinned_versions_follow_the_build() -> None:
    """Chart.yaml's dependency versions, the default images and the kuberay-operator chart
    are the versions devcluster/build.py builds (a bump changes them together)."""
    meta = yaml.safe_load((chart.CHART_DIR / "Chart.yaml").read_text())
    deps = {d["name"]: d for d in meta["dependencies"]}
    assert deps["kueue"]["version"] == build.KUEUE_VERSION.removeprefix("v")
    assert deps["kueue"]["condition"] == "kueue.enabled"
    assert deps["kuberay-operator"]["version"] == build.KUBERAY_VERSION.removeprefix("v")
    assert deps["kuberay-operator"]["alias"] == "kuberay"
    assert deps["kuberay-operator"]["condition"] == "kuberay.enabled"
    ray_chart = yaml.safe_load((chart.KUBERAY_CHART_DIR / "Chart.yaml").read_text())
    assert ray_chart["version"] == build.KUBERAY_VERSION.removeprefix("v")
    values = yaml.safe_load((chart.CHART_DIR / "values.yaml").read_text())
    assert values["kueue"]["controllerManager"]["manager"]["image"]["tag"] == build.KUEUE_VERSION
    assert values["kuberay"]["image"]["tag"] == build.KUBERAY_VERSION
    assert values["kueue"]["enabled"] is False
    assert values["kuberay"]["enabled"] is False


def test_the_dependencies_are_assembled_from_the_build_and_not_committed() -> None:
    """`charts/` holds Kueue's chart as its module ships it and the assembled kuberay-operator
    chart; git ignores it."""
    charts = chart.CHART_DIR / "charts"
    kueue = yaml.safe_load((charts / "kueue" / "Chart.yaml").read_text())
    assert kueue["version"] == build.KUEUE_VERSION.removeprefix("v")
    assert sorted(p.name for p in (charts / "kuberay-operator" / "crds").iterdir()) == [
        "ray.io_rayclusters.yaml", "ray.io_rayjobs.yaml", "ray.io_rayservices.yaml",
    ]  # fmt: skip
    ignore = (build.REPO / ".gitignore").read_text().splitlines()
    assert "deploy/helm/taugrid/charts/" in ignore


KUEUE_PLURALS = {"LocalQueue": "localqueues", "ClusterQueue": "clusterqueues",
                 "ResourceFlavor": "resourceflavors", "AdmissionCheck": "admissionchecks",
                 "WorkloadPriorityClass": "workloadpriorityclasses"}  # fmt: skip


def uninstall_hook(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The objects of the pre-delete hook that removes TauGrid's Kueue objects."""
    return [d for d in docs if d["metadata"]["name"] == "taugrid-kueue-uninstall"]


def test_with_kueue_a_pre_delete_hook_removes_exactly_the_charts_kueue_objects(
    stack: list[dict[str, Any]],
) -> None:
    """The hook Job's targets are the Kueue objects the chart renders, no more, and its
    ServiceAccount may get and delete exactly those (by name), nothing else; all of it is a
    pre-delete hook, the RBAC made before the Job and every piece removed once it succeeded."""
    made = {
        (KUEUE_PLURALS[d["kind"]], d["metadata"].get("namespace", ""), d["metadata"]["name"])
        for kind in KUEUE_PLURALS
        for d in objects(stack, kind)
    }
    assert len(made) == len(KUEUE_PLURALS)
    hook_docs = uninstall_hook(stack)
    assert {d["kind"] for d in hook_docs} == {
        "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Job",
    }  # fmt: skip
    for doc in hook_docs:
        annotations = doc["metadata"]["annotations"]
        assert hooks(doc) == "pre-delete", doc["kind"]
        assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
        weight = int(annotations["helm.sh/hook-weight"])
        assert weight == 0 if doc["kind"] == "Job" else weight < 0, doc["kind"]
    (job,) = objects(hook_docs, "Job")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["python", "-m", "controller.kube.uninstall"]
    targets = set()
    for arg in container["args"][1:]:
        kind, *rest = arg.split("/")
        targets.add((kind, rest[0] if len(rest) == 2 else "", rest[-1]))
    assert container["args"][0] == "--timeout-s=120"
    assert targets == made
    granted = set()
    for role in [*objects(hook_docs, "ClusterRole"), *objects(hook_docs, "Role")]:
        for rule in role["rules"]:
            assert rule["apiGroups"] == ["kueue.x-k8s.io"]
            assert sorted(rule["verbs"]) == ["delete", "get"]
            for resource in rule["resources"]:
                for name in rule["resourceNames"]:
                    granted.add((resource, role["metadata"].get("namespace", ""), name))
    assert granted == made


def test_the_uninstall_hook_runs_where_the_controller_runs() -> None:
    """The controller's image, node selector, tolerations and extra environment (how its pods
    reach the API server on the dev cluster's real node)."""
    where = {"nodeSelector": {"pool": "system"},
             "tolerations": [{"key": "system", "operator": "Exists"}],
             "extraEnv": [{"name": "KUBERNETES_SERVICE_HOST", "value": "10.0.0.1"}],
             "image": {"repository": "example.org/tg", "tag": "v9"}}  # fmt: skip
    docs = render(merged(STACK, {"controller": where, "kueueUninstall": {"timeoutS": 30}}))
    (job,) = objects(uninstall_hook(docs), "Job")
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == where["nodeSelector"]
    assert pod["tolerations"] == where["tolerations"]
    (container,) = pod["containers"]
    assert container["image"] == "example.org/tg:v9"
    assert container["env"] == where["extraEnv"]
    assert container["args"][0] == "--timeout-s=30"
    assert job["spec"]["activeDeadlineSeconds"] > 30


def test_without_kueue_in_the_release_there_is_no_uninstall_hook() -> None:
    """Kueue of the cluster outlives the release: Helm deletes the objects, Kueue lets go."""
    assert uninstall_hook(render({"queues": {"enabled": True}})) == []


REAL = devstack.RealNode(
    name="real-node", images={"controller": "docker.io/taugrid/controller:dev-c",
                              "agent": "docker.io/taugrid/agent:dev-a",
                              "kueue": "docker.io/taugrid/kueue:dev-k",
                              "kuberay": "docker.io/taugrid/kuberay:dev-r"},
    host_ip="198.18.0.1", apiserver_port=6443, controller_port=8080,
    agent_state=pathlib.Path("/s/agents"), controller_addr=pathlib.Path("/s/addr"),
    pod_resources_dir=pathlib.Path("/s/pr"), fakenvml_lib=pathlib.Path("/s/lib"),
    agents_dir=pathlib.Path("/s/agents"), taint_key="taugrid.dev/real-node",
    label="taugrid.dev/real-node",
)  # fmt: skip
"""A dev cluster's real node as `stack.RealNode` describes it to the chart."""


def test_the_main_dev_cluster_installs_kueue_and_kuberay_through_the_chart() -> None:
    """`taugrid dev up` with its real node (`stack.chart_values(..., operators=True)`): Kueue
    and KubeRay are the chart's pods there, Kueue configured as the dev cluster needs (the DRA
    gate and class mapping, the pods-ready timeout, TauGrid's three integrations) over the
    chart's own configuration, and the dev queue waits on TauGrid's AdmissionCheck. Without
    `operators` (the host-process fallback) nothing of Kueue or KubeRay renders."""
    docs = chart.template(devstack.chart_values(4, REAL, operators=True), api_versions=BARE)
    deployments = {d["metadata"]["name"]: d["spec"]["template"]["spec"]
                   for d in objects(docs, "Deployment")}  # fmt: skip
    assert set(deployments) == {"taugrid-controller", "taugrid-kueue-controller-manager",
                                "kuberay-operator"}  # fmt: skip
    assert set(devstack.OPERATOR_DEPLOYMENTS.values()) < set(deployments)
    for pod in deployments.values():
        assert pod["nodeSelector"]["taugrid.dev/real-node"] == "true"
    (config,) = [d for d in objects(docs, "ConfigMap") if "controller_manager_config.yaml"
                 in (d.get("data") or {})]  # fmt: skip
    cfg = yaml.safe_load(config["data"]["controller_manager_config.yaml"])
    assert cfg["featureGates"]["KueueDRAIntegration"] is True
    assert cfg["resources"]["deviceClassMappings"] == [
        {"name": "nvidia.com/gpu", "deviceClassNames": ["gpu.nvidia.com"]}
    ]
    assert cfg["waitForPodsReady"]["timeout"] == f"{cluster.PODS_READY_TIMEOUT_S}s"
    assert cfg["integrations"]["frameworks"] == ["batch/job", "ray.io/rayjob",
                                                 "ray.io/raycluster"]  # fmt: skip
    assert cfg["manageJobsWithoutQueueName"] is False
    assert cfg["webhook"] == {"port": 9443}  # the chart's own, kept
    (cq,) = objects(docs, "ClusterQueue")
    assert cq["spec"]["admissionChecksStrategy"]["admissionChecks"] == [
        {"name": cluster.ADMISSION_CHECK}
    ]
    assert hooks(cq) == "post-install"  # made once Kueue answers (the install waits)

    host = chart.template(devstack.chart_values(4, REAL), api_versions=BARE)
    assert names(host, "Deployment") == {"taugrid-controller"}
    assert objects(host, "ValidatingWebhookConfiguration") == []


def test_the_dev_one_install_runs_the_operators_on_the_real_node_in_its_images() -> None:
    """`stack.one_install_values` (the e2e's values): Kueue's and KubeRay's controllers in the
    images `taugrid dev up --bare` imported, never pulled, on the real node (tolerating its
    taint); TauGrid manages that node alone; the queue does not wait on the check."""
    docs = chart.template(devstack.one_install_values(4, REAL), api_versions=BARE)
    deployments = {d["metadata"]["name"]: d["spec"]["template"]["spec"]
                   for d in objects(docs, "Deployment")}  # fmt: skip
    for name, image in [("taugrid-kueue-controller-manager", "docker.io/taugrid/kueue:dev-k"),
                        ("kuberay-operator", "docker.io/taugrid/kuberay:dev-r"),
                        ("taugrid-controller", "docker.io/taugrid/controller:dev-c")]:  # fmt: skip
        pod = deployments[name]
        assert pod["containers"][0]["image"] == image, name
        assert pod["containers"][0]["imagePullPolicy"] == "Never", name
        assert pod["nodeSelector"]["taugrid.dev/real-node"] == "true", name
        assert {"key": "taugrid.dev/real-node", "operator": "Exists",
                "effect": "NoSchedule"} in pod["tolerations"], name  # fmt: skip
    (agents,) = objects(docs, "DaemonSet")
    assert agents["spec"]["template"]["spec"]["nodeSelector"]["taugrid.dev/real-node"] == "true"
    (cq,) = objects(docs, "ClusterQueue")
    assert "admissionChecksStrategy" not in cq["spec"]
    (job,) = objects(uninstall_hook(docs), "Job")
    assert job["spec"]["template"]["spec"]["nodeSelector"]["taugrid.dev/real-node"] == "true"
