"""`helm test`'s pod (templates/tests/controller-test.yaml), rendered by the built Helm binary:
its least-privilege hook RBAC, where it runs and what it trusts; then its script, taken from
the rendered pod and run against a stand-in controller and a stand-in API server over TLS, so
each verdict it can give is seen. tests/e2e/test_helm_test.py runs it on the dev cluster."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import pathlib
import shutil
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from devcluster import chart, pki, stack
from tests.integration.deploy.test_chart import (
    NAMESPACE,
    hook,
    objects,
    one,
    render,
    with_images,
)
from tests.integration.deploy.test_chart_schema import real_node

pytestmark = pytest.mark.cluster  # needs the built Helm binary, not a running cluster

CHECK = "taugrid-gpu-health"


def hooks_of(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The hook objects of `helm test`, by kind."""
    found = {d["kind"]: d for d in docs if hook(d)}
    assert len(found) == len([d for d in docs if hook(d)]), "one hook object per kind"
    return found


def pod_env(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0]["env"]}


# ---------------------------------------------------------------------- rendering
def test_helm_test_is_a_pod_with_its_own_account_that_may_get_only_the_admission_check() -> None:
    """A ServiceAccount, a ClusterRole granting `get` on the release's AdmissionCheck alone,
    its binding and the pod, all `helm.sh/hook: test`; the RBAC goes once the test passed,
    the pod stays for `helm test --logs`."""
    found = hooks_of(render())
    assert sorted(found) == ["ClusterRole", "ClusterRoleBinding", "Pod", "ServiceAccount"]
    assert {d["metadata"]["annotations"]["helm.sh/hook"] for d in found.values()} == {"test"}
    role = found["ClusterRole"]
    assert role["rules"] == [{"apiGroups": ["kueue.x-k8s.io"], "resources": ["admissionchecks"],
                              "resourceNames": [CHECK], "verbs": ["get"]}]  # fmt: skip
    binding = found["ClusterRoleBinding"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "taugrid-test",
                                    "namespace": NAMESPACE}]  # fmt: skip
    pod = found["Pod"]
    assert pod["spec"]["serviceAccountName"] == "taugrid-test"
    policies = {k: d["metadata"]["annotations"]["helm.sh/hook-delete-policy"]
                for k, d in found.items()}  # fmt: skip
    assert policies == {"ServiceAccount": "before-hook-creation,hook-succeeded",
                        "ClusterRole": "before-hook-creation,hook-succeeded",
                        "ClusterRoleBinding": "before-hook-creation,hook-succeeded",
                        "Pod": "before-hook-creation"}  # fmt: skip


def test_the_rbac_of_the_test_names_the_configured_check() -> None:
    rules = hooks_of(render({"admissionCheck": {"name": "other-check"}}))["ClusterRole"]["rules"]
    assert rules[0]["resourceNames"] == ["other-check"]


def test_the_test_pod_runs_the_controllers_image_unprivileged_and_trusts_its_ca() -> None:
    """The controller's image (no other to pull), non-root, read-only, no capability; with TLS
    it reaches the controller Service over https and trusts only the CA key of the Secret the
    agents trust (never tls.key)."""
    docs = render()
    pod = hooks_of(docs)["Pod"]
    container = pod["spec"]["containers"][0]
    deploy = one(docs, "Deployment")
    assert container["image"] == deploy["spec"]["template"]["spec"]["containers"][0]["image"]
    assert container["command"] == ["python3", "-c"]
    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"] == {"allowPrivilegeEscalation": False,
                                            "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}}  # fmt: skip
    env = pod_env(pod)
    assert (
        env["TAUGRID_TEST_URL"]
        == "https://taugrid-controller.taugrid-system.svc.cluster.local:8080"
    )
    assert env["TAUGRID_TEST_ADMISSION_CHECK"] == CHECK
    assert env["TAUGRID_TEST_CA_FILE"] == "/etc/taugrid/controller-ca/ca.crt"
    [volume] = pod["spec"]["volumes"]
    assert volume["secret"] == {"secretName": "taugrid-controller-tls",
                                "items": [{"key": "ca.crt", "path": "ca.crt"}]}  # fmt: skip


def test_without_tls_the_test_pod_uses_http_and_mounts_nothing() -> None:
    pod = hooks_of(render({"tls": {"enabled": False}}))["Pod"]
    env = pod_env(pod)
    assert env["TAUGRID_TEST_URL"].startswith("http://taugrid-controller.")
    assert "TAUGRID_TEST_CA_FILE" not in env
    assert "volumes" not in pod["spec"]


@pytest.mark.parametrize(
    ("values", "url"),
    [
        ({"controller": {"runControllerUrl": "https://tg.example.com"}}, "https://tg.example.com"),
        ({"controller": {"runControllerUrl": "https://tg.example.com"},
          "tests": {"controllerUrl": "https://x.example.com:8443"}}, "https://x.example.com:8443"),
    ],
    ids=["the run pods' URL by default", "tests.controllerUrl first"],
)  # fmt: skip
def test_the_test_pod_reaches_the_controller_where_run_pods_do(
    values: dict[str, Any], url: str
) -> None:
    assert pod_env(hooks_of(render(values))["Pod"])["TAUGRID_TEST_URL"] == url


def test_the_test_pod_runs_where_the_controller_runs_unless_told() -> None:
    """Empty tests.nodeSelector/tolerations/extraEnv take the controller's; set ones win."""
    controller = {"nodeSelector": {"pool": "system"},
                  "tolerations": [{"key": "dedicated", "operator": "Exists"}],
                  "extraEnv": [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}]}  # fmt: skip
    inherited = hooks_of(render({"controller": controller}))["Pod"]
    assert inherited["spec"]["nodeSelector"] == {"pool": "system"}
    assert inherited["spec"]["tolerations"] == controller["tolerations"]
    assert pod_env(inherited)["HTTPS_PROXY"] == "http://proxy:3128"
    own = {"nodeSelector": {"pool": "tests"}, "tolerations": [{"key": "t", "operator": "Exists"}],
           "extraEnv": [{"name": "X", "value": "1"}]}  # fmt: skip
    told = hooks_of(render({"controller": controller, "tests": own}))["Pod"]
    assert told["spec"]["nodeSelector"] == {"pool": "tests"}
    assert told["spec"]["tolerations"] == own["tolerations"]
    assert "HTTPS_PROXY" not in pod_env(told)
    assert pod_env(told)["X"] == "1"


def test_on_the_dev_cluster_the_test_pod_lands_on_the_real_node(tmp_path: pathlib.Path) -> None:
    """KWOK nodes run no container: with the dev cluster's values the pod is pinned to the
    real node (its label, its taint tolerated), reaches the controller through the relay
    and the API server at the node's host address, like the controller pod there."""
    real = real_node(tmp_path)
    docs = render(stack.chart_values(4, real), release=stack.RELEASE, namespace=stack.NAMESPACE)
    pod = hooks_of(docs)["Pod"]
    assert pod["spec"]["nodeSelector"][real.label] == "true"
    assert {"key": real.taint_key, "operator": "Exists", "effect": "NoSchedule"} in pod["spec"][
        "tolerations"
    ]
    env = pod_env(pod)
    assert env["TAUGRID_TEST_URL"] == real.controller_url
    assert env["KUBERNETES_SERVICE_HOST"] == real.host_ip
    assert pod["spec"]["containers"][0]["imagePullPolicy"] == "Never"


def test_helm_test_objects_are_not_part_of_the_installed_release() -> None:
    """Only hooks: an install or upgrade creates none of them."""
    docs = render()
    names = {d["metadata"]["name"] for d in objects(docs, "Pod")}
    assert names == {"taugrid-test"}
    assert all(hook(d) for d in docs if d["metadata"]["name"] == "taugrid-test")


# ---------------------------------------------------------------------- the script
class Stub:
    """A stand-in HTTPS server answering each path with a (status, JSON body) from `answers`,
    and recording what it was asked."""

    def __init__(self, pki_dir: pathlib.Path, answers: dict[str, tuple[int, Any]]) -> None:
        self.answers = answers
        self.asked: list[tuple[str, str | None]] = []
        stub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                stub.asked.append((self.path, self.headers.get("Authorization")))
                status, body = stub.answers.get(self.path, (404, {"reason": "NotFound"}))
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(pki_dir / "serving.crt", pki_dir / "serving.key")
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]

    @contextlib.contextmanager
    def running(self) -> Iterator[Stub]:
        thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self.server.shutdown()
            self.server.server_close()


@pytest.fixture(scope="module")
def script() -> str:
    """The script as the rendered pod runs it."""
    pod = hooks_of(render())["Pod"]
    return str(pod["spec"]["containers"][0]["args"][0])


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A CA and a serving certificate for 127.0.0.1 (the dev cluster's PKI code)."""
    return pki.ensure(tmp_path_factory.mktemp("pki"))


def active(status: str, reason: str = "Ready") -> dict[str, Any]:
    return {"status": {"conditions": [{"type": "Active", "status": status, "reason": reason,
                                       "message": f"the check is {reason}"}]}}  # fmt: skip


CHECK_PATH = f"/apis/kueue.x-k8s.io/v1beta2/admissionchecks/{CHECK}"


def run_script(
    script: str,
    certs: pathlib.Path,
    tmp: pathlib.Path,
    controller: Stub,
    api: Stub,
    *,
    ca_file: pathlib.Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run it as the pod would, with the stand-ins for the controller and the API server."""
    sa = tmp / "sa"
    sa.mkdir(exist_ok=True)
    (sa / "token").write_text("test-sa-token\n")
    (sa / "ca.crt").write_bytes((certs / "ca.crt").read_bytes())
    env = {
        "PATH": os.environ.get("PATH", ""),
        "TAUGRID_TEST_URL": f"https://127.0.0.1:{controller.port}",
        "TAUGRID_TEST_CA_FILE": str(ca_file or certs / "ca.crt"),
        "TAUGRID_TEST_ADMISSION_CHECK": CHECK,
        "TAUGRID_TEST_TIMEOUT_S": "0",
        "TAUGRID_TEST_SA_DIR": str(sa),
        "KUBERNETES_SERVICE_HOST": "127.0.0.1",
        "KUBERNETES_SERVICE_PORT": str(api.port),
    }
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, check=False, timeout=60)  # fmt: skip


def test_the_script_passes_when_the_controller_is_ready_and_the_check_active(
    script: str, certs: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    """Both checks pass: exit 0; the API server was asked for that one AdmissionCheck with
    the pod's ServiceAccount token."""
    controller = Stub(certs, {"/readyz": (200, {"ready": True})})
    api = Stub(certs, {CHECK_PATH: (200, active("True"))})
    with controller.running(), api.running():
        done = run_script(script, certs, tmp_path, controller, api)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASS: AdmissionCheck taugrid-gpu-health is Active" in done.stdout
    assert controller.asked == [("/readyz", None)]
    assert api.asked == [(CHECK_PATH, "Bearer test-sa-token")]


def test_the_script_fails_naming_the_checks_condition_when_it_is_not_active(
    script: str, certs: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    controller = Stub(certs, {"/readyz": (200, {"ready": True})})
    api = Stub(certs, {CHECK_PATH: (200, active("False", "ControllerDown"))})
    with controller.running(), api.running():
        done = run_script(script, certs, tmp_path, controller, api)
    assert done.returncode == 1
    assert "FAIL: AdmissionCheck taugrid-gpu-health is Active" in done.stdout
    assert "condition Active is False (ControllerDown" in done.stdout


def test_the_script_fails_when_its_account_may_not_read_the_check(
    script: str, certs: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    controller = Stub(certs, {"/readyz": (200, {"ready": True})})
    api = Stub(certs, {CHECK_PATH: (403, {"reason": "Forbidden"})})
    with controller.running(), api.running():
        done = run_script(script, certs, tmp_path, controller, api)
    assert done.returncode == 1
    assert "HTTP 403" in done.stdout


def test_the_script_fails_while_the_controller_is_not_ready_and_asks_no_further(
    script: str, certs: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    controller = Stub(certs, {"/readyz": (503, {"ready": False})})
    api = Stub(certs, {CHECK_PATH: (200, active("True"))})
    with controller.running(), api.running():
        done = run_script(script, certs, tmp_path, controller, api)
    assert done.returncode == 1
    assert "/readyz answers 200: HTTP 503" in done.stdout
    assert api.asked == []


def test_the_script_verifies_the_controllers_certificate(
    script: str, certs: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    """A CA that did not issue the controller's certificate fails the test (TLS is checked,
    not skipped)."""
    other = pki.ensure(tmp_path / "other-pki")
    controller = Stub(certs, {"/readyz": (200, {"ready": True})})
    api = Stub(certs, {CHECK_PATH: (200, active("True"))})
    with controller.running(), api.running():
        done = run_script(script, certs, tmp_path, controller, api, ca_file=other / "ca.crt")
    assert done.returncode == 1
    assert "CERTIFICATE_VERIFY_FAILED" in done.stdout
    assert controller.asked == []


def test_an_upgrade_reusing_an_older_releases_values_still_renders(
    tmp_path: pathlib.Path,
) -> None:
    """`helm upgrade --reuse-values` (docs/platform.md, "Upgrades") replaces the chart's
    defaults with the old release's values, which have no `rbac` or `tests` map: the chart
    renders as if they were defaults (no user roles, the test's own timeout)."""
    copy = tmp_path / "taugrid"
    shutil.copytree(chart.CHART_DIR, copy)
    values = yaml.safe_load((copy / "values.yaml").read_text())
    del values["rbac"], values["tests"]
    (copy / "values.yaml").write_text(yaml.safe_dump(values))
    docs = chart.template(with_images({}), chart_dir=copy, release="taugrid", namespace=NAMESPACE)
    assert not [
        d for d in docs if d["metadata"]["name"] in ("taugrid-researcher", "taugrid-oncall")
    ]
    assert pod_env(hooks_of(docs)["Pod"])["TAUGRID_TEST_TIMEOUT_S"] == "120"
