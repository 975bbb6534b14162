"""Evidence: the passages an answer was recomputed from, with where they are in the documents.

A context that came from text or documents keeps a ``Source``: the extracted text with its map
(``Extracted``) and, per context token, the character where it starts. A method that recomputes selected
context tokens (REFORM's gather, §3.3 of the paper; truncation; RAG) tells which tokens it kept and, where it
scores them, their gather scores; ``passages`` merges the kept tokens into runs of consecutive tokens, one
passage per run, ranked by their best score (docs/documents.md)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from .extracted import Extracted


@dataclass
class Source:
    """Where a context's tokens came from: ``token_starts[i]`` is the character of ``document.text`` at
    which context token i starts (-1 for the prompt template's tokens)."""

    document: Extracted
    token_starts: torch.Tensor      # int32 [context tokens], on the CPU


@dataclass
class Passage:
    text: str
    document: str
    page: int | None        # 1-based page (PDF, scan), slide (deck) or row (sheet) where the passage starts
    page_end: int | None    # the one where it ends (a passage may run over a page break)
    section: str | None     # the nearest heading above it; a sheet's name
    line: int               # 1-based line in its document's extracted text
    start: int              # character offsets in the context's text
    end: int
    score: float | None     # the best gather score of its tokens; None for methods that do not score
    tokens: int
    unit: str = "page"      # what ``page`` counts: page, slide or row

    def to_json(self) -> dict:
        return asdict(self)

    def where(self) -> str:
        """``book.pdf, page 12, "2.3 Permissions"`` (``data.xlsx, "Sheet2", row 41``) for a human."""
        parts = [self.document]
        if self.section and self.unit == "row":
            parts.append(f"\u201c{self.section}\u201d")
        if self.page is not None:
            parts.append(f"{self.unit} {self.page}" if self.page_end in (None, self.page) else
                         f"{self.unit}s {self.page}-{self.page_end}")
        if self.section and self.unit != "row":
            parts.append(f"\u201c{self.section}\u201d")
        if self.page is None:
            parts.append(f"line {self.line}")
        return ", ".join(parts)


def runs(indices: torch.Tensor) -> list[tuple[int, int]]:
    """``[first, last]`` of each run of consecutive values in the ascending ``indices``."""
    if indices.numel() == 0:
        return []
    idx = indices.tolist()
    out, first = [], idx[0]
    for a, b in zip(idx, idx[1:]):
        if b != a + 1:
            out.append((first, a))
            first = b
    out.append((first, idx[-1]))
    return out


def passages(source: Source, kept: torch.Tensor, scores: torch.Tensor | None = None) -> list[Passage]:
    """The passages of the context tokens ``kept`` (ascending indices; ``scores`` their gather scores, in
    the same order), best score first (in context order where there are no scores)."""
    starts, doc = source.token_starts, source.document
    n, size = starts.numel(), len(doc.text)
    kept = kept.detach().to("cpu", torch.long)
    score_of = None if scores is None else dict(zip(kept.tolist(), scores.detach().float().cpu().tolist()))
    kept = kept[(kept < n)]
    kept = kept[starts[kept] >= 0]                  # the template's tokens are no part of any document
    found = []
    for first, last in runs(kept):
        begin = int(starts[first])
        end = int(starts[last + 1]) if last + 1 < n and starts[last + 1] >= 0 else size
        run_starts = starts[first:last + 1]
        # a run that crosses from one document of a folder into the next (or one sheet of a workbook into
        # the next): one passage per document and sheet
        for a, b in split_by_document(doc, begin, max(end, begin)):
            text = doc.text[a:b]
            lead = len(text) - len(text.lstrip())
            body = text.strip()
            if not body:
                continue
            tokens = [first + int(i) for i in torch.nonzero((run_starts >= a) & (run_starts < b)).flatten()]
            at = a + lead
            loc, last_loc = doc.locate(at), doc.locate(at + len(body) - 1)
            # a passage from a heading above the first page or row (a sheet's name and table header) is placed
            # at the first one it holds
            page = loc.page if loc.page is not None else doc.first_page(at, at + len(body))
            best = None if score_of is None or not tokens else max(score_of[i] for i in tokens)
            found.append(Passage(body, loc.document, page, last_loc.page if page is not None else None,
                                 loc.section, loc.line, at, at + len(body),
                                 None if best is None else round(best, 4), len(tokens), loc.unit))
    if scores is not None:
        found.sort(key=lambda p: -p.score)
    return found


def split_by_document(doc: Extracted, begin: int, end: int) -> list[tuple[int, int]]:
    """``[begin, end)`` cut where it crosses into another document, or into another sheet of a workbook
    (its rows count from 1 again)."""
    first = doc.mark_at(begin)
    cuts, document, sheet = [], first.document, first.section if first.unit == "row" else None
    for mark in doc.marks:
        if not begin < mark.start < end:
            continue
        if mark.document != document or (mark.unit == "row" and sheet is not None and mark.section != sheet):
            cuts.append(mark.start)
        document, sheet = mark.document, mark.section if mark.unit == "row" else sheet
    edges = [begin, *cuts, end]
    return list(zip(edges, edges[1:]))
