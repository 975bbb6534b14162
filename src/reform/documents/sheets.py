"""Spreadsheets (XLSX, openpyxl, MIT) and CSV (the standard library's csv): each sheet a Markdown table
under a heading with its name, in row order; every row a line of its own, marked with the row number the
spreadsheet shows, so evidence reads ``data.xlsx, "Sheet2", row 41``. Formulas are read as the values the
file has cached for them (what the spreadsheet last showed)."""

from __future__ import annotations

import csv
import datetime
import io
import re

from .extracted import Builder, DocumentError, Extracted, Limits

SHARED_BYTES_PER_CELL = 64     # a workbook's shared strings may unpack to this much per allowed cell
_DIMENSION = re.compile(rb"<(?:\w+:)?dimension\s+ref=\"([A-Z]+)(\d+)(?::([A-Z]+)(\d+))?\"")


def cell_text(value) -> str:
    """One cell as a table reads it: numbers without a needless ``.0``, dates in ISO form, ``|`` escaped."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        value = int(value)
    if isinstance(value, datetime.datetime) and value.time() == datetime.time():
        value = value.date()
    if isinstance(value, (datetime.date, datetime.time)):
        value = value.isoformat()
    return " ".join(str(value).split()).replace("|", "\\|")


class Tables:
    """Sheets written as Markdown tables into one ``Builder``: each under a heading with its name, each row
    a line marked with its row number, the first row that has any text the header."""

    def __init__(self, name: str, limits: Limits, kind: str):
        self.out, self.name, self.limits = Builder(name, limits, kind), name, limits
        self.cells = 0
        self.header = True

    def sheet(self, title: str) -> None:
        self.out.page, self.out.unit = None, "row"
        self.out.heading(title, 2)
        self.header = True

    def row(self, number: int, values) -> None:
        cells = [cell_text(v) for v in values]
        while cells and not cells[-1]:
            cells.pop()
        self.cells += len(cells)
        if self.cells > self.limits.max_cells:
            raise DocumentError(f"{self.name} has more than {self.limits.max_cells:,} cells, over the limit")
        if not cells:
            return
        self.out.line("| " + " | ".join(cells) + " |", number)
        if self.header:
            self.out.write("\n|" + "---|" * len(cells))
            self.header = False
        if number % 1024 == 0:
            self.out.check_time()


def declared_cells(sheet_xml_head: bytes) -> int:
    """The cells a worksheet's ``<dimension ref="A1:XFD1048576">`` declares (0 when it declares none)."""
    m = _DIMENSION.search(sheet_xml_head)
    if not m or not m.group(3):
        return 0

    def column(letters: bytes) -> int:
        n = 0
        for c in letters:
            n = n * 26 + c - 64
        return n
    return (column(m.group(3)) - column(m.group(1)) + 1) * (int(m.group(4)) - int(m.group(2)) + 1)


def extract_xlsx(data: bytes, name: str, limits: Limits = Limits()) -> Extracted:
    from openpyxl import load_workbook

    from .packaged import open_package
    archive, load = open_package(data, name, limits, "Excel (XLSX)", "xl/workbook.xml",
                                 lambda f: load_workbook(f, read_only=True, data_only=True),
                                 streamed=("xl/worksheets/",))   # read_only: rows as they come
    members = archive.namelist()
    shared = limits.max_cells * SHARED_BYTES_PER_CELL     # openpyxl holds every shared string in memory
    if "xl/sharedStrings.xml" in members and (size := archive.getinfo("xl/sharedStrings.xml").file_size) > shared:
        raise DocumentError(f"{name}: its shared strings unpack to {size >> 20} MB, over the limit of "
                            f"{shared >> 20} MB")
    for member in members:            # refused by what the sheets declare, before openpyxl reads any of them
        if member.startswith("xl/worksheets/") and member.endswith(".xml"):
            with archive.open(member) as f:
                declared = declared_cells(f.read(4096))
            if declared > limits.max_cells:
                raise DocumentError(f"{name}: a sheet declares {declared:,} cells, over the limit of "
                                    f"{limits.max_cells:,}")
    book = load()
    tables = Tables(name, limits, "xlsx")
    try:
        for sheet in book.worksheets:
            tables.sheet(sheet.title)
            first = sheet.min_row or 1
            for number, values in enumerate(sheet.iter_rows(values_only=True), start=first):
                tables.row(number, values)
    finally:
        book.close()
    return tables.out.done()


def extract_csv(data: bytes, name: str, limits: Limits = Limits()) -> Extracted:
    """A CSV or TSV in any encoding (``text.decode``), its delimiter sniffed; one table named after the file.
    Row numbers count records as a spreadsheet would import them (a quoted cell may hold line breaks)."""
    from .text import decode
    text = decode(data, name)
    sample = text[:1 << 16]
    try:
        dialect = csv.Sniffer().sniff(sample, delimiters=",;\t|")
    except csv.Error:
        dialect = csv.excel_tab if name.lower().endswith(".tsv") else csv.excel
    tables = Tables(name, limits, "csv")
    tables.sheet(name.rsplit("/", 1)[-1])
    try:
        for number, values in enumerate(csv.reader(io.StringIO(text, newline=""), dialect), start=1):
            tables.row(number, values)
    except csv.Error as e:
        raise DocumentError(f"{name} is not a readable CSV ({e})") from None
    return tables.out.done()
