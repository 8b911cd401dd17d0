"""The Xid catalog: what each NVIDIA Xid means and what it asks of us.

The rows are NVIDIA's, read verbatim from its published `Xid-Catalog.xlsx`
(docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html) into the generated module
`shared.xid_catalog`, which records the spreadsheet's SHA-256 and date. `immediate` and
`investigatory` are NVIDIA's "Resolution Bucket (Immediate Action)" and "(Investigatory
Action)" cells verbatim; `mnemonic` and `description` are NVIDIA's too. What is ours is the
reading of a bucket for the verdict, `xid_class` (DESIGN.md section 5):

- `Application` (RESTART_APP, WORKFLOW_XID_45): the job's fault; counted, never changes the GPU
  verdict. 43 is pinned here too (DESIGN.md), though NVIDIA's bucket is IGNORE.
- `Reset` (RESET_GPU; WORKFLOW_NVLINK_ERR, whose text says "A GPU reset or node reboot is
  needed"; CHECK_UVM, "If UVM/vGPU is being utilized, RESET_GPU", since the agent cannot tell
  whether a job uses CUDA managed memory): the GPU fails until a reset, and a repeat inside the
  escalation window asks for a reboot.
- `Reboot` (RESTART_BM, RESTART_VM): only a reboot brings the GPU back.
- `Inspect` (CHECK_MECHANICALS; CONTACT_SUPPORT for a row NVIDIA says applies to one of its
  listed products): a person must look.
- `Workflow`: NVIDIA's multi-step decision, resolved by the verdict core from other readings
  (48 and 64 by the row-remapper state, 154 by NVML's recovery-action field).
- `NvLink5` (WORKFLOW_NVLINK5_ERR, Xid 144-150): decided per subcode by NVIDIA's "Xid 144-150
  Decode" sheet (`decode_nvlink5`), from the IntrInfo and error-status registers that only the
  kernel-log line carries.
- `Ignore` (IGNORE; CONTACT_SUPPORT rows NVIDIA marks "Unused" on A100/H100/B100/GB200;
  UPDATE_SWFW, a vGPU guest's start error; rows NVIDIA has not classified yet): counted only.
"""

from __future__ import annotations

import dataclasses
import enum
import re

from shared import xid_catalog


class XidClass(enum.StrEnum):
    """How the verdict core treats an Xid."""

    APPLICATION = "Application"
    RESET = "Reset"
    REBOOT = "Reboot"
    INSPECT = "Inspect"
    WORKFLOW = "Workflow"
    NVLINK5 = "NvLink5"
    IGNORE = "Ignore"


@dataclasses.dataclass(frozen=True, slots=True)
class XidEntry:
    """One catalog row; every text field but `reason` is NVIDIA's cell text verbatim."""

    xid: int
    mnemonic: str
    reason: str
    """PascalCase reason code used in verdicts and NodeConditions (`XidFallenOffBus`)."""
    immediate: str
    investigatory: str
    xid_class: XidClass
    description: str
    applies_to: tuple[str, ...] = ()
    """The products NVIDIA says the row applies to (A100, H100, B100, GB200)."""
    xid154_linkage: str = ""


BUCKET_CLASS: dict[str, XidClass] = {
    "RESTART_APP": XidClass.APPLICATION,
    "WORKFLOW_XID_45": XidClass.APPLICATION,
    "IGNORE": XidClass.IGNORE,
    "RESET_GPU": XidClass.RESET,
    "WORKFLOW_NVLINK_ERR": XidClass.RESET,
    "CHECK_UVM": XidClass.RESET,
    "RESTART_BM": XidClass.REBOOT,
    "RESTART_VM": XidClass.REBOOT,
    "CHECK_MECHANICALS": XidClass.INSPECT,
    "WORKFLOW_XID_48": XidClass.WORKFLOW,
    "XID_154": XidClass.WORKFLOW,
    "WORKFLOW_NVLINK5_ERR": XidClass.NVLINK5,
    "UPDATE_SWFW": XidClass.IGNORE,
    "": XidClass.IGNORE,
}
"""Our reading of NVIDIA's immediate buckets; CONTACT_SUPPORT is decided by `_class_of`."""

_CLASS_OVERRIDES: dict[int, XidClass] = {
    43: XidClass.APPLICATION,  # DESIGN.md: an application Xid (NVIDIA: IGNORE, so counted anyway)
    64: XidClass.WORKFLOW,  # NVIDIA: RESET_GPU; the row remapper tells a reset from an RMA
}

# Our reason codes for the Xids the agent had named before the catalog was generated; they
# appear in NodeConditions and dashboards, so they stay stable. Others are derived.
_REASONS: dict[int, str] = {
    8: "XidIdleTimeout",
    13: "XidGraphicsEngineException",
    31: "XidMemoryPageFault",
    32: "XidCorruptedPushBuffer",
    38: "XidFecsWatchdog",
    43: "XidChannelReset",
    44: "XidContextSwitchFault",
    45: "XidPreemptiveCleanup",
    46: "XidGpuStoppedProcessing",
    48: "XidDoubleBitEcc",
    54: "XidAuxPowerNotConnected",
    61: "XidPmuBreakpoint",
    62: "XidMicroControllerHalt",
    63: "XidRowRemapEvent",
    64: "XidRowRemapFailure",
    68: "XidVideoDecoderException",
    69: "XidGraphicsClassError",
    74: "XidNvLinkError",
    79: "XidFallenOffBus",
    92: "XidHighSingleBitEccRate",
    94: "XidContainedEcc",
    95: "XidUncontainedEcc",
    109: "XidContextSwitchTimeout",
    110: "XidSecurityFault",
    119: "XidGspRpcTimeout",
    120: "XidGspError",
    121: "XidChipToChipError",
    136: "XidLinkTrainingFailed",
    140: "XidUnrecoveredEcc",
    143: "XidGpuInitError",
    144: "XidNvLinkSawError",
    145: "XidNvLinkRlwError",
    146: "XidNvLinkTlwError",
    147: "XidNvLinkTrexError",
    148: "XidNvLinkPowerControlError",
    149: "XidNvLinkNetirError",
    150: "XidNvLinkMseError",
    151: "XidKeyRotation",
    154: "XidRecoveryActionChanged",
    155: "XidNvLinkSoftwareError",
    156: "XidResourceRetirement",
    157: "XidResourceRetirementFailure",
    158: "XidGpuFatalTimeout",
}


def _reason_of(code: int, mnemonic: str) -> str:
    if code in _REASONS:
        return _REASONS[code]
    first = mnemonic.split("/", maxsplit=1)[0].strip().removeprefix("ROBUST_CHANNEL_")
    words = [w for w in re.split(r"[^A-Za-z0-9]+", first) if w]
    return ("Xid" + "".join(w.capitalize() for w in words))[:63] or f"Xid{code}"


def _class_of(code: int, immediate: str, applies_to: tuple[str, ...]) -> XidClass:
    if code in _CLASS_OVERRIDES:
        return _CLASS_OVERRIDES[code]
    if immediate == "CONTACT_SUPPORT":
        return XidClass.INSPECT if applies_to else XidClass.IGNORE
    return BUCKET_CLASS.get(immediate, XidClass.IGNORE)


def _entry(row: tuple[int, str, str, str, str, str, tuple[str, ...]]) -> XidEntry:
    code, mnemonic, description, immediate, investigatory, linkage, applies_to = row
    return XidEntry(
        xid=code,
        mnemonic=mnemonic,
        reason=_reason_of(code, mnemonic),
        immediate=immediate,
        investigatory=investigatory,
        xid_class=_class_of(code, immediate, applies_to),
        description=description,
        applies_to=applies_to,
        xid154_linkage=linkage,
    )


CATALOG: dict[int, XidEntry] = {row[0]: _entry(row) for row in xid_catalog.XIDS}
"""Every Xid NVIDIA's catalog lists, keyed by number."""

APPLICATION_XIDS: frozenset[int] = frozenset({13, 31, 32, 43, 45, 68, 69, 94})
"""The Xids DESIGN.md section 5 names as never changing a verdict (45 when it comes alone);
every other RESTART_APP Xid of the catalog is treated the same way."""

NVLINK5_XIDS: frozenset[int] = frozenset(range(144, 151))


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


# ---------------------------------------------------------------- Xid 144-150 (NVLink5)
@dataclasses.dataclass(frozen=True, slots=True)
class Nvlink5Rule:
    """One row of NVIDIA's "Xid 144-150 Decode" sheet, verbatim."""

    xid: int
    unit: str
    v1: str
    """IntrInfo pattern for drivers before R575 (32 characters, bit 31 first; '-' is free)."""
    v2: str
    """IntrInfo pattern from R575 on."""
    error_statuses: tuple[int, ...] | None
    """The error-status register values the row covers; None covers any."""
    immediate: str
    action2_v1: str
    action2_v2: str
    action2: str
    """The bucket when IntrInfo matches the action-2 pattern instead ("promotable" rows)."""
    investigatory: str
    severity: str
    hw_sw: str


NVLINK5_RULES: tuple[Nvlink5Rule, ...] = tuple(
    Nvlink5Rule(*row) for row in xid_catalog.NVLINK5_DECODE
)

NVLINK5_BUCKET_RANK: dict[str, int] = {"IGNORE": 0, "XID_154_EVAL": 1, "RESET_GPU": 2}
"""How severe each decoded bucket is, to pick one when several rows match."""


@dataclasses.dataclass(frozen=True, slots=True)
class Nvlink5Decode:
    """The row an Xid 144-150 message matched, and the bucket it decides."""

    rule: Nvlink5Rule
    bucket: str
    """NVIDIA's bucket: IGNORE, RESET_GPU or XID_154_EVAL (or a bucket this agent does not
    know, which the verdict core treats as undecoded)."""
    by_action2: bool = False


def pattern_matches(pattern: str, value: int) -> bool:
    """Say whether a 32-bit register value matches one of NVIDIA's 0/1/- patterns."""
    if len(pattern) != 32:
        return False
    for position, char in enumerate(pattern):
        bit = (value >> (31 - position)) & 1
        if (char == "1" and bit != 1) or (char == "0" and bit != 0):
            return False
    return True


def driver_is_r575_or_newer(driver_version: str) -> bool | None:
    """Say which IntrInfo encoding a driver writes (V2 from R575 on); None when unknown."""
    match = re.match(r"\A(\d+)\.", driver_version.strip())
    if match is None:
        return None
    return int(match.group(1)) >= 575


def decode_nvlink5(
    xid: int, intr_info: int, error_status: int | None, *, r575: bool | None
) -> Nvlink5Decode | None:
    """Decode an Xid 144-150 message by NVIDIA's sheet; None when no row matches.

    `r575` picks the pattern set (True: V2, False: V1, None: either). A row matches when its
    IntrInfo pattern (or its action-2 pattern) matches and its error status covers the
    message's; when several match, the most severe bucket wins.
    """
    versions = {True: ("v2",), False: ("v1",), None: ("v2", "v1")}[r575]
    found: list[Nvlink5Decode] = []
    for rule in NVLINK5_RULES:
        if rule.xid != xid:
            continue
        if rule.error_statuses is not None and error_status not in rule.error_statuses:
            continue
        for version in versions:
            base = rule.v1 if version == "v1" else rule.v2
            second = rule.action2_v1 if version == "v1" else rule.action2_v2
            if base and pattern_matches(base, intr_info):
                found.append(Nvlink5Decode(rule, rule.immediate))
                break
            if second and rule.action2 and pattern_matches(second, intr_info):
                found.append(Nvlink5Decode(rule, rule.action2, by_action2=True))
                break
    if not found:
        return None
    return max(found, key=lambda d: NVLINK5_BUCKET_RANK.get(d.bucket, len(NVLINK5_BUCKET_RANK)))


# ---------------------------------------------------------------- dcgm-exporter's err_msg
EXPORTER_UNKNOWN_ERROR = "Unknown Error"


def exporter_err_msg(code: int) -> str:
    """Return the `err_msg` label dcgm-exporter puts on `DCGM_FI_DEV_XID_ERRORS` for a value."""
    if 0 <= code < len(xid_catalog.EXPORTER_XID_TEXT):
        return xid_catalog.EXPORTER_XID_TEXT[code]
    return EXPORTER_UNKNOWN_ERROR
