"""Documents to encode: one text file, a folder of them or a glob, on the local disk or at any fsspec URL
(``s3://bucket/contracts/*.txt``). Used by ``reform encode`` in one process and by the cluster workers,
which read each document themselves so that only its name crosses the network."""

from __future__ import annotations

import os
from pathlib import Path

HIDDEN = (".", "_")


class DocumentError(ValueError):
    """A document that cannot be encoded (missing, empty, binary, not UTF-8) or a source with none."""


def decode_text(data: bytes, name: str) -> str:
    """``data`` as UTF-8 text, refused in one line when empty, binary or not UTF-8."""
    if not data.strip():
        raise DocumentError(f"{name} is empty")
    if b"\x00" in data[:1 << 20]:
        raise DocumentError(f"{name} looks binary (it contains NUL bytes); give a UTF-8 text file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DocumentError(f"{name} is not valid UTF-8 (byte {e.start}); convert it to UTF-8 first") from None


def read_document(location: str) -> str:
    """The text of one document (a local path or an fsspec URL)."""
    import fsspec
    try:
        with fsspec.open(location, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise DocumentError(f"file not found: {location}") from None
    except IsADirectoryError:
        raise DocumentError(f"{location} is a directory, not a text file") from None
    except (OSError, ImportError, ValueError) as e:
        raise DocumentError(f"cannot read {location}: {getattr(e, 'strerror', None) or e}") from None
    return decode_text(data, location)


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


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".webp", ".bmp", ".tif", ".tiff")


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
