"""Latched faults and the per-GPU state that outlives a probe, a restart and a crash.

An Xid is an event: the next probe would look healthy. So a fault whose action is ResetGPU,
RebootNode or Inspect latches on its GPU until its clearing condition is seen (DESIGN.md section 5):

- RebootNode: a new `bootId`.
- ResetGPU: a reset observed through NVML or a new `bootId`, then a passing level-1 DCGM
  diagnostic when DCGM is present.
- Inspect: a manual release only.

Everything here is pure; `agent.statefile` writes `NodeState` to disk.
"""

from __future__ import annotations

import datetime as dt
import enum
from typing import Literal

import pydantic

from agent import readings, wire
from shared import health

STATE_VERSION: Literal[1] = 1


class ClearingCondition(enum.StrEnum):
    """What clears a latched fault."""

    NEW_BOOT_ID = "NewBootId"
    RESET_THEN_DIAG = "ObservedResetThenDiag"
    MANUAL_RELEASE = "ManualRelease"


def clears_when_text(condition: ClearingCondition, *, dcgm_present: bool) -> str:
    """Say in words what clears a fault, as on-call reads it in `/v1/gpus` and on the node."""
    if condition is ClearingCondition.NEW_BOOT_ID:
        return "a new bootId (reboot the node)"
    if condition is ClearingCondition.RESET_THEN_DIAG:
        if dcgm_present:
            return (
                "a GPU reset observed through NVML (or a new bootId), then a passing "
                "level-1 DCGM diagnostic"
            )
        return "a GPU reset observed through NVML (or a new bootId)"
    return "a manual release (POST /v1/release on the agent)"


def clearing_for(action: health.Action) -> ClearingCondition | None:
    """Return the clearing condition of a fault with this action; None means it does not latch."""
    if action is health.Action.REBOOT_NODE:
        return ClearingCondition.NEW_BOOT_ID
    if action is health.Action.RESET_GPU:
        return ClearingCondition.RESET_THEN_DIAG
    if action is health.Action.INSPECT:
        return ClearingCondition.MANUAL_RELEASE
    return None


class LatchedFault(wire.WireModel):
    """A fault that stays on its GPU until `clears_when` is observed."""

    code: str
    verdict: health.Verdict
    action: health.Action
    message: str = ""
    xid: int | None = None
    since: dt.datetime
    last_seen: dt.datetime
    boot_id: str
    clears_when: ClearingCondition
    reset_observed_at: dt.datetime | None = None
    """For RESET_THEN_DIAG: when the reset was seen; the diagnostic must finish after it."""


class XidOccurrence(wire.WireModel):
    """One counted Xid, kept for escalation and the application-Xid display window."""

    xid: int
    at: dt.datetime
    detail: str = ""
    """What to show instead of the catalog's text (an NVLink5 decode, why it is pending)."""


class GpuState(wire.WireModel):
    """What the verdict core remembers about one GPU between probes and across restarts."""

    uuid: str
    index: int
    pci_bus_id: str = ""
    latched: tuple[LatchedFault, ...] = ()
    reset_xids: tuple[XidOccurrence, ...] = ()
    """Reset-class Xids inside the escalation window, oldest first."""
    app_xids: tuple[XidOccurrence, ...] = ()
    """Application Xids still inside the display window (they say RestartApp, then vanish)."""
    nvlink5_pending: tuple[XidOccurrence, ...] = ()
    """Xid 144-150 not decoded yet (NVML's event carries no subcode): Degraded, never
    escalated, until the kernel-log line decodes them or the decode window passes."""
    pending_since: dict[str, dt.datetime] = pydantic.Field(default_factory=dict)
    """Debounced findings (thermal, clock events) by code: when each was first seen."""
    nvlinks_seen_up: tuple[int, ...] = ()
    xid_counts: dict[int, int] = pydantic.Field(default_factory=dict)
    """Cumulative Xid counts since the state file was created (`taugrid_gpu_xid_total`)."""
    last_diag_at: dt.datetime | None = None
    # The readings the next evaluation compares with (ECC rise, reset detection).
    last_ecc_dbe: int | None = None
    last_ecc_sbe_volatile: int | None = None
    last_ecc_dbe_volatile: int | None = None
    last_remap_pending: bool | None = None
    last_nvml_error: readings.NvmlErrorKind | None = None
    last_recovery_action: int | None = None
    last_nvlinks_down: tuple[int, ...] = ()
    """Links that were down at the last read; one coming back up shows a reset."""
    last_reset_at: dt.datetime | None = None
    """When a reset (or a reboot) of this GPU was last observed: a reset-class Xid escalates
    only when it comes back after one, the rung below having been tried (NVIDIA's catalog)."""
    slowdown_minutes: dict[str, tuple[dt.datetime, ...]] = pydantic.Field(default_factory=dict)
    """HW slowdown by code: the minutes (truncated) it was seen in, inside the rate window."""


class NodeState(wire.WireModel):
    """The whole state file."""

    version: Literal[1] = STATE_VERSION
    boot_id: str = ""
    gpus: dict[str, GpuState] = pydantic.Field(default_factory=dict)
    """Keyed by GPU UUID."""
    kmsg_seq: int | None = None
    sxid_counts: dict[int, int] = pydantic.Field(default_factory=dict)
    """NVSwitch SXids seen (fatal and non-fatal), cumulative (`taugrid_nvswitch_sxid_total`)."""
    """The last kernel-log record sequence number folded in during `boot_id`."""


def waiting_for_diag(state: NodeState) -> dt.datetime | None:
    """The latest observed reset whose ResetGPU fault waits for a passing diagnostic."""
    waiting = [
        fault.reset_observed_at
        for gpu in state.gpus.values()
        for fault in gpu.latched
        if fault.reset_observed_at is not None
    ]
    return max(waiting) if waiting else None


def diag_after_reset_due(
    state: NodeState,
    last_diag: readings.DiagResult | None,
    *,
    runs_since_reset: int,
    retry_after_s: float,
    max_runs: int,
) -> dt.datetime | None:
    """When the automatic level-1 diagnostic after a reset is due; None when it is not needed.

    Due at once after the latest reset that waits for one. If a run since then did not clear
    the fault although the waiting GPUs themselves passed (Fabric Manager still training after
    a reboot: DCGM fails the software test with a CONFIG error of no entity, which latches
    nothing and is gone a minute later), or the run itself failed (dcgmi timed out), it is due
    again `retry_after_s` after that run, until `max_runs` runs since the reset have been made.
    A run that fails a waiting GPU itself found something: no retry.
    """
    latest = waiting_for_diag(state)
    if latest is None:
        return None
    if last_diag is None or last_diag.finished_at < latest:
        return latest
    if runs_since_reset >= max_runs:
        return None
    waiting = {
        gpu.index
        for gpu in state.gpus.values()
        if any(f.reset_observed_at is not None for f in gpu.latched)
    }
    outcome = {g.gpu_index: g.status for g in last_diag.gpus}
    passed = (readings.DiagStatus.PASS, readings.DiagStatus.SKIP)
    if not last_diag.error and any(outcome.get(i) not in passed for i in waiting):
        return None
    return last_diag.finished_at + dt.timedelta(seconds=retry_after_s)


def release(
    state: GpuState, *, code: str | None, force: bool
) -> tuple[GpuState, tuple[LatchedFault, ...]]:
    """Release latched faults by hand; return the new state and what was released.

    Without `force` only Inspect faults (whose only clearing condition is a release) go;
    `force` lets on-call release any latched fault, for the day a clearing signal cannot arrive.
    """
    released: list[LatchedFault] = []
    kept: list[LatchedFault] = []
    for fault in state.latched:
        matches = code is None or fault.code == code
        allowed = force or fault.clears_when is ClearingCondition.MANUAL_RELEASE
        (released if matches and allowed else kept).append(fault)
    return state.model_copy(update={"latched": tuple(kept)}), tuple(released)
