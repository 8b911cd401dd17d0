"""Which pod and container each GPU is allocated to, from the kubelet's PodResources (pure).

Like dcgm-exporter with its Kubernetes mapping on (`internal/pkg/transformation/kubernetes.go`),
the agent labels per-GPU series with `pod`, `namespace` and `container`. The kubelet reports:

- device-plugin GPUs as `device_ids` of a resource (`nvidia.com/gpu`, or a configured name, or
  `nvidia.com/mig-*`). NVIDIA's plugin writes the GPU UUID; with time-slicing `GPU-<uuid>::<n>`;
  MIG devices as `MIG-<uuid>` (a MIG UUID, resolved through NVML) or, on older drivers,
  `MIG-GPU-<uuid>/<gi>/<ci>`; GKE's plugin `nvidia<index>` (`/gi<n>`, `/vgpu<n>`); and the
  index strategy a bare `<index>`.
- DRA GPUs as `claim_resources` {driver, pool, device}. NVIDIA's DRA driver (`gpu.nvidia.com`)
  names a whole GPU `gpu-<index>` in the node's pool, which this module maps to the NVML index;
  an explicit table (a setting) wins where a driver names them otherwise.

One pod per GPU, as dcgm-exporter does without `--kubernetes-virtual-gpus`: when several
containers share a GPU, the first by (namespace, pod, container) gets the labels and the rest
are counted, so a scrape's series set is stable.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence

DEFAULT_RESOURCES = ("nvidia.com/gpu",)
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
DRA_GPU_DRIVER = "gpu.nvidia.com"

_UUID = r"GPU-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
_PLUGIN_UUID = re.compile(rf"\A(?P<uuid>{_UUID})(?:::\d+)?\Z")
_OLD_MIG = re.compile(rf"\AMIG-(?P<uuid>{_UUID})/\d+/\d+(?:::\d+)?\Z")
_MIG = re.compile(r"\A(?P<mig>MIG-[0-9a-fA-F-]{36})(?:::\d+)?\Z")
_GKE = re.compile(r"\Anvidia(?P<index>\d+)(?:/gi\d+)?(?:/vgpu\d+)?\Z")
_INDEX = re.compile(r"\A(?P<index>\d+)(?:::\d+)?\Z")
_DRA_GPU = re.compile(r"\Agpu-(?P<index>\d+)\Z")


@dataclasses.dataclass(frozen=True, slots=True, order=True)
class PodRef:
    """The labels a GPU's series carry: dcgm-exporter's `namespace`, `pod`, `container`."""

    namespace: str
    pod: str
    container: str


@dataclasses.dataclass(frozen=True, slots=True)
class DeviceGrant:
    """One device-plugin allocation the kubelet reports."""

    ref: PodRef
    resource: str
    device_id: str


@dataclasses.dataclass(frozen=True, slots=True)
class ClaimGrant:
    """One DRA device the kubelet reports for a container's claim."""

    ref: PodRef
    driver: str
    pool: str
    device: str


@dataclasses.dataclass(frozen=True, slots=True)
class Gpu:
    """A GPU as NVML enumerates it."""

    index: int
    uuid: str


@dataclasses.dataclass(frozen=True, slots=True)
class Attribution:
    """The outcome of one refresh."""

    pods: dict[str, PodRef] = dataclasses.field(default_factory=dict)
    """GPU UUID -> the pod its series are labelled with."""
    sharing: dict[str, tuple[PodRef, ...]] = dataclasses.field(default_factory=dict)
    """GPU UUID -> every pod allocated it (more than one under time-slicing or MPS)."""
    unmatched: tuple[str, ...] = ()
    """NVIDIA device ids or DRA devices that name no GPU of this node (`MIG-…` unresolved)."""


def wants(resource: str, resources: Sequence[str]) -> bool:
    """Say whether a device-plugin resource holds NVIDIA GPUs (dcgm-exporter's test)."""
    return resource in resources or resource.startswith(MIG_RESOURCE_PREFIX)


def gpu_of_device_id(
    device_id: str,
    *,
    uuids: Mapping[str, str],
    by_index: Mapping[int, str],
    mig_parents: Mapping[str, str],
) -> str | None:
    """The UUID of the physical GPU a device-plugin id names, or None.

    `uuids` maps each UUID in lower case to its spelling; `mig_parents` maps MIG UUIDs
    (`MIG-…`) to their parent GPU's UUID, as NVML resolved them.
    """
    if (m := _PLUGIN_UUID.fullmatch(device_id)) is not None:
        return uuids.get(m["uuid"].lower())
    if (m := _OLD_MIG.fullmatch(device_id)) is not None:
        return uuids.get(m["uuid"].lower())
    if (m := _MIG.fullmatch(device_id)) is not None:
        parent = mig_parents.get(m["mig"])
        return uuids.get(parent.lower()) if parent else None
    if (m := _GKE.fullmatch(device_id)) is not None:
        return by_index.get(int(m["index"]))
    if (m := _INDEX.fullmatch(device_id)) is not None:
        return by_index.get(int(m["index"]))
    return None


def gpu_of_claim(
    grant: ClaimGrant,
    *,
    by_index: Mapping[int, str],
    dra_table: Mapping[str, str],
    uuids: Mapping[str, str],
) -> str | None:
    """The UUID a DRA device names: the explicit table first, then `gpu-<index>`."""
    for key in (f"{grant.pool}/{grant.device}", grant.device):
        if key in dra_table:
            return uuids.get(dra_table[key].lower())
    if (m := _DRA_GPU.fullmatch(grant.device)) is not None:
        return by_index.get(int(m["index"]))
    return None


def attribute(
    devices: Iterable[DeviceGrant],
    claims: Iterable[ClaimGrant],
    gpus: Iterable[Gpu],
    *,
    resources: Sequence[str] = DEFAULT_RESOURCES,
    dra_driver: str = DRA_GPU_DRIVER,
    dra_table: Mapping[str, str] | None = None,
    mig_parents: Mapping[str, str] | None = None,
) -> Attribution:
    """Map every reported allocation to this node's GPUs."""
    known = list(gpus)
    uuids = {g.uuid.lower(): g.uuid for g in known}
    by_index = {g.index: g.uuid for g in known}
    holders: dict[str, set[PodRef]] = {}
    unmatched: set[str] = set()
    for grant in devices:
        if not wants(grant.resource, resources):
            continue
        uuid = gpu_of_device_id(
            grant.device_id, uuids=uuids, by_index=by_index, mig_parents=mig_parents or {}
        )
        if uuid is None:
            unmatched.add(grant.device_id)
            continue
        holders.setdefault(uuid, set()).add(grant.ref)
    for claim in claims:
        if claim.driver != dra_driver:
            continue
        uuid = gpu_of_claim(claim, by_index=by_index, dra_table=dra_table or {}, uuids=uuids)
        if uuid is None:
            unmatched.add(f"{claim.driver}/{claim.pool}/{claim.device}")
            continue
        holders.setdefault(uuid, set()).add(claim.ref)
    sharing = {uuid: tuple(sorted(refs)) for uuid, refs in holders.items()}
    return Attribution(
        pods={uuid: refs[0] for uuid, refs in sharing.items()},
        sharing=sharing,
        unmatched=tuple(sorted(unmatched)),
    )


def mig_ids(devices: Iterable[DeviceGrant], resources: Sequence[str]) -> set[str]:
    """The MIG UUIDs (`MIG-…`, new format) that NVML must resolve to a parent GPU."""
    out: set[str] = set()
    for grant in devices:
        if wants(grant.resource, resources) and (m := _MIG.fullmatch(grant.device_id)):
            out.add(m["mig"])
    return out
