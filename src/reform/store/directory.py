"""A folder of saved contexts addressed by content (``Pipeline.context_key``): ``KEY.reform`` files, the
least recently used removed first when the folder outgrows its size budget. Survives restarts: the
folder is the whole state (a file's modification time is its last use)."""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from .format import ContextFileError, read_manifest

SUFFIX = ".reform"
_KEY = re.compile(r"[0-9a-f]{32}")


@dataclass
class StoredContext:
    key: str
    path: Path
    bytes: int
    last_used: float


class ContextStore:
    """``put``/``path``/``touch``/``delete`` by key; ``max_bytes`` bounds the folder (None: unbounded)."""

    def __init__(self, root: str | os.PathLike, max_bytes: int | None = None):
        self.root = Path(root).expanduser()
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ContextFileError(f"cannot use {self.root} as a context store: {e.strerror or e}") from None
        if not os.access(self.root, os.W_OK):
            raise ContextFileError(f"cannot use {self.root} as a context store: it is not writable")
        if max_bytes is not None and max_bytes <= 0:
            raise ValueError("the store's size budget must be positive")
        self.max_bytes = max_bytes

    @staticmethod
    def valid_key(key: str) -> bool:
        return isinstance(key, str) and _KEY.fullmatch(key) is not None

    def path(self, key: str) -> Path:
        if not self.valid_key(key):
            raise KeyError(key)
        return self.root / f"{key}{SUFFIX}"

    def has(self, key: str) -> bool:
        return self.valid_key(key) and self.path(key).is_file()

    def get(self, key: str) -> StoredContext | None:
        if not self.has(key):
            return None
        st = self.path(key).stat()
        return StoredContext(key, self.path(key), st.st_size, st.st_mtime)

    def manifest(self, key: str) -> dict:
        return read_manifest(self.path(key))

    def touch(self, key: str) -> None:
        """Mark ``key`` as just used (the size budget removes the least recently used first)."""
        try:
            os.utime(self.path(key))
        except OSError:
            pass

    def put(self, key: str, ctx) -> int:
        """Save ``ctx`` (anything with ``save(path)``) under ``key``; then enforce the size budget, never
        removing ``key`` itself. Returns the file's size."""
        size = ctx.save(self.path(key))
        self.enforce_budget(keep={key})
        return size

    def delete(self, key: str) -> bool:
        try:
            self.path(key).unlink()
            return True
        except (FileNotFoundError, KeyError):
            return False

    def entries(self) -> list[StoredContext]:
        """Every stored context, most recently used first (half-written temporary files are not listed)."""
        out = []
        for p in self.root.glob(f"*{SUFFIX}"):
            key = p.name[:-len(SUFFIX)]
            if self.valid_key(key):
                try:
                    st = p.stat()
                except FileNotFoundError:    # removed meanwhile
                    continue
                out.append(StoredContext(key, p, st.st_size, st.st_mtime))
        return sorted(out, key=lambda e: e.last_used, reverse=True)

    def total_bytes(self) -> int:
        return sum(e.bytes for e in self.entries())

    def enforce_budget(self, keep: set[str] = frozenset()) -> list[str]:
        """Remove least recently used contexts until the folder fits ``max_bytes``; returns removed keys."""
        if self.max_bytes is None:
            return []
        entries, removed = self.entries(), []
        total = sum(e.bytes for e in entries)
        for e in reversed(entries):
            if total <= self.max_bytes:
                break
            if e.key in keep:
                continue
            if self.delete(e.key):
                total -= e.bytes
                removed.append(e.key)
        return removed

    def remove_stale_temporaries(self, older_than_s: float = 3600) -> None:
        """Temporary files of writes that were killed mid-way (a normal write removes its own)."""
        now = time.time()
        for p in self.root.glob(f".*{SUFFIX}.*.tmp"):
            try:
                if now - p.stat().st_mtime > older_than_s:
                    p.unlink()
            except FileNotFoundError:
                pass
