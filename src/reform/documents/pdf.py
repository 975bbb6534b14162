"""PDF: the text layer page by page (pypdfium2, BSD-3/Apache-2.0; pypdf, BSD-3, where pypdfium2 is not
installed), page breaks kept as blank lines and in the map, sections from the outline (bookmarks), and the
running headers and footers that repeat on most pages left out. Pages without a text layer (scans) are read
by OCR (``ocr.py``; ``Limits.ocr``). Words the typesetter broke at a line end, which pdfium marks with a
control character, are joined, and compounds keep their hyphen (``dehyphenate``). Encrypted files are
opened with the empty password or refused."""

from __future__ import annotations

import io
import re
from collections import Counter

from .extracted import Builder, DocumentError, Extracted, Limits

EDGE_LINES = 2          # a running header or footer is among the first or last lines of a page
MIN_CHARS_PER_PAGE = 16  # less text than this on average: no text layer


def extract_pdf(data: bytes, name: str, limits: Limits = Limits()) -> Extracted:
    try:
        import pypdfium2  # noqa: F401
    except ImportError:
        return _build(name, limits, *_pages_pypdf(data, name, limits), {})
    return _build(name, limits, *_pages_pdfium(data, name, limits))


def _refuse_pages(name: str, n: int, limits: Limits) -> None:
    if n > limits.max_pages:
        raise DocumentError(f"{name} has {n} pages, over the limit of {limits.max_pages}")
    if n == 0:
        raise DocumentError(f"{name} has no pages")


def _pages_pdfium(data: bytes, name: str, limits: Limits):
    import pypdfium2 as pdfium

    try:
        pdf = pdfium.PdfDocument(data)
    except pdfium.PdfiumError as e:
        if "password" in str(e).lower():
            try:
                pdf = pdfium.PdfDocument(data, password="")
            except pdfium.PdfiumError:
                raise DocumentError(f"{name} is encrypted with a password; decrypt it first") from None
        else:
            raise DocumentError(f"{name} is not a readable PDF ({str(e).strip() or 'damaged or truncated'})") from None
    try:
        _refuse_pages(name, len(pdf), limits)
        outline = []
        try:
            outline = [(item.page_index, item.title) for item in pdf.get_toc(max_depth=3)
                       if item.page_index is not None and item.title]
        except Exception:          # a damaged outline costs the sections, not the text
            outline = []

        texts, timings = _read_pages(pdf, name, limits)
        return texts, outline, len(pdf), timings
    finally:
        pdf.close()


def _read_pages(pdf, name: str, limits: Limits) -> tuple[list[str], dict]:
    """Each page's text layer, and OCR's reading where ``limits.ocr`` asks for it: ``always`` every page,
    ``auto`` the pages that hold an image and no text layer."""
    import pypdfium2.raw as pdfium_c

    from .ocr import Pages, page_scale
    clock, texts, scans = Builder(name, limits, "pdf"), [], []
    for i in range(len(pdf)):
        clock.check_time()
        page = pdf[i]
        textpage = page.get_textpage()
        texts.append(textpage.get_text_bounded())
        textpage.close()
        if limits.ocr == "always" or (limits.ocr == "auto" and len(texts[-1].strip()) < MIN_CHARS_PER_PAGE and
                                      next(page.get_objects(filter=[pdfium_c.FPDF_PAGEOBJ_IMAGE]), None) is not None):
            scans.append(i)
        page.close()
    if len(scans) > limits.max_ocr_pages:
        raise DocumentError(f"{name} has {len(scans):,} pages to read by OCR, over the limit of "
                            f"{limits.max_ocr_pages:,} (--ocr never reads the text layer alone)")
    reader = Pages(len(scans))
    for i in scans:
        clock.check_time()
        page = pdf[i]
        where = f"{name}, page {i + 1}"
        image = page.render(scale=page_scale(*page.get_size(), where)).to_pil()
        page.close()
        texts[i] = reader.read(image, where)
    return texts, reader.timings()


def _pages_pypdf(data: bytes, name: str, limits: Limits):
    from pypdf import PdfReader
    from pypdf.errors import FileNotDecryptedError, PdfReadError

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise DocumentError(f"{name} is encrypted with a password; decrypt it first")
        n = len(reader.pages)
    except (PdfReadError, FileNotDecryptedError, ValueError, OSError) as e:
        raise DocumentError(f"{name} is not a readable PDF ({e})") from None
    _refuse_pages(name, n, limits)
    outline = []
    try:
        def walk(items):
            for item in items:
                if isinstance(item, list):
                    yield from walk(item)
                elif (page := reader.get_destination_page_number(item)) is not None:
                    yield page, item.title
        outline = list(walk(reader.outline))
    except Exception:
        outline = []
    return list(_timed((page.extract_text() or "" for page in reader.pages), name, limits)), outline, n


def _timed(pages, name: str, limits: Limits):
    probe = Builder(name, limits, "pdf")
    for text in pages:
        probe.check_time()
        yield text


def _normalised(line: str) -> str:
    return re.sub(r"\d+", "#", " ".join(line.split()).lower())


def running_lines(pages: list[list[str]]) -> set[str]:
    """Normalised lines (digits as ``#``: "Page 12 of 300") that are running headers or footers: among the
    first or last ``EDGE_LINES`` lines of three or more pages, and of at least half the pages from the first
    to the last of them (a chapter's own header runs over that chapter's pages only)."""
    where: dict[str, list[int]] = {}
    for i, lines in enumerate(pages):
        edges = [line for line in lines if line.strip()]
        for line in {_normalised(x) for x in edges[:EDGE_LINES] + edges[-EDGE_LINES:]}:
            if line:
                where.setdefault(line, []).append(i)
    return {line for line, at in where.items() if len(at) >= 3 and len(at) >= (at[-1] - at[0] + 1) / 2}


def dehyphenate(texts: list[str]) -> list[str]:
    """The pages with pdfium's mark for a hyphen at a line end (``\x02``, the line break already removed)
    resolved: the word is joined where the document spells it joined more often than hyphenated ("docu-
    ment"), keeps its hyphen where it is spelled hyphenated more often, or, never seen either way, where
    both halves are words of the document on their own ("non-developers"); otherwise it is joined."""
    broken = re.compile(r"(\w*)\x02(\w*)")
    rest = broken.sub(" ", "\n".join(texts)).lower()
    words, compounds = Counter(re.findall(r"\w+", rest)), Counter(re.findall(r"\w+(?:-\w+)+", rest))

    def resolve(m: re.Match) -> str:
        a, b = m.group(1), m.group(2)
        joined, hyphenated = words[(a + b).lower()], compounds[f"{a}-{b}".lower()]
        if joined != hyphenated:
            return a + b if joined > hyphenated else f"{a}-{b}"
        return f"{a}-{b}" if a and b and words[a.lower()] and words[b.lower()] else a + b
    return [broken.sub(resolve, t) if "\x02" in t else t for t in texts]


def _build(name: str, limits: Limits, texts: list[str], outline: list[tuple[int, str]], n: int,
           timings: dict) -> Extracted:
    texts = dehyphenate([t.replace("\r\n", "\n").replace("\r", "\n") for t in texts])
    if sum(len(t.strip()) for t in texts) < MIN_CHARS_PER_PAGE * n:
        if timings.get("ocr_pages"):
            pages = timings["ocr_pages"]
            raise DocumentError(f"{name} has no text that OCR can read ({pages} page{'s' if pages > 1 else ''} read)")
        raise DocumentError(f"{name} has no text layer (a scanned or image-only PDF?)" +
                            ("; --ocr auto reads it by OCR" if limits.ocr == "never" else ""))
    lines = [t.split("\n") for t in texts]
    running = running_lines(lines)
    sections: dict[int, str] = {}
    for page, title in outline:                 # in outline order: the last entry starting on a page wins
        sections[page] = " ".join(title.split())
    out = Builder(name, limits, "pdf")
    section = None
    for i, page_lines in enumerate(lines):
        section = out.section = sections.get(i, section)
        out.new_page(i + 1)
        kept = [l.rstrip() for l in page_lines if _normalised(l) not in running]
        out.write("\n".join(kept).strip("\n"))
    extracted = out.done()
    extracted.pages = n
    extracted.timings.update(timings)
    return extracted
