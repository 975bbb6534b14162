"""Documents in: every format extracted from real files (a PDF printed by Chromium, a DOCX written by
python-docx, an EPUB built to the spec, HTML; tests/data/documents/make.py), with the map back to pages,
sections and lines; folders as one context; hostile files refused in one line with bounded memory.
Evidence out: the passages an answer was recomputed from, through the pipeline and saved contexts."""

from __future__ import annotations

import io
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest
import torch

from reform.documents import DocumentError, Extracted, Limits, UnsupportedDocument, extract, extract_bytes
from reform.documents.evidence import passages, runs
from reform.documents.pdf import running_lines
from reform.documents.text import decode, headings

DATA = Path(__file__).parent / "data" / "documents"
FACT = "The harbour master of Bod\u00f8 later gave her a silver medal engraved with the number 11."
DEBIAN = Path("/usr/share/debian-reference/ch01.en.html")


def chapters_in_order(text: str) -> bool:
    at = [text.find(t) for t in ("1. The lighthouse keeper", "2. The storm of 1923", "3. The last light")]
    return -1 not in at and at == sorted(at)


def test_pdf_printed_by_chromium_keeps_pages_and_drops_its_running_header_and_footer():
    doc = extract(DATA / "book.pdf")
    assert doc.kind == "pdf" and doc.pages == 3 and chapters_in_order(doc.text)
    at = doc.text.find("silver medal")
    assert doc.locate(at).page == 2                                     # chapter 2 starts page 2 (break-before)
    assert doc.locate(doc.text.find("maritime museum")).page == 3
    # Chromium prints the date and title at the top and the file URL and "2/3" at the bottom of every page
    assert "file://" not in doc.text and "/3\n" not in doc.text + "\n"
    assert doc.text.count("The Keeper of Skarvhella") == 1              # the title on page 1, not the header
    assert [m.page for m in doc.marks] == [1, 2, 3]


def test_running_lines_are_those_on_most_pages_with_numbers_folded():
    pages = [[f"Manual {i}", f"the body of page {'abcdefghi'[i - 1]}", "a line every page has in its middle",
              f"more of page {'abcdefghi'[i - 1]}", f"Page {i} of 9"] for i in range(1, 10)]
    assert running_lines(pages) == {"manual #", "page # of #"}
    assert running_lines(pages[:2]) == set()                            # too few pages to tell
    chapters = [[f"Chapter {1 + i // 5}: {'AB'[i // 5]}", f"text {w}", f"more {w}", f"end {w}", "x"]
                for i, w in enumerate("abcdefghij")]
    assert running_lines(chapters) == {"chapter #: a", "chapter #: b", "x"}


def test_docx_paragraphs_headings_and_tables_in_order():
    doc = extract(DATA / "book.docx")
    assert doc.kind == "docx" and chapters_in_order(doc.text)
    loc = doc.locate(doc.text.find("silver medal"))
    assert loc.section == "2. The storm of 1923" and loc.page is None and loc.document.endswith("book.docx")
    assert "1887 | Lens made in Paris" in doc.text
    assert doc.text.index("3. The last light") < doc.text.index("1958 | Automated")


def test_epub_chapters_follow_the_spine_not_the_manifest():
    doc = extract(DATA / "book.epub")
    assert doc.kind == "epub" and chapters_in_order(doc.text)
    assert doc.locate(doc.text.find("Trondheim")).section == "3. The last light"


def test_html_main_text_with_headings_and_no_scripts_styles_or_navigation():
    doc = extract(DATA / "book.html")
    assert chapters_in_order(doc.text) and FACT in doc.text
    for gone in ("tracking", "font:12pt", "Next chapter", "Copyright notice"):
        assert gone not in doc.text
    assert "## 2. The storm of 1923" in doc.text                        # a heading stays a heading
    assert doc.locate(doc.text.find(FACT)).section == "2. The storm of 1923"


@pytest.mark.skipif(not DEBIAN.exists(), reason="Debian's debian-reference-en is not installed")
def test_a_debian_documentation_page_as_html_and_printed_to_pdf_by_chromium(tmp_path):
    html = extract(DEBIAN)
    assert "1.1. Console basics" in html.text and len(html.marks) > 30
    assert html.locate(html.text.find("The shell prompt under GUI", 2000)).section.startswith("1.1.")
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed")
    pdf = tmp_path / "ch01.pdf"
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                    "--disable-background-networking", "--disable-component-update", "--disable-sync",
                    f"--user-data-dir={tmp_path / 'profile'}", f"--print-to-pdf={pdf}", DEBIAN.as_uri()],
                   check=True, capture_output=True, timeout=120)
    doc = extract(pdf)
    assert doc.pages > 20 and "file:///" not in doc.text and "Console basics" in doc.text
    assert [m.page for m in doc.marks] == list(range(1, doc.pages + 1))


def test_text_in_any_encoding_and_markdown_sections():
    french = ("Le caf\u00e9 \u00e9tait ferm\u00e9 ce matin-l\u00e0, et la cr\u00e8me br\u00fbl\u00e9e que "
              "pr\u00e9parait H\u00e9l\u00e8ne \u00e0 la fen\u00eatre sentait d\u00e9j\u00e0 le caramel. Les "
              "\u00e9l\u00e8ves du lyc\u00e9e passaient devant la vitrine en se d\u00e9p\u00eachant.")
    russian = "\u041f\u0440\u0438\u0432\u0435\u0442, \u043a\u0430\u043a \u0434\u0435\u043b\u0430? " * 8
    assert decode(french.encode("cp1252"), "x") == french
    assert decode(russian.encode("cp1251"), "x") == russian
    assert decode("hello".encode("utf-16"), "x") == "hello"         # with its byte-order mark
    with pytest.raises(DocumentError, match="looks binary"):
        decode(b"\x00\x01\x02 not text", "blob.bin")
    md = "# Title\n\nintro\n\n## Install\n\n```\n# not a heading\n```\n\nUsage\n=====\n\ntext\n"
    assert [t for _, t in headings(md)] == ["Title", "Install", "Usage"]
    doc = extract_bytes(md.encode(), "README.md")
    assert doc.locate(md.index("text\n")).section == "Usage" and doc.locate(md.index("text\n")).line == 14


def test_a_folder_is_one_context_with_a_header_per_file_and_code_fenced(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "app.py").write_text("def main():\n    return 42\n")
    (tmp_path / "notes.md").write_text("# Notes\n\nThe answer is in src/app.py.\n")
    shutil.copy(DATA / "book.docx", tmp_path / "book.docx")
    (tmp_path / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 64)
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    doc = extract(tmp_path)
    names = [line[4:] for line in doc.text.splitlines() if line.startswith("### ")]
    assert names == ["book.docx", "notes.md", "src/app.py"]            # sorted; hidden folders skipped
    assert "### src/app.py\n\n```python\ndef main():" in doc.text
    assert [name for name, _ in doc.skipped] == ["logo.png"]
    at = doc.text.index("return 42")
    assert doc.locate(at).document == "src/app.py" and doc.locate(at).line == 5   # header, blank, fence, def
    assert doc.locate(doc.text.index("silver medal")).section == "2. The storm of 1923"
    glob = extract(str(tmp_path / "*.md"))
    assert glob.text.startswith("### notes.md\n\n# Notes")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DocumentError, match="no documents"):
        extract(empty)


# ---------------------------------------------------------------------- hostile files
def zip_with(member: str, data: bytes, mimetype: bytes | None = None) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        if mimetype:
            z.writestr(zipfile.ZipInfo("mimetype"), mimetype, compress_type=zipfile.ZIP_STORED)
        z.writestr(member, data)
    return buf.getvalue()


def test_zip_bombs_are_refused_before_anything_is_unpacked():
    bomb = b"\x00" * (64 << 20)                  # 64 MB of zeros: 64 KB deflated
    limits = Limits(max_unpacked_bytes=16 << 20)
    with pytest.raises(DocumentError, match="unpacks to 64 MB.*zip bomb"):
        extract_bytes(zip_with("word/document.xml", bomb), "bomb.docx", limits)
    with pytest.raises(DocumentError, match="zip bomb"):
        extract_bytes(zip_with("OEBPS/a.xhtml", bomb, b"application/epub+zip"), "bomb.epub", limits)


def test_a_part_the_library_parses_whole_is_refused_by_its_size_before_the_library_opens_it(monkeypatch):
    """A 400 KB DOCX whose document.xml unpacks to 102 MB (under the zip's total limit) is refused from the
    zip's directory: python-docx never inflates it (issue 100: the server's memory rose 412 MB first)."""
    import docx
    xml = b"<w:document><w:body>" + b"<w:p><w:r><w:t>a</w:t></w:r></w:p>" * (3 << 20) + b"</w:body></w:document>"
    monkeypatch.setattr(docx, "Document", lambda *a: pytest.fail("python-docx opened the bomb"))
    with pytest.raises(DocumentError, match=r"part 'word/document.xml' unpacks to 102 MB, over the limit of 64 MB"):
        extract_bytes(zip_with("word/document.xml", xml), "bomb.docx")


def test_a_member_that_lies_about_its_size_is_still_read_within_the_limit():
    from reform.documents.packaged import read_member
    data = bytearray(zip_with("META-INF/container.xml", b"<a>" + b" " * (4 << 20) + b"</a>"))
    archive = zipfile.ZipFile(io.BytesIO(bytes(data)))
    with pytest.raises(DocumentError, match="past the limit"):
        read_member(archive, "META-INF/container.xml", "x.epub", Limits(max_unpacked_bytes=1 << 20))


def test_damaged_encrypted_scanned_and_huge_pdfs_are_refused_in_one_line(tmp_path):
    from pypdf import PdfWriter
    good = (DATA / "book.pdf").read_bytes()
    with pytest.raises(DocumentError, match="not a readable PDF") as e:
        extract_bytes(good[: len(good) // 3], "truncated.pdf")
    assert "\n" not in str(e.value)

    def encrypted(user: str) -> bytes:
        writer = PdfWriter(clone_from=io.BytesIO(good))
        writer.encrypt(user_password=user, owner_password="owner")
        out = io.BytesIO()
        writer.write(out)
        return out.getvalue()
    with pytest.raises(DocumentError, match="encrypted with a password"):
        extract_bytes(encrypted("secret"), "locked.pdf")
    assert "silver medal" in extract_bytes(encrypted(""), "owner-only.pdf").text   # opens with the empty password

    from PIL import Image
    scan = io.BytesIO()
    Image.new("RGB", (400, 500), "white").save(scan, "PDF")
    with pytest.raises(DocumentError, match="no text that OCR can read"):     # a blank scan
        extract_bytes(scan.getvalue(), "scan.pdf")
    with pytest.raises(DocumentError, match="no text layer .*--ocr auto reads it by OCR"):
        extract_bytes(scan.getvalue(), "scan.pdf", Limits(ocr="never"))

    writer = PdfWriter()
    for _ in range(10_000):
        writer.add_blank_page(width=72, height=72)
    huge = io.BytesIO()
    writer.write(huge)
    with pytest.raises(DocumentError, match="10000 pages, over the limit of 5000"):
        extract_bytes(huge.getvalue(), "huge.pdf")


def test_html_of_only_scripts_and_unsupported_types_are_refused():
    page = b"<html><body><script>" + b"x=1;" * 10_000 + b"</script><nav>menu</nav></body></html>"
    with pytest.raises(DocumentError, match="has no text"):
        extract_bytes(page, "scripts.html")
    with pytest.raises(UnsupportedDocument, match="an image"):
        extract_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 32, "photo.png", Limits(ocr="never"))
    with pytest.raises(DocumentError, match="not an image PIL can read"):
        extract_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 32, "photo.png")
    with pytest.raises(UnsupportedDocument, match="a zip archive; unpack it and give the folder"):
        extract_bytes(zip_with("data/records.bin", b"<x/>"), "backup.zip")
    with pytest.raises(DocumentError, match="is empty"):
        extract_bytes(b"  \n", "blank.txt")


# ---------------------------------------------------------------------- evidence
def test_runs_of_consecutive_indices():
    assert runs(torch.tensor([0, 1, 2, 5, 7, 8])) == [(0, 2), (5, 5), (7, 8)]
    assert runs(torch.tensor([], dtype=torch.long)) == []


def ascii_book() -> Extracted:
    doc = extract(DATA / "book.docx")
    return Extracted(doc.text.replace("\u00f8", "o"), doc.marks, doc.kind)


def test_evidence_is_the_recomputed_passages_with_their_places(tiny_model):
    from conftest import CharTokenizer
    from reform import Pipeline
    # REFORM's gather keeps no run of blank tokens here (a run that is only whitespace is no passage)
    pipe = Pipeline(tiny_model, CharTokenizer(), method="reform", heads="1:v:0,2:k:1", chunk_size=128,
                    cache_budget=256, recompute_budget=384)
    book = ascii_book()
    ctx = pipe.encode(book)
    answer = ctx.ask("What number was engraved on the silver medal?", max_new_tokens=4)
    kept = answer.kept.tolist()
    assert answer.evidence and answer.evidence_note is None
    assert sum(p.tokens for p in answer.evidence) == len([i for i in kept if i >= len(pipe.templater.prefix)])
    scores = [p.score for p in answer.evidence]
    assert scores == sorted(scores, reverse=True)
    for p in answer.evidence:                         # each passage is the decoded text of its tokens, placed
        assert book.text[p.start:p.end] == p.text and p.text.strip() == p.text
        assert book.locate(p.start).section == p.section and p.document.endswith("book.docx")
    # the tokens of the passages are exactly the kept ones: decode them and find each passage inside
    decoded = pipe.tokenizer.decode(ctx.ids[answer.kept].tolist())
    assert all(p.text in decoded for p in answer.evidence)
    assert answer.to_json()["evidence"][0]["section"] == answer.evidence[0].section


def test_evidence_survives_a_saved_context_and_old_files_say_why_they_have_none(tiny_model, tmp_path):
    from conftest import CharTokenizer
    from reform import Pipeline
    pipe = Pipeline(tiny_model, CharTokenizer(), heads="1:v:0,2:k:1", chunk_size=128, cache_budget=256,
                    recompute_budget=384)
    ctx = pipe.encode(ascii_book())
    ctx.save(tmp_path / "book.reform")
    loaded = pipe.load_context(tmp_path / "book.reform")
    q = "In which city does the old lens stand now?"
    assert [p.to_json() for p in loaded.ask(q, max_new_tokens=3).evidence] == \
        [p.to_json() for p in ctx.ask(q, max_new_tokens=3).evidence]
    loaded.source = None                              # as a file saved before contexts kept their map
    answer = loaded.ask(q, max_new_tokens=3)
    assert answer.evidence == [] and "saved before" in answer.evidence_note


def test_methods_reading_a_compressed_cache_have_no_evidence_and_say_so(tiny_model):
    from conftest import CharTokenizer
    from reform import Pipeline
    pipe = Pipeline(tiny_model, CharTokenizer(), method="h2o", chunk_size=128, cache_budget=256)
    answer = pipe.encode(ascii_book()).ask("Who rowed out?", max_new_tokens=3)
    assert answer.evidence == [] and "compressed cache" in answer.evidence_note


def test_passages_split_where_a_run_crosses_into_another_document():
    text = "### a.txt\n\nalpha\n\n### b.txt\n\nbeta"
    from reform.documents import Mark
    from reform.documents.evidence import Source
    doc = Extracted(text, [Mark(0, "a.txt"), Mark(text.index("### b"), "b.txt")], "folder")
    source = Source(doc, torch.arange(len(text), dtype=torch.int32))     # one token per character
    found = passages(source, torch.arange(len(text)))
    assert [(p.document, p.text) for p in found] == [("a.txt", "### a.txt\n\nalpha"), ("b.txt", "### b.txt\n\nbeta")]
    assert [p.tokens for p in found] == [18, 15] and [p.line for p in found] == [1, 1]
