"""The chart's optional roles for people (rbac.userRoles.create, templates/rbac-users.yaml),
rendered by the built Helm binary: the rules are the ones docs/platform.md documents (parsed
from its YAML), they cover every check the controller makes for researchers and on-call, and
they never grant what security review 3 forbids (findings 6 and 9: no tauruns/status writes,
no TauRunLog writes). tests/e2e/test_user_roles.py asks the real API server."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from devcluster import build
from tests.integration.deploy.test_chart import NAMESPACE, Right, allows, objects, one, render

pytestmark = pytest.mark.cluster  # needs the built Helm binary, not a running cluster

ON = {"rbac": {"userRoles": {"create": True}}}
PLATFORM_MD = build.REPO / "docs" / "platform.md"


def documented() -> dict[tuple[str, str], list[dict[str, Any]]]:
    """(kind, name) → rules of each role in the docs' "RBAC for researchers" section."""
    text = PLATFORM_MD.read_text()
    section = text.split("## RBAC for researchers", 1)[1].split("\n## ", 1)[0]
    roles = {}
    for block in re.findall(r"```yaml\n(.*?)```", section, flags=re.DOTALL):
        for doc in yaml.safe_load_all(block):
            if doc and doc["kind"] in ("Role", "ClusterRole"):
                roles[(doc["kind"], doc["metadata"]["name"])] = doc["rules"]
    return roles


@pytest.fixture(scope="module")
def roles() -> list[dict[str, Any]]:
    """The chart rendered with the user roles on."""
    return render(ON)


def rules(docs: list[dict[str, Any]], kind: str, name: str) -> list[dict[str, Any]]:
    return list(one(docs, kind, name)["rules"])


def test_the_user_roles_are_off_by_default() -> None:
    """Roles made by hand from the docs carry the same names; the chart makes them only when
    asked, so an install or upgrade never collides with them."""
    names = {d["metadata"]["name"] for d in render() if d["kind"] in ("ClusterRole", "Role")}
    assert not names & {"taugrid-researcher", "taugrid-oncall"}


def test_the_chart_makes_the_documented_roles(roles: list[dict[str, Any]]) -> None:
    """Researcher and on-call ClusterRoles and the on-call Role in the release namespace,
    each with exactly the rules the docs give (the docs' researcher Role is the same rules
    written out for one namespace)."""
    docs = documented()
    assert rules(roles, "ClusterRole", "taugrid-researcher") == docs[("Role", "taugrid-researcher")]
    assert rules(roles, "ClusterRole", "taugrid-oncall") == docs[("ClusterRole", "taugrid-oncall")]
    assert rules(roles, "Role", "taugrid-oncall") == docs[("Role", "taugrid-oncall")]
    assert one(roles, "Role", "taugrid-oncall")["metadata"]["namespace"] == NAMESPACE


def test_the_chart_binds_nobody_to_them(roles: list[dict[str, Any]]) -> None:
    """Who is a researcher or on-call is the platform's decision: no binding refers to them."""
    bound = {
        b["roleRef"]["name"] for b in roles if b["kind"] in ("RoleBinding", "ClusterRoleBinding")
    }
    assert not bound & {"taugrid-researcher", "taugrid-oncall"}


RESEARCHER_CHECKS = [
    Right("taugrid.dev", "tauruns", "create"),  # submit, rerun
    Right("taugrid.dev", "tauruns", "get"),  # status, evidence, results
    Right("taugrid.dev", "tauruns", "list"),  # list, experiments, queues
    Right("taugrid.dev", "tauruns", "patch"),  # cancel, resume
    Right("taugrid.dev", "tauruns", "delete"),  # cancel
    Right("", "pods/log", "get"),  # tau logs, live and kept
]
"""The SubjectAccessReviews the controller makes for a researcher (controller/runs/)."""

RESEARCHER_NEVER = [
    Right("taugrid.dev", "tauruns/status", "update"),  # review 3 finding 6
    Right("taugrid.dev", "tauruns/status", "patch"),
    Right("taugrid.dev", "taurunlogs", "create"),  # review 3 finding 9
    Right("taugrid.dev", "taurunlogs", "update"),
    Right("taugrid.dev", "taurunlogs", "get"),
    Right("", "secrets", "get"),
    Right("", "secrets", "list"),
    Right("", "pods", "create"),
    Right("batch", "jobs", "create"),
    Right("ray.io", "rayjobs", "create"),
    Right("", "nodes", "get"),
    Right("", "serviceaccounts/token", "create"),
]

ONCALL_CHECKS = [Right("", "nodes", "get"), Right("", "nodes", "patch"), Right("", "nodes", "list")]
"""The controller's on-call check is get (read) or patch (act) on nodes (serving.on_call)."""

ONCALL_NEVER = [
    Right("", "nodes", "delete"),
    Right("", "nodes", "update"),
    Right("", "nodes/status", "patch"),
    Right("", "secrets", "get"),
    Right("taugrid.dev", "tauruns/status", "patch"),
    Right("taugrid.dev", "taurunlogs", "create"),
    Right("", "pods/exec", "create"),
    Right("", "pods", "delete"),
    Right("", "pods/eviction", "create"),
]


@pytest.mark.parametrize("right", RESEARCHER_CHECKS, ids=str)
def test_the_researcher_role_passes_the_controllers_checks(
    roles: list[dict[str, Any]], right: Right
) -> None:
    assert allows(rules(roles, "ClusterRole", "taugrid-researcher"), right)


@pytest.mark.parametrize("right", RESEARCHER_NEVER, ids=str)
def test_the_researcher_role_never_grants(roles: list[dict[str, Any]], right: Right) -> None:
    assert not allows(rules(roles, "ClusterRole", "taugrid-researcher"), right)


@pytest.mark.parametrize("right", ONCALL_CHECKS, ids=str)
def test_the_oncall_role_passes_the_controllers_checks(
    roles: list[dict[str, Any]], right: Right
) -> None:
    assert allows(rules(roles, "ClusterRole", "taugrid-oncall"), right)


@pytest.mark.parametrize("right", ONCALL_NEVER, ids=str)
def test_the_oncall_roles_never_grant(roles: list[dict[str, Any]], right: Right) -> None:
    both = rules(roles, "ClusterRole", "taugrid-oncall") + rules(roles, "Role", "taugrid-oncall")
    assert not allows(both, right)


def test_the_oncall_role_may_port_forward_only_in_the_release_namespace(
    roles: list[dict[str, Any]],
) -> None:
    """pods/portforward (to an agent, docs/oncall.md) only through the namespaced Role."""
    assert not allows(rules(roles, "ClusterRole", "taugrid-oncall"),
                      Right("", "pods/portforward", "create"))  # fmt: skip
    assert allows(rules(roles, "Role", "taugrid-oncall"), Right("", "pods/portforward", "create"))


def test_no_user_role_uses_a_wildcard(roles: list[dict[str, Any]]) -> None:
    for role in objects(roles, "ClusterRole") + objects(roles, "Role"):
        if role["metadata"]["name"] not in ("taugrid-researcher", "taugrid-oncall"):
            continue
        for rule in role["rules"]:
            for key in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[key], role["metadata"]["name"]


@pytest.mark.parametrize("aggregate", [False, True], ids=["not aggregated", "aggregated"])
def test_only_the_researcher_role_aggregates_into_edit_and_admin_when_asked(
    aggregate: bool,
) -> None:
    docs = render({"rbac": {"userRoles": {"create": True, "aggregateToEdit": aggregate}}})
    labels = one(docs, "ClusterRole", "taugrid-researcher")["metadata"]["labels"]
    keys = {"rbac.authorization.k8s.io/aggregate-to-edit",
            "rbac.authorization.k8s.io/aggregate-to-admin"}  # fmt: skip
    assert (keys <= {k for k, v in labels.items() if v == "true"}) is aggregate
    assert (keys & set(labels)) == (keys if aggregate else set())
    oncall = one(docs, "ClusterRole", "taugrid-oncall")["metadata"]["labels"]
    assert not [k for k in oncall if k.startswith("rbac.authorization.k8s.io/aggregate")]


def test_a_second_releases_roles_have_its_own_names() -> None:
    docs = render(ON, release="tg2", namespace="ops")
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert {("ClusterRole", "tg2-taugrid-researcher"), ("ClusterRole", "tg2-taugrid-oncall"),
            ("Role", "tg2-taugrid-oncall")} <= names  # fmt: skip
