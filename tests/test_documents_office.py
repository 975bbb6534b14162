"""Spreadsheets, CSV and presentations from real tools: a workbook LibreOffice writes from Debian's
distro-info-data CSVs (two sheets, dates, a formula column), a CSV in cp1252 from iso-codes' country names,
a deck LibreOffice Impress imports from the test book's PDF (tests/data/documents/make.py). Each is read
with its places (sheet and row, slide), and hostile ones are refused in one line before they are unpacked.
Clean text: no control characters in any extracted test document, and pdfium's soft-hyphen marks resolved."""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
import sys
from pathlib import Path

import pytest

from reform.documents import DocumentError, Limits, UnsupportedDocument, extract, extract_bytes
from reform.documents.evidence import Passage
from reform.documents.pdf import dehyphenate

DATA = Path(__file__).parent / "data" / "documents"
sys.path.insert(0, str(DATA))
import make  # noqa: E402  (the fixtures' maker: tests/data/documents/make.py)

SOFFICE = shutil.which("soffice") or shutil.which("libreoffice")
needs_libreoffice = pytest.mark.skipif(SOFFICE is None, reason="Debian's LibreOffice (libreoffice-calc-nogui, "
                                       "libreoffice-impress-nogui) is not installed")
needs_releases = pytest.mark.skipif(not (make.RELEASES / "ubuntu.csv").exists(),
                                    reason="Debian's distro-info-data is not installed")
DEBIAN_PDF = Path("/usr/share/debian-reference/debian-reference.en.pdf")
COUNTRIES = Path("/usr/share/iso-codes/json/iso_3166-1.json")
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def csv_row(name: str, word: str) -> int:
    """The 1-based line of distro-info's ``name``.csv that holds ``word``: the row a spreadsheet shows."""
    lines = (make.RELEASES / f"{name}.csv").read_text().splitlines()
    return next(i for i, line in enumerate(lines, start=1) if word in line)


@pytest.fixture(scope="module")
def workbook(tmp_path_factory):
    if SOFFICE is None or not (make.RELEASES / "ubuntu.csv").exists():
        pytest.skip("needs Debian's LibreOffice and distro-info-data")
    return make.make_workbook(tmp_path_factory.mktemp("workbook"))


@needs_libreoffice
@needs_releases
def test_a_workbook_written_by_libreoffice_is_a_table_per_sheet_with_rows_as_places(workbook):
    doc = extract(workbook)
    assert doc.kind == "xlsx" and doc.text.index("## debian") < doc.text.index("## ubuntu")
    assert "| version | codename | series | created | release | eol | days supported |\n|---|" in doc.text
    trusty = doc.text.index("Trusty Tahr")
    line = doc.text[doc.text.rindex("\n", 0, trusty) + 1: doc.text.index("\n", trusty)]
    # dates as the sheet shows them, the formula as the value LibreOffice cached (2019-04-25 - 2014-04-17)
    assert line.startswith("| 14.04 LTS | Trusty Tahr | trusty | 2013-10-17 | 2014-04-17 | 2019-04-25 | 1834 |")
    where = doc.locate(trusty)
    assert (where.section, where.page, where.unit) == ("ubuntu", csv_row("ubuntu", "Trusty"), "row")
    bo = doc.locate(doc.text.index("| Bo |"))
    assert (bo.section, bo.page) == ("debian", csv_row("debian", ",Bo,"))
    passage = Passage("...", workbook.name, where.page, where.page, where.section, where.line, 0, 3, None, 4, "row")
    assert passage.where() == f"releases.xlsx, \u201cubuntu\u201d, row {where.page}"


def test_a_csv_in_cp1252_reads_as_a_table_with_its_rows(tmp_path):
    if COUNTRIES.exists():
        countries = json.loads(COUNTRIES.read_text())["3166-1"]
        rows = [(c["alpha_2"], c["name"]) for c in countries]
    else:   # iso-codes absent: a few of its names, as written there
        rows = [("AX", "\u00c5land Islands"), ("CI", "C\u00f4te d'Ivoire"), ("CW", "Cura\u00e7ao"), ("RE", "R\u00e9union")]
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\r\n")
    writer.writerow(["code", "name"])
    writer.writerows(rows)
    path = tmp_path / "countries.csv"
    path.write_bytes(buf.getvalue().encode("cp1252", errors="replace"))
    doc = extract(path)
    assert doc.kind == "csv" and "| CW | Cura\u00e7ao |" in doc.text and "\r" not in doc.text
    row = 1 + next(i for i, (code, _) in enumerate(rows, start=1) if code == "CW")
    where = doc.locate(doc.text.index("Cura\u00e7ao"))
    assert (where.section, where.page, where.unit) == ("countries.csv", row, "row")


@needs_libreoffice
def test_a_deck_imported_by_libreoffice_is_read_slide_by_slide(tmp_path):
    deck = make.make_deck(tmp_path)
    doc = extract(deck)
    assert doc.kind == "pptx" and doc.pages == 3
    fact = "silver medal engraved with the number 11"
    assert [m.page for m in doc.marks] == [1, 2, 3] and {m.unit for m in doc.marks} == {"slide"}
    assert doc.locate(doc.text.index(fact)).page == 2
    assert doc.locate(doc.text.index("automated in 1958")).page == 3


def test_slides_with_titles_tables_groups_and_notes():
    from pptx import Presentation
    from pptx.util import Inches
    deck = Presentation()
    slide = deck.slides.add_slide(deck.slide_layouts[5])          # title only
    slide.shapes.title.text = "Quarterly results"
    table = slide.shapes.add_table(2, 2, Inches(1), Inches(2), Inches(4), Inches(1)).table
    for (r, c), text in {(0, 0): "Region", (0, 1): "Sales", (1, 0): "North", (1, 1): "412"}.items():
        table.cell(r, c).text = text
    slide.notes_slide.notes_text_frame.text = "Mention the new warehouse."
    second = deck.slides.add_slide(deck.slide_layouts[6])        # blank
    group = second.shapes.add_group_shape()
    group.shapes.add_textbox(Inches(1), Inches(1), Inches(3), Inches(1)).text_frame.text = "Inside a group"
    buf = io.BytesIO()
    deck.save(buf)
    doc = extract_bytes(buf.getvalue(), "deck.pptx")
    assert "Region | Sales\nNorth | 412" in doc.text and "Notes: Mention the new warehouse." in doc.text
    at = doc.locate(doc.text.index("North | 412"))
    assert (at.page, at.section, at.unit) == (1, "Quarterly results", "slide")
    assert doc.locate(doc.text.index("Inside a group")).page == 2


def test_workbook_and_deck_bombs_are_refused_before_they_are_unpacked():
    sheet = (b'<?xml version="1.0"?><worksheet xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main">'
             b'<dimension ref="A1:XFD1048576"/><sheetData/></worksheet>')
    huge = make.zipped({"xl/workbook.xml": b"<workbook/>", "xl/worksheets/sheet1.xml": sheet})
    with pytest.raises(DocumentError, match="declares 17,179,869,184 cells, over the limit of 1,000,000") as e:
        extract_bytes(huge, "dimensions.xlsx")
    assert "\n" not in str(e.value)
    strings = b"<sst>" + b"<si><t>a</t></si>" * 4_000_000 + b"</sst>"         # 68 MB of shared strings
    with pytest.raises(DocumentError, match="shared strings unpack to 64 MB, over the limit of 58 MB"):
        extract_bytes(make.zipped({"xl/workbook.xml": b"<workbook/>", "xl/sharedStrings.xml": strings}), "strings.xlsx",
                      Limits(max_cells=1_000_000 - 40_000, max_part_bytes=128 << 20))
    with pytest.raises(DocumentError, match="part 'xl/sharedStrings.xml' unpacks to 64 MB, over the limit of 64 MB"):
        extract_bytes(make.zipped({"xl/workbook.xml": b"<workbook/>", "xl/sharedStrings.xml": strings}), "strings.xlsx")
    slides = {f"ppt/slides/slide{i}.xml": b"<p:sld/>" for i in range(1, 10_001)}
    with pytest.raises(DocumentError, match="has 10,000 slides, over the limit of 5,000"):
        extract_bytes(make.zipped({"ppt/presentation.xml": b"<p/>", **slides}), "deck.pptx")
    cells = io.StringIO()
    csv.writer(cells).writerows([[str(i)] * 10 for i in range(2_000)])
    with pytest.raises(DocumentError, match="more than 10,000 cells"):
        extract_bytes(cells.getvalue().encode(), "big.csv", Limits(max_cells=10_000))


def test_legacy_and_opendocument_office_files_are_refused_with_what_to_do():
    with pytest.raises(UnsupportedDocument, match=r"legacy Excel \(.xls\) workbook; save it as .xlsx"):
        extract_bytes(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + b"\x00" * 64, "old.xls")
    with pytest.raises(UnsupportedDocument, match="OpenDocument presentation; save it as .pptx"):
        extract_bytes(make.zipped({"content.xml": b"<x/>"}), "talk.odp")
    with pytest.raises(DocumentError, match="not a readable Excel"):
        extract_bytes(make.zipped({"xl/workbook.xml": b"<not a workbook"}), "broken.xlsx")


def test_no_control_characters_in_any_extracted_test_document(tmp_path):
    for path in sorted(DATA.glob("book.*")):
        assert not CONTROL.search(extract(path).text), path.name
    text = extract_bytes(b"one\r\ntwo\x0cthree\x07\tfour", "notes.txt").text
    assert text == "one\ntwo\n\nthree\tfour"


def test_pdfium_soft_hyphens_join_broken_words_and_keep_compounds():
    pages = ["The distri\x02bution ships a distribution of programs for non\x02developers (non free ones for developers).",
             "An apt\x02pinning file; see apt-pinning. The docu\x02ment and the document. Syn\x02taxerror."]
    assert dehyphenate(pages) == [
        "The distribution ships a distribution of programs for non-developers (non free ones for developers).",
        "An apt-pinning file; see apt-pinning. The document and the document. Syntaxerror."]


@pytest.mark.skipif(not DEBIAN_PDF.exists(), reason="Debian's debian-reference-en is not installed")
def test_the_debian_reference_pdf_has_no_control_characters_and_keeps_its_compounds():
    doc = extract(DEBIAN_PDF, limits=Limits(ocr="never"))
    assert not CONTROL.search(doc.text)
    assert "shell-command examples for non-developers." in doc.text
    assert "distri-bution" not in doc.text and "Debian distribution" in doc.text


def test_a_passage_is_cut_where_it_crosses_into_the_next_sheet():
    import torch

    from reform.documents.evidence import Source, passages
    from openpyxl import Workbook
    book = Workbook()
    book.active.title = "First"
    for i in range(1, 4):
        book.active.append([f"a{i}", i])
    second = book.create_sheet("Second")
    for i in range(1, 4):
        second.append([f"b{i}", i])
    out = io.BytesIO()
    book.save(out)
    doc = extract_bytes(out.getvalue(), "book.xlsx")
    starts = torch.arange(0, len(doc.text), 8, dtype=torch.int32)       # a "token" every 8 characters
    found = passages(Source(doc, starts), torch.arange(starts.numel()))
    assert [p.section for p in found] == ["First", "Second"]
    assert "a3" in found[0].text and "b1" not in found[0].text and found[1].text.startswith("## Second")
    middle = passages(Source(doc, starts), torch.arange(3, starts.numel() - 2))    # from a row of each sheet
    assert [(p.section, p.unit) for p in middle] == [("First", "row"), ("Second", "row")]
    assert middle[0].where().startswith("book.xlsx, \u201cFirst\u201d, row")
