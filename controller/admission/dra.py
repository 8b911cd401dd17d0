"""A DRA fleet's GPUs as the admission gate counts them (pure): each DRA node's devices as
device quarantine judges them (`DeviceSlot`), what ResourceClaims hold (`Claims`, counted from
the claims cache's changes), each DRA node's GPU capacity (`WithDevices`) and the pods a claim
is reserved for (`MarkClaimed`). No I/O, no clock, no logging.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Container, Iterable, Mapping
from typing import Any, NamedTuple, Protocol

from controller import marks
from controller.admission.views import NodeCapacity, PodUsage


@dataclasses.dataclass(frozen=True)
class DeviceSlot:
    """One GPU of a DRA node, as device quarantine judges it."""

    pool: str
    name: str
    usable: bool
    why: str = ""
    """Why not usable: `tainted` (a NoSchedule or NoExecute device taint) or `faulty` (its
    agent reports a fault not fenced yet)."""


class Slot(Protocol):
    """What the gate reads of one GPU: a `DeviceSlot`, or the fleet's own listing of it
    handed over as it is (a pass does not copy a fleet's GPUs)."""

    @property
    def pool(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def usable(self) -> bool: ...
    @property
    def why(self) -> str: ...


class DeviceNode(NamedTuple):
    """A DRA node's GPUs and whether its health data is fresh (from the fleet). A plain
    `(fresh, devices)` pair is read the same way: the fleet's listing is handed over as it
    is, without a copy per node per pass."""

    fresh: bool
    devices: tuple[Slot, ...] = ()


@dataclasses.dataclass(frozen=True)
class Claim:
    """What the gate reads of one ResourceClaim."""

    devices: frozenset[tuple[str, str]] = frozenset()
    """(pool, device) of each device of NVIDIA's driver allocated to it."""
    pods: frozenset[tuple[str, str]] = frozenset()
    """(namespace, name) of each pod it is allocated and reserved for."""


def parse_claim(raw: Mapping[str, Any]) -> Claim:
    """Read what the gate needs from a raw ResourceClaim: the NVIDIA devices allocated to it,
    and, once it is allocated, the pods it is reserved for.

    The scheduler allocates a pod's claims and reserves them for it before it binds the pod,
    so for a moment a pod holds devices while it has no node yet."""
    meta = raw.get("metadata")
    status = raw.get("status")
    namespace = str(meta.get("namespace", "")) if isinstance(meta, Mapping) else ""
    allocation = status.get("allocation") if isinstance(status, Mapping) else None
    if not isinstance(status, Mapping) or not isinstance(allocation, Mapping) or not allocation:
        return Claim()
    found = allocation.get("devices")
    results = found.get("results") if isinstance(found, Mapping) else None
    devices = frozenset(
        (str(r.get("pool", "")), str(r.get("device", "")))
        for r in (results if isinstance(results, list) else [])
        if isinstance(r, Mapping) and r.get("driver") == marks.DRA_DRIVER
    )
    refs = status.get("reservedFor")
    pods = frozenset(
        (namespace, str(ref.get("name", "")))
        for ref in (refs if isinstance(refs, list) else [])
        if isinstance(ref, Mapping) and ref.get("resource") == "pods" and not ref.get("apiGroup")
    )
    return Claim(devices, pods)


class Claims:
    """Every ResourceClaim's devices and pods, kept as claims come, change and go.

    The claims cache tells each change with the claim's old and new views (`tell`), so what
    the claims hold is changed by the claims that came or went, never summed again. A pool
    whose holdings changed gets a new `version`, so `WithDevices` builds again only its
    nodes."""

    def __init__(self) -> None:
        self._held: dict[str, dict[str, int]] = {}
        """pool -> device -> how many claims hold it (admin access lets claims share one)."""
        self._pods: dict[tuple[str, str], int] = {}
        self._versions: dict[str, int] = {}
        self._clock = 0

    @classmethod
    def of(cls, claims: Iterable[Claim]) -> Claims:
        """What these claims (every claim there is) hold."""
        held = cls()
        for claim in claims:
            held.tell(None, claim)
        return held

    def tell(self, old: Claim | None, new: Claim | None) -> None:
        """A claim changed from `old` to `new` (None: it came, or went)."""
        if old == new:
            return
        if old is not None:
            self._count(old, -1)
        if new is not None:
            self._count(new, +1)

    def _count(self, claim: Claim, delta: int) -> None:
        if claim.devices:
            self._clock += 1
        for pool, device in claim.devices:
            devices = self._held.setdefault(pool, {})
            devices[device] = devices.get(device, 0) + delta
            if not devices[device]:
                del devices[device]
            self._versions[pool] = self._clock
            if not devices:
                del self._held[pool], self._versions[pool]
        for pod in claim.pods:
            self._pods[pod] = self._pods.get(pod, 0) + delta
            if not self._pods[pod]:
                del self._pods[pod]

    def holds(self, pool: str, device: str) -> bool:
        """Whether a claim holds this device."""
        return device in self._held.get(pool, ())

    def version(self, pool: str) -> int:
        """Changes whenever what claims hold in `pool` does (0: nothing held there)."""
        return self._versions.get(pool, 0)

    @property
    def versions(self) -> Mapping[str, int]:
        """`version` of every pool where claims hold something."""
        return self._versions

    @property
    def devices(self) -> frozenset[tuple[str, str]]:
        """(pool, device) of every device allocated to a ResourceClaim of NVIDIA's driver."""
        return frozenset((p, d) for p, held in self._held.items() for d in held)

    @property
    def pods(self) -> Mapping[tuple[str, str], int]:
        """(namespace, name) of every pod a ResourceClaim is allocated and reserved for (with
        how many claims are)."""
        return self._pods


def _with_devices(
    n: NodeCapacity, fresh: bool, devices: tuple[Slot, ...], usable: list[Slot], held: int
) -> NodeCapacity:
    fenced = tuple((d.name, d.why) for d in devices if not d.usable)
    return dataclasses.replace(
        n, dra=True, fresh=fresh, fenced=fenced,
        allocatable=dataclasses.replace(n.allocatable, gpus=len(usable) if fresh else 0),
        used=dataclasses.replace(n.used, gpus=n.used.gpus + held),
    )  # fmt: skip


@dataclasses.dataclass(frozen=True, slots=True)
class _Fitted:
    node: NodeCapacity
    fresh: bool
    devices: tuple[Slot, ...]
    versions: tuple[tuple[str, int], ...]
    out: NodeCapacity


class WithDevices:
    """Give every DRA node its GPU capacity: the usable devices, and which of them claims
    hold. A node the fleet lists without devices, or as stale, offers no GPUs.

    Only the DRA nodes whose view, GPUs, freshness or claimed devices changed since the call
    before are built again. A node's view comes from the nodes cache (parsed once as it
    arrived: `controller.kube.informer`) and its GPUs from the fleet's
    listing, which keeps a node's tuple while nothing about it changes; both are checked by
    identity (and held here, so an id cannot be reused), its pools' holdings by
    `Claims.version`. Without this, a gate pass on 10,000 DRA nodes rebuilt every node's
    capacity (three `dataclasses.replace` each) while one Workload waited."""

    def __init__(self) -> None:
        self._kept: dict[str, _Fitted] = {}
        self.built = 0
        """Nodes built so far (the rest were kept)."""

    def __call__(
        self,
        node_list: Iterable[NodeCapacity],
        dra: Mapping[str, tuple[bool, tuple[Slot, ...]]],
        claims: Claims,
    ) -> list[NodeCapacity]:
        """Every node of `node_list`, a DRA node (one `dra` names) with its GPU capacity."""
        kept: dict[str, _Fitted] = {}
        out = []
        version = claims.versions.get
        for n in node_list:
            found = dra.get(n.name)
            if found is None:
                out.append(n)
                continue
            fresh, devices = found
            hit = self._kept.get(n.name)
            if hit is not None and hit.node is n and hit.devices is devices and hit.fresh == fresh:
                for pool, v in hit.versions:
                    if version(pool, 0) != v:
                        break
                else:  # the same node, GPUs and holdings: kept
                    kept[n.name] = hit
                    out.append(hit.out)
                    continue
            usable = [d for d in devices if d.usable]
            held = sum(1 for d in usable if claims.holds(d.pool, d.name))
            versions = tuple((p, version(p, 0)) for p in sorted({d.pool for d in usable}))
            hit = _Fitted(n, fresh, devices, versions,
                          _with_devices(n, fresh, devices, usable, held))  # fmt: skip
            self.built += 1
            kept[n.name] = hit
            out.append(hit.out)
        self._kept = kept
        return out


class MarkClaimed:
    """Mark the pods a claim is reserved for (`PodUsage.claimed`), keeping each marked copy
    while its pod's view stays the same object (the pods cache keeps a pod's view until the
    pod changes)."""

    def __init__(self) -> None:
        self._kept: dict[int, tuple[PodUsage, PodUsage]] = {}

    def __call__(
        self, pods: Iterable[PodUsage], claimed: Container[tuple[str, str]]
    ) -> list[PodUsage]:
        """Every pod, a copy with `claimed` set where `claimed` names it."""
        kept: dict[int, tuple[PodUsage, PodUsage]] = {}
        out = []
        for p in pods:
            if (p.namespace, p.name) not in claimed:
                out.append(p)
                continue
            hit = self._kept.get(id(p))
            if hit is None or hit[0] is not p:
                hit = p, dataclasses.replace(p, claimed=True)
            kept[id(p)] = hit
            out.append(hit[1])
        self._kept = kept
        return out
