"""Generate `shared/xid_catalog.py` from NVIDIA's published Xid catalog (a developer tool).

NVIDIA publishes its Xid catalog for Ampere and newer as a spreadsheet, `Xid-Catalog.xlsx`,
linked from docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html. Its sheets are the
catalog ("Xids": one row per Xid with the immediate and investigatory resolution buckets),
the NVLink5 decode ("Xid 144-150 Decode": one row per subcode and error status) and the
bucket glossary ("Resolution Buckets"). dcgm-exporter's `err_msg` label text comes from its
own table, `internal/pkg/collector/xid_errors.go`.

This module reads both (stdlib only: an .xlsx is a zip of XML) and writes one Python data
module, so the agent carries NVIDIA's rows verbatim and records where they came from:

    python -m devcluster.xidcatalog --xlsx Xid-Catalog.xlsx \\
        --xlsx-origin "NVIDIA/NVSentinel health-monitors/.../Xid-Catalog.xlsx @ <commit>" \\
        --exporter-go xid_errors.go --exporter-origin "NVIDIA/dcgm-exporter 4.5.3-4.8.2 @ <sha>"

Neither input is committed (the spreadsheet is a binary; the Go file is another project's
code); the generated module is, with the SHA-256 of the spreadsheet it was made from.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import pathlib
import re
import subprocess
import sys
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from xml.etree import ElementTree as ET

_MAIN = "{http://schemas.openxmlformats.org/spreadsheetml/2006/main}"
_DOC = "{http://purl.org/dc/terms/}"
_REL = "{http://schemas.openxmlformats.org/officeDocument/2006/relationships}id"
REPO = pathlib.Path(__file__).resolve().parents[1]
OUTPUT = REPO / "shared" / "xid_catalog.py"

Row = dict[str, str]


class CatalogError(Exception):
    """The spreadsheet or the Go table is not laid out as this generator expects."""


def _column(ref: str) -> str:
    match = re.match(r"[A-Z]+", ref)
    if match is None:
        msg = f"cell reference {ref!r} has no column"
        raise CatalogError(msg)
    return match.group(0)


def read_sheets(path: pathlib.Path) -> dict[str, list[Row]]:
    """Return every sheet of an .xlsx as rows of {column letter: cell text}."""
    with zipfile.ZipFile(path) as book:
        strings: list[str] = []
        if "xl/sharedStrings.xml" in book.namelist():
            root = ET.fromstring(book.read("xl/sharedStrings.xml"))  # noqa: S314
            strings = ["".join(t.text or "" for t in si.iter(f"{_MAIN}t")) for si in root]
        workbook = ET.fromstring(book.read("xl/workbook.xml"))  # noqa: S314
        rels = ET.fromstring(book.read("xl/_rels/workbook.xml.rels"))  # noqa: S314
        targets = {r.get("Id"): r.get("Target", "") for r in rels}
        sheets: dict[str, list[Row]] = {}
        for sheet in workbook.iter(f"{_MAIN}sheet"):
            target = targets[sheet.get(_REL)].lstrip("/")
            name = target if target.startswith("xl/") else f"xl/{target}"
            data = ET.fromstring(book.read(name))  # noqa: S314
            sheets[sheet.get("name", "")] = list(_rows(data, strings))
        return sheets


def _rows(sheet: ET.Element, strings: Sequence[str]) -> Iterator[Row]:
    for row in sheet.iter(f"{_MAIN}row"):
        cells: Row = {}
        for cell in row.findall(f"{_MAIN}c"):
            value = cell.find(f"{_MAIN}v")
            if value is not None and value.text is not None:
                text = strings[int(value.text)] if cell.get("t") == "s" else value.text
            else:
                inline = cell.find(f"{_MAIN}is")
                if inline is None:
                    continue
                text = "".join(t.text or "" for t in inline.iter(f"{_MAIN}t"))
            cells[_column(cell.get("r", ""))] = text
        if cells:
            yield cells


def modified_at(path: pathlib.Path) -> str:
    """Return the spreadsheet's own last-modified stamp (docProps/core.xml), or ''."""
    with zipfile.ZipFile(path) as book:
        if "docProps/core.xml" not in book.namelist():
            return ""
        core = ET.fromstring(book.read("docProps/core.xml"))  # noqa: S314
        node = core.find(f"{_DOC}modified")
        return (node.text or "") if node is not None else ""


def _header(rows: Sequence[Row], sheet: str, expected: Mapping[str, str]) -> None:
    """Refuse a layout change: each column must still start with the expected title."""
    if not rows:
        msg = f"sheet {sheet!r} is empty"
        raise CatalogError(msg)
    for col, title in expected.items():
        got = " ".join(rows[0].get(col, "").split())
        if not got.startswith(title):
            msg = f"sheet {sheet!r} column {col}: expected a title starting {title!r}, got {got!r}"
            raise CatalogError(msg)


XIDS_HEADER = {
    "B": "Code",
    "C": "Mnemonic",
    "D": "Description",
    "E": "Applies to A100",
    "F": "Applies to H100",
    "G": "Applies to B100",
    "H": "Applies to GB200",
    "I": "Resolution Bucket (Immediate Action)",
    "J": "Resolution Bucket (Investigatory Action)",
    "K": "Xid 154 linkage",
}
DECODE_HEADER = {
    "A": "Xid",
    "B": "Subcode",
    "C": "(V1(<R575)) IntrInfo decode",
    "D": "(V2(>=R575)) IntrInfo decode",
    "E": "Error Status (hex)",
    "F": "Resolution Bucket",
    "G": "(V1(<R575)) Decode for action 2",
    "H": "(V2(>=R575)) Decode for action 2",
    "I": "Action 2",
    "J": "Resolution Bucket (Investigatory Action)",
    "K": "Severity",
    "L": "HW/SW",
}
_PATTERN = re.compile(r"\A[01-]{32}\Z")


def catalog_rows(rows: Sequence[Row]) -> list[tuple[object, ...]]:
    """Rows of the "Xids" sheet as (code, mnemonic, description, immediate, investigatory,
    Xid 154 linkage, products it applies to), all text verbatim."""
    _header(rows, "Xids", XIDS_HEADER)
    products = {"E": "A100", "F": "H100", "G": "B100", "H": "GB200"}
    out: list[tuple[object, ...]] = []
    for row in rows[1:]:
        code = row.get("B", "").strip()
        if not code.isdigit():
            msg = f"Xids sheet: code {code!r} is not a number"
            raise CatalogError(msg)
        applies = tuple(p for col, p in products.items() if row.get(col, "").strip() == "YES")
        out.append(
            (
                int(code),
                row.get("C", ""),
                row.get("D", ""),
                row.get("I", ""),
                row.get("J", ""),
                row.get("K", ""),
                applies,
            )
        )
    codes = [r[0] for r in out]
    if len(set(codes)) != len(codes):
        msg = "Xids sheet: a code appears twice"
        raise CatalogError(msg)
    return out


def _pattern(text: str, where: str) -> str:
    value = text.strip()
    if value and not _PATTERN.fullmatch(value):
        msg = f"{where}: {value!r} is not a 32-bit pattern of 0, 1 and -"
        raise CatalogError(msg)
    return value


def decode_rows(rows: Sequence[Row]) -> list[tuple[object, ...]]:
    """Rows of the "Xid 144-150 Decode" sheet as (xid, unit, V1 pattern, V2 pattern, error
    statuses or None for any, immediate bucket, action-2 V1, action-2 V2, action-2 bucket,
    investigatory bucket, severity, HW/SW)."""
    _header(rows, "Xid 144-150 Decode", DECODE_HEADER)
    out: list[tuple[object, ...]] = []
    for number, row in enumerate(rows[1:], start=2):
        where = f"Xid 144-150 Decode row {number}"
        xid = row.get("A", "").strip()
        if not xid.isdigit() or not 144 <= int(xid) <= 150:
            msg = f"{where}: Xid {xid!r} is not one of 144-150"
            raise CatalogError(msg)
        raw_status = row.get("E", "").strip()
        statuses: tuple[int, ...] | None = None
        if raw_status:
            try:
                statuses = tuple(int(s.strip(), 16) for s in raw_status.split("/"))
            except ValueError as err:
                msg = f"{where}: error status {raw_status!r} is not hex"
                raise CatalogError(msg) from err
        out.append(
            (
                int(xid),
                row.get("B", ""),
                _pattern(row.get("C", ""), where),
                _pattern(row.get("D", ""), where),
                statuses,
                row.get("F", ""),
                _pattern(row.get("G", ""), where),
                _pattern(row.get("H", ""), where),
                row.get("I", ""),
                row.get("J", ""),
                row.get("K", ""),
                row.get("L", ""),
            )
        )
    return out


_GO_ENTRY = re.compile(r'^\s*(?P<code>\d+):\s*"(?P<text>(?:[^"\\]|\\.)*)",\s*$')


def exporter_texts(go_source: str) -> list[tuple[int, str]]:
    """The `xidErrCodeToText` table of dcgm-exporter's xid_errors.go as (code, text)."""
    body = go_source.split("xidErrCodeToText", 1)
    if len(body) != 2:
        msg = "xid_errors.go: no xidErrCodeToText table"
        raise CatalogError(msg)
    table = body[1].split("}", 1)[0]
    out: list[tuple[int, str]] = []
    for line in table.splitlines():
        match = _GO_ENTRY.match(line)
        if match:
            text = match["text"].encode().decode("unicode_escape")
            out.append((int(match["code"]), text))
    if not out or [c for c, _ in out] != list(range(len(out))):
        msg = "xid_errors.go: the table is not a dense list from Xid 0"
        raise CatalogError(msg)
    return out


def render(
    *,
    xlsx: pathlib.Path,
    xlsx_origin: str,
    exporter_go: pathlib.Path,
    exporter_origin: str,
    now: dt.datetime,
) -> str:
    """Return the text of `shared/xid_catalog.py`."""
    sheets = read_sheets(xlsx)
    for name in ("Xids", "Xid 144-150 Decode"):
        if name not in sheets:
            msg = f"{xlsx}: no sheet {name!r} (sheets: {', '.join(sheets)})"
            raise CatalogError(msg)
    catalog = catalog_rows(sheets["Xids"])
    decode = decode_rows(sheets["Xid 144-150 Decode"])
    texts = exporter_texts(exporter_go.read_text())
    digest = hashlib.sha256(xlsx.read_bytes()).hexdigest()
    lines = [
        '"""NVIDIA\'s Xid catalog as data. GENERATED by `python -m devcluster.xidcatalog`; do not',
        "edit: regenerate from a newer Xid-Catalog.xlsx instead (see docs/agent.md).",
        "",
        "Every string is NVIDIA's (or dcgm-exporter's) cell text, verbatim; `shared.xid` reads",
        "these rows and holds our reading of them.",
        '"""',
        "",
        "# ruff: noqa: E501 - verbatim strings",
        "",
        "SOURCE: dict[str, str] = {",
        f'    "catalog": {xlsx.name!r},',
        f'    "catalog_sha256": {digest!r},',
        f'    "catalog_modified": {modified_at(xlsx)!r},',
        f'    "catalog_origin": {xlsx_origin!r},',
        '    "catalog_page": "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html",',
        f'    "exporter_texts_origin": {exporter_origin!r},',
        f'    "generated_at": {now.strftime("%Y-%m-%dT%H:%M:%SZ")!r},',
        "}",
        '"""Where the rows came from: the spreadsheet\'s SHA-256 and its own modified stamp."""',
        "",
        "XIDS: tuple[tuple[int, str, str, str, str, str, tuple[str, ...]], ...] = (",
        *(f"    {row!r}," for row in catalog),
        ")",
        '"""The "Xids" sheet: (code, mnemonic, description, immediate bucket, investigatory',
        'bucket, Xid 154 linkage, products the row applies to)."""',
        "",
        "NVLINK5_DECODE: tuple[",
        "    tuple[int, str, str, str, tuple[int, ...] | None, str, str, str, str, str, str, str],",
        "    ...,",
        "] = (",
        *(f"    {row!r}," for row in decode),
        ")",
        '"""The "Xid 144-150 Decode" sheet: (Xid, subcode unit, V1 (<R575) IntrInfo pattern, V2',
        "(>=R575) pattern, error statuses (None: any), immediate bucket, action-2 V1 pattern,",
        "action-2 V2 pattern, action-2 bucket, investigatory bucket, severity, HW/SW). Patterns",
        'are 32 characters, bit 31 first; "-" bits are not part of the decode."""',
        "",
        "EXPORTER_XID_TEXT: tuple[str, ...] = (",
        *(f"    {text!r},  # {code}" for code, text in texts),
        ")",
        '"""dcgm-exporter\'s `err_msg` text by Xid (index = Xid); beyond it, "Unknown Error"."""',
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Write `shared/xid_catalog.py` (or `--out`), then format it with ruff."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--xlsx", type=pathlib.Path, required=True)
    parser.add_argument("--xlsx-origin", required=True, help="where the spreadsheet came from")
    parser.add_argument("--exporter-go", type=pathlib.Path, required=True)
    parser.add_argument("--exporter-origin", required=True, help="dcgm-exporter tag and commit")
    parser.add_argument("--out", type=pathlib.Path, default=OUTPUT)
    args = parser.parse_args(argv)
    try:
        text = render(
            xlsx=args.xlsx,
            xlsx_origin=args.xlsx_origin,
            exporter_go=args.exporter_go,
            exporter_origin=args.exporter_origin,
            now=dt.datetime.now(dt.UTC),
        )
    except (CatalogError, OSError, zipfile.BadZipFile, ET.ParseError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    args.out.write_text(text)
    ruff = pathlib.Path(sys.executable).with_name("ruff")
    if ruff.exists():
        subprocess.run([str(ruff), "format", "--quiet", str(args.out)], check=False)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
