"""The verdict per GPU: DESIGN.md section 5's fault table as pure functions.

`evaluate_node(state, inputs, policy, now)` folds one probe pass (snapshots, new Xid events,
DCGM results) into the persisted `NodeState` and returns the new state with a verdict per GPU.
No clock reads, no I/O, no logging: the probe loop passes `now` and writes the state file.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from typing import TypeVar

from agent import dcgmerrors, latching, readings
from shared import health, heartbeat, xid

_T = TypeVar("_T")

CLOCK_EVENT_HW_THERMAL_SLOWDOWN = 0x40
CLOCK_EVENT_HW_POWER_BRAKE_SLOWDOWN = 0x80

RECOVERY_ACTION_NONE = 0
RECOVERY_ACTIONS: dict[int, tuple[str, health.Verdict, health.Action, str]] = {
    1: ("RecoveryActionGpuReset", health.Verdict.FAILED, health.Action.RESET_GPU, "GPU_RESET"),
    2: ("RecoveryActionNodeReboot", health.Verdict.FAILED, health.Action.REBOOT_NODE,
        "NODE_REBOOT"),
    3: ("RecoveryActionDrainP2p", health.Verdict.DEGRADED, health.Action.RESET_GPU, "DRAIN_P2P"),
    4: ("RecoveryActionDrainAndReset", health.Verdict.DEGRADED, health.Action.RESET_GPU,
        "DRAIN_AND_RESET"),
    5: ("RecoveryActionRecoverImexDomain", health.Verdict.DEGRADED, health.Action.NONE,
        "RECOVER_IMEX_DOMAIN"),
    6: ("RecoveryActionBusReset", health.Verdict.FAILED, health.Action.RESET_GPU, "BUS_RESET"),
    7: ("RecoveryActionSystemReboot", health.Verdict.FAILED, health.Action.REBOOT_NODE,
        "SYSTEM_REBOOT"),
}  # fmt: skip
"""NVML's `nvmlDeviceGpuRecoveryAction_t` values 1-7 (0 is NONE) and what each asks of us.

RECOVER_IMEX_DOMAIN is no GPU reset: the node's IMEX domain (GB200 multi-node NVLink) must be
recovered, which none of our actions does, so it keeps new work off (Degraded) for as long as
NVML reports it and latches nothing. A value NVML adds later reads Degraded/None, named.
"""

# DCGM error severities (`dcgmErrorSeverity_t`; agent.dcgmerrors cites DCGM's source).
_DCGM_SEVERITIES = frozenset(int(s) for s in dcgmerrors.Severity)


@dataclasses.dataclass(frozen=True, slots=True)
class Policy:
    """The tunables of the fault table; the agent builds it from its settings."""

    escalation_window_s: float = 24 * 3600.0
    debounce_s: float = 60.0
    app_xid_display_s: float = 60.0
    dcgm_present: bool = False
    nvlink5_decode_window_s: float = 300.0
    """How long an Xid 144-150 without its kernel-log decode stays Degraded/Inspect-pending."""
    slowdown_window_s: float = 600.0
    slowdown_rate_per_min: float = 0.6
    """HW slowdown is Degraded only at this rate of minutes seen over the window (gpud's)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Finding:
    """One row of the fault table that matched."""

    code: str
    verdict: health.Verdict
    action: health.Action
    message: str
    xid: int | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class GpuVerdict:
    """A GPU's verdict, action and the reasons behind them."""

    uuid: str
    index: int
    verdict: health.Verdict
    action: health.Action
    reasons: tuple[heartbeat.Reason, ...]
    pci_bus_id: str = ""
    """Set on a GPU NVML does not enumerate (no snapshot carries its address)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Inputs:
    """One probe pass, as the shell hands it to `evaluate_node`."""

    boot_id: str
    snapshots: Sequence[readings.GpuSnapshot]
    xids: Sequence[readings.XidEvent] = ()
    """New, deduplicated Xid events, each attributed to a GPU index."""
    diag: readings.DiagResult | None = None
    health_check: readings.HealthCheck | None = None
    nvml_available: bool = True
    kmsg_seq: int | None = None
    """The newest kernel-log record read this pass, folded or deduplicated away."""
    twins: Sequence[readings.XidEvent] = ()
    """Kernel-log lines whose NVML twin was counted already: not counted again, but an Xid
    144-150 line is the only carrier of the decode NVIDIA's table needs."""
    driver_version: str = ""
    """The driver's version string; it tells the NVLink5 IntrInfo encoding (R575+: V2)."""
    nvml_detail: str = ""
    """Why NVML cannot be used, when `nvml_available` is False (the cause, named)."""
    missing: Sequence[readings.MissingGpu] = ()
    """GPUs the node has that NVML does not give the agent (`missing_gpus`)."""
    sxids: Sequence[readings.SxidEvent] = ()
    """New NVSwitch SXid kernel-log lines: a fatal one is a node finding."""


def evaluate_node(
    state: latching.NodeState, inputs: Inputs, policy: Policy, now: dt.datetime
) -> tuple[latching.NodeState, tuple[GpuVerdict, ...]]:
    """Fold one probe pass into the node state; return the new state and a verdict per GPU."""
    new_boot = bool(state.boot_id) and state.boot_id != inputs.boot_id
    gpus = dict(state.gpus)
    if new_boot:
        gpus = {uuid: _on_new_boot(gpu, now) for uuid, gpu in gpus.items()}
    xids_by_index: dict[int, list[readings.XidEvent]] = {}
    for event in inputs.xids:
        if event.gpu_index is not None:
            xids_by_index.setdefault(event.gpu_index, []).append(event)
    twins_by_index: dict[int, list[readings.XidEvent]] = {}
    for event in inputs.twins:
        if event.gpu_index is not None:
            twins_by_index.setdefault(event.gpu_index, []).append(event)
    health_by_index = (
        {g.gpu_index: g for g in inputs.health_check.gpus} if inputs.health_check else {}
    )
    node_health = tuple(
        e
        for e in (inputs.health_check.others if inputs.health_check else ())
        if e.value == "Failure"
    )

    unseen = _unseen_gpu_findings(inputs.xids) if inputs.nvml_available and inputs.snapshots else []
    unseen.extend(_sxid_findings(inputs.sxids))

    verdicts: list[GpuVerdict] = []
    seen: set[str] = set()
    for snapshot in sorted(inputs.snapshots, key=lambda s: s.index):
        seen.add(snapshot.uuid)
        previous = gpus.get(snapshot.uuid) or latching.GpuState(
            uuid=snapshot.uuid, index=snapshot.index, pci_bus_id=snapshot.pci_bus_id
        )
        gpu, verdict = evaluate_gpu(
            previous,
            snapshot,
            xids_by_index.get(snapshot.index, ()),
            diag=_diag_for(inputs.diag, snapshot.index),
            gpu_health=health_by_index.get(snapshot.index),
            node_health=node_health,
            boot_id=inputs.boot_id,
            policy=policy,
            now=now,
            twins=twins_by_index.get(snapshot.index, ()),
            driver_version=inputs.driver_version,
            node_findings=unseen,
        )
        gpus[snapshot.uuid] = gpu
        verdicts.append(verdict)
    absent = list(inputs.missing)
    for uuid, gpu in sorted(gpus.items(), key=lambda item: item[1].index):
        if uuid in seen:
            continue
        known = _take_missing(absent, gpu, nvml_available=inputs.nvml_available)
        if not inputs.nvml_available:
            verdicts.append(_unknown_verdict(gpu, policy, inputs.nvml_detail))
            continue
        # A GPU we knew that no longer enumerates has fallen off the bus as far as we can tell,
        # unless its enumeration error says otherwise (power cables, a host-side error).
        missing = readings.GpuSnapshot(
            index=gpu.index,
            uuid=uuid,
            pci_bus_id=gpu.pci_bus_id,
            taken_at=now,
            nvml_error=(
                known.error
                if known is not None and known.error is not None
                else readings.NvmlErrorKind.GPU_NOT_FOUND
            ),
            nvml_error_detail=(
                known.detail
                if known is not None and known.detail
                else "the GPU no longer enumerates through NVML"
            ),
        )
        gpus[uuid], verdict = evaluate_gpu(
            gpu,
            missing,
            xids_by_index.get(gpu.index, ()),
            diag=None,
            gpu_health=None,
            boot_id=inputs.boot_id,
            policy=policy,
            now=now,
        )
        verdicts.append(verdict)
    taken = {v.index for v in verdicts}
    for gpu_missing in absent:
        verdict = _missing_verdict(gpu_missing, taken)
        taken.add(verdict.index)
        verdicts.append(verdict)
    if not inputs.nvml_available and not verdicts:
        # Blind and knowing of no GPU (no state file, no PCI listing): still say so, or the
        # node would read as one with no GPUs, which the controller calls healthy.
        blind = readings.MissingGpu(
            index=0,
            error=readings.NvmlErrorKind.HOST_SIDE,
            detail=inputs.nvml_detail or "NVML is not initialised or not answering",
        )
        verdicts.append(_missing_verdict(blind, taken, uuid="unenumerated-nvml"))
    kmsg_seq = None if new_boot else state.kmsg_seq
    kmsg_seqs = [e.kmsg_seq for e in inputs.xids if e.kmsg_seq is not None]
    if inputs.kmsg_seq is not None:
        kmsg_seqs.append(inputs.kmsg_seq)
    if kmsg_seqs:
        kmsg_seq = max([*kmsg_seqs, *([kmsg_seq] if kmsg_seq is not None else [])])
    kmsg_seqs.extend(e.kmsg_seq for e in inputs.sxids if e.kmsg_seq is not None)
    if kmsg_seqs:
        kmsg_seq = max([*kmsg_seqs, *([kmsg_seq] if kmsg_seq is not None else [])])
    sxid_counts = dict(state.sxid_counts)
    for sxid_event in inputs.sxids:
        sxid_counts[sxid_event.sxid] = sxid_counts.get(sxid_event.sxid, 0) + 1
    new_state = state.model_copy(
        update={
            "boot_id": inputs.boot_id,
            "gpus": gpus,
            "kmsg_seq": kmsg_seq,
            "sxid_counts": sxid_counts,
        }
    )
    return new_state, tuple(sorted(verdicts, key=lambda v: v.index))


def _diag_for(
    result: readings.DiagResult | None, index: int
) -> tuple[readings.DiagResult, readings.GpuDiag] | None:
    """The diagnostic as one GPU sees it: its own outcome, or only the node-wide findings."""
    if result is None or result.error:
        return None
    gpu = next((g for g in result.gpus if g.gpu_index == index), None)
    if gpu is None:
        if not result.node_findings:
            return None
        gpu = readings.GpuDiag(gpu_index=index, status=readings.DiagStatus.SKIP)
    return result, gpu


def _on_new_boot(gpu: latching.GpuState, now: dt.datetime) -> latching.GpuState:
    """Clear what a reboot clears and forget the readings a reboot resets."""
    latched: list[latching.LatchedFault] = []
    for fault in gpu.latched:
        if fault.clears_when is latching.ClearingCondition.NEW_BOOT_ID:
            continue
        if fault.clears_when is latching.ClearingCondition.RESET_THEN_DIAG:
            fault = fault.model_copy(update={"reset_observed_at": now})  # noqa: PLW2901
        latched.append(fault)
    return gpu.model_copy(
        update={
            "latched": tuple(latched),
            "pending_since": {},
            "nvlinks_seen_up": (),
            "app_xids": (),
            "nvlink5_pending": (),
            "last_ecc_dbe": None,
            "last_ecc_sbe_volatile": None,
            "last_ecc_dbe_volatile": None,
            "last_remap_pending": None,
            "last_nvml_error": None,
            "last_recovery_action": None,
            "last_nvlinks_down": (),
            "last_reset_at": now,
            "slowdown_minutes": {},
        }
    )


def _unknown_verdict(gpu: latching.GpuState, policy: Policy, detail: str = "") -> GpuVerdict:
    reasons = [_latched_reason(f, policy) for f in gpu.latched]
    reasons.append(
        heartbeat.Reason(
            code="NvmlUnavailable",
            verdict=health.Verdict.UNKNOWN,
            action=health.Action.NONE,
            message=(
                "the agent cannot probe the GPU: "
                + (detail or "NVML is not initialised or not answering")
            )[:1024],
        )
    )
    return _assemble(gpu, reasons)


def missing_gpus(
    enumerated: Sequence[tuple[int, str]],
    errors: Mapping[int, tuple[readings.NvmlErrorKind, str]],
    pci_gpus: Sequence[str],
    *,
    expected: int = 0,
    unavailable: str = "",
) -> tuple[readings.MissingGpu, ...]:
    """The GPUs the node has that NVML does not give the agent (pure).

    `enumerated` is NVML's (index, PCI bus id) list, `errors` the indexes whose
    `nvmlDeviceGetHandleByIndex` failed, `pci_gpus` the NVIDIA 3D/VGA controllers the PCI bus
    lists, `expected` the GPU count the node should have (the device plugin's; 0 = unknown).
    With NVML unusable (`unavailable` says why) every PCI-listed GPU is one the agent cannot
    see. gpud's gpu-counts compares the PCI count with NVML's the same way.
    """
    if unavailable:
        return tuple(
            readings.MissingGpu(
                index=i, pci_bus_id=pci, error=readings.NvmlErrorKind.HOST_SIDE, detail=unavailable
            )
            for i, pci in enumerate(sorted(pci_gpus, key=_pci_order))
        )
    out = [
        readings.MissingGpu(
            index=index,
            error=kind,
            detail=f"nvmlDeviceGetHandleByIndex({index}): {detail}",
        )
        for index, (kind, detail) in sorted(errors.items())
    ]
    known = {key for _, pci in enumerated if (key := _pci_key(pci)) is not None}
    unexplained = [pci for pci in sorted(pci_gpus, key=_pci_order) if _pci_key(pci) not in known]
    # An enumeration error has no PCI address to match; the PCI functions beyond those errors
    # are GPUs NVML does not count at all.
    beyond = unexplained[len(errors) :]
    for pci in beyond:
        among = "" if len(beyond) == len(unexplained) else f" (one of {', '.join(unexplained)})"
        out.append(
            readings.MissingGpu(
                pci_bus_id=pci,
                detail=(
                    f"the PCI bus lists an NVIDIA GPU at {pci}{among} that is not among the "
                    f"{len(enumerated) + len(errors)} GPUs NVML counts"
                ),
            )
        )
    seen = len(enumerated) + len(errors) + len(beyond)
    short = readings.MissingGpu(
        expected=True,
        detail=(
            f"the node should have {expected} GPUs; NVML counts "
            f"{len(enumerated) + len(errors)} and the PCI bus lists {len(pci_gpus)}"
        ),
    )
    out.extend([short] * max(0, expected - seen))
    return tuple(out)


def _pci_key(address: str) -> tuple[int, int, int, int] | None:
    """`0000:07:00.0` and NVML's `00000000:07:00.0` alike as (domain, bus, device, function)."""
    parts = address.strip().lower().split(":")
    if len(parts) != 3:
        return None
    device, _, function = parts[2].partition(".")
    try:
        return int(parts[0], 16), int(parts[1], 16), int(device, 16), int(function or "0", 16)
    except ValueError:
        return None


def _pci_order(address: str) -> tuple[int, int, int, int]:
    return _pci_key(address) or (0, 0, 0, 0)


def _take_missing(
    absent: list[readings.MissingGpu], gpu: latching.GpuState, *, nvml_available: bool
) -> readings.MissingGpu | None:
    """Remove and return the missing entry that is this known GPU (by index or PCI address)."""
    key = _pci_key(gpu.pci_bus_id)
    for i, entry in enumerate(absent):
        by_pci = key is not None and _pci_key(entry.pci_bus_id) == key
        # With NVML down the index is only a PCI order, so only the address identifies it.
        by_index = nvml_available and entry.index == gpu.index and not entry.pci_bus_id
        if by_pci or by_index:
            return absent.pop(i)
    return None


def _missing_verdict(gpu: readings.MissingGpu, taken: set[int], *, uuid: str = "") -> GpuVerdict:
    """The verdict of a GPU NVML does not enumerate; not latched (it is seen again each pass)."""
    index = gpu.index if gpu.index is not None and gpu.index not in taken else None
    if index is None:
        index = next(i for i in range(heartbeat.MAX_GPUS_PER_NODE * 2) if i not in taken)
    if gpu.error is not None:
        finding = _nvml_error_finding(gpu.error, f": {gpu.detail}" if gpu.detail else "")
        if gpu.error is readings.NvmlErrorKind.UNKNOWN:
            finding = Finding(
                "GpuNotEnumerated",
                health.Verdict.FAILED,
                health.Action.REBOOT_NODE,
                f"NVML cannot enumerate the GPU: {gpu.detail}",
            )
    elif gpu.expected:
        finding = Finding(
            "GpuMissing",
            health.Verdict.FAILED,
            health.Action.INSPECT,
            f"{gpu.detail}: a GPU is not even on the PCI bus (reseat or replace it)",
        )
    else:
        finding = Finding(
            "GpuMissing",
            health.Verdict.FAILED,
            health.Action.REBOOT_NODE,
            f"{gpu.detail}: it fell off or failed to initialise before NVML started",
        )
    where = gpu.pci_bus_id or f"index-{index}"
    reason = heartbeat.Reason(
        code=finding.code,
        verdict=finding.verdict,
        action=finding.action,
        message=finding.message[:1024],
    )
    return GpuVerdict(
        uuid=uuid or f"unenumerated-{where}",
        index=index,
        verdict=finding.verdict,
        action=finding.action,
        reasons=(reason,),
        pci_bus_id=gpu.pci_bus_id,
    )


def reset_observed(previous: latching.GpuState, snapshot: readings.GpuSnapshot) -> bool:
    """Say whether the readings show a GPU reset since the previous probe.

    NVML has no reset counter; a reset shows as volatile ECC counters going back down, a
    pending row remap being applied, a lost / reset-required GPU answering again, or NVIDIA's
    recovery-action field returning to NONE, or an NVLink that was down training up again.
    """
    if snapshot.nvml_error is not None:
        return False
    if previous.last_nvml_error not in (None, readings.NvmlErrorKind.HOST_SIDE):
        # A host-side error ending (driver reloaded, cgroup fixed) is no GPU reset.
        return True
    for before, after in (
        (previous.last_ecc_sbe_volatile, snapshot.ecc_sbe_volatile),
        (previous.last_ecc_dbe_volatile, snapshot.ecc_dbe_volatile),
    ):
        if before is not None and after is not None and after < before:
            return True
    if previous.last_remap_pending and snapshot.remap_pending is False:
        return True
    if snapshot.nvlink_up and any(
        snapshot.nvlink_up.get(link) for link in previous.last_nvlinks_down
    ):
        return True
    return bool(
        previous.last_recovery_action
        and previous.last_recovery_action != RECOVERY_ACTION_NONE
        and snapshot.recovery_action == RECOVERY_ACTION_NONE
    )


def evaluate_gpu(
    previous: latching.GpuState,
    snapshot: readings.GpuSnapshot,
    xids: Iterable[readings.XidEvent],
    *,
    diag: tuple[readings.DiagResult, readings.GpuDiag] | None,
    gpu_health: readings.GpuHealth | None,
    boot_id: str,
    policy: Policy,
    now: dt.datetime,
    node_health: Sequence[readings.EntityHealth] = (),
    twins: Iterable[readings.XidEvent] = (),
    driver_version: str = "",
    node_findings: Sequence[Finding] = (),
) -> tuple[latching.GpuState, GpuVerdict]:
    """Apply the fault table to one GPU; return its new state and verdict."""
    state = previous.model_copy(
        update={"index": snapshot.index, "pci_bus_id": snapshot.pci_bus_id or previous.pci_bus_id}
    )
    # 1. Clearing conditions that this pass observes.
    if reset_observed(previous, snapshot):
        state = state.model_copy(
            update={
                "last_reset_at": now,
                "latched": tuple(
                    f.model_copy(update={"reset_observed_at": now})
                    if f.clears_when is latching.ClearingCondition.RESET_THEN_DIAG
                    and f.reset_observed_at is None
                    else f
                    for f in state.latched
                ),
            }
        )
    diag_passed_at: dt.datetime | None = None
    new_diag = diag is not None and (
        state.last_diag_at is None or diag[0].finished_at > state.last_diag_at
    )
    if diag is not None and new_diag:
        result, gpu_diag = diag
        state = state.model_copy(update={"last_diag_at": result.finished_at})
        node_bad = any(
            f.status in (readings.DiagStatus.FAIL, readings.DiagStatus.WARN)
            for f in result.node_findings
        )
        if gpu_diag.status in (readings.DiagStatus.PASS, readings.DiagStatus.SKIP) and not node_bad:
            diag_passed_at = result.finished_at

    # 2. Findings: events first, then levels.
    findings: list[Finding] = []
    transient: list[heartbeat.Reason] = []
    counts = dict(state.xid_counts)
    reset_xids = [o for o in state.reset_xids if _age_s(now, o.at) <= policy.escalation_window_s]
    app_xids = [o for o in state.app_xids if _age_s(now, o.at) <= policy.app_xid_display_s]
    nvlink5_pending = [
        o for o in state.nvlink5_pending if _age_s(now, o.at) <= policy.nvlink5_decode_window_s
    ]
    r575 = xid.driver_is_r575_or_newer(driver_version)
    ordered = [(e, True) for e in xids] + [(e, False) for e in twins]
    for event, counted in sorted(ordered, key=lambda pair: (pair[0].at, not pair[1])):
        if counted:
            counts[event.xid] = counts.get(event.xid, 0) + 1
        entry = xid.lookup(event.xid)
        if entry.xid_class is xid.XidClass.NVLINK5:
            outcome = _nvlink5_outcome(event, entry, r575)
            if outcome is None and event.intr_info is not None:
                # The line carries the registers and no row of NVIDIA's decode matches them:
                # nothing says it needs an action (NVSentinel: NONE). Shown, counted, no
                # verdict change; a pending NVML twin is resolved by it.
                nvlink5_pending = _drop_first(nvlink5_pending, event.xid)
                transient.append(
                    heartbeat.Reason(
                        code="XidNvLink5Unmatched",
                        verdict=health.Verdict.HEALTHY,
                        action=health.Action.NONE,
                        message=(
                            f"Xid {event.xid} ({entry.mnemonic}): {_undecoded_why(event)}; "
                            "NVIDIA's table names no action for it"
                        )[:1024],
                        xid=event.xid,
                        since=event.at,
                    )
                )
                continue
            if outcome is None:
                if counted:
                    nvlink5_pending.append(
                        latching.XidOccurrence(
                            xid=event.xid, at=event.at, detail=_undecoded_why(event)
                        )
                    )
                continue
            nvlink5_pending = _drop_first(nvlink5_pending, event.xid)
            bucket, text = outcome
            if bucket == "XID_154_EVAL":
                app_xids.append(latching.XidOccurrence(xid=event.xid, at=event.at, detail=text))
            elif bucket == "RESET_GPU":
                findings.append(
                    _reset_finding(
                        event,
                        entry.reason,
                        text,
                        reset_xids,
                        policy,
                        last_reset_at=state.last_reset_at,
                    )
                )
                reset_xids.append(latching.XidOccurrence(xid=event.xid, at=event.at))
            continue
        if not counted:
            if event.xid == 154 and snapshot.recovery_action is None:
                finding = _recovery_finding(event.recovery_action, "the Xid 154 kernel-log line")
                if finding is not None:
                    findings.append(finding)
            continue
        finding = _xid_finding(
            event, snapshot, reset_xids, policy, last_reset_at=state.last_reset_at
        )
        if event.xid == 154 and snapshot.recovery_action is None:
            # NVML cannot read field 230 (or has not yet): the line's "to 0xN" stands in.
            finding = _recovery_finding(event.recovery_action, "the Xid 154 kernel-log line")
        if finding is not None:
            findings.append(finding)
        if entry.xid_class is xid.XidClass.APPLICATION:
            app_xids.append(latching.XidOccurrence(xid=event.xid, at=event.at))
        elif entry.xid_class is xid.XidClass.RESET:
            reset_xids.append(latching.XidOccurrence(xid=event.xid, at=event.at))
    for occurrence in app_xids:
        entry = xid.lookup(occurrence.xid)
        transient.append(
            heartbeat.Reason(
                code=entry.reason,
                verdict=health.Verdict.HEALTHY,
                action=health.Action.RESTART_APP,
                message=occurrence.detail
                or f"Xid {occurrence.xid}: {entry.description} (the application's fault)",
                xid=occurrence.xid,
                since=occurrence.at,
            )
        )
    for occurrence in nvlink5_pending:
        entry = xid.lookup(occurrence.xid)
        transient.append(
            heartbeat.Reason(
                code="XidNvLink5Undecoded",
                verdict=health.Verdict.DEGRADED,
                action=health.Action.INSPECT,
                message=(
                    f"Xid {occurrence.xid} ({entry.mnemonic}): {occurrence.detail}; NVIDIA "
                    "decides Xid 144-150 per subcode, so this waits for the kernel-log line "
                    f"for up to {policy.nvlink5_decode_window_s:g} s (never escalated)"
                )[:1024],
                xid=occurrence.xid,
                since=occurrence.at,
            )
        )
    level, pending = _level_findings(state, snapshot, gpu_health, policy, now)
    findings.extend(level)
    slowdowns, slowdown_minutes = _slowdown_findings(state, snapshot, policy, now)
    findings.extend(slowdowns)
    findings.extend(_node_health_findings(node_health))
    findings.extend(node_findings)
    if diag is not None:
        # A finding that latches is folded once; one that does not stays visible for as long
        # as this is the last diagnostic.
        findings.extend(
            f
            for f in _diag_findings(diag[1], diag[0].node_findings)
            if new_diag or latching.clearing_for(f.action) is None
        )

    # 3. Latch what latches, keep the rest for this pass only.
    latched = list(state.latched)
    current: list[heartbeat.Reason] = list(transient)
    for finding in findings:
        condition = latching.clearing_for(finding.action)
        if condition is None:
            current.append(
                heartbeat.Reason(
                    code=finding.code,
                    verdict=finding.verdict,
                    action=finding.action,
                    message=finding.message,
                    xid=finding.xid,
                    since=now,
                )
            )
            continue
        latched = _latch(latched, finding, condition, boot_id, now)

    # 4. Clear what a reset plus a passing diagnostic (or no DCGM) clears.
    kept: list[latching.LatchedFault] = []
    for fault in latched:
        if fault.clears_when is latching.ClearingCondition.RESET_THEN_DIAG and (
            fault.reset_observed_at is not None
            and (
                not policy.dcgm_present
                or (diag_passed_at is not None and diag_passed_at >= fault.reset_observed_at)
            )
        ):
            continue
        kept.append(fault)

    nvlinks_up = set(state.nvlinks_seen_up)
    if snapshot.nvlink_up:
        nvlinks_up |= {link for link, up in snapshot.nvlink_up.items() if up}
    dbe = _dbe(snapshot)
    state = state.model_copy(
        update={
            "latched": tuple(kept),
            "reset_xids": tuple(reset_xids),
            "app_xids": tuple(app_xids),
            "nvlink5_pending": tuple(nvlink5_pending),
            "pending_since": pending,
            "slowdown_minutes": slowdown_minutes,
            "nvlinks_seen_up": tuple(sorted(nvlinks_up)),
            "xid_counts": counts,
            "last_ecc_dbe": dbe if dbe is not None else state.last_ecc_dbe,
            "last_ecc_sbe_volatile": _keep(snapshot.ecc_sbe_volatile, state.last_ecc_sbe_volatile),
            "last_ecc_dbe_volatile": _keep(snapshot.ecc_dbe_volatile, state.last_ecc_dbe_volatile),
            "last_remap_pending": _keep(snapshot.remap_pending, state.last_remap_pending),
            "last_nvml_error": snapshot.nvml_error,
            "last_recovery_action": _keep(snapshot.recovery_action, state.last_recovery_action),
            "last_nvlinks_down": (
                tuple(sorted(link for link, up in snapshot.nvlink_up.items() if not up))
                if snapshot.nvlink_up is not None
                else state.last_nvlinks_down
            ),
        }
    )
    reasons = [_latched_reason(f, policy) for f in state.latched] + current
    return state, _assemble(state, reasons)


def _keep(value: _T | None, previous: _T | None) -> _T | None:
    # A reading that failed this pass (absent) must not erase the baseline it is compared with.
    return value if value is not None else previous


def _age_s(now: dt.datetime, then: dt.datetime) -> float:
    return (now - then).total_seconds()


def _dbe(snapshot: readings.GpuSnapshot) -> int | None:
    if snapshot.ecc_dbe_volatile is not None:
        return snapshot.ecc_dbe_volatile
    return snapshot.ecc_dbe_aggregate


def _latch(
    latched: list[latching.LatchedFault],
    finding: Finding,
    condition: latching.ClearingCondition,
    boot_id: str,
    now: dt.datetime,
) -> list[latching.LatchedFault]:
    for i, fault in enumerate(latched):
        if fault.code == finding.code:
            # Seen again: it is still there, so any reset observed before now did not fix it.
            latched[i] = fault.model_copy(
                update={"last_seen": now, "reset_observed_at": None, "message": finding.message}
            )
            return latched
    latched.append(
        latching.LatchedFault(
            code=finding.code,
            verdict=finding.verdict,
            action=finding.action,
            message=finding.message,
            xid=finding.xid,
            since=now,
            last_seen=now,
            boot_id=boot_id,
            clears_when=condition,
        )
    )
    return latched


def _xid_finding(
    event: readings.XidEvent,
    snapshot: readings.GpuSnapshot,
    reset_xids: Sequence[latching.XidOccurrence],
    policy: Policy,
    *,
    last_reset_at: dt.datetime | None = None,
) -> Finding | None:
    entry = xid.lookup(event.xid)
    label = f"Xid {event.xid} ({entry.mnemonic}): {entry.description}"
    if entry.xid_class is xid.XidClass.APPLICATION:
        return None
    if entry.xid_class is xid.XidClass.REBOOT:
        return Finding(
            entry.reason, health.Verdict.FAILED, health.Action.REBOOT_NODE, label, event.xid
        )
    if entry.xid_class is xid.XidClass.INSPECT:
        return Finding(entry.reason, health.Verdict.FAILED, health.Action.INSPECT, label, event.xid)
    if entry.xid_class is xid.XidClass.RESET:
        return _reset_finding(
            event, entry.reason, label, reset_xids, policy, last_reset_at=last_reset_at
        )
    if event.xid == 48:
        if snapshot.remap_failure:
            return Finding(
                "XidDoubleBitEccRemapFailure",
                health.Verdict.FAILED,
                health.Action.INSPECT,
                f"{label}; the row remapper reports a failure (RMA threshold)",
                48,
            )
        if snapshot.remap_pending:
            return Finding(
                "XidDoubleBitEccRemapPending",
                health.Verdict.DEGRADED,
                health.Action.RESET_GPU,
                f"{label}; a row remap is pending and takes effect at the next GPU reset",
                48,
            )
        return Finding(
            "XidDoubleBitEcc", health.Verdict.DEGRADED, health.Action.RESET_GPU, label, 48
        )
    if event.xid == 64:
        if snapshot.remap_failure:
            return Finding(
                "XidRowRemapFailure",
                health.Verdict.FAILED,
                health.Action.INSPECT,
                f"{label}; the row remapper reports a failure (RMA threshold)",
                64,
            )
        return Finding(
            "XidRowRemapRecordingFailure",
            health.Verdict.DEGRADED,
            health.Action.RESET_GPU,
            label,
            64,
        )
    # Xid 154 is read through the recovery-action field (a level finding); IGNORE-class Xids
    # (157 among them: NVIDIA says workloads may still run) and unlisted ones are counted only.
    return None


def _sxid_findings(events: Iterable[readings.SxidEvent]) -> list[Finding]:
    """A fatal NVSwitch SXid quarantines the node: Failed/RebootNode on every GPU.

    NVSentinel treats a fatal SXid as fatal (CONTACT_SUPPORT), gpud asks for a reboot (the
    Fabric Manager guide's REBOOT_SYSTEM for 20034, 24007) and DCGM rates DCGM_FR_SXID_ERROR
    ISOLATE. An NVSwitch is not a GPU the agent can reset, and a reboot re-trains the fabric,
    so RebootNode, cleared by a new boot; a fatal SXid again after it latches again. Non-fatal
    SXids are counted only.
    """
    fatal = [e for e in events if e.fatal]
    if not fatal:
        return []
    text = "; ".join(
        f"nvswitch{e.switch} SXid {e.sxid}" + (f" link {e.link}" if e.link is not None else "")
        for e in fatal
    )
    return [
        Finding(
            "NvSwitchFatalSxid",
            health.Verdict.FAILED,
            health.Action.REBOOT_NODE,
            f"fatal NVSwitch error, node-wide: {text}"[:1024],
        )
    ]


def _unseen_gpu_findings(events: Iterable[readings.XidEvent]) -> list[Finding]:
    """Kernel-log Xids for a PCI address NVML does not enumerate: a GPU the agent cannot see.

    NVSentinel attributes such a line by its PCI address alone. Whatever the catalog says for
    the Xid, a GPU outside NVML can be neither reset nor checked through it, and a reboot is
    what brings a GPU back onto the bus: a node finding, Failed/RebootNode on every GPU,
    cleared by a new boot. Application and ignore-class Xids stay counts.
    """
    out: list[Finding] = []
    for event in events:
        if event.gpu_index is not None or not event.pci_bus_id:
            continue
        entry = xid.lookup(event.xid)
        if entry.xid_class in (xid.XidClass.APPLICATION, xid.XidClass.IGNORE):
            continue
        if entry.xid_class is xid.XidClass.NVLINK5 or event.xid == 154:
            continue
        out.append(
            Finding(
                "XidOnUnseenGpu",
                health.Verdict.FAILED,
                health.Action.REBOOT_NODE,
                f"Xid {event.xid} ({entry.mnemonic}) on PCI {event.pci_bus_id}, a GPU NVML "
                f"does not enumerate: {entry.description}"[:1024],
                event.xid,
            )
        )
    return out


def _reset_finding(
    event: readings.XidEvent,
    reason: str,
    label: str,
    reset_xids: Sequence[latching.XidOccurrence],
    policy: Policy,
    *,
    last_reset_at: dt.datetime | None = None,
) -> Finding:
    """A reset-class Xid: ResetGPU, or RebootNode when it came back after a reset in the window.

    NVIDIA's catalog says RESET_GPU for these and escalates only when the reset did not hold.
    Their lines come in bursts (one per channel, process or link, or one per RPC timeout as
    Xid 119 does), so a repeat with no reset observed in between is the same incident: it
    stays ResetGPU. Only an occurrence from before the last observed reset (or reboot) makes
    this one a repeat.
    """
    repeats = [
        o
        for o in reset_xids
        if o.xid == event.xid
        and 0 <= _age_s(event.at, o.at) <= policy.escalation_window_s
        and last_reset_at is not None
        and o.at < last_reset_at
    ]
    if repeats and last_reset_at is not None:
        hours = policy.escalation_window_s / 3600
        return Finding(
            "XidRepeated",
            health.Verdict.FAILED,
            health.Action.REBOOT_NODE,
            f"{label}; seen again within {hours:g} h (first at "
            f"{repeats[0].at.isoformat()}) after the reset observed at "
            f"{last_reset_at.isoformat()}: the reset did not hold",
            event.xid,
        )
    return Finding(reason, health.Verdict.FAILED, health.Action.RESET_GPU, label, event.xid)


def _nvlink5_outcome(
    event: readings.XidEvent, entry: xid.XidEntry, r575: bool | None
) -> tuple[str, str] | None:
    """Decode an Xid 144-150 by NVIDIA's sheet: (bucket, message), or None if undecoded."""
    if event.intr_info is None:
        return None
    decode = xid.decode_nvlink5(event.xid, event.intr_info, event.error_status, r575=r575)
    if decode is None or decode.bucket not in xid.NVLINK5_BUCKET_RANK:
        return None
    rule = decode.rule
    status = "any" if event.error_status is None else f"0x{event.error_status:08x}"
    text = (
        f"Xid {event.xid} ({entry.mnemonic}) {rule.unit}, IntrInfo 0x{event.intr_info:08x}, "
        f"error status {status}: NVIDIA's decode says {decode.bucket}"
        f"{' (action 2)' if decode.by_action2 else ''}, severity {rule.severity or '?'}, "
        f"investigate: {rule.investigatory or '-'}"
    )
    if decode.bucket == "XID_154_EVAL":
        text += "; follow an accompanying Xid 154, else restart the application"
    return decode.bucket, text[:1024]


def _undecoded_why(event: readings.XidEvent) -> str:
    if event.intr_info is None:
        if event.source is readings.XidSource.NVML:
            return "seen through NVML, whose event carries no subcode"
        return "its kernel-log line carries no IntrInfo/error-status registers"
    status = "none" if event.error_status is None else f"0x{event.error_status:08x}"
    return (
        f"no row of NVIDIA's decode matches {event.unit or 'its unit'} IntrInfo "
        f"0x{event.intr_info:08x}, error status {status}"
    )


def _drop_first(pending: list[latching.XidOccurrence], code: int) -> list[latching.XidOccurrence]:
    for i, occurrence in enumerate(pending):
        if occurrence.xid == code:
            return pending[:i] + pending[i + 1 :]
    return pending


def _recovery_finding(value: int | None, source: str) -> Finding | None:
    """NVIDIA's recovery action as a finding (None for NONE or no reading)."""
    if value is None or value == RECOVERY_ACTION_NONE:
        return None
    if value in RECOVERY_ACTIONS:
        code, verdict, action, name = RECOVERY_ACTIONS[value]
        return Finding(code, verdict, action, f"{source} says {name}")
    return Finding(
        "RecoveryActionUnknown",
        health.Verdict.DEGRADED,
        health.Action.NONE,
        f"{source} says {value}, a recovery action this agent does not know",
    )


def _level_findings(
    state: latching.GpuState,
    snapshot: readings.GpuSnapshot,
    gpu_health: readings.GpuHealth | None,
    policy: Policy,
    now: dt.datetime,
) -> tuple[list[Finding], dict[str, dt.datetime]]:
    """Return the findings the current readings support and the new debounce map."""
    findings: list[Finding] = []
    error = snapshot.nvml_error
    detail = f": {snapshot.nvml_error_detail}" if snapshot.nvml_error_detail else ""
    if error is not None:
        # Nothing else was read this pass: the error is the only finding.
        return [_nvml_error_finding(error, detail)], {}

    if snapshot.remap_failure:
        findings.append(
            Finding(
                "RowRemapFailure",
                health.Verdict.FAILED,
                health.Action.INSPECT,
                "the row remapper reports a failure (NVIDIA's RMA threshold for row remapping)",
            )
        )
    elif snapshot.remap_pending:
        findings.append(
            Finding(
                "RowRemapPending",
                health.Verdict.DEGRADED,
                health.Action.RESET_GPU,
                "a row remap is pending; it takes effect at the next GPU reset",
            )
        )
    dbe = _dbe(snapshot)
    if (
        not snapshot.remap_failure
        and dbe is not None
        and state.last_ecc_dbe is not None
        and dbe > state.last_ecc_dbe
    ):
        findings.append(
            Finding(
                "EccUncorrectedRising",
                health.Verdict.DEGRADED,
                health.Action.RESET_GPU,
                f"uncorrected ECC errors rose from {state.last_ecc_dbe} to {dbe}",
            )
        )
    if snapshot.nvlink_up:
        down = sorted(
            link for link in state.nvlinks_seen_up if snapshot.nvlink_up.get(link) is False
        )
        if down:
            findings.append(
                Finding(
                    "NvLinkDown",
                    health.Verdict.DEGRADED,
                    health.Action.RESET_GPU,
                    f"NVLink {', '.join(map(str, down))} went down after being up",
                )
            )
    recovery = _recovery_finding(snapshot.recovery_action, "NVIDIA's recovery-action field")
    if recovery is not None:
        findings.append(recovery)
    if gpu_health is not None and gpu_health.value == "Failure":
        findings.append(
            Finding(
                "DcgmHealthFailure",
                health.Verdict.DEGRADED,
                health.Action.NONE,
                "DCGM health watch failure: " + "; ".join(gpu_health.incidents),
            )
        )

    return findings, {}


def _slowdown_findings(
    state: latching.GpuState, snapshot: readings.GpuSnapshot, policy: Policy, now: dt.datetime
) -> tuple[list[Finding], dict[str, tuple[dt.datetime, ...]]]:
    """HW thermal and power-brake slowdown: a warning while seen, Degraded at a sustained rate.

    DCGM rates both MONITOR ("can perform workload, but needs to be monitored") and its health
    watch WARN; power brake is asserted from outside the GPU (the power supply, the facility).
    So neither is a fault: seen, it is a Healthy reason; only a rate over a window (gpud's
    hw-slowdown: 10 minutes, at least 0.6 events a minute, one event a minute at most) keeps
    new work off, Degraded with no action. Nothing latches: it clears when the rate drops.
    """
    findings: list[Finding] = []
    kept: dict[str, tuple[dt.datetime, ...]] = {}
    minute = now.replace(second=0, microsecond=0)
    for bit, code, what in (
        (CLOCK_EVENT_HW_THERMAL_SLOWDOWN, "HwThermalSlowdown", "hardware thermal slowdown"),
        (CLOCK_EVENT_HW_POWER_BRAKE_SLOWDOWN, "HwPowerBrakeSlowdown", "hardware power-brake"),
    ):
        seen = [
            m
            for m in state.slowdown_minutes.get(code, ())
            if _age_s(now, m) < policy.slowdown_window_s
        ]
        active = snapshot.clock_event_reasons is not None and bool(
            snapshot.clock_event_reasons & bit
        )
        if active and minute not in seen:
            seen.append(minute)
        if seen:
            kept[code] = tuple(seen)
        window_min = policy.slowdown_window_s / 60
        rate = len(seen) / window_min if window_min else 0.0
        text = (
            f"{what}: seen in {len(seen)} of the last {window_min:g} minutes "
            f"({rate:.2f}/min; sustained from {policy.slowdown_rate_per_min:g}/min)"
        )
        if seen and rate >= policy.slowdown_rate_per_min:
            findings.append(
                Finding(code, health.Verdict.DEGRADED, health.Action.NONE, f"{text}, sustained")
            )
        elif active:
            findings.append(
                Finding(code, health.Verdict.HEALTHY, health.Action.NONE, f"{text}, a warning")
            )
    return findings, kept


def _nvml_error_finding(error: readings.NvmlErrorKind, detail: str) -> Finding:
    """What an NVML error says about a GPU (nvml.h `nvmlReturn_t`, go-nvml 2f9e261).

    Host-side errors (driver not loaded, library/driver mismatch, OS or cgroup blocking, host
    memory) mean the agent cannot see: Unknown, latched never, no reset asked for. A GPU's
    external power cables (INSUFFICIENT_POWER) are mechanical: Inspect, not a reboot.
    """
    code, verdict, action, text = _NVML_ERRORS.get(error, _NVML_UNEXPECTED)
    return Finding(code, verdict, action, text.format(error=error, detail=detail))


_V, _A = health.Verdict, health.Action
_NVML_UNEXPECTED = (
    "NvmlError",
    _V.FAILED,
    _A.RESET_GPU,
    "NVML returned an unexpected error{detail}",
)
_NVML_ERRORS: dict[readings.NvmlErrorKind, tuple[str, health.Verdict, health.Action, str]] = {
    readings.NvmlErrorKind.GPU_IS_LOST: (
        "GpuLost",
        _V.FAILED,
        _A.REBOOT_NODE,
        "NVML reports the GPU lost ({error}){detail}",
    ),
    readings.NvmlErrorKind.GPU_NOT_FOUND: (
        "GpuLost",
        _V.FAILED,
        _A.REBOOT_NODE,
        "NVML reports the GPU lost ({error}){detail}",
    ),
    readings.NvmlErrorKind.RESET_REQUIRED: (
        "GpuResetRequired",
        _V.FAILED,
        _A.RESET_GPU,
        "NVML says the GPU needs a reset{detail}",
    ),
    readings.NvmlErrorKind.HOST_SIDE: (
        "NvmlHostError",
        _V.UNKNOWN,
        _A.NONE,
        (
            "the agent cannot read this GPU{detail}; the cause is on the host (driver, library, "
            "permissions, cgroups or memory), not the GPU, so no reset is asked for"
        ),
    ),
    readings.NvmlErrorKind.INSUFFICIENT_POWER: (
        "GpuInsufficientPower",
        _V.FAILED,
        _A.INSPECT,
        (
            "NVML says the GPU's external power cables are not properly attached{detail}; "
            "check the power cables"
        ),
    ),
    readings.NvmlErrorKind.IRQ_ISSUE: (
        "GpuIrqIssue",
        _V.FAILED,
        _A.REBOOT_NODE,
        "the NVIDIA kernel driver detected an interrupt issue with the GPU{detail}",
    ),
    readings.NvmlErrorKind.CORRUPTED_INFOROM: (
        "GpuInforomCorrupted",
        _V.FAILED,
        _A.INSPECT,
        "NVML says the GPU's infoROM is corrupted{detail}",
    ),
}
"""What each NVML error says about a GPU: reason, verdict, action, message (`{detail}`)."""


def _diag_findings(
    gpu: readings.GpuDiag, node: Sequence[readings.DiagFinding] = ()
) -> list[Finding]:
    out: list[Finding] = []
    bad = [f for f in node if f.status in (readings.DiagStatus.FAIL, readings.DiagStatus.WARN)]
    # A GPU that ran only the node-wide checks takes their outcome as its status; the node
    # finding below says so once, not again as this GPU's own failure.
    if gpu.status is readings.DiagStatus.FAIL and (gpu.findings or not bad):
        failed = [f for f in gpu.findings if f.status is readings.DiagStatus.FAIL] or list(
            gpu.findings
        )
        text = "; ".join(f"{f.test}: {f.message}" for f in failed) or "diagnostic failed"
        out.append(_by_severity("DcgmDiagFailed", "DcgmDiagWarning", failed, text, node=False))
    if bad:
        text = "node-wide, not tied to a GPU: " + "; ".join(
            f"{f.test}: {f.message}" if f.message else f.test for f in bad
        )
        out.append(
            _by_severity("DcgmDiagNodeFailed", "DcgmDiagNodeWarning", bad, text[:1024], node=True)
        )
    return out


def _by_severity(
    failed_code: str,
    warning_code: str,
    findings: Sequence[readings.DiagFinding],
    text: str,
    *,
    node: bool,
) -> Finding:
    """Map DCGM's error severities onto a finding (DESIGN.md section 5), in DCGM's order.

    Severities are an enum, not a scale: ISOLATE (2) decides before RESET (6), as dcgmi's
    `GetFailureResult` stops at the first ISOLATE. A GPU with faulty memory (ISOLATE) and a
    pending row remap (RESET) needs a person, not a reset that the automatic level-1 diagnostic,
    which tests no memory, would then "pass" (`dcgmerrors.precedence` has the whole order).
    """
    severities = [
        dcgmerrors.Severity(s) if s in _DCGM_SEVERITIES else dcgmerrors.Severity.UNKNOWN
        for f in findings
        for s in (f.severities or (() if f.severity is None else (f.severity,)))
    ]
    decides = dcgmerrors.precedence(severities)
    if decides is dcgmerrors.Severity.RESET:
        return Finding(failed_code, health.Verdict.FAILED, health.Action.RESET_GPU, text)
    if decides in (dcgmerrors.Severity.MONITOR, dcgmerrors.Severity.CONFIG):
        return Finding(warning_code, health.Verdict.DEGRADED, health.Action.NONE, text)
    if node and not severities:
        # DCGM 3.0-3.2 print no severity at all: a node-wide deployment finding is shown and
        # keeps new work off, but is no reason to latch every GPU of the node for a person.
        return Finding(warning_code, health.Verdict.DEGRADED, health.Action.NONE, text)
    return Finding(failed_code, health.Verdict.FAILED, health.Action.INSPECT, text)


def _node_health_findings(entities: Sequence[readings.EntityHealth]) -> list[Finding]:
    if not entities:
        return []
    text = "; ".join(f"{e.entity}: " + ("; ".join(e.incidents) or e.value) for e in entities)
    return [
        Finding(
            "DcgmHealthNodeFailure",
            health.Verdict.DEGRADED,
            health.Action.NONE,
            f"DCGM health watch failure, node-wide: {text}"[:1024],
        )
    ]


def _latched_reason(fault: latching.LatchedFault, policy: Policy) -> heartbeat.Reason:
    clears = latching.clears_when_text(fault.clears_when, dcgm_present=policy.dcgm_present)
    if fault.reset_observed_at is not None:
        clears += f" (reset observed at {fault.reset_observed_at.isoformat()})"
    return heartbeat.Reason(
        code=fault.code,
        verdict=fault.verdict,
        action=fault.action,
        message=fault.message,
        xid=fault.xid,
        latched=True,
        clears_when=clears[:1024],
        since=fault.since,
    )


def _assemble(gpu: latching.GpuState, reasons: Sequence[heartbeat.Reason]) -> GpuVerdict:
    bounded = tuple(reasons[: heartbeat.MAX_REASONS_PER_GPU])
    return GpuVerdict(
        uuid=gpu.uuid,
        index=gpu.index,
        verdict=health.worst_verdict([r.verdict for r in bounded]),
        action=health.worst_action([r.action for r in bounded]),
        reasons=bounded,
    )


def changed(before: Mapping[str, GpuVerdict], after: Iterable[GpuVerdict]) -> bool:
    """Say whether any GPU's verdict or action differs: the trigger for an immediate heartbeat."""
    after_map = {v.uuid: v for v in after}
    if set(before) != set(after_map):
        return True
    return any(
        (before[u].verdict, before[u].action) != (v.verdict, v.action) for u, v in after_map.items()
    )
