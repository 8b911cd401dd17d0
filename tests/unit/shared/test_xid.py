"""The Xid catalog against NVIDIA's published rows, and the Xid 144-150 subcode decode.

The rows pinned here are checked against NVIDIA's Xid catalog page
(docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html) and its `Xid-Catalog.xlsx`
("Xids" and "Xid 144-150 Decode" sheets), from which `shared/xid_catalog.py` is generated.
The kernel-log lines come from other projects' tests of the same messages: NVIDIA/NVSentinel
`health-monitors/syslog-health-monitor/pkg/xid/parser/csv_test.go` (0x025525c6) and
leptonai/gpud `components/accelerator/nvidia/xid` (0x021425c6, 0x000625c6, the R575+ lines).
"""

from __future__ import annotations

import collections

import pytest

from agent.probing import kmsg
from shared import xid, xid_catalog

C = xid.XidClass


@pytest.mark.parametrize(
    ("code", "immediate", "investigatory"),
    [
        pytest.param(79, "RESTART_BM", "CONTACT_SUPPORT", id="79 fell off the bus: restart"),
        pytest.param(48, "WORKFLOW_XID_48", "WORKFLOW_XID_48", id="48 is NVIDIA's DBE workflow"),
        pytest.param(45, "WORKFLOW_XID_45", "Solo: RESTART_FM\nNot Solo: IGNORE (follow other Xid)",
                     id="45's investigatory text is NVIDIA's, line break included"),
        pytest.param(94, "RESTART_APP", "IGNORE (sympathetic)", id="94 restarts the app"),
        pytest.param(95, "RESET_GPU", "IGNORE (sympathetic)", id="95 resets the GPU"),
        pytest.param(145, "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR",
                     id="145 is NVIDIA's NVLink5 workflow"),
        pytest.param(154, "XID_154", "N/A Informational only regarding another Xid",
                     id="154 points at another Xid"),
        pytest.param(157, "IGNORE", "CONTACT_SUPPORT", id="157 is IGNORE"),
        pytest.param(69, "RESTART_APP", "CHECK_APP/CUDA", id="69 checks the application"),
        pytest.param(167, "", "", id="167 has no bucket yet"),
    ],
)  # fmt: skip
def test_rows_are_nvidias_cells_verbatim(code: int, immediate: str, investigatory: str) -> None:
    """A sample of rows carries NVIDIA's immediate and investigatory buckets exactly."""
    entry = xid.CATALOG[code]
    assert (immediate, investigatory) == (entry.immediate, entry.investigatory)


def test_the_catalog_records_the_spreadsheet_it_came_from() -> None:
    """The generated table names its source and the SHA-256 NVSentinel published for it."""
    expected = "7f70ce9684be0c9d98a367770341ccc1d8bca4465cebe42dab7e23d57df5d5a5"
    assert expected == xid_catalog.SOURCE["catalog_sha256"]
    assert xid_catalog.SOURCE["catalog_modified"].startswith("2025-09-30")
    assert len(xid.CATALOG) == 172
    assert list(range(1, 173)) == sorted(xid.CATALOG)


def test_every_bucket_of_the_catalog_has_a_reading() -> None:
    """A bucket NVIDIA adds later fails this test instead of silently reading Ignore."""
    buckets = {entry.immediate for entry in xid.CATALOG.values()}
    assert set() == buckets - set(xid.BUCKET_CLASS) - {"CONTACT_SUPPORT"}


@pytest.mark.parametrize(
    ("codes", "klass"),
    [
        pytest.param((79, 151), C.REBOOT, id="restart buckets need a reboot"),
        pytest.param((95, 62, 109, 119, 120, 140, 143, 74, 159), C.RESET, id="reset buckets"),
        pytest.param((54, 142), C.INSPECT, id="mechanics and support on a listed product"),
        pytest.param((13, 31, 32, 43, 45, 68, 69, 94, 39, 139), C.APPLICATION,
                     id="application xids, 43 pinned by DESIGN"),
        pytest.param((48, 64, 154), C.WORKFLOW, id="workflows decided by other readings"),
        pytest.param(tuple(range(144, 151)), C.NVLINK5, id="144-150 are decided per subcode"),
        pytest.param((157, 63, 92, 121, 1, 61, 78, 167, 172), C.IGNORE,
                     id="ignore, unused and unclassified rows are counted only"),
    ],
)  # fmt: skip
def test_each_bucket_reads_as_its_class(codes: tuple[int, ...], klass: xid.XidClass) -> None:
    """Our reading of NVIDIA's buckets (DESIGN.md section 5)."""
    assert dict.fromkeys(codes, klass) == {code: xid.lookup(code).xid_class for code in codes}


def test_reason_codes_are_condition_reasons() -> None:
    """Every reason code is a valid PascalCase condition reason, and the old names stay."""
    pattern = __import__("re").compile(r"\A[A-Z][A-Za-z0-9]{0,62}\Z")
    assert all(pattern.fullmatch(e.reason) for e in xid.CATALOG.values())
    assert xid.lookup(79).reason == "XidFallenOffBus"
    assert xid.lookup(39).reason == "XidCe0Error"
    assert xid.lookup(999).reason == "XidUnlisted"


def test_the_decode_sheet_has_nvidias_counts_per_bucket() -> None:
    """95 rows: 45 IGNORE, 8 XID_154_EVAL, 42 RESET_GPU; every 147 and 148 row is IGNORE."""
    counts = collections.Counter((r.xid, r.immediate) for r in xid.NVLINK5_RULES)
    assert dict(counts) == {
        (144, "IGNORE"): 4, (144, "RESET_GPU"): 2,
        (145, "IGNORE"): 16, (145, "XID_154_EVAL"): 8, (145, "RESET_GPU"): 9,
        (146, "IGNORE"): 15, (146, "RESET_GPU"): 5,
        (147, "IGNORE"): 2, (148, "IGNORE"): 1,
        (149, "IGNORE"): 7, (149, "RESET_GPU"): 24,
        (150, "RESET_GPU"): 2,
    }  # fmt: skip


V1, V2 = False, True


@pytest.mark.parametrize(
    ("code", "intr_info", "status", "r575", "unit", "bucket"),
    [
        pytest.param(149, 0x025525C6, 0, V1, "NETIR_LINK_EVT/NETIR_LINK_DOWN", "RESET_GPU",
                     id="149 link down with a peer-device subcode resets the GPU"),
        pytest.param(149, 0x021425C6, 0, None, "NETIR_LINK_EVT/NETIR_LINK_DOWN", "RESET_GPU",
                     id="149 link down decodes without knowing the driver"),
        pytest.param(149, 0x026625C6, 0, V1, "NETIR_LINK_EVT/NETIR_LINK_DOWN", "IGNORE",
                     id="149 link down with subcode 38 is ignored"),
        pytest.param(149, 0x00000013, 1, V2, "NETIR_BER_EVENT", "IGNORE",
                     id="149 BER events are ignored"),
        pytest.param(145, 0x00000004, 1, V2, "RLW_REMAP", "XID_154_EVAL",
                     id="145 RLW_REMAP follows the accompanying Xid 154"),
        pytest.param(145, 0x00000004, 0x40, V2, "RLW_REMAP", "RESET_GPU",
                     id="145 RLW_REMAP with a fatal status resets the GPU"),
        pytest.param(145, 0x00000006, 1, V2, "RLW_RXPIPE", "IGNORE",
                     id="145 RLW_RXPIPE non-fatal is ignored"),
        pytest.param(145, 0x00000086, 1, V2, "RLW_RXPIPE", "RESET_GPU",
                     id="145 RLW_RXPIPE promoted by its action-2 bit resets the GPU"),
        pytest.param(144, 0x00000001, 2, V2, "SAW_MVB", "RESET_GPU", id="144 fatal SAW"),
        pytest.param(144, 0x00000021, 1, V1, "SAW_MVB", "IGNORE", id="144 non-fatal SAW (V1)"),
        pytest.param(147, 0x0000000E, 0x80000000, V2, "TREX", "IGNORE", id="147 is ignored"),
        pytest.param(148, 0x00000005, 0x80000000, V1, "NVLPW_CTRL/NVLPW", "IGNORE",
                     id="148 is ignored"),
        pytest.param(150, 0x00000000, 0xFFFFFFFF, V2, "MSE Degraded", "RESET_GPU",
                     id="150 MSE degraded resets the GPU"),
    ],
)  # fmt: skip
def test_subcodes_decode_as_nvidias_sheet(  # noqa: PLR0917 - parametrized
    code: int, intr_info: int, status: int, r575: bool | None, unit: str, bucket: str
) -> None:
    """A sample of subcodes each way: IGNORE, XID_154_EVAL and RESET_GPU."""
    decode = xid.decode_nvlink5(code, intr_info, status, r575=r575)
    assert decode is not None
    assert (unit, bucket) == (decode.rule.unit, decode.bucket)


@pytest.mark.parametrize(
    ("code", "intr_info", "status", "r575"),
    [
        pytest.param(145, 0x00000004, 0x4000, V2, id="an error status no row lists"),
        pytest.param(145, 0x0000007F, 1, V2, id="a unit no row lists"),
        pytest.param(145, 0x00000082, 1, V2, id="a V1 encoding read as V2"),
        pytest.param(146, 0x00000004, 1, V2, id="another xid's unit"),
    ],
)  # fmt: skip
def test_an_unknown_subcode_is_not_decoded(
    code: int, intr_info: int, status: int, r575: bool | None
) -> None:
    """No row, no decode: the verdict core keeps it pending rather than guessing."""
    assert xid.decode_nvlink5(code, intr_info, status, r575=r575) is None


def test_147_and_148_are_ignore_whatever_their_registers() -> None:
    """Any message matching a 147 or 148 row decodes IGNORE, each pattern version."""
    for rule in (r for r in xid.NVLINK5_RULES if r.xid in (147, 148)):
        for pattern, r575 in ((rule.v1, V1), (rule.v2, V2)):
            value = int(pattern.replace("-", "0"), 2)
            for status in rule.error_statuses or (0,):
                decode = xid.decode_nvlink5(rule.xid, value, status, r575=r575)
                assert decode is not None
                assert decode.bucket == "IGNORE"


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        pytest.param("570.148.08", False, id="R570 writes V1"),
        pytest.param("575.51.03", True, id="R575 writes V2"),
        pytest.param("580.65.06", True, id="R580 writes V2"),
        pytest.param("", None, id="an unknown driver is undecided"),
        pytest.param("garbage", None, id="a garbled version is undecided"),
    ],
)
def test_the_driver_version_picks_the_intrinfo_encoding(
    version: str, expected: bool | None
) -> None:
    """R575 changed the IntrInfo encoding (NVIDIA's sheet: V1 before R575, V2 from R575)."""
    assert expected == xid.driver_is_r575_or_newer(version)


@pytest.mark.parametrize(
    ("line", "unit", "intr_info", "status", "recovery"),
    [
        pytest.param("NVRM: Xid (PCI:0018:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 09 "
                     "(0x025525c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
                     "NETIR_LINK_EVT", 0x025525C6, 0, None, id="an R570 link-down line"),
        pytest.param("NVRM: Xid (PCI:0000:04:00): 145, RLW_REMAP Nonfatal XC0 i0 Link 00 "
                     "(0x00000004 0x00000001 0x00000000 0x00000000)",
                     "RLW_REMAP", 4, 1, None, id="an R575 remap line"),
        pytest.param("NVRM: Xid (PCI:0000:00:1e): 149, NETIR_LINK_EVT Fatal XC 1 i 2 Link 01 "
                     "[0x0000000a]", "NETIR_LINK_EVT", 10, None, None,
                     id="registers in brackets without an error status"),
        pytest.param("NVRM: Xid (PCI:0008:01:00): 154, GPU recovery action changed from 0x0 "
                     "(None) to 0x1 (GPU Reset Required)", "", None, None, 1,
                     id="xid 154 names the new recovery action"),
        pytest.param("NVRM: Xid (PCI:0000:04:00): 149, something else", "", None, None, None,
                     id="a 149 line without registers carries no decode"),
        pytest.param("NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.",
                     "", None, None, None, id="other xids carry no detail"),
    ],
)  # fmt: skip
def test_kernel_log_lines_give_the_registers(
    line: str, unit: str, intr_info: int | None, status: int | None, recovery: int | None
) -> None:
    """The reader takes IntrInfo and error status (or Xid 154's new action) from the line."""
    assert kmsg.XidDetail(unit, intr_info, status, recovery) == kmsg.parse_detail(line)


@pytest.mark.parametrize(
    ("code", "text"),
    [
        pytest.param(0, "No Error", id="zero is no error"),
        pytest.param(79, "GPU has fallen off the bus", id="79"),
        pytest.param(144, "NVLINK: Saw Error", id="144 keeps dcgm-exporter's spelling"),
        pytest.param(172, "Uncorrectable SRAM Error", id="the last row of the table"),
        pytest.param(173, "Unknown Error", id="past the table"),
        pytest.param(-1, "Unknown Error", id="below the table"),
    ],
)
def test_err_msg_is_dcgm_exporters_text(code: int, text: str) -> None:
    """`err_msg` is dcgm-exporter's xidErrCodeToText, "Unknown Error" outside it."""
    assert text == xid.exporter_err_msg(code)
