"""A folder or glob of documents as one context: each document under a header line naming it (its path
below the folder), in sorted order; source code in a fenced block with its language, the layout code
models read in chat and repository prompts. Files reform does not read are left out and listed."""

from __future__ import annotations

from .extracted import DocumentError, Extracted, Limits, Mark, UnsupportedDocument


def relative_name(location: str, base: str) -> str:
    base = base.split("*")[0].split("?")[0].split("[")[0].rstrip("/")
    if location.startswith(base + "/"):
        return location[len(base) + 1:]
    return location.rsplit("/", 1)[-1]


def combine(documents: list[str], source: str, limits: Limits, images: bool = False) -> Extracted:
    """The documents at ``documents`` (locations ``find_documents`` gave for ``source``) as one context.
    Images are read by OCR where ``images`` (files named one by one) or ``limits.ocr`` is ``always``; a
    folder's images are otherwise left out (icons and figures of a repository are no pages of text)."""
    from pathlib import Path

    from .formats import extract_bytes, kind_of, read_bytes
    if len(documents) > limits.max_files:
        raise DocumentError(f"{source} holds {len(documents)} documents, over the limit of {limits.max_files}")
    base = source if "://" in source else str(Path(source).expanduser().absolute())
    if Path(base).is_file():
        base = str(Path(base).parent)
    named, skipped = [], []
    for location in documents:
        name = relative_name(location, base)
        try:
            data = read_bytes(location)
            if not images and limits.ocr != "always" and data.strip() and kind_of(name, data) == "image":
                raise UnsupportedDocument(f"{name} is an image: a folder's images are read by OCR with --ocr always")
            named.append((name, extract_bytes(data, name, limits)))
        except UnsupportedDocument as e:
            skipped.append((name, str(e)))
        except DocumentError as e:
            if "is empty" not in str(e) and "has no text" not in str(e):
                raise
            skipped.append((name, str(e)))        # a blank page or image in a folder: nothing to read there
    if not named:
        why = "; ".join(f"{n}: {w}" for n, w in skipped[:3])
        raise DocumentError(f"no document in {source} that reform reads" + (f" ({why})" if why else ""))
    joined = join(named)
    joined.skipped = skipped
    return joined


def join(named: list[tuple[str, Extracted]]) -> Extracted:
    """Extracted documents as one: each under a ``### name`` header line, source code fenced."""
    from .text import code_language
    pieces, marks, size, pages = [], [], 0, 0
    for name, doc in named:
        language = code_language(name)
        header = f"### {name}\n\n" + (f"```{language}\n" if language else "")
        footer = "\n```" if language else ""
        start = size + (2 if pieces else 0)
        if pieces:
            pieces.append("\n\n")
        marks.append(Mark(start, name))
        pieces += [header, doc.text, footer]
        body = start + len(header)
        marks += [Mark(body + m.start, name, m.page, m.section, m.unit) for m in doc.marks
                  if m.start > 0 or m.page is not None or m.section is not None]
        size = body + len(doc.text) + len(footer)
        pages += doc.pages
    joined = Extracted("".join(pieces), marks, "folder", pages)
    joined.timings = added_timings([doc.timings for _, doc in named])
    return joined


def added_timings(timings: list[dict]) -> dict:
    """The documents' extraction timings as one: seconds and OCR pages added, OCR seconds per page over all."""
    extract_s = sum(t.get("extract_s", 0.0) for t in timings)
    pages = sum(t.get("ocr_pages", 0) for t in timings)
    out = {"extract_s": round(extract_s, 3)}
    if pages:
        seconds = sum(t.get("ocr_pages", 0) * t.get("ocr_s_per_page", 0.0) for t in timings)
        out.update(ocr_pages=pages, ocr_s_per_page=round(seconds / pages, 3))
    return out
