"""What the quarantine policy decides, as values: the breaker's state, one frozen dataclass per
action, and the decision of one pass.

Each action carries its `kind`; `Skipped` makes a safety limit visible instead of silent; the
`Decision` says what to do now and when a pass would next decide differently. The loop
(`controller.fleet.quarantining`) carries the actions out; nothing here performs I/O.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
from collections.abc import Mapping
from typing import ClassVar

from controller import wire
from controller.fleet import devices, nodes, state


class BreakerState(wire.Wire):
    """The circuit breaker's memory between passes; the shell keeps it (and may persist it)."""

    open: bool = False
    opened_at: dt.datetime | None = None
    message: str = ""
    """Why it opened, naming the count, the share and some of the nodes."""
    reset_at: dt.datetime | None = None
    """Last close (reset or automatic): nodes that turned bad before it do not count again."""
    reset_by: str = ""
    fleet_healthy_since: dt.datetime | None = None
    """While open: start of the current spell of a contained, fully reporting fleet."""


class SkipReason(enum.StrEnum):
    """Why an action the policy wanted was not taken."""

    DRY_RUN = "DryRun"
    BREAKER_OPEN = "BreakerOpen"
    MAX_QUARANTINED = "MaxQuarantined"
    MAX_QUARANTINED_DEVICES = "MaxQuarantinedDevices"


class ActionKind(enum.StrEnum):
    """Action names, as metrics labels, Event reasons and history entries use them."""

    SET_CONDITION = "SetCondition"
    QUARANTINE = "Quarantine"
    UPDATE_QUARANTINE = "UpdateQuarantine"
    RESTORE_TAINT = "RestoreTaint"
    EVICT_GPU_PODS = "EvictGpuPods"
    RELEASE = "Release"
    MANUAL_RELEASE = "ManualRelease"
    FORGET_MANUAL_RELEASE = "ForgetManualRelease"
    OPEN_BREAKER = "OpenBreaker"
    CLOSE_BREAKER = "CloseBreaker"
    SKIPPED = "Skipped"
    FENCE_DEVICE = "FenceDevice"
    UNFENCE_DEVICE = "UnfenceDevice"


@dataclasses.dataclass(frozen=True, slots=True)
class SetCondition:
    """Write the `GPUHealthy` condition (its transition time moves only with its status)."""

    kind: ClassVar[ActionKind] = ActionKind.SET_CONDITION
    node: str
    condition: nodes.Condition


@dataclasses.dataclass(frozen=True, slots=True)
class Quarantine:
    """Taint, cordon (unless someone else already did) and annotate the node, in one patch."""

    kind: ClassVar[ActionKind] = ActionKind.QUARANTINE
    node: str
    record: nodes.QuarantineRecord
    message: str
    cordon: bool
    """False when the node was already unschedulable: that cordon is not ours to undo."""


@dataclasses.dataclass(frozen=True, slots=True)
class UpdateQuarantine:
    """Rewrite the quarantine record: the fault escalated (stricter clearing, earlier drain)."""

    kind: ClassVar[ActionKind] = ActionKind.UPDATE_QUARANTINE
    node: str
    record: nodes.QuarantineRecord


@dataclasses.dataclass(frozen=True, slots=True)
class RestoreTaint:
    """Put our taint back on a quarantined node it was removed from."""

    kind: ClassVar[ActionKind] = ActionKind.RESTORE_TAINT
    node: str


@dataclasses.dataclass(frozen=True, slots=True)
class EvictGpuPods:
    """Evict the node's GPU pods through the Eviction API; due since `deadline`.

    Returned on every pass while it is due, so pods that survive one pass (a PDB said 429) are
    retried; the actuator records only the first pass in the history (`first`).
    """

    kind: ClassVar[ActionKind] = ActionKind.EVICT_GPU_PODS
    node: str
    deadline: dt.datetime
    reason: str
    first: bool


@dataclasses.dataclass(frozen=True, slots=True)
class Release:
    """Remove our taint and quarantine annotations; uncordon only if the cordon was ours."""

    kind: ClassVar[ActionKind] = ActionKind.RELEASE
    node: str
    reason: str
    message: str
    uncordon: bool


@dataclasses.dataclass(frozen=True, slots=True)
class ManualRelease:
    """Record a release by a person (on-call API or `kubectl uncordon`) and end the quarantine.

    `released_faults` are remembered on the node so they do not quarantine it again.
    """

    kind: ClassVar[ActionKind] = ActionKind.MANUAL_RELEASE
    node: str
    by: str
    reason: str
    released_faults: frozenset[state.FaultKey]
    uncordon: bool


@dataclasses.dataclass(frozen=True, slots=True)
class ForgetManualRelease:
    """Drop the released-fault set: the node reported healthy, so any later fault is new."""

    kind: ClassVar[ActionKind] = ActionKind.FORGET_MANUAL_RELEASE
    node: str


@dataclasses.dataclass(frozen=True, slots=True)
class OpenBreaker:
    """The breaker opened on this pass: raise the metric and an Event."""

    kind: ClassVar[ActionKind] = ActionKind.OPEN_BREAKER
    message: str
    nodes: tuple[str, ...]
    devices: bool = False
    """The device breaker (DRA device quarantine), not the node breaker."""


@dataclasses.dataclass(frozen=True, slots=True)
class CloseBreaker:
    """The breaker closed on this pass (`FleetHealthy`, or `Reset` by an operator)."""

    kind: ClassVar[ActionKind] = ActionKind.CLOSE_BREAKER
    reason: str
    by: str
    devices: bool = False
    note: str = ""
    """Why the operator reset it, in their words ('' when none was given, or automatic)."""


def close_breaker_text(which: str, action: CloseBreaker) -> str:
    """The breaker Event's note: `breaker closed (Reset by alice): GPU driver rolled back`."""
    by = f" by {action.by}" if action.by else ""
    text = f"{which} closed ({action.reason}{by})"
    return f"{text}: {action.note}" if action.note else text


NodeAction = (
    SetCondition
    | Quarantine
    | UpdateQuarantine
    | RestoreTaint
    | EvictGpuPods
    | Release
    | ManualRelease
    | ForgetManualRelease
)


@dataclasses.dataclass(frozen=True, slots=True)
class Skipped:
    """An action the policy wanted but a safety limit held back; reported, never executed."""

    kind: ClassVar[ActionKind] = ActionKind.SKIPPED
    node: str
    wanted: NodeAction
    why: SkipReason


Action = NodeAction | Skipped | OpenBreaker | CloseBreaker


@dataclasses.dataclass(frozen=True, slots=True)
class FenceDevice:
    """Create our DeviceTaintRules of `kinds` for one device, all in the same step."""

    kind: ClassVar[ActionKind] = ActionKind.FENCE_DEVICE
    node: str
    device: devices.Device
    kinds: frozenset[devices.RuleKind]
    record: devices.DeviceRecord
    escalation: bool = False
    """The device was fenced already: this adds a stricter rule (never a new quarantine)."""


@dataclasses.dataclass(frozen=True, slots=True)
class UnfenceDevice:
    """Delete our rules `names` of one device (only ours: each carries our label)."""

    kind: ClassVar[ActionKind] = ActionKind.UNFENCE_DEVICE
    node: str
    device: str
    gpu_uuid: str
    rules: tuple[tuple[str, str], ...]
    """(name, uid) of each rule, so a rule re-created meanwhile is not deleted."""
    reason: str
    message: str


DeviceAction = FenceDevice | UnfenceDevice


@dataclasses.dataclass(frozen=True, slots=True)
class SkippedDevice:
    """A device action a safety limit held back; reported, never executed."""

    kind: ClassVar[ActionKind] = ActionKind.SKIPPED
    node: str
    wanted: DeviceAction
    why: SkipReason


@dataclasses.dataclass(frozen=True, slots=True)
class FencedDevice:
    """One GPU under device quarantine, as the on-call API and the metrics show it."""

    node: str
    device: str
    gpu_uuid: str
    rules: tuple[devices.TaintRule, ...]
    record: devices.DeviceRecord | None
    healthy_since: dt.datetime | None
    """Start of the GPU's healthy streak (None while it still reports the fault)."""
    release_at: dt.datetime | None
    """When the rules go, if the GPU stays healthy (None while it is not)."""


@dataclasses.dataclass(frozen=True, slots=True)
class DeviceDecision:
    """The outcome of one device-quarantine pass."""

    actions: tuple[DeviceAction | SkippedDevice | OpenBreaker | CloseBreaker, ...]
    breaker: BreakerState
    next_deadline: dt.datetime | None
    scope: frozenset[str]
    """Nodes whose faults are fenced device by device: node quarantine leaves them alone."""
    dra_nodes: frozenset[str]
    """Managed nodes whose GPUs are DRA devices (they count as GPU nodes)."""
    fenced: Mapping[str, tuple[FencedDevice, ...]]
    """The devices under quarantine (dry-run rules included), by node."""
    quarantined_devices: int
    """Devices fenced by us (dry-run rules aside) before this pass's actions."""
    max_quarantined_devices: int
    devices_total: int
    """GPUs of the managed DRA nodes."""


@dataclasses.dataclass(frozen=True, slots=True)
class Decision:
    """The outcome of one pass."""

    actions: tuple[Action, ...]
    breaker: BreakerState
    """The breaker state to keep for the next pass (changes even without Open/Close actions)."""
    next_deadline: dt.datetime | None
    """The earliest future time a pass would decide differently with no new input."""
    health: Mapping[str, state.NodeHealth]
    """Health of every managed GPU node at `now`, for metrics and the on-call API."""
    quarantined: int
    """Nodes in automatic quarantine before this pass's actions."""
    max_quarantined: int


# ---------------------------------------------------------------- in words


def eviction_notes(
    node: str, pods: list[dict[str, str]]
) -> tuple[str, list[tuple[dict[str, str], str]]]:
    """The notes of an eviction round: the node's, then one per evicted pod.

    The node's Event lives in `default`, which more people read than any one tenant's
    namespace, and pods of many tenants share a node: so it gives only a count, and each pod
    is told (by name of its node, never of other pods) in an Event of its own namespace
    (security review 3, finding 4).
    """
    n = len(pods)
    node_note = f"evicted {n} GPU pod{'s' if n != 1 else ''}; each has an Event of its own"
    return node_note, [
        (pod, f"evicted from node {node}: TauGrid quarantined its GPUs") for pod in pods
    ]


def device_of(action: DeviceAction) -> str:
    """The name of the device an action fences or unfences."""
    return action.device.name if isinstance(action, FenceDevice) else action.device


def describe(action: NodeAction) -> str:
    """One line for the Event and the log that says what was done and why."""
    match action:
        case SetCondition():
            return f"GPUHealthy={action.condition.status}: {action.condition.message}"
        case Quarantine():
            return f"quarantined: {action.message}"
        case UpdateQuarantine():
            return f"quarantine updated: clears with {action.record.clears_with}"
        case RestoreTaint():
            return "restored the taugrid.dev/gpu-unhealthy taint"
        case EvictGpuPods():
            return f"evicting GPU pods: {action.reason}"
        case Release():
            return f"released: {action.message}"
        case ManualRelease():
            return f"released by {action.by}: {action.reason}"
        case ForgetManualRelease():
            return "healthy again; the earlier manual release is forgotten"
