"""The chart refuses a Kubernetes older than it works on: it always renders a
ValidatingAdmissionPolicy of `admissionregistration.k8s.io/v1`, GA only in 1.30, so on 1.29
the install would fail half-way with "no matches for kind"; `kubeVersion` says so first."""

from __future__ import annotations

import subprocess

import pytest

from devcluster import chart

pytestmark = pytest.mark.cluster  # needs the built Helm binary, not a running cluster


@pytest.mark.parametrize(
    ("kube_version", "accepted"),
    [("1.29.9", False), ("1.30.0", True), ("1.30.2-gke.1", True), ("1.37.2", True)],
    ids=[
        "1.29 is refused before anything is rendered",
        "1.30 is accepted",
        "a vendor's 1.30 pre-release suffix is accepted",
        "the dev cluster's 1.37 is accepted",
    ],
)
def test_the_chart_renders_only_on_kubernetes_1_30_or_newer(
    kube_version: str, accepted: bool
) -> None:
    """`helm template --kube-version V` renders on 1.30 and later and names the requirement
    when it refuses."""
    done = subprocess.run(
        [str(chart.helm_binary(None)), "template", "taugrid", str(chart.CHART_DIR),
         "-n", "taugrid-system", "--kube-version", kube_version,
         # The chart refuses its unpublished default images (test_chart_schema.py).
         "--set", "controller.image.repository=registry.example.com/taugrid/controller",
         "--set", "agent.image.repository=registry.example.com/taugrid/agent"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert (done.returncode == 0) is accepted, done.stderr
    if not accepted:
        assert ">=1.30.0-0" in done.stderr
