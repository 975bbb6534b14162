"""Documents to encode: PDF, Word (DOCX), HTML, EPUB, Markdown, reStructuredText, plain text and source
code, one file, a folder of them or a glob, on the local disk or at any fsspec URL
(``s3://bucket/contracts/*.pdf``). ``extract`` turns any of them into one ``Extracted``: the text a model
reads and a map from its characters back to document, page, section and line (docs/documents.md). Used by
the pipeline, ``reform ask``/``encode``, the server and the cluster workers (which read each document
themselves so that only its name crosses the network)."""

from __future__ import annotations

import os
from pathlib import Path

from .extracted import Extracted, Limits, Location, Mark

HIDDEN = (".", "_")
__all__ = ["DocumentError", "Extracted", "Limits", "Location", "Mark", "UnsupportedDocument", "extract",
           "extract_bytes", "find_documents", "read_document", "read_image", "IMAGE_SUFFIXES"]


class DocumentError(ValueError):
    """A document that cannot be encoded (missing, empty, damaged, over a limit) or a source with none."""


class UnsupportedDocument(DocumentError):
    """A file of a type reform does not read (an image outside a vision-language context, an archive...)."""


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


def extract(source: str | os.PathLike | bytes, *, name: str | None = None, limits: Limits = Limits()) -> Extracted:
    """Any supported document (bytes, a path or URL of a file) or a folder or glob of them (one context:
    each document under a header line naming it, in sorted order; source code fenced with its language)."""
    if isinstance(source, (bytes, bytearray)):
        return extract_bytes(bytes(source), name or "the document", limits)
    location = str(source)
    if "://" not in location and Path(location).expanduser().is_file():
        return extract_bytes(read_bytes(location), name or location, limits)
    documents = find_documents(location)
    if len(documents) == 1 and not any(c in location for c in "*?[") and not Path(location).expanduser().is_dir():
        return extract_bytes(read_bytes(documents[0]), name or location, limits)
    from .folder import combine
    return combine(documents, location, limits)


def read_document(location: str) -> str:
    """The text of one document (a local path or an fsspec URL), extracted by its type."""
    return extract_bytes(read_bytes(location), location).text


def find_documents(source: str | os.PathLike) -> list[str]:
    """Every document ``source`` names, sorted: a file, the files under a folder (recursively; names
    starting with '.' or '_' are skipped) or the files a glob matches. Local sources give absolute
    paths, URLs give URLs. Raises ``DocumentError`` when there are none."""
    import fsspec
    source = str(source)
    url = "://" in source
    try:
        fs, path = fsspec.core.url_to_fs(source if url else str(Path(source).expanduser().absolute()))
    except (ImportError, ValueError) as e:
        raise DocumentError(f"cannot read {source}: {str(e).strip().splitlines()[0] if str(e).strip() else e}") \
            from None
    if any(c in path for c in "*?["):
        base, found = path.split("*")[0].split("?")[0].split("[")[0].rpartition("/")[0], fs.glob(path)
        found = [p for p in found if fs.isfile(p)]
    elif fs.isdir(path):
        base, found = path, fs.find(path)
    elif fs.isfile(path):
        base, found = path.rpartition("/")[0], [path]
    else:
        raise DocumentError(f"file not found: {source}")
    found = sorted(p for p in found if not any(part.startswith(HIDDEN) for part in
                                                p[len(base):].strip("/").split("/")))
    if not found:
        raise DocumentError(f"no documents in {source}")
    return found if not url else [fs.unstrip_protocol(p) for p in found]


def read_image(location):
    """One image (a local path, an fsspec URL or raw bytes) as an RGB ``PIL.Image``, refused in one line
    when missing or not an image."""
    import io

    import fsspec
    from PIL import Image, UnidentifiedImageError
    name = "the image" if isinstance(location, (bytes, bytearray)) else str(location)
    try:
        if isinstance(location, (bytes, bytearray)):
            data = bytes(location)
        else:
            with fsspec.open(str(location), "rb") as f:
                data = f.read()
        with Image.open(io.BytesIO(data)) as image:
            return image.convert("RGB")
    except FileNotFoundError:
        raise DocumentError(f"image not found: {name}") from None
    except IsADirectoryError:
        raise DocumentError(f"{name} is a directory, not an image") from None
    except (UnidentifiedImageError, Image.DecompressionBombError):
        raise DocumentError(f"{name} is not an image PIL can read (PNG, JPEG, GIF, WebP, ...)") from None
    except (OSError, ValueError) as e:
        raise DocumentError(f"cannot read {name}: {getattr(e, 'strerror', None) or e}") from None
