"""Scans read by OCR: pages of the Debian Reference's PDF rendered to images and wrapped back as a PDF with
no text layer (tests/data/documents/make.py ``make_scan``), read against the text layer of the same pages;
mixed PDFs keep their text layer; images given as documents; the OCR policy; and hostile scans refused in
one line (a page too narrow to hold text, 5,000 image pages, the time cap)."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from reform.documents import DocumentError, Limits, UnsupportedDocument, extract, extract_bytes
from reform.documents import ocr

DATA = Path(__file__).parent / "data" / "documents"
sys.path.insert(0, str(DATA))
import make  # noqa: E402

DEBIAN_PDF = Path("/usr/share/debian-reference/debian-reference.en.pdf")
PAGES = [30, 31]
needs_debian_pdf = pytest.mark.skipif(not DEBIAN_PDF.exists(), reason="Debian's debian-reference-en is not installed")


def character_accuracy(truth: str, read: str) -> float:
    """1 - the edit distance between the two texts (whitespace runs as one space) over the truth's length."""
    import editdistance
    truth, read = " ".join(truth.split()), " ".join(read.split())
    return 1 - editdistance.eval(truth, read) / len(truth)


@pytest.fixture(scope="module")
def scan(tmp_path_factory):
    if not DEBIAN_PDF.exists():
        pytest.skip("Debian's debian-reference-en is not installed")
    path = make.make_scan(DEBIAN_PDF, PAGES, tmp_path_factory.mktemp("scan") / "scan.pdf")
    seen = []
    with ocr.progress(lambda done, total: seen.append((done, total))):
        doc = extract(path)
    return path, doc, seen


@needs_debian_pdf
def test_a_scan_of_a_real_pdf_reads_as_its_text_layer_page_by_page(scan):
    path, doc, seen = scan
    assert doc.kind == "pdf" and doc.pages == 2 and [m.page for m in doc.marks] == [1, 2]
    assert doc.timings["ocr_pages"] == 2 and doc.timings["ocr_s_per_page"] > 0 and seen == [(1, 2), (2, 2)]
    original = extract(DEBIAN_PDF, limits=Limits(ocr="never"))
    for page in (1, 2):
        read = doc.text[doc.marks[page - 1].start: doc.marks[page].start if page < 2 else len(doc.text)]
        layer = [m for m in original.marks if m.page == PAGES[page - 1]][0]
        following = original.marks[original.marks.index(layer) + 1].start
        assert character_accuracy(original.text[layer.start:following], read) >= 0.95
    assert doc.locate(doc.text.index("The root account is also called superuser")).page == 1


@needs_debian_pdf
def test_the_ocr_policy_and_its_limits(scan):
    path, _, _ = scan
    with pytest.raises(DocumentError, match="has no text layer .*; --ocr auto reads it by OCR"):
        extract(path, limits=Limits(ocr="never"))
    with pytest.raises(DocumentError, match="has 2 pages to read by OCR, over the limit of 1"):
        extract(path, limits=Limits(max_ocr_pages=1))
    with pytest.raises(DocumentError, match="extraction took longer than 1 s"):
        extract(path, limits=Limits(max_seconds=1.0))
    with pytest.raises(ValueError, match="ocr must be one of never, auto, always"):
        Limits(ocr="sometimes")


@needs_debian_pdf
def test_a_mixed_pdf_keeps_its_text_layer_and_reads_only_its_scanned_page(scan, tmp_path):
    from pypdf import PdfWriter
    path, _, _ = scan
    mixed = PdfWriter()
    mixed.append(str(DATA / "book.pdf"))
    mixed.append(str(path), pages=[0])
    out = io.BytesIO()
    mixed.write(out)
    doc = extract_bytes(out.getvalue(), "mixed.pdf")
    book = extract(DATA / "book.pdf")
    assert doc.pages == 4 and doc.timings["ocr_pages"] == 1
    assert doc.text.startswith(book.text) and "superuser" in doc.text[len(book.text):]
    assert extract(DATA / "book.pdf", limits=Limits(ocr="always")).timings["ocr_pages"] == 3


@needs_debian_pdf
def test_an_image_of_a_page_given_as_a_document_is_read_by_ocr():
    import pypdfium2 as pdfium
    pdf = pdfium.PdfDocument(str(DEBIAN_PDF))
    image = pdf[PAGES[0] - 1].render(scale=150 / 72).to_pil()
    png = io.BytesIO()
    image.save(png, "PNG")
    doc = extract_bytes(png.getvalue(), "page.png")
    assert doc.kind == "image" and doc.pages == 1 and "The root account" in doc.text
    with pytest.raises(UnsupportedDocument, match="--ocr never leaves images of pages unread"):
        extract_bytes(png.getvalue(), "page.png", Limits(ocr="never"))


def test_hostile_scans_are_refused_in_one_line():
    from PIL import Image
    from pypdf import PdfWriter
    sliver = io.BytesIO()
    Image.new("RGB", (1, 2000), "white").save(sliver, "PNG")
    with pytest.raises(DocumentError, match="^sliver.png is 1 x 2000 pixels, too small to read by OCR$"):
        extract_bytes(sliver.getvalue(), "sliver.png")
    narrow = io.BytesIO()
    Image.new("RGB", (1, 2000), "black").save(narrow, "PDF", resolution=72)     # a page 1 point wide
    with pytest.raises(DocumentError, match="page 1 is 1 x 2000 points, too narrow to hold text for OCR"):
        extract_bytes(narrow.getvalue(), "narrow.pdf")
    many = io.BytesIO()
    dot = Image.new("RGB", (8, 8), "black")
    dot.save(many, "PDF", save_all=True, append_images=[dot] * 4_999)
    with pytest.raises(DocumentError, match="5,000 pages to read by OCR, over the limit of 500") as e:
        extract_bytes(many.getvalue(), "5000-images.pdf", Limits(ocr="always"))
    assert "\n" not in str(e.value)
    blank = PdfWriter()
    blank.add_blank_page(width=595, height=842)
    out = io.BytesIO()
    blank.write(out)
    with pytest.raises(DocumentError, match="has no text layer"):      # no image on it: nothing for OCR to read
        extract_bytes(out.getvalue(), "blank.pdf")


def test_a_folders_images_are_left_out_unless_ocr_always(tmp_path):
    from PIL import Image
    (tmp_path / "notes.md").write_text("# Notes\n\nThe lighthouse was automated in 1958.\n")
    Image.new("RGB", (64, 64), "red").save(tmp_path / "icon.png")
    doc = extract(tmp_path)
    assert "automated in 1958" in doc.text and [name for name, _ in doc.skipped] == ["icon.png"]
    assert "read by OCR with --ocr always" in doc.skipped[0][1]
    always = extract(tmp_path, limits=Limits(ocr="always"))         # read, found blank, left out with why
    assert "automated in 1958" in always.text and "no text that OCR can read" in always.skipped[0][1]
