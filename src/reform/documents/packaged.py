"""Zip-packaged documents: Word (DOCX, python-docx, MIT) and EPUB (the OPF spine read with the standard
library's zipfile and defusedxml, each chapter through the HTML path), and the opening of every Office
Open XML file (``open_package``: DOCX here, XLSX in sheets.py, PPTX in slides.py). All are zip files, so
all are checked for zip bombs before anything is unpacked."""

from __future__ import annotations

import io
import posixpath
import zipfile

from .extracted import Builder, DocumentError, Extracted, Limits

PARSED_PARTS = (".xml", ".rels", ".xhtml", ".html", ".htm", ".opf", ".ncx")   # what the libraries parse whole


def open_zip(data: bytes, name: str, limits: Limits, kind: str, streamed: tuple[str, ...] = ()) -> zipfile.ZipFile:
    """The zip, refused in one line when it is no zip, unpacks past ``limits.max_unpacked_bytes`` or has an
    XML or HTML part past ``limits.max_part_bytes`` (by the sizes its directory declares; reads are bounded
    by them too, see ``read_member``). ``streamed``: folders of parts its library reads as a stream, not
    whole (an XLSX's worksheets, bounded by their cells instead)."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, ValueError):
        raise DocumentError(f"{name} is not a valid {kind} file (not a zip archive; truncated or damaged?)") from None
    unpacked = sum(info.file_size for info in archive.infolist())
    if unpacked > limits.max_unpacked_bytes:
        raise DocumentError(f"{name} unpacks to {unpacked >> 20} MB, over the limit of "
                            f"{limits.max_unpacked_bytes >> 20} MB (a zip bomb?)")
    # a part a library parses whole is checked here, before it inflates (zipfile never inflates a member past
    # the size its directory declares, so a lying directory cannot pass this)
    for info in archive.infolist():
        if info.filename.lower().endswith(PARSED_PARTS) and info.file_size > limits.max_part_bytes \
                and not info.filename.startswith(streamed or "\0"):
            raise DocumentError(f"{name}: its part {info.filename!r} unpacks to {info.file_size >> 20} MB, over the "
                                f"limit of {limits.max_part_bytes >> 20} MB for one part (a zip bomb?)")
    return archive


def open_package(data: bytes, name: str, limits: Limits, kind: str, main_part: str, opener,
                 streamed: tuple[str, ...] = ()):
    """An Office Open XML file (DOCX, XLSX, PPTX) opened by its library's ``opener`` (a file object in,
    the document out), refused in one line when its zip is a bomb, lacks ``main_part`` or is damaged.
    Returns ``(zip, document)``; the zip is for checks that must come before the library reads a part."""
    archive = open_zip(data, name, limits, kind, streamed)
    if main_part not in archive.namelist():
        raise DocumentError(f"{name} is not a {kind} file (no {main_part})")
    return archive, lambda: _opened(opener, data, name, kind)


def _opened(opener, data: bytes, name: str, kind: str):
    try:
        return opener(io.BytesIO(data))
    except Exception as e:    # each library raises its own kinds for a damaged part (KeyError, ValueError, ...)
        raise DocumentError(f"{name} is not a readable {kind} file ({type(e).__name__}: {e})") from None


def read_member(archive: zipfile.ZipFile, member: str, name: str, limits: Limits) -> bytes:
    """One member's bytes, never more than the limit whatever its header claims."""
    try:
        with archive.open(member) as f:
            data = f.read(limits.max_unpacked_bytes + 1)
    except KeyError:
        raise DocumentError(f"{name} is damaged: it names {member!r}, which it does not contain") from None
    except (zipfile.BadZipFile, OSError, EOFError, NotImplementedError) as e:   # NotImplementedError: zipfile's
        # answer to a compression method it lacks (a foreign or damaged archive), not unfinished code here
        raise DocumentError(f"{name} is damaged: cannot unpack {member!r} ({e})") from None
    if len(data) > limits.max_unpacked_bytes:
        raise DocumentError(f"{name}: {member!r} unpacks past the limit of {limits.max_unpacked_bytes >> 20} MB")
    return data


def extract_docx(data: bytes, name: str, limits: Limits = Limits()) -> Extracted:
    """Paragraphs, headings (sections) and tables (rows as ``a | b | c``), in document order."""
    from docx import Document
    from docx.table import Table
    from docx.text.paragraph import Paragraph

    _, load = open_package(data, name, limits, "Word (DOCX)", "word/document.xml", Document)
    doc = load()
    out = Builder(name, limits, "docx")
    body = doc.element.body
    for child in body.iterchildren():
        out.check_time()
        tag = child.tag.rsplit("}", 1)[-1]
        if tag == "p":
            paragraph = Paragraph(child, doc)
            style = (paragraph.style.name if paragraph.style is not None else "") or ""
            if style == "Title" or style.startswith("Heading"):
                level = int(style.split()[-1]) if style.split()[-1].isdigit() else 1
                out.heading(paragraph.text, level)
            else:
                out.paragraph(paragraph.text)
        elif tag == "tbl":
            for row in Table(child, doc).rows:
                cells = []
                for cell in row.cells:
                    text = " ".join(cell.text.split())
                    if not cells or cells[-1] != text:        # a merged cell repeats in each grid column
                        cells.append(text)
                if any(cells):
                    out.paragraph(" | ".join(cells))
    return out.done()


def extract_epub(data: bytes, name: str, limits: Limits = Limits()) -> Extracted:
    """The chapters in the order of the OPF spine, each through the HTML path."""
    from defusedxml import ElementTree
    from defusedxml.common import DefusedXmlException

    from .html import extract_html
    archive = open_zip(data, name, limits, "EPUB")

    def xml(member: str):
        try:
            return ElementTree.fromstring(read_member(archive, member, name, limits))
        except (ElementTree.ParseError, DefusedXmlException) as e:
            raise DocumentError(f"{name} is damaged: {member} is not valid XML ({e})") from None

    container = xml("META-INF/container.xml")
    rootfile = next((el.get("full-path") for el in container.iter() if el.tag.endswith("rootfile")), None)
    if not rootfile:
        raise DocumentError(f"{name} is not a valid EPUB (META-INF/container.xml names no package file)")
    opf = xml(rootfile)
    base = posixpath.dirname(rootfile)
    manifest = {item.get("id"): item for item in opf.iter() if item.tag.endswith("}item") or item.tag == "item"}
    spine = [ref.get("idref") for ref in opf.iter() if ref.tag.endswith("itemref") or ref.tag == "itemref"]
    if not spine:
        raise DocumentError(f"{name} is not a valid EPUB (its package file has an empty spine)")
    out = Builder(name, limits, "epub")
    for idref in spine:
        item = manifest.get(idref)
        if item is None or "html" not in (item.get("media-type") or ""):
            continue
        out.check_time()
        member = posixpath.normpath(posixpath.join(base, item.get("href", "")))
        extract_html(read_member(archive, member, name, limits), name, limits, out=out)
    return out.done()
