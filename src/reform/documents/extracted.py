"""What every extractor returns: the text a model reads, and a map from character offsets in it back to
places in the documents it came from (docs/documents.md). One type for every format, so the pipeline,
saved contexts and the evidence of an answer never need to know which format a passage came from."""

from __future__ import annotations

import bisect
import re
import time
from dataclasses import dataclass, field


OCR_POLICIES = ("never", "auto", "always")
# control characters other than tab and newline: extractors drop them (a PDF's \x02 soft hyphen, form feeds)
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def clean(text: str) -> str:
    """``text`` with Windows and old Mac line ends as newlines, form feeds as blank lines and no other
    control character but tab and newline."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\x0c", "\n\n")
    return CONTROL.sub("", text)


class DocumentError(ValueError):
    """A document that cannot be encoded (missing, empty, damaged, over a limit) or a source with none."""


class UnsupportedDocument(DocumentError):
    """A file of a type reform does not read (an image outside a vision-language context, an archive...)."""


@dataclass(frozen=True)
class Mark:
    """From character ``start`` on (until the next mark), the text is in ``document``, at ``page`` (1-based;
    ``unit`` says what it counts: a PDF's or scan's ``page``, a deck's ``slide``, a sheet's ``row``) under
    the heading ``section`` (a sheet's name; None: before the first heading, or a format without them)."""

    start: int
    document: str
    page: int | None = None
    section: str | None = None
    unit: str = "page"

    def stored(self, document) -> list:
        """The mark as a JSON list, ``document`` standing for its document; the unit only where it is not
        ``page``, so the marks of PDFs and text read as they did before units existed (content keys and saved
        contexts unchanged)."""
        return [self.start, document, self.page, self.section] + ([self.unit] if self.unit != "page" else [])


@dataclass(frozen=True)
class Location:
    document: str
    page: int | None
    section: str | None
    line: int            # 1-based, within the document's own text as extracted
    unit: str = "page"   # what ``page`` counts (``Mark.unit``)


@dataclass(frozen=True)
class Limits:
    """What one extraction may cost, each refused in one line when passed (``DocumentError``), and whether
    pages without text are read by OCR (``ocr``: ``never``, ``auto`` for pages without a text layer and
    images given as documents, or ``always``)."""

    max_unpacked_bytes: int = 512 << 20   # the members of a zip (DOCX, EPUB, XLSX, PPTX), unpacked, together
    max_part_bytes: int = 64 << 20        # one XML or HTML part of such a zip, unpacked (a library parses it whole)
    max_pages: int = 5_000                # PDF pages, slides of a deck
    max_seconds: float = 600.0            # wall time of one extraction, OCR included
    max_files: int = 20_000               # documents in one folder or glob
    max_cells: int = 1_000_000            # cells of a workbook or CSV, all sheets together
    max_ocr_pages: int = 500              # pages read by OCR in one document
    ocr: str = "auto"

    def __post_init__(self):
        if self.ocr not in OCR_POLICIES:
            raise ValueError(f"ocr must be one of {', '.join(OCR_POLICIES)}, not {self.ocr!r}")


@dataclass
class Extracted:
    """``text`` plus ``marks`` (sorted by ``start``, the first at 0); ``skipped``: files of a folder that
    were left out, each with why."""

    text: str
    marks: list[Mark]
    kind: str
    pages: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)
    timings: dict = field(default_factory=dict)     # extract_s; ocr_pages and ocr_s_per_page where OCR read pages

    def __post_init__(self):
        self._mark_starts = [m.start for m in self.marks]
        self._newlines: list[int] | None = None

    @classmethod
    def plain(cls, text: str, document: str = "text") -> "Extracted":
        return cls(text, [Mark(0, document)], "text")

    def digest(self) -> str | None:
        """What tells this document's map apart from plain text's (None for ``plain`` text, whose contexts
        are named by their text alone): its kind and marks, for content keys."""
        if self.kind == "text" and [(m.document, m.page, m.section) for m in self.marks] == [("text", None, None)]:
            return None
        import hashlib
        import json
        return hashlib.sha256(json.dumps([self.kind, [m.stored(m.document) for m in self.marks]]).encode()).hexdigest()

    def mark_at(self, offset: int) -> Mark:
        return self.marks[max(0, bisect.bisect_right(self._mark_starts, offset) - 1)]

    def first_page(self, start: int, end: int) -> int | None:
        """The first page (row, slide) a mark in ``[start, end)`` names, None where none does."""
        i = max(0, bisect.bisect_right(self._mark_starts, start) - 1)
        while i < len(self.marks) and self.marks[i].start < end:
            if self.marks[i].page is not None:
                return self.marks[i].page
            i += 1
        return None

    def document_start(self, document: str, before: int) -> int:
        """Where ``document``'s text starts (its first mark at or before ``before``)."""
        i = bisect.bisect_right(self._mark_starts, before) - 1
        while i > 0 and self.marks[i - 1].document == document:
            i -= 1
        return self.marks[max(i, 0)].start

    def locate(self, offset: int) -> Location:
        if self._newlines is None:
            self._newlines = [m.start() for m in re.finditer("\n", self.text)]
        mark = self.mark_at(offset)
        first = self.document_start(mark.document, offset)
        line = bisect.bisect_left(self._newlines, offset) - bisect.bisect_left(self._newlines, first) + 1
        return Location(mark.document, mark.page, mark.section, line, mark.unit)


class Builder:
    """Text written piece by piece, with a mark wherever the document, page or section changes."""

    def __init__(self, document: str, limits: Limits, kind: str):
        self.document, self.limits, self.kind = document, limits, kind
        self.pieces: list[str] = []
        self.size = 0
        self.marks: list[Mark] = []
        self.page: int | None = None
        self.section: str | None = None
        self.started = time.monotonic()
        self.pages = 0
        self.unit = "page"

    def _mark(self) -> None:
        mark = Mark(self.size, self.document, self.page, self.section, self.unit)
        if self.marks and self.marks[-1].start == self.size:
            self.marks[-1] = mark                      # nothing was written under the previous one
        elif not self.marks or (self.marks[-1].page, self.marks[-1].section) != (mark.page, mark.section):
            self.marks.append(mark)

    def write(self, text: str) -> None:
        text = clean(text)
        if text:
            if not self.marks:
                self._mark()
            self.pieces.append(text)
            self.size += len(text)

    def paragraph(self, text: str) -> None:
        """``text`` as a block of its own: separated from what came before by a blank line."""
        text = text.strip("\n")
        if not text.strip():
            return
        if self.size:
            self.write("\n\n")
        self.write(text)

    def heading(self, title: str, level: int = 1) -> None:
        title = " ".join(title.split())
        if not title:
            return
        if self.size:
            self.write("\n\n")
        self.section = title
        self._mark()
        self.write("#" * max(1, min(level, 6)) + " " + title)

    def line(self, text: str, page: int) -> None:
        """``text`` on a line of its own at ``page`` (a sheet's row): one mark per line, so evidence names it."""
        if self.size:
            self.write("\n")
        self.page = page
        self._mark()
        self.write(text)

    def new_page(self, page: int) -> None:
        self.check_time()
        if self.size:
            self.write("\n\n")
        self.page = page
        self.pages = max(self.pages, page)
        self._mark()

    def check_time(self) -> None:
        if time.monotonic() - self.started > self.limits.max_seconds:
            raise DocumentError(f"{self.document}: extraction took longer than {self.limits.max_seconds:.0f} s; "
                                "split the document or raise the limit")

    def done(self) -> Extracted:
        text = "".join(self.pieces)
        if not text.strip():
            raise DocumentError(f"{self.document} has no text")
        return Extracted(text, self.marks or [Mark(0, self.document)], self.kind, self.pages)
