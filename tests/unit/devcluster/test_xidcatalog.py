"""The Xid catalog generator reads NVIDIA's spreadsheet layout and refuses a changed one.

The spreadsheet here is built in the test with NVIDIA's sheet names and column titles (the
real one is not committed: it is a binary); rows are copied from NVIDIA's catalog.
"""

from __future__ import annotations

import datetime as dt
import pathlib
import zipfile
from typing import Any
from xml.sax import saxutils

import pytest

from devcluster import xidcatalog

XIDS_TITLES = {
    "A": "Type \n(XID)", "B": "Code", "C": "Mnemonic", "D": "Description",
    "E": "Applies to\nA100", "F": "Applies to\nH100", "G": "Applies to\nB100",
    "H": "Applies to\nGB200", "I": "Resolution Bucket \n(Immediate Action)",
    "J": "Resolution Bucket \n(Investigatory Action)", "K": "Xid 154 linkage",
    "L": "Trigger Conditions",
}  # fmt: skip
DECODE_TITLES = {
    "A": "Xid", "B": "Subcode V1(<R575)/V2(>=R575)",
    "C": "(V1(<R575)) IntrInfo decode for Data Center Recovery Action",
    "D": "(V2(>=R575)) IntrInfo decode for Data Center Recovery Action",
    "E": "Error Status (hex)", "F": "Resolution Bucket \n(Data Center Recovery Action)",
    "G": "(V1(<R575)) Decode for action 2", "H": "(V2(>=R575)) Decode for action 2",
    "I": "Action 2", "J": "Resolution Bucket \n(Investigatory Action)",
    "K": "Severity (for items with '*' please see Customer User Guide tab)", "L": "HW/SW",
}  # fmt: skip
XID_79 = {
    "A": "XID", "B": "79", "C": "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS",
    "D": "GPU has fallen off the bus", "E": "YES", "F": "YES", "G": "YES", "H": "YES",
    "I": "RESTART_BM", "J": "CONTACT_SUPPORT", "K": "CUDA 12.7; GPU driver R565",
}  # fmt: skip
RXPIPE = {
    "A": "145", "B": "RLW_RXPIPE", "C": "------000000---------00011000010",
    "D": "------000000------------00000110", "E": "0x00000001", "F": "IGNORE",
    "G": "------000000---------10011000010", "H": "------000000------------10000110",
    "I": "RESET_GPU", "J": "CONTACT_SUPPORT", "K": "Non-fatal*", "L": "HW",
}  # fmt: skip
GO = "\n".join(
    [
        "package collector",
        "var xidErrCodeToText = []string{",
        '\t0: "No Error",',
        '\t1: "Invalid",',
        "}",
    ]
)


def _sheet(rows: list[dict[str, str]]) -> str:
    out = []
    for number, row in enumerate(rows, start=1):
        cells = "".join(
            f'<c r="{col}{number}" t="inlineStr"><is><t>{saxutils.escape(text)}</t></is></c>'
            for col, text in row.items()
        )
        out.append(f'<row r="{number}">{cells}</row>')
    main = "http://schemas.openxmlformats.org/spreadsheetml/2006/main"
    return f'<worksheet xmlns="{main}"><sheetData>{"".join(out)}</sheetData></worksheet>'


def xlsx(
    path: pathlib.Path,
    xids: list[dict[str, str]],
    decode: list[dict[str, str]],
    titles: dict[str, str] = XIDS_TITLES,
) -> None:
    """Write a two-sheet workbook in NVIDIA's layout."""
    main = "http://schemas.openxmlformats.org/spreadsheetml/2006/main"
    rel = "http://schemas.openxmlformats.org/officeDocument/2006/relationships"
    with zipfile.ZipFile(path, "w") as book:
        book.writestr(
            "xl/workbook.xml",
            f'<workbook xmlns="{main}" xmlns:r="{rel}"><sheets>'
            '<sheet name="Xids" sheetId="1" r:id="rId1"/>'
            '<sheet name="Xid 144-150 Decode" sheetId="2" r:id="rId2"/></sheets></workbook>',
        )
        book.writestr(
            "xl/_rels/workbook.xml.rels",
            '<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
            '<Relationship Id="rId1" Target="worksheets/sheet1.xml"/>'
            '<Relationship Id="rId2" Target="worksheets/sheet2.xml"/></Relationships>',
        )
        book.writestr("xl/worksheets/sheet1.xml", _sheet([titles, *xids]))
        book.writestr("xl/worksheets/sheet2.xml", _sheet([DECODE_TITLES, *decode]))


def generate(
    tmp_path: pathlib.Path, xids: list[dict[str, str]], titles: dict[str, str] = XIDS_TITLES
) -> dict[str, Any]:
    """Render the module from a workbook and run it; return its names."""
    book, go = tmp_path / "Xid-Catalog.xlsx", tmp_path / "xid_errors.go"
    xlsx(book, xids, [RXPIPE], titles)
    go.write_text(GO)
    text = xidcatalog.render(
        xlsx=book, xlsx_origin="test", exporter_go=go, exporter_origin="test",
        now=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
    )  # fmt: skip
    names: dict[str, Any] = {}
    exec(compile(text, "xid_catalog.py", "exec"), names)  # noqa: S102 - our own output
    return names


def test_rows_are_carried_verbatim(tmp_path: pathlib.Path) -> None:
    """Each sheet's cells come through unchanged, with the spreadsheet's digest recorded."""
    names = generate(tmp_path, [XID_79])
    expected = (79, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "GPU has fallen off the bus",
                "RESTART_BM", "CONTACT_SUPPORT", "CUDA 12.7; GPU driver R565",
                ("A100", "H100", "B100", "GB200"))  # fmt: skip
    assert (expected,) == names["XIDS"]
    (decode,) = names["NVLINK5_DECODE"]
    assert (decode[0], decode[1], decode[4], decode[8]) == (145, "RLW_RXPIPE", (1,), "RESET_GPU")
    assert names["EXPORTER_XID_TEXT"] == ("No Error", "Invalid")
    assert len(names["SOURCE"]["catalog_sha256"]) == 64


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        pytest.param({**XID_79, "B": "seventy-nine"}, "is not a number",
                     id="a code that is not a number"),
        pytest.param({**XID_79, "E": "yes"}, "", id="an unexpected applies-to spelling"),
    ],
)  # fmt: skip
def test_a_changed_layout_is_refused_or_read_strictly(
    tmp_path: pathlib.Path, row: dict[str, str], problem: str
) -> None:
    """A malformed code stops the generator; only NVIDIA's exact YES marks a product."""
    if problem:
        with pytest.raises(xidcatalog.CatalogError, match=problem):
            generate(tmp_path, [row])
        return
    names = generate(tmp_path, [row])
    assert names["XIDS"][0][6] == ("H100", "B100", "GB200")


def test_a_renamed_column_is_refused(tmp_path: pathlib.Path) -> None:
    """A column title that moved means the layout changed: refuse rather than misread."""
    with pytest.raises(xidcatalog.CatalogError, match="column I"):
        generate(tmp_path, [XID_79], {**XIDS_TITLES, "I": "Something else"})
