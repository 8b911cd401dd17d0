"""DCGM's error codes and the severity DCGM gives each: the table `dcgmi` decides by.

Generated from NVIDIA/DCGM `dcgmlib/src/dcgm_errors.c` (`dcgmErrorMeta`, the severity column)
and `dcgmlib/dcgm_errors.h` (`dcgmError_t` numbers, `dcgmErrorSeverity_t`) at commit
`72fa3feaa67d716a75323a8f47c34ff3ee73f824` (DCGM 4.6.0). DCGM only appends codes ("New error
codes must be added to end of enum to maintain backwards compatibility", dcgm_errors.h), so a
3.x run's `error_id` means the same error here.

The severities are an enum, not a scale (dcgm_errors.h:177-185): RESET (6) is not "worse" than
ISOLATE (2). `dcgmi/Diag.cpp` `Diag::GetFailureResult` (lines 248-290 at that commit) walks a
run's errors and stops at the first whose code `dcgmErrorGetPriorityByCode` rates ISOLATE
("Stop here as a serious error was reported", DCGM_ST_NVVS_ISOLATE_ERROR); any other error makes
the run a plain DCGM_ST_NVVS_ERROR. `precedence` below follows that order (see its docstring).
"""

from __future__ import annotations

import enum


class Severity(enum.IntEnum):
    """`dcgmErrorSeverity_t` (dcgm_errors.h:177-185)."""

    NONE = 0
    MONITOR = 1
    """Can perform workload, but needs to be monitored."""
    ISOLATE = 2
    """Cannot perform workload. GPU should be isolated."""
    UNKNOWN = 3
    """This error code is not recognized."""
    TRIAGE = 4
    """This error should be triaged."""
    CONFIG = 5
    """This error can be configured."""
    RESET = 6
    """Drain and reset GPU."""


ERRORS: dict[int, tuple[str, Severity]] = {
    0: ("OK", Severity.UNKNOWN),
    1: ("UNKNOWN", Severity.UNKNOWN),
    2: ("UNRECOGNIZED", Severity.UNKNOWN),
    3: ("PCI_REPLAY_RATE", Severity.ISOLATE),
    4: ("VOLATILE_DBE_DETECTED", Severity.ISOLATE),
    5: ("VOLATILE_SBE_DETECTED", Severity.MONITOR),
    6: ("PENDING_PAGE_RETIREMENTS", Severity.RESET),
    7: ("RETIRED_PAGES_LIMIT", Severity.ISOLATE),
    8: ("RETIRED_PAGES_DBE_LIMIT", Severity.ISOLATE),
    9: ("CORRUPT_INFOROM", Severity.TRIAGE),
    10: ("CLOCKS_EVENT_THERMAL", Severity.MONITOR),
    11: ("POWER_UNREADABLE", Severity.MONITOR),
    12: ("CLOCKS_EVENT_POWER", Severity.MONITOR),
    13: ("NVLINK_ERROR_THRESHOLD", Severity.ISOLATE),
    14: ("NVLINK_DOWN", Severity.TRIAGE),
    15: ("NVSWITCH_FATAL_ERROR", Severity.ISOLATE),
    16: ("NVSWITCH_NON_FATAL_ERROR", Severity.MONITOR),
    17: ("NVSWITCH_DOWN", Severity.MONITOR),
    18: ("NO_ACCESS_TO_FILE", Severity.CONFIG),
    19: ("NVML_API", Severity.MONITOR),
    20: ("DEVICE_COUNT_MISMATCH", Severity.CONFIG),
    21: ("BAD_PARAMETER", Severity.UNKNOWN),
    22: ("CANNOT_OPEN_LIB", Severity.TRIAGE),
    23: ("DENYLISTED_DRIVER", Severity.CONFIG),
    24: ("NVML_LIB_BAD", Severity.ISOLATE),
    25: ("GRAPHICS_PROCESSES", Severity.RESET),
    26: ("HOSTENGINE_CONN", Severity.MONITOR),
    27: ("FIELD_QUERY", Severity.MONITOR),
    28: ("BAD_CUDA_ENV", Severity.CONFIG),
    29: ("PERSISTENCE_MODE", Severity.CONFIG),
    30: ("LOW_BANDWIDTH", Severity.TRIAGE),
    31: ("HIGH_LATENCY", Severity.TRIAGE),
    32: ("CANNOT_GET_FIELD_TAG", Severity.MONITOR),
    33: ("FIELD_VIOLATION", Severity.ISOLATE),
    34: ("FIELD_THRESHOLD", Severity.MONITOR),
    35: ("FIELD_VIOLATION_DBL", Severity.ISOLATE),
    36: ("FIELD_THRESHOLD_DBL", Severity.ISOLATE),
    37: ("UNSUPPORTED_FIELD_TYPE", Severity.TRIAGE),
    38: ("FIELD_THRESHOLD_TS", Severity.ISOLATE),
    39: ("FIELD_THRESHOLD_TS_DBL", Severity.ISOLATE),
    40: ("THERMAL_VIOLATIONS", Severity.MONITOR),
    41: ("THERMAL_VIOLATIONS_TS", Severity.MONITOR),
    42: ("TEMP_VIOLATION", Severity.MONITOR),
    43: ("CLOCKS_EVENT_VIOLATION", Severity.MONITOR),
    44: ("INTERNAL", Severity.TRIAGE),
    45: ("PCIE_GENERATION", Severity.TRIAGE),
    46: ("PCIE_WIDTH", Severity.CONFIG),
    47: ("ABORTED", Severity.CONFIG),
    48: ("TEST_DISABLED", Severity.CONFIG),
    49: ("CANNOT_GET_STAT", Severity.TRIAGE),
    50: ("STRESS_LEVEL", Severity.TRIAGE),
    51: ("CUDA_API", Severity.MONITOR),
    52: ("FAULTY_MEMORY", Severity.ISOLATE),
    53: ("CANNOT_SET_WATCHES", Severity.MONITOR),
    54: ("CUDA_UNBOUND", Severity.TRIAGE),
    55: ("ECC_DISABLED", Severity.CONFIG),
    56: ("MEMORY_ALLOC", Severity.TRIAGE),
    57: ("CUDA_DBE", Severity.ISOLATE),
    58: ("MEMORY_MISMATCH", Severity.ISOLATE),
    59: ("CUDA_DEVICE", Severity.TRIAGE),
    60: ("ECC_UNSUPPORTED", Severity.CONFIG),
    61: ("ECC_PENDING", Severity.MONITOR),
    62: ("MEMORY_BANDWIDTH", Severity.TRIAGE),
    63: ("TARGET_POWER", Severity.TRIAGE),
    64: ("API_FAIL", Severity.TRIAGE),
    65: ("API_FAIL_GPU", Severity.TRIAGE),
    66: ("CUDA_CONTEXT", Severity.TRIAGE),
    67: ("DCGM_API", Severity.TRIAGE),
    68: ("CONCURRENT_GPUS", Severity.CONFIG),
    69: ("TOO_MANY_ERRORS", Severity.MONITOR),
    70: ("NVLINK_CRC_ERROR_THRESHOLD", Severity.ISOLATE),
    71: ("NVLINK_ERROR_CRITICAL", Severity.ISOLATE),
    72: ("ENFORCED_POWER_LIMIT", Severity.CONFIG),
    73: ("MEMORY_ALLOC_HOST", Severity.TRIAGE),
    74: ("GPU_OP_MODE", Severity.MONITOR),
    75: ("NO_MEMORY_CLOCKS", Severity.MONITOR),
    76: ("NO_GRAPHICS_CLOCKS", Severity.MONITOR),
    77: ("HAD_TO_RESTORE_STATE", Severity.TRIAGE),
    78: ("L1TAG_UNSUPPORTED", Severity.CONFIG),
    79: ("L1TAG_MISCOMPARE", Severity.ISOLATE),
    80: ("ROW_REMAP_FAILURE", Severity.RESET),
    81: ("UNCONTAINED_ERROR", Severity.ISOLATE),
    82: ("EMPTY_GPU_LIST", Severity.CONFIG),
    83: ("DBE_PENDING_PAGE_RETIREMENTS", Severity.RESET),
    84: ("UNCORRECTABLE_ROW_REMAP", Severity.RESET),
    85: ("PENDING_ROW_REMAP", Severity.RESET),
    86: ("BROKEN_P2P_MEMORY_DEVICE", Severity.ISOLATE),
    87: ("BROKEN_P2P_WRITER_DEVICE", Severity.ISOLATE),
    88: ("NVSWITCH_NVLINK_DOWN", Severity.ISOLATE),
    89: ("EUD_BINARY_PERMISSIONS", Severity.TRIAGE),
    90: ("EUD_NON_ROOT_USER", Severity.TRIAGE),
    91: ("EUD_SPAWN_FAILURE", Severity.TRIAGE),
    92: ("EUD_TIMEOUT", Severity.TRIAGE),
    93: ("EUD_ZOMBIE", Severity.TRIAGE),
    94: ("EUD_NON_ZERO_EXIT_CODE", Severity.TRIAGE),
    95: ("EUD_TEST_FAILED", Severity.ISOLATE),
    96: ("FILE_CREATE_PERMISSIONS", Severity.CONFIG),
    97: ("PAUSE_RESUME_FAILED", Severity.TRIAGE),
    98: ("PCIE_H_REPLAY_VIOLATION", Severity.ISOLATE),
    99: ("GPU_EXPECTED_NVLINKS_UP", Severity.TRIAGE),
    100: ("NVSWITCH_EXPECTED_NVLINKS_UP", Severity.TRIAGE),
    101: ("XID_ERROR", Severity.TRIAGE),
    102: ("SBE_VIOLATION", Severity.ISOLATE),
    103: ("DBE_VIOLATION", Severity.ISOLATE),
    104: ("PCIE_REPLAY_VIOLATION", Severity.ISOLATE),
    105: ("SBE_THRESHOLD_VIOLATION", Severity.ISOLATE),
    106: ("DBE_THRESHOLD_VIOLATION", Severity.ISOLATE),
    107: ("PCIE_REPLAY_THRESHOLD_VIOLATION", Severity.ISOLATE),
    108: ("CUDA_FM_NOT_INITIALIZED", Severity.MONITOR),
    109: ("SXID_ERROR", Severity.ISOLATE),
    110: ("GFLOPS_THRESHOLD_VIOLATION", Severity.TRIAGE),
    111: ("NAN_VALUE", Severity.ISOLATE),
    112: ("FABRIC_MANAGER_TRAINING_ERROR", Severity.CONFIG),
    113: ("BROKEN_P2P_PCIE_MEMORY_DEVICE", Severity.ISOLATE),
    114: ("BROKEN_P2P_PCIE_WRITER_DEVICE", Severity.ISOLATE),
    115: ("BROKEN_P2P_NVLINK_MEMORY_DEVICE", Severity.ISOLATE),
    116: ("BROKEN_P2P_NVLINK_WRITER_DEVICE", Severity.ISOLATE),
    117: ("TEST_SKIPPED", Severity.CONFIG),
    118: ("SRAM_THRESHOLD", Severity.ISOLATE),
    119: ("NVLINK_EFFECTIVE_BER_THRESHOLD", Severity.ISOLATE),
    120: ("FALLEN_OFF_BUS", Severity.ISOLATE),
    121: ("NVLINK_SYMBOL_BER_THRESHOLD", Severity.ISOLATE),
    122: ("IMEX_UNHEALTHY", Severity.ISOLATE),
    123: ("FABRIC_PROBE_STATE", Severity.MONITOR),
    124: ("BINARY_PERMISSIONS", Severity.TRIAGE),
    125: ("GPU_RECOVERY_RESET", Severity.RESET),
    126: ("GPU_RECOVERY_REBOOT", Severity.ISOLATE),
    127: ("GPU_RECOVERY_DRAIN_P2P", Severity.RESET),
    128: ("GPU_RECOVERY_DRAIN_RESET", Severity.RESET),
    129: ("NCCL_ERROR", Severity.RESET),
    130: ("RETEST_REQUESTED", Severity.TRIAGE),
    131: ("CONTAINED_ERROR", Severity.MONITOR),
    132: ("UNCORRECTABLE_ROW_REMAP_LIMIT", Severity.TRIAGE),
}
"""`dcgmError_t` code -> (name without `DCGM_FR_`, severity), row for row as `dcgmErrorMeta`."""

ISOLATE_CODES: frozenset[int] = frozenset(
    code for code, (_, severity) in ERRORS.items() if severity is Severity.ISOLATE
)
"""The codes `GetFailureResult` stops at (FAULTY_MEMORY, MEMORY_MISMATCH, NAN_VALUE, ...)."""

_RANK: dict[Severity, int] = {
    Severity.ISOLATE: 4,
    Severity.TRIAGE: 3,
    Severity.UNKNOWN: 3,
    Severity.RESET: 2,
    Severity.CONFIG: 1,
    Severity.MONITOR: 1,
    Severity.NONE: 0,
}


def severity_of(error_id: int | None, printed: int | None) -> Severity | None:
    """The severity one error carries, as `GetFailureResult` judges it.

    `GetFailureResult` rates an error by its code (`dcgmErrorGetPriorityByCode`), so a code in an
    ISOLATE row is ISOLATE whatever severity was printed beside it; otherwise the printed
    severity stands, and a layout that prints none (3.2: `error_id` only) takes the table's.
    Code 0 (DCGM_FR_OK) names no error, as `GetFailureResult` reads it.
    """
    if error_id is not None and error_id in ISOLATE_CODES:
        return Severity.ISOLATE
    if printed is not None:
        try:
            return Severity(printed)
        except ValueError:
            return Severity.UNKNOWN
    if error_id is None or error_id == 0:
        return None
    entry = ERRORS.get(error_id)
    return entry[1] if entry is not None else Severity.UNKNOWN


def precedence(severities: list[Severity]) -> Severity | None:
    """The severity that decides for a set of errors: DCGM's order, not the numeric maximum.

    ISOLATE first, as `GetFailureResult` stops at it. Then TRIAGE and UNKNOWN, which ask a
    person to look: a GPU reset clears a latch only through the automatic level-1 diagnostic,
    which does not re-run the level-2/3 test that found a TRIAGE error, so letting RESET win
    would release a finding nobody looked at (the same hole as ISOLATE+RESET). Then RESET;
    CONFIG and MONITOR ("can perform workload") last. None for no severity at all.
    """
    if not severities:
        return None
    return max(severities, key=_RANK.__getitem__)
