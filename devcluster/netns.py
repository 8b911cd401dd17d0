"""The real node's network: a network namespace of ours joined to the host by a veth pair.

The kubelet refuses a loopback node IP and pods cannot reach the host's 127.0.0.1, so the
real node (its kubelet, containerd and pods) lives in a network namespace the dev cluster
makes, with addresses inside 198.18.0.0/15 (RFC 2544's benchmarking range): they exist only
on this machine, in namespaces the project made. Nothing gets a default route: the node's
namespace reaches only the host end of the link, its pods only 198.18.0.0/15.

Every host-global name derives from the state directory, so two dev clusters never collide:
the namespace is a file under the state directory (bind-mounted by `unshare`, not a name in
/run/netns), the veth names carry a hash of the state directory, and the /24 slot defaults to
one derived from it too (`TAUGRID_NODE_SLOT` chooses another when two hash alike; `up` refuses
a slot whose addresses are already on this machine).
"""

from __future__ import annotations

import dataclasses
import hashlib
import ipaddress
import os
import pathlib
import re
import subprocess
from collections.abc import Sequence

LINK_NET = ipaddress.ip_network("198.18.0.0/16")
"""/30 links, one per dev cluster: 198.18.<slot>.0/30 (host .1, node .2)."""
POD_NET = ipaddress.ip_network("198.19.0.0/16")
"""Pod CIDRs, one /24 per dev cluster: 198.19.<slot>.0/24."""
ROUTED = "198.18.0.0/15"
"""The only destination the node's pods get a route to."""
SLOT_ENV = "TAUGRID_NODE_SLOT"


class NetnsError(Exception):
    """The namespace or its link could not be made or removed; the message says which step."""


@dataclasses.dataclass(frozen=True)
class Link:
    """Everything about one dev cluster's node network, derived from its state directory."""

    netns: pathlib.Path
    host_if: str
    node_if: str
    slot: int

    @property
    def host_ip(self) -> str:
        """The host end of the link: the API server and the controller are relayed here."""
        return f"198.18.{self.slot}.1"

    @property
    def node_ip(self) -> str:
        """The node's address (the kubelet's --node-ip)."""
        return f"198.18.{self.slot}.2"

    @property
    def prefix(self) -> int:
        """The link's prefix length."""
        return 30

    @property
    def pod_cidr(self) -> str:
        """The node's pod CIDR (CNI bridge with host-local IPAM)."""
        return f"198.19.{self.slot}.0/24"

    @property
    def pod_gateway(self) -> str:
        """The bridge's address inside the node's namespace."""
        return f"198.19.{self.slot}.1"


def state_hash(state: pathlib.Path) -> str:
    """Six hex digits naming a state directory in host-global names."""
    return hashlib.sha256(str(state.resolve()).encode()).hexdigest()[:6]


def default_slot(state: pathlib.Path) -> int:
    """The /24 slot a state directory gets unless TAUGRID_NODE_SLOT says otherwise (1..254)."""
    return int(state_hash(state), 16) % 254 + 1


def slot_from(env: str | None, state: pathlib.Path) -> int:
    """Parse TAUGRID_NODE_SLOT (a whole number 1..254), or derive the slot from the state dir."""
    if env is None or env == "":
        return default_slot(state)
    if not re.fullmatch(r"[0-9]{1,3}", env) or not 1 <= int(env) <= 254:
        msg = f"{SLOT_ENV} must be a whole number from 1 to 254, not {env!r}"
        raise NetnsError(msg)
    return int(env)


def plan(state: pathlib.Path, slot: int | None = None) -> Link:
    """The node network of the dev cluster rooted at `state` (pure)."""
    h = state_hash(state)
    chosen = slot if slot is not None else slot_from(os.environ.get(SLOT_ENV), state)
    return Link(netns=state / "node" / "netns", host_if=f"tg{h}h", node_if=f"tg{h}n", slot=chosen)


def in_netns(link: Link, argv: Sequence[str]) -> list[str]:
    """A command run inside the node's namespace."""
    return ["nsenter", f"--net={link.netns}", *argv]


def setup_commands(link: Link) -> list[list[str]]:
    """The commands that make the link, in order (the namespace file exists already)."""
    host = f"{link.host_ip}/{link.prefix}"
    node = f"{link.node_ip}/{link.prefix}"
    return [
        # Made inside the namespace with its peer sent to PID 1's (the host's) namespace.
        in_netns(link, ["ip", "link", "add", link.node_if, "type", "veth", "peer", "name",
                        link.host_if, "netns", "1"]),
        ["ip", "addr", "add", host, "dev", link.host_if],
        ["ip", "link", "set", link.host_if, "up"],
        ["ip", "route", "add", link.pod_cidr, "via", link.node_ip, "dev", link.host_if],
        in_netns(link, ["ip", "link", "set", "lo", "up"]),
        in_netns(link, ["ip", "addr", "add", node, "dev", link.node_if]),
        in_netns(link, ["ip", "link", "set", link.node_if, "up"]),
        # Forwarding between the pods' bridge and the link, inside the namespace only.
        in_netns(link, ["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"]),
    ]  # fmt: skip


def conflicts(link: Link, addresses: str) -> list[str]:
    """Host addresses (`ip -o addr` output) that already sit in this link's or pod networks,
    on an interface that is not ours."""
    mine = ipaddress.ip_network(f"{link.host_ip}/{link.prefix}", strict=False)
    pods = ipaddress.ip_network(link.pod_cidr)
    out = []
    for line in addresses.splitlines():
        m = re.search(r"^\d+:\s+(\S+)\s+inet\s+([0-9.]+)/(\d+)", line)
        if not m or m.group(1) == link.host_if:
            continue
        addr = ipaddress.ip_address(m.group(2))
        if addr in mine or addr in pods:
            out.append(f"{m.group(2)} on {m.group(1)}")
    return out


def _run(argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        msg = f"`{' '.join(argv)}` failed: {proc.stderr.strip() or proc.stdout.strip()}"
        raise NetnsError(msg)
    return proc


def exists(link: Link) -> bool:
    """True when the namespace file is a mounted namespace and the host end of the link exists."""
    mounted = _run(["mountpoint", "-q", str(link.netns)], check=False).returncode == 0
    return mounted and _run(["ip", "link", "show", link.host_if], check=False).returncode == 0


def ensure(link: Link) -> None:
    """Make the namespace and its link (a leftover of an interrupted run is removed first)."""
    if exists(link):
        return
    remove(link)
    used = conflicts(link, _run(["ip", "-o", "-4", "addr", "show"]).stdout)
    if used:
        msg = (
            f"the node network 198.18.{link.slot}.0/30 + {link.pod_cidr} is in use on this "
            f"machine ({', '.join(used)}): set {SLOT_ENV} to another slot (1-254)"
        )
        raise NetnsError(msg)
    link.netns.parent.mkdir(parents=True, exist_ok=True)
    link.netns.touch()
    _run(["unshare", f"--net={link.netns}", "true"])
    for argv in setup_commands(link):
        _run(argv)


def remove(link: Link) -> list[str]:
    """Remove the link and the namespace; return what was removed (nothing there is fine)."""
    removed = []
    if _run(["ip", "link", "show", link.host_if], check=False).returncode == 0:
        _run(["ip", "link", "del", link.host_if])  # the peer and the route go with it
        removed.append(f"veth {link.host_if}")
    if _run(["mountpoint", "-q", str(link.netns)], check=False).returncode == 0:
        _run(["umount", str(link.netns)])
        removed.append(f"netns {link.netns}")
    link.netns.unlink(missing_ok=True)
    return removed
