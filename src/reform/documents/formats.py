"""One document's bytes to ``Extracted``, by its type: read from the bytes first (``%PDF``, a zip holding
``word/``, ``xl/``, ``ppt/`` or an EPUB ``mimetype``, an image's signature, an ``<html>`` start), then from
the name (docs/documents.md)."""

from __future__ import annotations

import time
from pathlib import Path

from .extracted import DocumentError, Extracted, Limits, UnsupportedDocument

SUPPORTED = ("PDF (scans by OCR), Word (.docx), Excel (.xlsx), CSV, PowerPoint (.pptx), HTML, EPUB, images of "
             "pages (by OCR), Markdown, reStructuredText, plain text and source code")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".webp", ".bmp", ".tif", ".tiff")
IMAGE_SIGNATURES = (b"\x89PNG", b"\xff\xd8\xff", b"GIF8", b"II*\x00", b"MM\x00*")
TABLE_SUFFIXES = (".csv", ".tsv")
ZIPPED = {"word/": "docx", "xl/": "xlsx", "ppt/": "pptx"}     # the folder an Office Open XML zip keeps its parts in
KNOWN_BINARY = {".doc": "a legacy Word (.doc) file; save it as .docx",
                ".xls": "a legacy Excel (.xls) workbook; save it as .xlsx",
                ".ppt": "a legacy PowerPoint (.ppt) file; save it as .pptx",
                ".odt": "an OpenDocument file; save it as .docx", ".ods": "an OpenDocument spreadsheet; save it as .xlsx",
                ".odp": "an OpenDocument presentation; save it as .pptx",
                ".zip": "a zip archive; unpack it and give the folder", ".gz": "a compressed file",
                ".tar": "a tar archive", ".7z": "an archive", ".rar": "an archive", ".exe": "a program",
                ".so": "a library", ".dll": "a library", ".mp3": "audio", ".wav": "audio", ".mp4": "video",
                ".mkv": "video", ".mov": "video"}


def decode_text(data: bytes, name: str) -> str:
    """``data`` as text in whatever encoding it is in, refused in one line when empty or binary."""
    from .text import decode
    return decode(data, name)


def kind_of(name: str, data: bytes) -> str:
    """``pdf``, ``docx``, ``xlsx``, ``pptx``, ``epub``, ``image``, ``csv``, ``html`` or ``text`` by the file's
    bytes first, then its name; raises ``UnsupportedDocument`` for anything else."""
    suffix = Path(name.split("?")[0]).suffix.lower()
    head = data[:2048]
    if head.startswith(b"%PDF") or (suffix == ".pdf" and b"%PDF" in data[:1024]):
        return "pdf"
    if head.startswith(b"PK\x03\x04"):
        if b"mimetypeapplication/epub+zip" in data[:128] or suffix == ".epub":
            return "epub"
        by_suffix = {".docx": "docx", ".docm": "docx", ".xlsx": "xlsx", ".xlsm": "xlsx", ".pptx": "pptx"}
        if suffix in by_suffix:
            return by_suffix[suffix]
        for folder, kind in ZIPPED.items():
            if folder.encode() in data[:1 << 16]:
                return kind
        raise UnsupportedDocument(f"{name} is {KNOWN_BINARY.get(suffix, 'a zip archive')}, which reform does not "
                                  f"read (it reads {SUPPORTED})")
    if suffix == ".pdf":
        raise DocumentError(f"{name} is not a readable PDF (no PDF header; truncated or not a PDF?)")
    if suffix in (".docx", ".epub", ".xlsx", ".pptx"):
        raise DocumentError(f"{name} is not a valid {suffix[1:].upper()} file (not a zip archive; truncated or damaged?)")
    if (head.startswith(IMAGE_SIGNATURES) or (head.startswith(b"RIFF") and head[8:12] == b"WEBP")
            or (suffix == ".bmp" and head.startswith(b"BM"))):
        return "image"
    if suffix in IMAGE_SUFFIXES:
        raise DocumentError(f"{name} is not a readable image (no image signature; truncated or not an image?)")
    if suffix in TABLE_SUFFIXES:
        return "csv"
    if suffix in KNOWN_BINARY:
        raise UnsupportedDocument(f"{name} is {KNOWN_BINARY[suffix]}, which reform does not read (it reads {SUPPORTED})")
    if suffix in (".html", ".htm", ".xhtml") or head.lstrip()[:15].lower().startswith((b"<!doctype html", b"<html")):
        return "html"
    return "text"


def extract_bytes(data: bytes, name: str, limits: Limits = Limits()) -> Extracted:
    """One document's bytes as ``Extracted``, by its type (``kind_of``); ``timings["extract_s"]`` its wall time."""
    from .html import extract_html
    from .ocr import extract_image
    from .packaged import extract_docx, extract_epub
    from .pdf import extract_pdf
    from .sheets import extract_csv, extract_xlsx
    from .slides import extract_pptx
    from .text import extract_text
    started = time.perf_counter()
    if not data.strip():
        raise DocumentError(f"{name} is empty")
    kind = kind_of(name, data)
    if kind == "image" and limits.ocr == "never":
        raise UnsupportedDocument(f"{name} is an image, and --ocr never leaves images of pages unread (a "
                                  "vision-language model takes it as an image part)")
    if kind == "html":
        from .text import decode
        data = decode(data, name)
    extracted = {"pdf": extract_pdf, "docx": extract_docx, "xlsx": extract_xlsx, "pptx": extract_pptx,
                 "epub": extract_epub, "image": extract_image, "csv": extract_csv, "html": extract_html,
                 "text": lambda d, n, _limits: extract_text(d, n)}[kind](data, name, limits)
    extracted.timings = {"extract_s": round(time.perf_counter() - started, 3), **extracted.timings}
    return extracted


def read_bytes(location: str) -> bytes:
    import fsspec
    try:
        with fsspec.open(location, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise DocumentError(f"file not found: {location}") from None
    except IsADirectoryError:
        raise DocumentError(f"{location} is a directory, not a file") from None
    except (OSError, ImportError, ValueError) as e:
        raise DocumentError(f"cannot read {location}: {getattr(e, 'strerror', None) or e}") from None
