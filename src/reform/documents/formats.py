"""One document's bytes to ``Extracted``, by its type: read from the bytes first (``%PDF``, a zip holding
``word/`` or an EPUB ``mimetype``, an ``<html>`` start), then from the name (docs/documents.md)."""

from __future__ import annotations

from pathlib import Path

from .extracted import DocumentError, Extracted, Limits, UnsupportedDocument

SUPPORTED = "PDF, Word (.docx), HTML, EPUB, Markdown, reStructuredText, plain text and source code"
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".webp", ".bmp", ".tif", ".tiff")
KNOWN_BINARY = {".doc": "a legacy Word (.doc) file; save it as .docx", ".xls": "a spreadsheet", ".xlsx": "a spreadsheet",
                ".ppt": "a presentation", ".pptx": "a presentation", ".odt": "an OpenDocument file; save it as .docx",
                ".zip": "a zip archive; unpack it and give the folder", ".gz": "a compressed file",
                ".tar": "a tar archive", ".7z": "an archive", ".rar": "an archive", ".exe": "a program",
                ".so": "a library", ".dll": "a library", ".mp3": "audio", ".wav": "audio", ".mp4": "video",
                ".mkv": "video", ".mov": "video"}


def decode_text(data: bytes, name: str) -> str:
    """``data`` as text in whatever encoding it is in, refused in one line when empty or binary."""
    from .text import decode
    return decode(data, name)


def kind_of(name: str, data: bytes) -> str:
    """``pdf``, ``docx``, ``epub``, ``html`` or ``text`` by the file's bytes first, then its name; raises
    ``UnsupportedDocument`` for anything else."""
    suffix = Path(name.split("?")[0]).suffix.lower()
    head = data[:2048]
    if head.startswith(b"%PDF") or (suffix == ".pdf" and b"%PDF" in data[:1024]):
        return "pdf"
    if head.startswith(b"PK\x03\x04"):
        if b"mimetypeapplication/epub+zip" in data[:128] or suffix == ".epub":
            return "epub"
        if suffix in (".docx", ".docm") or b"word/" in data[:1 << 16]:
            return "docx"
        raise UnsupportedDocument(f"{name} is {KNOWN_BINARY.get(suffix, 'a zip archive')}, which reform does not "
                                  f"read (it reads {SUPPORTED})")
    if suffix == ".pdf":
        raise DocumentError(f"{name} is not a readable PDF (no PDF header; truncated or not a PDF?)")
    if suffix in (".docx", ".epub"):
        raise DocumentError(f"{name} is not a valid {suffix[1:].upper()} file (not a zip archive; truncated or damaged?)")
    if suffix in IMAGE_SUFFIXES or head.startswith((b"\x89PNG", b"\xff\xd8\xff", b"GIF8")):
        raise UnsupportedDocument(f"{name} is an image; images go to a vision-language model as image parts, "
                                  f"not as a document (reform reads {SUPPORTED})")
    if suffix in KNOWN_BINARY:
        raise UnsupportedDocument(f"{name} is {KNOWN_BINARY[suffix]}, which reform does not read (it reads {SUPPORTED})")
    if suffix in (".html", ".htm", ".xhtml") or head.lstrip()[:15].lower().startswith((b"<!doctype html", b"<html")):
        return "html"
    return "text"


def extract_bytes(data: bytes, name: str, limits: Limits = Limits()) -> Extracted:
    """One document's bytes as ``Extracted``, by its type (``kind_of``)."""
    from .html import extract_html
    from .packaged import extract_docx, extract_epub
    from .pdf import extract_pdf
    from .text import extract_text
    if not data.strip():
        raise DocumentError(f"{name} is empty")
    kind = kind_of(name, data)
    if kind == "html":
        from .text import decode
        data = decode(data, name)
    return {"pdf": extract_pdf, "docx": extract_docx, "epub": extract_epub, "html": extract_html,
            "text": lambda d, n, _limits: extract_text(d, n)}[kind](data, name, limits)


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
