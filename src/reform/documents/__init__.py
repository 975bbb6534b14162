"""Documents to encode: PDF, Word (DOCX), HTML, EPUB, Markdown, reStructuredText, plain text and source
code, one file, a folder of them or a glob, on the local disk or at any fsspec URL
(``s3://bucket/contracts/*.pdf``). ``extract`` turns any of them into one ``Extracted``: the text a model
reads and a map from its characters back to document, page, section and line (docs/documents.md). Used by
the pipeline, ``reform ask``/``encode``, the server and the cluster workers (which read each document
themselves so that only its name crosses the network). Layer 0 of docs/architecture.md (foundations)."""

from __future__ import annotations

import os
from pathlib import Path

from .extracted import DocumentError, Extracted, Limits, Location, Mark, UnsupportedDocument
from .formats import IMAGE_SUFFIXES, SUPPORTED, decode_text, extract_bytes, kind_of, read_bytes

HIDDEN = (".", "_")
__all__ = ["DocumentError", "Extracted", "Limits", "Location", "Mark", "UnsupportedDocument", "extract",
           "extract_bytes", "find_documents", "kind_of", "read_bytes", "read_document", "read_image", "decode_text",
           "IMAGE_SUFFIXES", "SUPPORTED"]


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
