"""Render, install and uninstall TauGrid's Helm chart (`deploy/helm/taugrid`) from Python.

Everything goes through the Helm binary the control-plane build puts in the cache
(`build.built_dir() / "bin" / "helm"`), so the tests, the dev cluster and a person at a shell
use one Helm version. Values travel as a YAML file, never as `--set` strings, so a value is
passed with its type (a string "true" stays a string).
"""

from __future__ import annotations

import hashlib
import pathlib
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from devcluster import build

CHART_DIR = build.REPO / "deploy" / "helm" / "taugrid"
KUBERAY_CHART_DIR = build.REPO / "deploy" / "helm" / "kuberay-operator"
"""TauGrid's stand-in for the upstream kuberay-operator chart: its templates render the
ray-operator module's released manifests, which `assemble_dependencies` puts beside them."""
DEPENDENCIES = ("kueue", "kuberay-operator")
"""The chart's dependencies (Chart.yaml), as directories under its `charts/` (gitignored)."""
MARKER = ".taugrid-assembled"

DEV_API_VERSIONS = (
    "kueue.x-k8s.io/v1beta2",
    "ray.io/v1",
)
"""API versions the dev cluster serves beyond Kubernetes' own: what `template` tells Helm the
cluster has, since offline rendering cannot ask (the chart's prerequisite check reads them)."""


class ChartError(Exception):
    """Helm refused to render, install or uninstall the chart; the message carries its stderr."""


def _tree_digest(*roots: pathlib.Path) -> str:
    h = hashlib.sha256()
    for root in roots:
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            h.update(path.relative_to(root).as_posix().encode() + b"\0")
            h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()[:16]


def assemble_dependencies(
    assets: pathlib.Path | None = None, chart_dir: pathlib.Path = CHART_DIR
) -> pathlib.Path:
    """Put the chart's dependencies into `chart_dir/charts/` from the build's assets: Kueue's
    chart as its Go module ships it, and the kuberay-operator chart made of our templates
    (`KUBERAY_CHART_DIR`) with the ray-operator module's CRDs (`crds/`) and RBAC manifests
    (`files/rbac/`). Nothing is rewritten when the marker records the same inputs; return the
    `charts/` directory. Raises ChartError when the build has not made the assets."""
    assets = assets if assets is not None else build.built_dir() / "assets"
    src = assets / "charts"
    if not (src / "kueue" / "Chart.yaml").exists() or not (src / "kuberay" / "crds").is_dir():
        msg = f"the chart's dependencies are not built ({src}): run `taugrid dev build`"
        raise ChartError(msg)
    charts = chart_dir / "charts"
    digest = _tree_digest(src, KUBERAY_CHART_DIR)
    marker = charts / MARKER
    if marker.exists() and marker.read_text().strip() == digest:
        return charts
    tmp = chart_dir / ".charts.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src / "kueue", tmp / "kueue")
    ray = tmp / "kuberay-operator"
    shutil.copytree(KUBERAY_CHART_DIR, ray)
    shutil.copytree(src / "kuberay" / "crds", ray / "crds")
    shutil.copytree(src / "kuberay" / "rbac", ray / "files" / "rbac")
    (tmp / MARKER).write_text(digest + "\n")
    shutil.rmtree(charts, ignore_errors=True)
    tmp.rename(charts)
    return charts


def ensure_dependencies(
    chart_dir: pathlib.Path = CHART_DIR, bin_dir: pathlib.Path | None = None
) -> None:
    """Assemble the dependencies of a chart directory from the build that `bin_dir` belongs
    to (default: this checkout's), unless its `charts/` holds them already (a copy made by
    `helm dependency build` is left alone)."""
    charts = chart_dir / "charts"
    if not (charts / MARKER).exists() and all(_present(charts, d) for d in DEPENDENCIES):
        return
    assets = bin_dir.parent / "assets" if bin_dir is not None else None
    assemble_dependencies(assets, chart_dir)


def _present(charts: pathlib.Path, name: str) -> bool:
    return (charts / name / "Chart.yaml").exists() or any(charts.glob(f"{name}-*.tgz"))


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
    ensure_dependencies(chart_dir, bin_dir)
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
    ensure_dependencies(chart_dir, bin_dir)
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
    ensure_dependencies(CHART_DIR, bin_dir)
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
