"""The chart's values.schema.json and its refusal of the unpublished default images, through the
built Helm binary (which validates the schema on install, upgrade, template and lint): every
values file the project itself uses passes, and a typo, a wrong type, a bad enum or a value
out of range fails before anything is rendered, naming the field."""

from __future__ import annotations

import json
import pathlib
import re
import shlex
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from devcluster import build, chart, node, stack
from tests import releasekit
from tests.integration.deploy.test_chart import IMAGES, merged, render, value_paths

pytestmark = pytest.mark.cluster  # needs the built Helm binary, not a running cluster

SCHEMA = json.loads((chart.CHART_DIR / "values.schema.json").read_text())
VALUES = yaml.safe_load((chart.CHART_DIR / "values.yaml").read_text())
PLATFORM_MD = build.REPO / "docs" / "platform.md"


def real_node(tmp: pathlib.Path) -> stack.RealNode:
    """A real node as `taugrid dev up` describes one to the chart."""
    return stack.RealNode(
        name=node.NODE_NAME,
        images={"controller": "docker.io/taugrid/controller:dev-1",
                "agent": "docker.io/taugrid/agent:dev-1"},
        host_ip="198.18.56.1", apiserver_port=6443, controller_port=8080,
        agent_state=tmp / "agent-state", controller_addr=tmp / "controller-addr",
        pod_resources_dir=tmp / "pod-resources", fakenvml_lib=tmp / "fakenvml",
        agents_dir=tmp / "agents", taint_key=node.TAINT_KEY, label=node.NODE_LABEL,
    )  # fmt: skip


# ---------------------------------------------------------------------- the schema itself
def schema_leaves(schema: dict[str, Any], values: Any, prefix: str = "") -> Iterator[str]:
    """Dotted paths the schema closes (objects with additionalProperties false) down to each
    property that is not such an object, or whose default is an empty map (as value_paths
    counts it: `tls.certManager.issuerRef: {}` is one value)."""
    for key, sub in schema.get("properties", {}).items():
        path = f"{prefix}{key}"
        default = values.get(key) if isinstance(values, dict) else None
        if sub.get("additionalProperties") is False and sub.get("properties") and default:
            yield from schema_leaves(sub, default, f"{path}.")
        else:
            yield path


def test_the_schema_is_draft_07_and_closed_at_the_top() -> None:
    """Helm 3 validates JSON Schema draft-07; a misspelt top-level key fails too."""
    assert SCHEMA["$schema"] == "http://json-schema.org/draft-07/schema#"
    assert SCHEMA["additionalProperties"] is False


def test_the_schema_covers_every_value_and_nothing_else() -> None:
    """Each key of values.yaml has a schema entry and each closed entry is a value: a key added
    to values.yaml without one would be refused by the chart's own schema."""
    values = set(value_paths(VALUES))
    described = set(schema_leaves(SCHEMA, VALUES)) - {"global"}
    assert {
        v for v in values if not any(v == d or v.startswith(f"{d}.") for d in described)
    } == set()
    assert {
        d for d in described if not any(v == d or v.startswith(f"{d}.") for v in values)
    } == set()


@pytest.mark.parametrize(
    "path",
    ["commonLabels", "controller.nodeSelector", "controller.tolerations", "controller.resources",
     "controller.extraSettings", "controller.podAnnotations", "agent.extraSettings",
     "agent.resources", "agent.updateStrategy", "queues.clusterQueue.nominalQuota",
     "serviceMonitor.controllerTlsConfig", "tests.nodeSelector"],
)  # fmt: skip
def test_free_form_maps_stay_open(path: str) -> None:
    """Labels, selectors, tolerations, resources and settings passthroughs take any key."""
    sub = SCHEMA
    for key in path.split("."):
        sub = sub["properties"][key]
    assert sub.get("additionalProperties") is not False


# ---------------------------------------------------------------------- values that pass
def test_the_defaults_pass_the_schema() -> None:
    """values.yaml as shipped (with published images, which validate.yaml asks for)."""
    assert render()


def test_lint_passes_the_defaults_with_published_images() -> None:
    """`helm lint --strict` validates values.yaml against the schema too."""
    report = chart.lint(IMAGES)
    assert "[ERROR]" not in report


@pytest.mark.parametrize("with_real_node", [False, True], ids=["KWOK only", "with the real node"])
def test_the_dev_clusters_values_pass(with_real_node: bool, tmp_path: pathlib.Path) -> None:
    """What `taugrid dev up` installs (devcluster.stack.chart_values, written to
    ~/.local/state/taugrid/dev/chart-values.yaml) renders, default images and all: KWOK
    pulls nothing and the real node's images are loaded there (`pullPolicy: Never`)."""
    real = real_node(tmp_path) if with_real_node else None
    values = stack.chart_values(4, real)
    docs = chart.template(values, release=stack.RELEASE, namespace=stack.NAMESPACE)
    assert [d["metadata"]["name"] for d in docs if d["kind"] == "Deployment"] == [
        "taugrid-controller"
    ]


def test_the_running_dev_clusters_values_file_passes() -> None:
    """The file the running dev cluster was installed with, when there is one here."""
    path = pathlib.Path.home() / ".local" / "state" / "taugrid" / "dev" / "chart-values.yaml"
    if not path.exists():
        pytest.skip(f"no dev cluster values at {path}")
    values = yaml.safe_load(path.read_text())
    assert chart.template(values, release=stack.RELEASE, namespace=stack.NAMESPACE)


def test_the_e2e_releases_values_pass() -> None:
    """The values tests/e2e installs its own releases with (tests/releasekit.py)."""
    rel = releasekit.Release("taugrid-e2e-x", "team-x")
    values = rel.values()
    assert chart.template(values, release=rel.name, namespace=rel.namespace)
    ca = merged(
        values,
        {"tls": {"caBundle": "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"}},
    )
    assert chart.template(ca, release=rel.name, namespace=rel.namespace)


def documented_installs() -> list[tuple[list[str], dict[str, Any]]]:
    """Each `helm install` of docs/platform.md: its --set arguments and its -f file, the YAML
    block the docs head with `# values-<name>.yaml`."""
    text = PLATFORM_MD.read_text()
    files: dict[str, dict[str, Any]] = {
        m.group(1): yaml.safe_load(m.group(2))
        for m in re.finditer(r"```yaml\n# (values-[a-z-]+\.yaml)\n(.*?)```", text, flags=re.DOTALL)
    }
    installs: list[tuple[list[str], dict[str, Any]]] = []
    for block in re.findall(r"```sh\n(.*?)```", text, flags=re.DOTALL):
        joined = re.sub(r"\\\n", " ", block)
        for line in joined.splitlines():
            if not line.startswith("helm install taugrid deploy/helm/taugrid"):
                continue
            argv = shlex.split(line.replace("$REGISTRY", "registry.example.com"))
            sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
            values = next((files[argv[i + 1]] for i, a in enumerate(argv) if a == "-f"), {})
            installs.append((sets, values))
    return installs


def test_docs_name_their_values_files() -> None:
    """The parser below finds the docs' installs, the -f ones included."""
    installs = documented_installs()
    assert len(installs) >= 4
    assert sum(1 for _, values in installs if values) >= 2


@pytest.mark.parametrize("index", range(len(documented_installs())))
def test_every_documented_install_passes(index: int, tmp_path: pathlib.Path) -> None:
    """Each install command of docs/platform.md, with its --set values and values file,
    renders on a cluster with Kueue, KubeRay, cert-manager and the Prometheus operator."""
    sets, values = documented_installs()[index]
    file = tmp_path / "values.yaml"
    file.write_text(yaml.safe_dump(values))
    argv = [str(chart.helm_binary()), "template", "taugrid", str(chart.CHART_DIR),
            "-n", "taugrid-system", "--kube-version", build.K8S_VERSION,
            "-f", str(file)]  # fmt: skip
    for api in (*chart.DEV_API_VERSIONS, "cert-manager.io/v1", "monitoring.coreos.com/v1"):
        argv += ["--api-versions", api]
    for pair in sets:
        argv += ["--set", pair]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


# ---------------------------------------------------------------------- values that fail
@pytest.mark.parametrize(
    ("values", "field", "complaint"),
    [
        pytest.param({"controller": {"image": {"repo": "r/c"}}}, "/controller/image",
                     "additional properties 'repo' not allowed", id="a typo in the image"),
        pytest.param({"controler": {"replicas": 2}}, "",
                     "additional properties 'controler' not allowed", id="a typo at the top"),
        pytest.param({"agent": {"kmsg": {"enable": True}}}, "/agent/kmsg",
                     "additional properties 'enable' not allowed", id="a typo deep down"),
        pytest.param({"controller": {"replicas": "2"}}, "/controller/replicas",
                     "got string, want integer", id="a string for a number"),
        pytest.param({"tls": {"enabled": "false"}}, "/tls/enabled",
                     "got string, want boolean", id="a string for a boolean"),
        pytest.param({"controller": {"runNamespaces": "team-a"}}, "/controller/runNamespaces",
                     "got string, want array", id="a string for a list"),
        pytest.param({"prerequisites": {"check": "sometimes"}}, "/prerequisites/check",
                     "value must be one of 'auto', 'always', 'never'", id="a bad check mode"),
        pytest.param({"controller": {"gpuMode": "mig"}}, "/controller/gpuMode",
                     "value must be one of", id="a bad gpu mode"),
        pytest.param({"controller": {"image": {"pullPolicy": "always"}}},
                     "/controller/image/pullPolicy", "value must be one of",
                     id="a bad pull policy"),
        pytest.param({"agent": {"logLevel": "debug"}}, "/agent/logLevel",
                     "value must be one of", id="a log level the agent cannot look up"),
        pytest.param({"controller": {"replicas": 0}}, "/controller/replicas",
                     "minimum: got 0, want 1", id="no replicas"),
        pytest.param({"controller": {"apiWrites": {"perS": 0}}}, "/controller/apiWrites/perS",
                     "exclusiveMinimum", id="a zero rate"),
        pytest.param({"controller": {"runLogKeepKiB": 1024}}, "/controller/runLogKeepKiB",
                     "maximum", id="more kept log than the CRD holds"),
        pytest.param({"agent": {"heartbeatIntervalS": 0.5}}, "/agent/heartbeatIntervalS",
                     "minimum", id="a heartbeat the controller refuses"),
        pytest.param({"controller": {"runNamespaces": ["Team_A"]}},
                     "/controller/runNamespaces/0", "does not match pattern",
                     id="a namespace that is no DNS label"),
        pytest.param({"rbac": {"userRoles": {"create": "yes"}}}, "/rbac/userRoles/create",
                     "got string, want boolean", id="a string for the user roles toggle"),
        pytest.param({"tests": {"timeoutS": 0}}, "/tests/timeoutS", "exclusiveMinimum",
                     id="a zero test timeout"),
    ],
)  # fmt: skip
def test_bad_values_fail_naming_the_field(
    values: dict[str, Any], field: str, complaint: str
) -> None:
    """`helm template` refuses before rendering, and the error says where and what."""
    with pytest.raises(chart.ChartError) as caught:
        render(values)
    message = str(caught.value)
    assert "don't meet the specifications of the schema" in message
    assert re.search(rf"at '{re.escape(field)}'[^\n]*{re.escape(complaint)}", message), message


def test_lint_names_a_typo_too(tmp_path: pathlib.Path) -> None:
    """`helm lint` reports the same schema error for a misspelt key."""
    file = tmp_path / "values.yaml"
    file.write_text(yaml.safe_dump(merged(IMAGES, {"controller": {"image": {"repo": "r/c"}}})))
    done = subprocess.run(
        [str(chart.helm_binary()), "lint", str(chart.CHART_DIR), "--strict",
         "--kube-version", build.K8S_VERSION, "-f", str(file)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode != 0
    assert (
        "[ERROR] values.yaml: - at '/controller/image': additional properties 'repo' not allowed"
        in done.stdout
    )


# ---------------------------------------------------------------------- unpublished images
@pytest.mark.parametrize(
    ("values", "component"),
    [
        pytest.param({}, "controller", id="both defaults: the controller is named first"),
        pytest.param({"controller": IMAGES["controller"]}, "agent", id="the agent's default"),
        pytest.param({"controller": {"image": {"repository": "docker.io/taugrid/controller"}}},
                     "controller", id="the default spelt with docker.io"),
    ],
)  # fmt: skip
def test_the_unpublished_default_images_fail_the_install(
    values: dict[str, Any], component: str
) -> None:
    """The defaults are published nowhere: the render fails and says which values to set."""
    argv = [str(chart.helm_binary()), "template", "taugrid", str(chart.CHART_DIR),
            "-n", "taugrid-system", "--kube-version", build.K8S_VERSION]  # fmt: skip
    with pytest.raises(chart.ChartError) as caught:
        chart._run(argv, values)
    message = str(caught.value)
    assert f"{component}.image.repository is the chart's default" in message
    assert f"set {component}.image.repository=<your registry>/taugrid/{component}" in message
    assert f"{component}.image.pullPolicy=Never" in message


def test_images_loaded_on_every_node_pass_with_pull_policy_never() -> None:
    """`pullPolicy: Never` (nothing is pulled) is the escape for preloaded default images."""
    never = {"image": {"pullPolicy": "Never"}}
    docs = chart.template({"controller": never, "agent": never})
    images = {d["kind"]: d["spec"]["template"]["spec"]["containers"][0]["image"]
              for d in docs if d["kind"] in ("Deployment", "DaemonSet")}  # fmt: skip
    assert images == {"Deployment": "taugrid/controller:0.1.0", "DaemonSet": "taugrid/agent:0.1.0"}
