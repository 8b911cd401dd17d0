"""A bare control plane (`taugrid dev up --bare`) and the main dev cluster with its real node
(Kueue and KubeRay the chart's pods): no Kueue or KubeRay processes to watch, and the dev-only
policy that tells the release's pods where the API server is."""

from __future__ import annotations

import argparse
import pathlib

import pytest

from devcluster import cli, cluster, node


def test_a_bare_cluster_watches_no_kueue_or_kuberay_process(tmp_path: pathlib.Path) -> None:
    """The marker `up(bare=True)` leaves drops the two operators from the components (so
    `status` and `is_up` do not wait for them); without it every component is there."""
    c = cluster.Cluster(state=tmp_path)
    full = [comp.name for comp in c.components()]
    assert set(cluster.OPERATORS) <= set(full)
    (tmp_path / cluster.BARE_MARKER).touch()
    assert c.bare
    assert [n for n in full if n not in cluster.OPERATORS] == [x.name for x in c.components()]


def test_operators_in_the_chart_are_not_host_processes_to_watch(tmp_path: pathlib.Path) -> None:
    """The main dev cluster whose Kueue and KubeRay are the chart's pods (`up(
    operators_in_chart=True)`) watches the same components as a bare one, and is not bare."""
    c = cluster.Cluster(state=tmp_path)
    (tmp_path / cluster.CHART_OPERATORS_MARKER).touch()
    assert c.operators_in_chart
    assert not c.bare
    assert not {comp.name for comp in c.components()} & set(cluster.OPERATORS)


@pytest.mark.parametrize(
    ("flags", "kueue", "problems", "expected"),
    [
        pytest.param({}, None, [], True, id="the default up: through the chart"),
        pytest.param({"real_node": False}, None, [], False, id="no real node: host processes"),
        pytest.param({}, None, ["not root"], False, id="the real node cannot run: host"),
        pytest.param({"no_taugrid": True}, None, [], False, id="no chart installed: host"),
        pytest.param({"bare": True}, None, [], False, id="bare: the e2e installs them"),
        pytest.param({}, "v0.17.0", [], False, id="another Kueue than the chart's: host"),
    ],
)  # fmt: skip
def test_up_installs_the_operators_through_the_chart_when_their_pods_can_run(
    monkeypatch: pytest.MonkeyPatch,
    flags: dict[str, bool],
    kueue: str | None,
    problems: list[str],
    expected: bool,
) -> None:
    """`taugrid dev up` takes the one install's path (Kueue and KubeRay as the chart's pods)
    exactly when the chart is installed, the real node can run and the Kueue built is the
    chart's; otherwise they stay host processes."""
    if kueue is None:
        monkeypatch.delenv("TAUGRID_KUEUE_VERSION", raising=False)
    else:
        monkeypatch.setenv("TAUGRID_KUEUE_VERSION", kueue)
    monkeypatch.setattr(node, "preflight", lambda _bin: problems)
    args = argparse.Namespace(**{"real_node": True, "no_taugrid": False, "bare": False, **flags})
    assert cli._operators_in_chart(args, pathlib.Path("/nowhere")) is expected


def test_the_api_env_policy_sets_both_variables_on_every_new_pod() -> None:
    """One mutating policy on pod CREATE in the release namespace only (users' pods are left
    as they were made), failing closed, whose patch drops any earlier pair and appends the
    given host and port."""
    policy, binding = cluster.api_env_policy("10.77.0.1", 7043)
    assert policy["spec"]["matchConstraints"]["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": "taugrid-system"}
    }
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rules == [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                      "resources": ["pods"]}]  # fmt: skip
    assert policy["spec"]["failurePolicy"] == "Fail"
    (mutation,) = policy["spec"]["mutations"]
    expression = mutation["jsonPatch"]["expression"]
    assert 'name: "KUBERNETES_SERVICE_HOST", value: "10.77.0.1"' in expression
    assert 'name: "KUBERNETES_SERVICE_PORT", value: "7043"' in expression
    assert ".filter(e, !(e.name in" in expression
    assert binding["kind"] == "MutatingAdmissionPolicyBinding"
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]


def test_the_summary_says_where_kueue_and_kuberay_run(tmp_path: pathlib.Path) -> None:
    """`up` prints what runs where: with the operators in the chart, a line says they are pods
    (no PID of theirs is listed); as host processes, no such line."""
    c = cluster.Cluster(state=tmp_path)
    assert "kueue, kuberay" not in cluster.summary(c)
    (tmp_path / cluster.CHART_OPERATORS_MARKER).touch()
    assert "kueue, kuberay" in cluster.summary(c)
    assert "of the chart in taugrid-system" in cluster.summary(c)
