"""A NetworkPolicy evaluator: would a connection from one pod to another on a port be allowed?

Nothing on the dev cluster enforces NetworkPolicy (the network plugin does, and KWOK pods
have no network), so the tests evaluate the policies the controller renders with this model of
the `networking.k8s.io/v1` semantics, as the API reference and the Kubernetes docs' "Network
Policies" page state them:

- a pod is isolated for ingress (egress) when some policy of its namespace selects it and
  lists `Ingress` (`Egress`) in `policyTypes`; `policyTypes` defaults to `Ingress`, plus
  `Egress` when the policy has egress rules; a pod not isolated in a direction allows all;
- an isolated pod allows a connection that some selecting policy's rule allows: a rule with
  no `from`/`to` matches every peer, one with no `ports` every port; policies are additive;
- a peer with `podSelector` alone matches pods of the policy's own namespace; with
  `namespaceSelector` alone every pod of the matching namespaces; with both (in one entry),
  pods matching the first in namespaces matching the second; `ipBlock` matches by address;
- a port entry matches on protocol (TCP by default) and number, or a named port of the
  destination's containers, up to `endPort` when given;
- a connection needs both the source's egress and the destination's ingress to allow it.

Label selectors support `matchLabels` and `matchExpressions` (In, NotIn, Exists,
DoesNotExist); an empty selector matches everything. It is a test tool: it models what the
controller renders and the cases in tests/unit/test_netpolicy.py, and refuses (ValueError)
what it does not model rather than guessing.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Mapping, Sequence
from typing import Any


@dataclasses.dataclass(frozen=True)
class Pod:
    """A pod as policies see it: where it is, its labels, its named ports and its address."""

    namespace: str
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    ports: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """Named container ports (name → number), for policies that name a port."""
    ip: str = ""


def selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """Whether a LabelSelector matches `labels` (None: the field is absent)."""
    if selector is None:
        msg = "an absent selector is not a selector; the caller decides what absence means"
        raise ValueError(msg)
    unknown = set(selector) - {"matchLabels", "matchExpressions"}
    if unknown:
        msg = f"unknown selector fields {sorted(unknown)}"
        raise ValueError(msg)
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "In":
            ok = key in labels and labels[key] in values
        elif op == "NotIn":
            ok = key not in labels or labels[key] not in values
        elif op == "Exists":
            ok = key in labels
        elif op == "DoesNotExist":
            ok = key not in labels
        else:
            msg = f"unknown selector operator {op!r}"
            raise ValueError(msg)
        if not ok:
            return False
    return True


def _types(policy: Mapping[str, Any]) -> set[str]:
    spec = policy.get("spec") or {}
    given = spec.get("policyTypes")
    if given:
        return set(given)
    return {"Ingress", "Egress"} if spec.get("egress") else {"Ingress"}


def _peer_matches(
    peer: Mapping[str, Any],
    policy_namespace: str,
    other: Pod,
    namespaces: Mapping[str, Mapping[str, str]],
) -> bool:
    if "ipBlock" in peer:
        block = peer["ipBlock"]
        if not other.ip:
            return False
        address = ipaddress.ip_address(other.ip)
        if address not in ipaddress.ip_network(block["cidr"]):
            return False
        return not any(address in ipaddress.ip_network(c) for c in block.get("except") or [])
    pods, spaces = peer.get("podSelector"), peer.get("namespaceSelector")
    if pods is None and spaces is None:
        msg = f"a peer needs a selector or an ipBlock: {dict(peer)}"
        raise ValueError(msg)
    if spaces is None:
        in_namespace = other.namespace == policy_namespace
    else:
        in_namespace = selects(spaces, namespaces.get(other.namespace, {}))
    return in_namespace and (pods is None or selects(pods, other.labels))


def _port_matches(entry: Mapping[str, Any], target: Pod, port: int, protocol: str) -> bool:
    if entry.get("protocol", "TCP") != protocol:
        return False
    want = entry.get("port")
    if want is None:
        return True
    if isinstance(want, str):
        number = target.ports.get(want)
        return number == port
    end = entry.get("endPort")
    low, high = int(want), int(end) if end is not None else int(want)
    return low <= port <= high


@dataclasses.dataclass(frozen=True)
class Connection:
    """A TCP (or UDP, SCTP) connection from one pod to a port of another."""

    source: Pod
    destination: Pod
    port: int
    protocol: str = "TCP"


def _rule_allows(
    rule: Mapping[str, Any],
    ingress: bool,
    policy_namespace: str,
    conn: Connection,
    namespaces: Mapping[str, Mapping[str, str]],
) -> bool:
    peer, peers = (conn.source, rule.get("from")) if ingress else (conn.destination, rule.get("to"))
    if peers and not any(_peer_matches(p, policy_namespace, peer, namespaces) for p in peers):
        return False
    ports = rule.get("ports")
    return not ports or any(
        _port_matches(e, conn.destination, conn.port, conn.protocol) for e in ports
    )


def _direction_allows(
    policies: Sequence[Mapping[str, Any]],
    namespaces: Mapping[str, Mapping[str, str]],
    conn: Connection,
    direction: str,
) -> bool:
    """Whether the policies of the pod at `direction`'s end (Ingress: the destination;
    Egress: the source) allow the connection."""
    ingress = direction == "Ingress"
    pod, rules_key = (conn.destination, "ingress") if ingress else (conn.source, "egress")
    isolated = False
    for policy in policies:
        meta, spec = policy.get("metadata") or {}, policy.get("spec") or {}
        namespace = meta.get("namespace")
        if namespace != pod.namespace or direction not in _types(policy):
            continue
        if not selects(spec.get("podSelector", {}), pod.labels):
            continue
        isolated = True
        for rule in spec.get(rules_key) or []:
            if _rule_allows(rule, ingress, namespace, conn, namespaces):
                return True
    return not isolated


def allowed(
    policies: Sequence[Mapping[str, Any]],
    namespaces: Mapping[str, Mapping[str, str]],
    conn: Connection,
) -> bool:
    """Whether `policies` allow the connection; `namespaces` maps each namespace to its
    labels (give it `kubernetes.io/metadata.name`, as the API server does)."""
    for policy in policies:
        if (policy.get("apiVersion"), policy.get("kind")) != (
            "networking.k8s.io/v1",
            "NetworkPolicy",
        ):
            msg = f"not a NetworkPolicy: {policy.get('apiVersion')}/{policy.get('kind')}"
            raise ValueError(msg)
    return _direction_allows(policies, namespaces, conn, "Egress") and _direction_allows(
        policies, namespaces, conn, "Ingress"
    )
