"""The Xid catalog: what each NVIDIA Xid means and what it asks of us.

Each entry cites NVIDIA's Xid catalog for Ampere and newer
(docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html), columns "Resolution Bucket
(Immediate Action)" and "(Investigatory Action)", as mirrored in leptonai/gpud
`components/accelerator/nvidia/xid/catalog_generated.go` (generated 2025-10). `xid_class` is our
reading of those buckets for the verdict (DESIGN.md section 5):

- `Application`: the job's fault; counted, never changes the GPU verdict (13, 31, 32, 43, 45 alone,
  68, 69, 94 are pinned by `APPLICATION_XIDS`).
- `Reset`: RESET_GPU bucket; the GPU fails until a reset (and escalates to a reboot on a repeat).
- `Reboot`: RESTART_BM / RESTART_VM; only a reboot brings the GPU back.
- `Inspect`: CHECK_MECHANICALS / hardware service; a person must look.
- `Workflow`: NVIDIA's multi-step decision, resolved by the verdict core from other readings
  (Xid 48 and 64 by the row-remapper state, Xid 154 by the recovery-action field).
- `Ignore`: IGNORE bucket or informational; counted only.
"""

from __future__ import annotations

import dataclasses
import enum


class XidClass(enum.StrEnum):
    """How the verdict core treats an Xid."""

    APPLICATION = "Application"
    RESET = "Reset"
    REBOOT = "Reboot"
    INSPECT = "Inspect"
    WORKFLOW = "Workflow"
    IGNORE = "Ignore"


@dataclasses.dataclass(frozen=True, slots=True)
class XidEntry:
    """One catalog row; `immediate`/`investigatory` are NVIDIA's bucket names verbatim."""

    xid: int
    mnemonic: str
    reason: str
    """PascalCase reason code used in verdicts and NodeConditions (`XidFallenOffBus`)."""
    immediate: str
    investigatory: str
    xid_class: XidClass
    description: str


def _e(  # noqa: PLR0917 - positional rows keep the catalog table readable
    xid: int,
    mnemonic: str,
    reason: str,
    immediate: str,
    investigatory: str,
    xid_class: XidClass,
    description: str,
) -> XidEntry:
    return XidEntry(xid, mnemonic, reason, immediate, investigatory, xid_class, description)


_A = XidClass.APPLICATION
_R = XidClass.RESET
_B = XidClass.REBOOT
_I = XidClass.INSPECT
_W = XidClass.WORKFLOW
_G = XidClass.IGNORE

_ENTRIES: tuple[XidEntry, ...] = (
    _e(8, "IDLE_TIMEOUT", "XidIdleTimeout", "RESTART_APP", "CONTACT_SUPPORT", _A,
       "GPU stopped processing: idle timeout"),
    _e(13, "GR_EXCEPTION", "XidGraphicsEngineException", "RESTART_APP", "WORKFLOW_XID_13", _A,
       "Graphics engine exception"),
    _e(31, "MMU_FAULT", "XidMemoryPageFault", "RESTART_APP", "WORKFLOW_XID_31", _A,
       "GPU memory page fault"),
    _e(32, "PBDMA_ERROR", "XidCorruptedPushBuffer", "RESTART_APP", "CHECK_APP/CUDA", _A,
       "Invalid or corrupted push buffer stream"),
    _e(38, "FECS_WATCHDOG", "XidFecsWatchdog", "IGNORE", "CONTACT_SUPPORT", _G,
       "Driver firmware error (FECS watchdog)"),
    _e(43, "RESETCHANNEL_VERIF", "XidChannelReset", "IGNORE", "CONTACT_SUPPORT", _A,
       "GPU stopped processing (channel reset)"),
    _e(44, "CTXSW_FAULT", "XidContextSwitchFault", "IGNORE", "CONTACT_SUPPORT", _G,
       "Graphics engine fault during context switch"),
    _e(45, "PREEMPTIVE_REMOVAL", "XidPreemptiveCleanup", "WORKFLOW_XID_45", "RESTART_FM", _A,
       "Preemptive cleanup after an earlier error; alone it is the application's"),
    _e(46, "GPU_TIMEOUT", "XidGpuStoppedProcessing", "RESET_GPU", "CONTACT_SUPPORT", _R,
       "GPU stopped processing (timeout)"),
    _e(48, "DBE", "XidDoubleBitEcc", "WORKFLOW_XID_48", "CONTACT_SUPPORT", _W,
       "Double-bit ECC error; the row remapper decides reset or RMA"),
    _e(54, "AUX_POWER", "XidAuxPowerNotConnected", "CHECK_MECHANICALS", "CONTACT_SUPPORT", _I,
       "Auxiliary power is not connected to the GPU board"),
    _e(61, "PMU_BREAKPOINT", "XidPmuBreakpoint", "CONTACT_SUPPORT", "CONTACT_SUPPORT", _I,
       "Internal micro-controller breakpoint/warning (unused on Ampere and newer)"),
    _e(62, "PMU_HALT", "XidMicroControllerHalt", "RESET_GPU", "CONTACT_SUPPORT", _R,
       "Internal micro-controller halt"),
    _e(63, "ECC_PAGE_RETIREMENT", "XidRowRemapEvent", "IGNORE", "IGNORE", _G,
       "Row-remapping or page-retirement recording event"),
    _e(64, "ECC_PAGE_RETIREMENT_FAILURE", "XidRowRemapFailure", "RESET_GPU", "CONTACT_SUPPORT",
       _W, "Row-remapping or page-retirement recording failure"),
    _e(68, "NVDEC0_EXCEPTION", "XidVideoDecoderException", "RESTART_APP", "CONTACT_SUPPORT", _A,
       "NVDEC0 exception"),
    _e(69, "GR_CLASS_ERROR", "XidGraphicsClassError", "RESTART_APP", "CONTACT_SUPPORT", _A,
       "Graphics engine class error"),
    _e(74, "NVLINK_ERROR", "XidNvLinkError", "WORKFLOW_NVLINK_ERR", "CONTACT_SUPPORT", _R,
       "NVLink error; reset, replace if it recurs"),
    _e(79, "GPU_FALLEN_OFF_BUS", "XidFallenOffBus", "RESTART_BM", "CONTACT_SUPPORT", _B,
       "GPU has fallen off the bus"),
    _e(92, "HIGH_SBE_RATE", "XidHighSingleBitEccRate", "IGNORE", "CONTACT_SUPPORT", _G,
       "High single-bit ECC error rate"),
    _e(94, "CONTAINED_ECC", "XidContainedEcc", "RESTART_APP", "IGNORE", _A,
       "Contained ECC error; only the affected application is hit"),
    _e(95, "UNCONTAINED_ECC", "XidUncontainedEcc", "RESET_GPU", "CONTACT_SUPPORT", _R,
       "Uncontained ECC error"),
    _e(109, "CTXSW_TIMEOUT", "XidContextSwitchTimeout", "RESET_GPU", "CONTACT_SUPPORT", _R,
       "Context-switch timeout"),
    _e(110, "SECURITY_FAULT", "XidSecurityFault", "RESET_GPU", "INVESTIGATE_SW", _R,
       "Security fault"),
    _e(119, "GSP_RPC_TIMEOUT", "XidGspRpcTimeout", "RESET_GPU", "INVESTIGATE_SW", _R,
       "GSP RPC timeout"),
    _e(120, "GSP_ERROR", "XidGspError", "RESET_GPU", "INVESTIGATE_SW", _R,
       "GSP error"),
    _e(121, "C2C_ERROR", "XidChipToChipError", "IGNORE", "CONTACT_SUPPORT", _G,
       "C2C link corrected error"),
    _e(136, "LINK_TRAINING_FAILED", "XidLinkTrainingFailed", "RESET_GPU", "INVESTIGATE_LINK_SI",
       _R, "Link training failed"),
    _e(140, "UNRECOVERED_ECC", "XidUnrecoveredEcc", "RESET_GPU", "CONTACT_SUPPORT", _R,
       "Unrecovered ECC error escaped containment"),
    _e(143, "GPU_INIT_ERROR", "XidGpuInitError", "RESET_GPU", "CONTACT_SUPPORT", _R,
       "GPU initialisation error"),
    _e(144, "NVLINK_SAW_ERROR", "XidNvLinkSawError", "WORKFLOW_NVLINK5_ERR", "CONTACT_SUPPORT",
       _R, "NVLink5 SAW error"),
    _e(145, "NVLINK_RLW_ERROR", "XidNvLinkRlwError", "WORKFLOW_NVLINK5_ERR", "CONTACT_SUPPORT",
       _R, "NVLink5 RLW error"),
    _e(146, "NVLINK_TLW_ERROR", "XidNvLinkTlwError", "WORKFLOW_NVLINK5_ERR", "CONTACT_SUPPORT",
       _R, "NVLink5 TLW error"),
    _e(147, "NVLINK_TREX_ERROR", "XidNvLinkTrexError", "WORKFLOW_NVLINK5_ERR",
       "CONTACT_SUPPORT", _R, "NVLink5 TREX error"),
    _e(148, "NVLINK_NVLPW_CTRL_ERROR", "XidNvLinkPowerControlError", "WORKFLOW_NVLINK5_ERR",
       "CONTACT_SUPPORT", _R, "NVLink5 NVLPW control error"),
    _e(149, "NVLINK_NETIR_ERROR", "XidNvLinkNetirError", "WORKFLOW_NVLINK5_ERR",
       "CONTACT_SUPPORT", _R, "NVLink5 NETIR error"),
    _e(150, "NVLINK_MSE_ERROR", "XidNvLinkMseError", "WORKFLOW_NVLINK5_ERR", "CONTACT_SUPPORT",
       _R, "NVLink5 MSE error"),
    _e(151, "KEY_ROTATION", "XidKeyRotation", "RESTART_VM", "CONTACT_SUPPORT", _B,
       "Key rotation error"),
    _e(154, "RECOVERY_ACTION_CHANGED", "XidRecoveryActionChanged", "XID_154", "IGNORE", _W,
       "GPU recovery action changed; read NVML_FI_DEV_GET_GPU_RECOVERY_ACTION"),
    _e(155, "NVLINK_SW_DEFINED", "XidNvLinkSoftwareError", "RESET_GPU", "INVESTIGATE_SW_USER", _R,
       "NVLink software-defined error"),
    _e(156, "RESOURCE_RETIREMENT_EVENT", "XidResourceRetirement", "RESET_GPU", "IGNORE", _R,
       "Resource retirement event"),
    _e(157, "RESOURCE_RETIREMENT_FAILURE", "XidResourceRetirementFailure", "IGNORE",
       "CONTACT_SUPPORT", _I, "Resource retirement failure"),
    _e(158, "GPU_FATAL_TIMEOUT", "XidGpuFatalTimeout", "RESET_GPU", "CONTACT_SUPPORT", _R,
       "GPU fatal timeout"),
)  # fmt: skip

CATALOG: dict[int, XidEntry] = {entry.xid: entry for entry in _ENTRIES}
"""Every Xid we know, keyed by number."""

APPLICATION_XIDS: frozenset[int] = frozenset({13, 31, 32, 43, 45, 68, 69, 94})
"""Xids that never change a verdict (DESIGN.md section 5); 45 counts here when it comes alone."""


def lookup(xid: int) -> XidEntry:
    """Return the catalog entry, or an `Ignore`-class placeholder for an Xid NVIDIA has not listed.

    An unlisted Xid is kept visible (reason `XidUnlisted`) but does not take a GPU out of
    service: NVIDIA adds Xids with new GPU generations, and quarantining a fleet on a number we
    cannot interpret would be worse than counting it and letting a person look.
    """
    entry = CATALOG.get(xid)
    if entry is not None:
        return entry
    return XidEntry(
        xid=xid,
        mnemonic="UNLISTED",
        reason="XidUnlisted",
        immediate="UNKNOWN",
        investigatory="UNKNOWN",
        xid_class=XidClass.IGNORE,
        description=f"Xid {xid} is not in the catalog this agent was built with",
    )
