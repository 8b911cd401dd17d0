"""Render, install and uninstall TauGrid's Helm chart (`deploy/helm/taugrid`) from Python.

Everything goes through the Helm binary the control-plane build puts in the cache
(`build.built_dir() / "bin" / "helm"`), so the tests, the dev cluster and a person at a shell
use one Helm version. Values travel as a YAML file, never as `--set` strings, so a value is
passed with its type (a string "true" stays a string).
"""

from __future__ import annotations

import pathlib
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from devcluster import build

CHART_DIR = build.REPO / "deploy" / "helm" / "taugrid"

DEV_API_VERSIONS = (
    "kueue.x-k8s.io/v1beta2",
    "ray.io/v1",
)
"""API versions the dev cluster serves beyond Kubernetes' own: what `template` tells Helm the
cluster has, since offline rendering cannot ask (the chart's prerequisite check reads them)."""


class ChartError(Exception):
    """Helm refused to render, install or uninstall the chart; the message carries its stderr."""


def helm_binary(bin_dir: pathlib.Path | None = None) -> pathlib.Path:
    """Return the built Helm binary (raises `build.BuildError` when the cache lacks it)."""
    return (bin_dir or build.built_dir() / "bin") / "helm"


def _run(
    argv: Sequence[str], values: Mapping[str, Any] | None = None, *, timeout_s: float | None = None
) -> str:
    """Run Helm (values, if any, in a temporary file); return stdout or raise ChartError."""
    with tempfile.TemporaryDirectory(prefix="taugrid-helm-") as tmp:
        extra: list[str] = []
        if values is not None:
            path = pathlib.Path(tmp) / "values.yaml"
            path.write_text(yaml.safe_dump(dict(values), sort_keys=False))
            extra = ["--values", str(path)]
        try:
            proc = subprocess.run(
                [*argv, *extra], capture_output=True, text=True, check=False, timeout=timeout_s
            )
        except subprocess.TimeoutExpired as err:
            msg = f"helm {argv[1]} did not finish within {timeout_s:.0f}s"
            raise ChartError(msg) from err
    if proc.returncode != 0:
        msg = f"helm {argv[1]} failed: {proc.stderr.strip() or proc.stdout.strip()}"
        raise ChartError(msg)
    return proc.stdout


def template(
    values: Mapping[str, Any],
    *,
    release: str = "taugrid",
    namespace: str = "taugrid-system",
    api_versions: Sequence[str] = DEV_API_VERSIONS,
    include_crds: bool = False,
    chart_dir: pathlib.Path = CHART_DIR,
    bin_dir: pathlib.Path | None = None,
) -> list[dict[str, Any]]:
    """Render the chart offline and return its objects (empty documents dropped).

    `api_versions` stands in for the cluster's discovery: optional templates gated on an API
    (ServiceMonitor, PrometheusRule) render only when it is listed. The Kubernetes version is
    the dev cluster's: offline, Helm would assume v1.20, which the chart's `kubeVersion`
    refuses.
    """
    argv = [str(helm_binary(bin_dir)), "template", release, str(chart_dir), "-n", namespace,
            "--kube-version", build.K8S_VERSION]  # fmt: skip
    for version in api_versions:
        argv += ["--api-versions", version]
    if include_crds:
        argv.append("--include-crds")
    out = _run(argv, values)
    return [doc for doc in yaml.safe_load_all(out) if doc]


def lint(
    values: Mapping[str, Any],
    *,
    chart_dir: pathlib.Path = CHART_DIR,
    bin_dir: pathlib.Path | None = None,
) -> str:
    """Lint the chart strictly (warnings fail); return Helm's report."""
    argv = [str(helm_binary(bin_dir)), "lint", str(chart_dir), "--strict",
            "--kube-version", build.K8S_VERSION]  # fmt: skip
    return _run(argv, values)


def install(
    kubeconfig: pathlib.Path,
    release: str,
    namespace: str,
    values: Mapping[str, Any],
    *,
    wait: bool = False,
    timeout_s: float = 300.0,
    skip_crds: bool = False,
    create_namespace: bool = False,
    bin_dir: pathlib.Path | None = None,
) -> None:
    """Install the chart as `release`, or upgrade it when that release exists already.

    `helm upgrade --install` makes a second call with the same release converge instead of
    failing, which is what `taugrid dev up` after an interrupted one needs. `wait` waits for
    the Deployment and DaemonSet to be ready, for at most `timeout_s`.
    """
    argv = [
        str(helm_binary(bin_dir)), "upgrade", release, str(CHART_DIR), "--install",
        "--kubeconfig", str(kubeconfig), "-n", namespace, f"--timeout={int(timeout_s)}s",
    ]  # fmt: skip
    if wait:
        argv.append("--wait")
    if skip_crds:
        argv.append("--skip-crds")
    if create_namespace:
        argv.append("--create-namespace")
    _run(argv, values, timeout_s=timeout_s + 60)


def uninstall(
    kubeconfig: pathlib.Path,
    release: str,
    namespace: str,
    *,
    wait: bool = False,
    timeout_s: float = 300.0,
    bin_dir: pathlib.Path | None = None,
) -> None:
    """Uninstall a release; a release that is not there is not an error.

    Helm keeps the CRDs (it never deletes what `crds/` installed), so TauRuns survive.
    """
    argv = [
        str(helm_binary(bin_dir)), "uninstall", release, "--ignore-not-found",
        "--kubeconfig", str(kubeconfig), "-n", namespace, f"--timeout={int(timeout_s)}s",
    ]  # fmt: skip
    if wait:
        argv.append("--wait")
    _run(argv, timeout_s=timeout_s + 60)
