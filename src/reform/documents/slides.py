"""Presentations (PPTX, python-pptx, MIT): each slide's text, tables (rows as ``a | b | c``) and speaker
notes, in slide order; the slide's title is its section and its number its place, so evidence reads
``deck.pptx, slide 7, "Results"``. Shapes are read in the order the slide stores them (the order a
screen reader follows), groups opened."""

from __future__ import annotations

import re

from .extracted import Builder, DocumentError, Extracted, Limits

_SLIDE = re.compile(r"ppt/slides/slide\d+\.xml")


def shape_lines(shape) -> list[str]:
    """A shape's text as lines: a text frame's paragraphs, a table's rows, a group's shapes in order."""
    if getattr(shape, "shapes", None) is not None:          # a group
        return [line for inner in shape.shapes for line in shape_lines(inner)]
    if getattr(shape, "has_table", False):
        rows = []
        for row in shape.table.rows:
            cells = [" ".join(cell.text.split()) for cell in row.cells]
            if any(cells):
                rows.append(" | ".join(cells))
        return rows
    if getattr(shape, "has_text_frame", False):
        return [" ".join(p.text.split()) for p in shape.text_frame.paragraphs if p.text.strip()]
    return []


def extract_pptx(data: bytes, name: str, limits: Limits = Limits()) -> Extracted:
    from pptx import Presentation

    from .packaged import open_package
    archive, load = open_package(data, name, limits, "PowerPoint (PPTX)", "ppt/presentation.xml", Presentation)
    slides = sum(1 for m in archive.namelist() if _SLIDE.fullmatch(m))
    if slides > limits.max_pages:      # counted in the zip's directory, before python-pptx loads any part
        raise DocumentError(f"{name} has {slides:,} slides, over the limit of {limits.max_pages:,}")
    deck = load()
    out = Builder(name, limits, "pptx")
    out.unit = "slide"
    for number, slide in enumerate(deck.slides, start=1):
        out.check_time()
        title = slide.shapes.title
        out.section = " ".join(title.text.split()) if title is not None and title.text.strip() else None
        out.new_page(number)
        lines = [line for shape in slide.shapes for line in shape_lines(shape)]
        if slide.has_notes_slide and (notes := slide.notes_slide.notes_text_frame) is not None and notes.text.strip():
            lines.append("Notes: " + " ".join(notes.text.split()))
        out.write("\n".join(lines))
    extracted = out.done()
    extracted.pages = len(deck.slides)
    return extracted
