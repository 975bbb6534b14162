"""Where results go: output paths checked before any work starts, files written atomically.

A command that computes for minutes must not learn at the end that it cannot write its result, so
``check_output_file`` / ``check_output_dir`` try the real thing up front (create the missing folders,
write and delete a probe file, then remove what they created) and refuse in one line. ``write_atomic``
writes to a temporary file in the target's folder, fsyncs and renames it over the target: a reader sees
the old file or the new one, never a partial one, and a failed or interrupted write leaves nothing.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from pathlib import Path
from typing import Callable


class OutputError(ValueError):
    """An output path that cannot be written."""


def as_path(path, what: str = "output path") -> Path:
    if not isinstance(path, (str, os.PathLike)) or not str(path).strip():
        raise OutputError(f"{what} must be a file or folder name, got {path!r}")
    return Path(path).expanduser()


def check_output_file(path, what: str = "output file") -> Path:
    """``path`` as a ``Path`` if a file can be written there (missing folders are allowed: they are made
    when the file is written); otherwise ``OutputError``. Creates nothing."""
    path = as_path(path, what)
    if path.is_dir():
        raise OutputError(f"{what} {path} is a folder; give a file name")
    _probe(path.parent, what, path)
    return path


def check_output_dir(path, what: str = "output folder") -> Path:
    """``path`` as a ``Path`` if files can be written into it (made later if missing); creates nothing."""
    path = as_path(path, what)
    if path.exists() and not path.is_dir():
        raise OutputError(f"{what} {path} is a file, not a folder")
    _probe(path, what, path)
    return path


def _probe(folder: Path, what: str, target: Path) -> None:
    missing, existing = [], folder
    while not existing.exists() and existing != existing.parent:
        missing.append(existing)
        existing = existing.parent
    if not existing.is_dir():
        raise OutputError(f"cannot write {what} {target}: {existing} is a file, not a folder")
    made = []
    try:
        for d in reversed(missing):
            d.mkdir()
            made.append(d)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".reform-write-test-"):
            pass
    except OSError as e:
        raise OutputError(f"cannot write {what} {target}: {e.strerror or e}") from None
    finally:
        for d in reversed(made):
            try:
                d.rmdir()
            except OSError:
                pass


def write_atomic(path, write: Callable[[Path], None] | bytes | str) -> int:
    """Write ``path`` all at once: ``write`` is the content (text or bytes) or a function that writes a
    given temporary path. Missing folders are made. Returns the file's size in bytes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        if callable(write):
            write(tmp)
        else:
            tmp.write_bytes(write.encode() if isinstance(write, str) else write)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    try:   # make the rename itself durable
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass
    return path.stat().st_size
