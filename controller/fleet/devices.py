"""GPUs as DRA devices, and the DeviceTaintRules that fence them: typed views, names and
the rules we write (DESIGN.md sections 2 and 6), as pure code.

On a DRA node, NVIDIA's driver lists the GPUs in a ResourceSlice of its own pool, named
after the node; each device carries the GPU's UUID, the name our agents report it by. A fault
on one GPU is fenced by DeviceTaintRules that select exactly that device (driver, pool,
device name). Which rules, by kind:

| kind | taint key (`taugrid.dev/…`) | effect | who tolerates it |
|---|---|---|---|
| `unhealthy` | `gpu-unhealthy` | NoSchedule | nothing: no new claim is allocated it |
| `evict` | `gpu-evict` | NoExecute | run claims, for their checkpoint grace |
| `failed` | `gpu-failed` | NoExecute | nothing: an uncontained fault evicts at once |
| `dry-run` | `gpu-unhealthy` | None | (KCM reports what NoExecute would evict) |

`unhealthy` always comes with `evict` or `failed`, created together: a request that
tolerates a NoExecute taint may otherwise be *allocated* the device. A rule's effect is
never changed (the API server resets its `timeAdded`, which restarts every toleration):
escalating a contained fault to an uncontained one adds a `failed` rule beside `evict`,
and ending a dry run creates the real rules, then deletes the `dry-run` one.

Our rules are named `taugrid-<node>-<device>-<kind>` and labelled
`taugrid.dev/quarantined-by=taugrid-controller`; their annotations name the node, the
device and the GPU UUID, and hold the quarantine record. We never delete a rule without
that label. Parsing is forgiving like `controller.fleet.nodes`: a damaged annotation becomes
a problem of the rule, never an exception.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from controller import marks, timestamps
from controller.fleet import nodes, state

MAX_NAME_CHARS = 253
"""A DeviceTaintRule's name is a DNS subdomain."""
HARD_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
UNCONTAINED_CODES = frozenset({"XidUncontainedEcc"})
"""Fault codes whose work cannot continue even for a checkpoint grace (Xid 95: the error
was not contained to one context, so whatever runs on the GPU may compute on bad memory)."""


class RuleKind(enum.StrEnum):
    """Which of our rules (the table in the module docstring)."""

    UNHEALTHY = "unhealthy"
    EVICT = "evict"
    FAILED = "failed"
    DRY_RUN = "dry-run"


RULE_TAINTS: Mapping[RuleKind, tuple[str, str]] = {
    RuleKind.UNHEALTHY: (marks.DEVICE_UNHEALTHY_KEY, "NoSchedule"),
    RuleKind.EVICT: (marks.DEVICE_EVICT_KEY, "NoExecute"),
    RuleKind.FAILED: (marks.DEVICE_FAILED_KEY, "NoExecute"),
    RuleKind.DRY_RUN: (marks.DEVICE_UNHEALTHY_KEY, "None"),
}
"""(taint key, effect) of each kind."""
FENCING_KINDS = frozenset({RuleKind.UNHEALTHY, RuleKind.EVICT, RuleKind.FAILED})
"""The kinds that act; a device with any of them is quarantined."""


@dataclasses.dataclass(frozen=True, slots=True)
class Device:
    """One GPU as a DRA device of a node's pool."""

    node: str
    pool: str
    name: str
    uuid: str
    driver: str = marks.DRA_DRIVER
    taints: tuple[tuple[str, str], ...] = ()
    """(key, effect) of the taints the driver itself put on the device in the slice."""


@dataclasses.dataclass(frozen=True, slots=True)
class NodeDevices:
    """The GPUs a node's slices list (empty for a node whose GPUs are no DRA devices)."""

    node: str
    devices: tuple[Device, ...] = ()

    def by_uuid(self) -> dict[str, Device]:
        """The devices keyed by GPU UUID."""
        return {d.uuid: d for d in self.devices if d.uuid}


def parse_slice(raw: Mapping[str, Any]) -> tuple[Device, ...]:
    """The GPUs of one ResourceSlice of NVIDIA's driver (none for another driver's slice or
    one that belongs to no node)."""
    spec = _mapping(raw.get("spec"))
    node = spec.get("nodeName")
    if spec.get("driver") != marks.DRA_DRIVER or not isinstance(node, str) or not node:
        return ()
    pool = str(_mapping(spec.get("pool")).get("name") or node)
    out = []
    for item in spec.get("devices") or []:
        if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
            continue
        attrs = _mapping(item.get("attributes"))
        uuid = _mapping(attrs.get(marks.DRA_UUID_ATTRIBUTE)).get("string")
        taints = tuple(
            (str(t.get("key", "")), str(t.get("effect", "")))
            for t in item.get("taints") or []
            if isinstance(t, Mapping)
        )
        out.append(
            Device(node=node, pool=pool, name=item["name"],
                   uuid=uuid if isinstance(uuid, str) else "", taints=taints)
        )  # fmt: skip
    return tuple(out)


class Inventory(dict[str, NodeDevices]):
    """The DRA fleet's GPUs by node: only nodes with at least one GPU are in it, and `gpus`
    counts them all (kept, so a pass need not sum the fleet)."""

    def __init__(self, found: Mapping[str, NodeDevices] | None = None) -> None:
        super().__init__({n: d for n, d in (found or {}).items() if d.devices})
        self.gpus = sum(len(d.devices) for d in self.values())


def inventory(slices: Iterable[Mapping[str, Any]]) -> Inventory:
    """Every node's GPUs from all the raw slices (a node may have several slices)."""
    return inventory_of(map(parse_slice, slices))


def inventory_of(parsed: Iterable[tuple[Device, ...]]) -> Inventory:
    """Every node's GPUs from the slices' devices, parsed (`parse_slice`) once each."""
    found: dict[str, list[Device]] = {}
    for slice_devices in parsed:
        for device in slice_devices:
            found.setdefault(device.node, []).append(device)
    return Inventory({
        node: NodeDevices(node, tuple(sorted(devs, key=lambda d: _natural(d.name))))
        for node, devs in found.items()
    })  # fmt: skip


@dataclasses.dataclass(frozen=True, slots=True)
class DeviceRecord:
    """What one of our rules says about the quarantine it stands for."""

    reason: str
    """PascalCase fault code (`XidUncontainedEcc`, `RowRemapPending`)."""
    message: str
    at: dt.datetime
    by: str
    clears_with: nodes.Clearing
    faults: frozenset[state.FaultKey]

    def to_annotation(self) -> str:
        """The `taugrid.dev/quarantine` value of the rule."""
        return json.dumps(
            {
                "reason": self.reason,
                "message": self.message[:512],
                "at": timestamps.rfc3339_exact(self.at),
                "by": self.by,
                "clearsWith": self.clears_with.value,
                "faults": sorted(list(k) for k in self.faults),
            },
            separators=(",", ":"),
            sort_keys=True,
        )


@dataclasses.dataclass(frozen=True, slots=True)
class TaintRule:
    """A DeviceTaintRule, ours or anyone's."""

    name: str
    uid: str = ""
    driver: str = ""
    pool: str = ""
    device: str = ""
    key: str = ""
    effect: str = ""
    time_added: dt.datetime | None = None
    ours: bool = False
    kind: RuleKind | None = None
    """Which of ours (None for anyone else's)."""
    node: str = ""
    """The node of the device (our annotation; the pool otherwise)."""
    gpu_uuid: str = ""
    record: DeviceRecord | None = None
    eviction_status: str = ""
    """`EvictionInProgress` status ('' until kube-controller-manager wrote it)."""
    eviction_message: str = ""
    problems: tuple[str, ...] = ()

    def selects(self, device: Device) -> bool:
        """Whether the rule's selector matches `device` (an empty field matches any)."""
        return (
            (not self.driver or self.driver == device.driver)
            and (not self.pool or self.pool == device.pool)
            and (not self.device or self.device == device.name)
        )


def parse_rule(raw: Mapping[str, Any]) -> TaintRule:
    """Read a DeviceTaintRule as the API server returns it."""
    meta = _mapping(raw.get("metadata"))
    spec = _mapping(raw.get("spec"))
    selector = _mapping(spec.get("deviceSelector"))
    taint = _mapping(spec.get("taint"))
    labels = _mapping(meta.get("labels"))
    annotations = _mapping(meta.get("annotations"))
    name = str(meta.get("name", ""))
    ours = labels.get(marks.DEVICE_RULE_LABEL) == marks.CONTROLLER_IDENTITY and name.startswith(
        marks.DEVICE_RULE_PREFIX
    )
    problems: list[str] = []
    kind = None
    record = None
    if ours:
        kind = _kind_of(name)
        if kind is None:
            problems.append(f"metadata.name: {name!r} ends in no rule kind we make")
        try:
            record = _parse_record(annotations.get(marks.DEVICE_RULE_RECORD_ANNOTATION))
        except ValueError as err:
            problems.append(str(err))
    eviction = next(
        (c for c in _mapping(raw.get("status")).get("conditions") or []
         if isinstance(c, Mapping) and c.get("type") == marks.EVICTION_IN_PROGRESS_CONDITION),
        {},
    )  # fmt: skip
    pool = str(selector.get("pool") or "")
    return TaintRule(
        name=name,
        uid=str(meta.get("uid", "")),
        driver=str(selector.get("driver") or ""),
        pool=pool,
        device=str(selector.get("device") or ""),
        key=str(taint.get("key") or ""),
        effect=str(taint.get("effect") or ""),
        time_added=timestamps.parse(taint.get("timeAdded")),
        ours=ours,
        kind=kind,
        node=str(annotations.get(marks.DEVICE_RULE_NODE_ANNOTATION) or pool) if ours else pool,
        gpu_uuid=str(annotations.get(marks.DEVICE_RULE_UUID_ANNOTATION) or "") if ours else "",
        record=record,
        eviction_status=str(eviction.get("status") or ""),
        eviction_message=str(eviction.get("message") or ""),
        problems=tuple(problems),
    )


def _kind_of(name: str) -> RuleKind | None:
    for kind in sorted(RuleKind, key=lambda k: -len(k.value)):
        if name.endswith(f"-{kind.value}"):
            return kind
    return None


def _parse_record(raw: Any) -> DeviceRecord | None:
    field = marks.DEVICE_RULE_RECORD_ANNOTATION
    if raw is None:
        return None
    try:
        data = json.loads(str(raw))
    except json.JSONDecodeError as err:
        msg = f"{field}: not JSON ({err.msg})"
        raise ValueError(msg) from err
    if not isinstance(data, dict):
        msg = f"{field}: expected a JSON object"
        raise ValueError(msg)
    clears_with = nodes.parse_clearing(data.get("clearsWith"), field)
    faults = nodes.parse_keys(data.get("faults") or [], f"{field}.faults")
    return DeviceRecord(
        reason=str(data.get("reason") or ""),
        message=str(data.get("message") or ""),
        at=timestamps.parse_strict(data.get("at"), f"{field}.at"),
        by=str(data.get("by") or ""),
        clears_with=clears_with,
        faults=faults,
    )


def rule_name(node: str, device: str, kind: RuleKind) -> str:
    """`taugrid-<node>-<device>-<kind>`; a name too long for a DNS subdomain keeps the start
    of the node name and a digest of the whole, so it stays unique."""
    name = f"{marks.DEVICE_RULE_PREFIX}{node}-{device}-{kind.value}"
    if len(name) <= MAX_NAME_CHARS:
        return name
    digest = hashlib.sha256(f"{node}/{device}".encode()).hexdigest()[:10]
    tail = f"-{digest}-{device}-{kind.value}"
    head = f"{marks.DEVICE_RULE_PREFIX}{node}"[: MAX_NAME_CHARS - len(tail)].rstrip("-.")
    return head + tail


def render_rule(device: Device, kind: RuleKind, record: DeviceRecord) -> dict[str, Any]:
    """The DeviceTaintRule of one kind for one device, labelled and annotated as ours."""
    key, effect = RULE_TAINTS[kind]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {
            "name": rule_name(device.node, device.name, kind),
            "labels": {marks.DEVICE_RULE_LABEL: marks.CONTROLLER_IDENTITY},
            "annotations": {
                marks.DEVICE_RULE_NODE_ANNOTATION: device.node,
                marks.DEVICE_RULE_DEVICE_ANNOTATION: device.name,
                marks.DEVICE_RULE_UUID_ANNOTATION: device.uuid,
                marks.DEVICE_RULE_RECORD_ANNOTATION: record.to_annotation(),
            },
        },
        "spec": {
            "deviceSelector": {"driver": device.driver, "pool": device.pool,
                               "device": device.name},
            "taint": {"key": key, "effect": effect},
        },
    }  # fmt: skip


def _natural(name: str) -> tuple[str, int]:
    head, _, tail = name.rpartition("-")
    return (head, int(tail)) if tail.isdigit() else (name, -1)


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
