"""The real node's network: names from the state directory, addresses inside 198.18.0.0/15,
no default route anywhere."""

from __future__ import annotations

import ipaddress
import pathlib

import pytest

from devcluster import netns

STATE = pathlib.Path("/root/.local/state/taugrid/node")


def test_every_address_is_inside_the_benchmarking_range() -> None:
    """Link, node, pod CIDR and gateway all sit in 198.18.0.0/15."""
    link = netns.plan(STATE, slot=7)
    bench = ipaddress.IPv4Network("198.18.0.0/15")
    for addr in (link.host_ip, link.node_ip, link.pod_gateway):
        assert ipaddress.ip_address(addr) in bench
    assert ipaddress.IPv4Network(link.pod_cidr).subnet_of(bench)


def test_interface_names_fit_the_kernel_limit_and_name_the_state_directory() -> None:
    """veth names are at most 15 characters and differ between state directories."""
    a = netns.plan(STATE, slot=1)
    b = netns.plan(pathlib.Path("/root/.local/state/taugrid/other"), slot=1)
    assert all(len(n) <= 15 for n in (a.host_if, a.node_if))
    assert a.host_if != b.host_if
    assert a.netns == STATE / "node" / "netns"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("", None), ("1", 1), ("254", 254)],
    ids=["unset derives the slot", "the lowest slot", "the highest slot"],
)
def test_the_slot_comes_from_the_variable_or_the_state_directory(
    raw: str, expected: int | None
) -> None:
    """TAUGRID_NODE_SLOT chooses the /24; unset, the state directory's hash does."""
    assert (expected or netns.default_slot(STATE)) == netns.slot_from(raw, STATE)


@pytest.mark.parametrize(
    "raw",
    ["0", "255", "-1", "1\n", "one", "1.5"],
    ids=["zero", "past 254", "negative", "a trailing newline", "a word", "a fraction"],
)
def test_a_bad_slot_is_refused_naming_the_variable(raw: str) -> None:
    """Full-match validation; the message names TAUGRID_NODE_SLOT."""
    with pytest.raises(netns.NetnsError, match="TAUGRID_NODE_SLOT"):
        netns.slot_from(raw, STATE)


def test_the_setup_adds_no_default_route() -> None:
    """Only the link, the host's route to the pod CIDR and forwarding inside the namespace."""
    commands = [" ".join(c) for c in netns.setup_commands(netns.plan(STATE, slot=9))]
    assert not [c for c in commands if "default" in c]
    assert [c for c in commands if " route " in c] == [
        f"ip route add 198.19.9.0/24 via 198.18.9.2 dev {netns.plan(STATE, slot=9).host_if}"
    ]
    forwarding = [c for c in commands if "ip_forward" in c]
    assert forwarding
    assert all(c.startswith("nsenter --net=") for c in forwarding)


def test_an_address_of_another_interface_in_our_networks_is_a_conflict() -> None:
    """`ip -o addr` lines on other interfaces inside the link or pod network are reported;
    our own host end and unrelated networks are not."""
    link = netns.plan(STATE, slot=9)
    out = "\n".join(
        [
            "1: lo    inet 127.0.0.1/8 scope host lo",
            f"5: {link.host_if}    inet 198.18.9.1/30 scope global {link.host_if}",
            "7: tgother    inet 198.19.9.7/24 scope global tgother",
            "8: eth0    inet 10.0.0.2/24 scope global eth0",
        ]
    )
    assert netns.conflicts(link, out) == ["198.19.9.7 on tgother"]
