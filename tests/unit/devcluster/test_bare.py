"""A bare control plane (`taugrid dev up --bare`): no Kueue or KubeRay processes to watch,
and the dev-only policy that tells pods of the real node where the API server is."""

from __future__ import annotations

import pathlib

from devcluster import cluster


def test_a_bare_cluster_watches_no_kueue_or_kuberay_process(tmp_path: pathlib.Path) -> None:
    """The marker `up(bare=True)` leaves drops the two operators from the components (so
    `status` and `is_up` do not wait for them); without it every component is there."""
    c = cluster.Cluster(state=tmp_path)
    full = [comp.name for comp in c.components()]
    assert set(cluster.OPERATORS) <= set(full)
    (tmp_path / cluster.BARE_MARKER).touch()
    assert c.bare
    assert [n for n in full if n not in cluster.OPERATORS] == [x.name for x in c.components()]


def test_the_api_env_policy_sets_both_variables_on_every_new_pod() -> None:
    """One mutating policy on pod CREATE, failing closed, bound cluster-wide, whose patch
    drops any earlier pair and appends the given host and port."""
    policy, binding = cluster.api_env_policy("10.77.0.1", 7043)
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
