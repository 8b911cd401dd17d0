"""The NetworkPolicy evaluator (tests/netpolicy.py) against the semantics of the Kubernetes
docs' "Network Policies" page: isolation, additivity, peers, ports, both directions."""

from __future__ import annotations

from typing import Any

import pytest

from tests import netpolicy
from tests.netpolicy import Pod

NAMESPACES = {
    "a": {"kubernetes.io/metadata.name": "a", "team": "ml"},
    "b": {"kubernetes.io/metadata.name": "b", "team": "ml"},
    "c": {"kubernetes.io/metadata.name": "c"},
}
WEB = Pod("a", {"app": "web"}, ports={"http": 8080}, ip="10.0.0.5")
DB = Pod("a", {"app": "db", "tier": "data"}, ip="10.0.0.6")
B_WEB = Pod("b", {"app": "web"}, ip="10.1.0.5")
C_WEB = Pod("c", {"app": "web"}, ip="10.2.0.5")


def policy(namespace: str, spec: dict[str, Any], name: str = "p") -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


DENY_INGRESS = policy("a", {"podSelector": {}, "policyTypes": ["Ingress"]}, "deny")
DB_FROM_WEB = policy("a", {
    "podSelector": {"matchLabels": {"app": "db"}},
    "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}]}],
}, "db")  # fmt: skip
AND_PEER = policy("a", {
    "podSelector": {"matchLabels": {"app": "db"}},
    "ingress": [{"from": [{
        "namespaceSelector": {"matchLabels": {"team": "ml"}},
        "podSelector": {"matchLabels": {"app": "web"}},
    }]}],
})  # fmt: skip
OR_PEERS = policy("a", {
    "podSelector": {"matchLabels": {"app": "db"}},
    "ingress": [{"from": [
        {"namespaceSelector": {"matchLabels": {"team": "ml"}}},
        {"podSelector": {"matchLabels": {"app": "web"}}},
    ]}],
})  # fmt: skip


def allowed(policies: list[dict[str, Any]], src: Pod, dst: Pod, port: int = 5432,
            protocol: str = "TCP") -> bool:  # fmt: skip
    return netpolicy.allowed(policies, NAMESPACES, netpolicy.Connection(src, dst, port, protocol))


@pytest.mark.parametrize(
    ("policies", "src", "dst", "port", "expected"),
    [
        pytest.param([], C_WEB, DB, 5432, True, id="no policy: a pod is not isolated"),
        pytest.param([DENY_INGRESS], WEB, DB, 5432, False, id="an empty podSelector isolates all"),
        pytest.param([DENY_INGRESS], DB, C_WEB, 5432, True,
                     id="ingress isolation in a leaves pods of c open"),
        pytest.param([DENY_INGRESS, DB_FROM_WEB], WEB, DB, 5432, True,
                     id="policies are additive: one allowing is enough"),
        pytest.param([DB_FROM_WEB], B_WEB, DB, 5432, False,
                     id="a podSelector alone matches the policy's namespace only"),
        pytest.param([DB_FROM_WEB], WEB, WEB, 8080, True,
                     id="a pod no policy selects stays open"),
        pytest.param([AND_PEER], B_WEB, DB, 5432, True,
                     id="namespace and pod selector in one peer: web pods of ml namespaces"),
        pytest.param([AND_PEER], Pod("b", {"app": "x"}), DB, 5432, False,
                     id="one peer with both selectors needs both to match"),
        pytest.param([AND_PEER], C_WEB, DB, 5432, False,
                     id="a web pod outside the ml namespaces is refused"),
        pytest.param([OR_PEERS], Pod("b", {"app": "x"}), DB, 5432, True,
                     id="two peers: any pod of an ml namespace"),
        pytest.param([OR_PEERS], Pod("c", {"app": "web"}), DB, 5432, False,
                     id="two peers: the pod selector still means the policy's namespace"),
    ],
)  # fmt: skip
def test_peers_and_isolation(
    policies: list[dict[str, Any]], src: Pod, dst: Pod, port: int, expected: bool
) -> None:
    """Who reaches whom, by the rules of the Kubernetes docs."""
    assert allowed(policies, src, dst, port) is expected


def _ports(entries: list[dict[str, Any]]) -> dict[str, Any]:
    return policy("a", {"podSelector": {}, "ingress": [{"ports": entries}]})


@pytest.mark.parametrize(
    ("entries", "port", "protocol", "expected"),
    [
        pytest.param([{"port": 8080}], 8080, "TCP", True, id="a numbered port, TCP by default"),
        pytest.param([{"port": 8080}], 8081, "TCP", False, id="another port is refused"),
        pytest.param([{"port": 8080}], 8080, "UDP", False, id="the protocol must match"),
        pytest.param([{"port": "http"}], 8080, "TCP", True, id="a named port of the target"),
        pytest.param([{"port": "grpc"}], 8080, "TCP", False, id="a name the target lacks"),
        pytest.param([{"port": 9000, "endPort": 9100}], 9050, "TCP", True, id="in a range"),
        pytest.param([{"port": 9000, "endPort": 9100}], 9101, "TCP", False, id="past a range"),
        pytest.param([{"protocol": "UDP"}], 53, "UDP", True, id="a protocol without a port"),
    ],
)
def test_ports(entries: list[dict[str, Any]], port: int, protocol: str, expected: bool) -> None:
    """A rule's ports: number, name, range and protocol."""
    assert allowed([_ports(entries)], DB, WEB, port, protocol) is expected


def test_egress_isolation_blocks_what_the_destination_would_allow() -> None:
    """A connection needs both ends: a source whose egress is denied reaches nobody, and a
    policy with egress rules but no policyTypes isolates egress too."""
    deny_egress = policy("b", {"podSelector": {}, "policyTypes": ["Egress"]})
    assert allowed([deny_egress], B_WEB, DB) is False
    only_dns = policy("b", {"podSelector": {}, "egress": [{"ports": [{"port": 53}]}]})
    assert allowed([only_dns], B_WEB, DB, 5432) is False
    assert allowed([only_dns], B_WEB, DB, 53) is True
    assert allowed([only_dns, DENY_INGRESS], B_WEB, DB, 53) is False


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        pytest.param({"key": "tier", "operator": "In", "values": ["data"]}, True, id="In"),
        pytest.param({"key": "tier", "operator": "NotIn", "values": ["data"]}, False, id="NotIn"),
        pytest.param({"key": "tier", "operator": "Exists"}, True, id="Exists"),
        pytest.param({"key": "tier", "operator": "DoesNotExist"}, False, id="DoesNotExist"),
        pytest.param({"key": "zone", "operator": "NotIn", "values": ["x"]}, True,
                     id="NotIn matches a pod without the key"),
    ],
)  # fmt: skip
def test_match_expressions(expression: dict[str, Any], expected: bool) -> None:
    """matchExpressions select the pods a policy isolates."""
    deny = policy("a", {"podSelector": {"matchExpressions": [expression]},
                        "policyTypes": ["Ingress"]})  # fmt: skip
    assert allowed([deny], WEB, DB) is not expected


def test_ip_blocks_match_by_address_with_exceptions() -> None:
    """An ipBlock matches addresses in its CIDR but not in its exceptions."""
    rule = policy("a", {"podSelector": {}, "ingress": [{"from": [
        {"ipBlock": {"cidr": "10.1.0.0/16", "except": ["10.1.0.0/30"]}}]}]})  # fmt: skip
    assert allowed([rule], Pod("b", ip="10.1.0.9"), DB) is True
    assert allowed([rule], Pod("b", ip="10.1.0.2"), DB) is False
    assert allowed([rule], C_WEB, DB) is False


def test_what_it_does_not_model_is_refused() -> None:
    """An unknown operator or a peer without a selector is an error, not a guess."""
    bad_op = policy("a", {"podSelector": {"matchExpressions": [
        {"key": "x", "operator": "Gt", "values": ["1"]}]}})  # fmt: skip
    with pytest.raises(ValueError, match="operator"):
        allowed([bad_op], WEB, DB)
    empty_peer = policy("a", {"podSelector": {}, "ingress": [{"from": [{}]}]})
    with pytest.raises(ValueError, match="peer"):
        allowed([empty_peer], WEB, DB)
    with pytest.raises(ValueError, match="not a NetworkPolicy"):
        allowed([{"apiVersion": "v1", "kind": "Service"}], WEB, DB)
