"""A store of saved contexts addressed by content (``Pipeline.context_key``): ``KEY.reform`` files in one
folder, the least recently used removed first when the folder outgrows its size budget. Survives
restarts: the folder is the whole state (a file's modification time is its last use).

A key is 32 hex digits, optionally in a scope: ``tenants/NAME/KEY`` lives in the folder ``tenants/NAME``
(a server's tenant, ``reform.server.tenants``). Listing takes a scope; the size budget is the whole store's.

The folder is a local path or any fsspec URL (``file://``, ``s3://bucket/contexts``, ``gs://``, a shared
filesystem, ``memory://`` in tests), so every worker of a cluster can read and write one store. A write
is whole or absent on every backend: the file is written under a hidden temporary name and then renamed
(locally: fsynced and ``os.replace``; remotely: uploaded, then moved), and readers list only final names.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from .format import ContextFileError, read_manifest, read_manifest_bytes

SUFFIX = ".reform"
NOTE_SUFFIX = ".status.json"      # a small JSON note beside a context being encoded (see ``write_note``)
SCOPES = "tenants"                # the folder of scopes: SCOPES/NAME/ holds one scope's files
_SCOPE = rf"{SCOPES}/[A-Za-z0-9][A-Za-z0-9_.-]{{0,63}}"
_KEY = re.compile(rf"(?:{_SCOPE}/)?[0-9a-f]{{32}}")


@dataclass
class StoredContext:
    key: str
    path: str
    bytes: int
    last_used: float


def _is_url(location: str) -> bool:
    return "://" in location or "::" in location


def open_filesystem(location: str | os.PathLike):
    """``(fs, root)`` of a local folder or an fsspec URL; a one-line ``ContextFileError`` when the URL's
    protocol is unknown or its package (s3fs, gcsfs, ...) is not installed."""
    import fsspec
    location = str(location)
    if not _is_url(location):
        location = str(Path(location).expanduser().resolve())
    try:
        fs, root = fsspec.core.url_to_fs(location)
    except (ImportError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ContextFileError(f"cannot use {location} as a context store: {first}") from None
    return fs, root.rstrip("/") or "/"


def _mtime(info: dict) -> float:
    """A file's modification time from an fsspec ``info`` dict, whatever the backend calls it."""
    for name in ("mtime", "LastModified", "last_modified", "updated", "created"):
        value = info.get(name)
        if value is None:
            continue
        if hasattr(value, "timestamp"):
            return float(value.timestamp())
        try:
            return float(value)
        except (TypeError, ValueError):
            continue
    return 0.0


class ContextStore:
    """``put``/``has``/``open_local``/``touch``/``delete`` by key; ``max_bytes`` bounds the folder (None:
    unbounded). ``location`` is a local folder or an fsspec URL."""

    def __init__(self, location: str | os.PathLike, max_bytes: int | None = None):
        from fsspec.implementations.local import LocalFileSystem
        self.fs, self.root = open_filesystem(location)
        self.local = isinstance(self.fs, LocalFileSystem)
        self.url = self.root if self.local else self.fs.unstrip_protocol(self.root)
        try:
            self.fs.makedirs(self.root, exist_ok=True)
        except OSError as e:
            raise ContextFileError(f"cannot use {self.url} as a context store: {e.strerror or e}") from None
        if self.local and not os.access(self.root, os.W_OK):
            raise ContextFileError(f"cannot use {self.url} as a context store: it is not writable")
        if max_bytes is not None and max_bytes <= 0:
            raise ValueError("the store's size budget must be positive")
        self.max_bytes = max_bytes
        # keys the size budget never removes (the documents of libraries, which a server sets here)
        self.pinned: Callable[[], set[str]] = set
        # called with (key, bytes) before a context is written; raises to refuse it (a server's quotas)
        self.room: Callable[[str, int], None] | None = None

    @staticmethod
    def valid_key(key: str) -> bool:
        return isinstance(key, str) and _KEY.fullmatch(key) is not None

    def folder(self, scope: str = "") -> str:
        """Where a scope's files are ("": the top folder)."""
        return f"{self.root}/{scope}" if scope else self.root

    def location(self, key: str) -> str:
        """Where ``key``'s file is on the store's filesystem (a path for fsspec calls)."""
        if not self.valid_key(key):
            raise KeyError(key)
        return f"{self.root}/{key}{SUFFIX}"

    def path(self, key: str) -> Path:
        """The local file of ``key`` (local stores only; use ``open_local`` for any store)."""
        if not self.local:
            raise ValueError(f"{self.url} is not a local folder; use open_local()")
        return Path(self.location(key))

    def has(self, key: str) -> bool:
        return self.valid_key(key) and self.fs.isfile(self.location(key))

    def get(self, key: str) -> StoredContext | None:
        if not self.valid_key(key):
            return None
        try:
            info = self.fs.info(self.location(key))
        except FileNotFoundError:
            return None
        return StoredContext(key, self.location(key), int(info.get("size") or 0), _mtime(info))

    def manifest(self, key: str) -> dict:
        """The file's manifest, reading only its header (no tensors are fetched from a remote store)."""
        if self.local:
            return read_manifest(self.location(key))
        try:
            with self.fs.open(self.location(key), "rb") as f:
                return read_manifest_bytes(f, f"{self.url}/{key}{SUFFIX}")
        except FileNotFoundError:
            raise ContextFileError(f"saved context not found: {self.url}/{key}{SUFFIX}") from None

    @contextlib.contextmanager
    def open_local(self, key: str) -> Iterator[Path]:
        """A local file holding ``key``'s context for as long as the ``with`` lasts: the file itself in a
        local store, a downloaded copy (removed afterwards) in a remote one."""
        if self.local:
            yield Path(self.location(key))
            return
        with tempfile.TemporaryDirectory(prefix="reform-context-") as folder:
            copy = Path(folder) / f"{key}{SUFFIX}"
            try:
                self.fs.get_file(self.location(key), str(copy))
            except FileNotFoundError:
                raise ContextFileError(f"saved context not found: {self.url}/{key}{SUFFIX}") from None
            yield copy

    def touch(self, key: str) -> None:
        """Mark ``key`` as just used (the size budget removes the least recently used first). Backends
        that cannot change a file's time without rewriting it (object stores) keep its upload time."""
        try:
            if self.local:
                os.utime(self.location(key))
        except OSError:
            pass

    def put(self, key: str, ctx) -> int:
        """Save ``ctx`` (anything with ``save(path)``) under ``key``; then enforce the size budget, never
        removing ``key`` itself. Returns the file's size. ``room`` may refuse it first."""
        if self.room is not None and hasattr(ctx, "stored_bytes"):
            self.room(key, ctx.stored_bytes())
        if self.local:
            size = ctx.save(self.location(key))
        else:
            size = self._upload(key, ctx)
        self.enforce_budget(keep={key})
        return size

    def _upload(self, key: str, ctx) -> int:
        """Write locally, upload under a hidden name, then move into place: readers never see a part."""
        final = self.location(key)
        scope, _, name = key.rpartition("/")
        hidden = f"{self.folder(scope)}/.{name}{SUFFIX}.{uuid.uuid4().hex[:8]}.tmp"
        with tempfile.TemporaryDirectory(prefix="reform-context-") as folder:
            size = ctx.save(Path(folder) / f"{key}{SUFFIX}")
            try:
                self.fs.put_file(str(Path(folder) / f"{key}{SUFFIX}"), hidden)
                self.fs.mv(hidden, final)
            except OSError as e:
                raise ContextFileError(f"cannot write {self.url}/{key}{SUFFIX}: {e.strerror or e}") from None
            finally:
                with contextlib.suppress(OSError):
                    if self.fs.exists(hidden):
                        self.fs.rm_file(hidden)
        return size

    def delete(self, key: str) -> bool:
        self.drop_note(key)
        try:
            self.fs.rm_file(self.location(key))
            return True
        except (FileNotFoundError, KeyError):
            return False

    # notes: what one process tells the others sharing the store about a context it is encoding
    def _note(self, key: str) -> str:
        if not self.valid_key(key):
            raise KeyError(key)
        return f"{self.root}/{key}{NOTE_SUFFIX}"

    def write_note(self, key: str, note: dict) -> None:
        """Publish ``note`` (JSON-able) about ``key``, replacing the last one whole."""
        import json
        with contextlib.suppress(OSError):
            self.write_whole(self._note(key), json.dumps(note).encode())

    def write_whole(self, path: str, data: bytes) -> None:
        """Write a small file at ``path`` (on the store's filesystem) whole or not at all."""
        if self.local:
            from ..outputs import write_atomic
            write_atomic(path, data)
        else:
            self.fs.pipe_file(path, data)     # an object store's put is whole or absent

    def read_whole(self, path: str) -> bytes:
        with self.fs.open(path, "rb") as f:
            return f.read()

    def read_note(self, key: str) -> dict | None:
        import json
        if not self.valid_key(key):
            return None
        try:
            with self.fs.open(self._note(key), "rb") as f:
                note = json.loads(f.read())
        except (OSError, ValueError):
            return None
        return note if isinstance(note, dict) else None

    def drop_note(self, key: str) -> None:
        with contextlib.suppress(OSError, KeyError):
            self.fs.rm_file(self._note(key))

    def _listing(self, folder: str | None = None) -> list[dict]:
        folder = folder or self.root
        try:
            return self.fs.ls(folder, detail=True, refresh=True) if not self.local else \
                self.fs.ls(folder, detail=True)
        except FileNotFoundError:
            return []
        except TypeError:       # a backend whose ls takes no ``refresh``
            return self.fs.ls(folder, detail=True)

    def scopes(self) -> list[str]:
        """Every scope with a folder, the top folder ("") first."""
        found = [""]
        for info in self._listing(f"{self.root}/{SCOPES}"):
            name = info["name"].rstrip("/").rsplit("/", 1)[-1]
            if info.get("type") == "directory" and re.fullmatch(_SCOPE, f"{SCOPES}/{name}"):
                found.append(f"{SCOPES}/{name}")
        return found

    def entries(self, scope: str | None = None) -> list[StoredContext]:
        """The stored contexts of ``scope`` ("": the top folder's; None: every scope's), most recently used
        first (half-written temporary files are not listed)."""
        out = []
        for where in (self.scopes() if scope is None else [scope]):
            for info in self._listing(self.folder(where)):
                name = info["name"].rstrip("/").rsplit("/", 1)[-1]
                key = "/".join(p for p in (where, name[:-len(SUFFIX)]) if p) if name.endswith(SUFFIX) else ""
                if self.valid_key(key) and info.get("type", "file") == "file":
                    out.append(StoredContext(key, self.location(key), int(info.get("size") or 0), _mtime(info)))
        return sorted(out, key=lambda e: e.last_used, reverse=True)

    def total_bytes(self) -> int:
        return sum(e.bytes for e in self.entries())

    def enforce_budget(self, keep: set[str] = frozenset()) -> list[str]:
        """Remove least recently used contexts until the folder fits ``max_bytes``; returns removed keys."""
        if self.max_bytes is None:
            return []
        entries, removed = self.entries(), []
        total = sum(e.bytes for e in entries)
        if total > self.max_bytes:
            keep = set(keep) | self.pinned()
        for e in reversed(entries):
            if total <= self.max_bytes:
                break
            if e.key in keep:
                continue
            if self.delete(e.key):
                total -= e.bytes
                removed.append(e.key)
        return removed

    def temporaries(self) -> list[dict]:
        """Hidden files of writes in progress, or of writers that were killed mid-way."""
        return [info for scope in self.scopes() for info in self._listing(self.folder(scope))
                if re.fullmatch(rf"\.[0-9a-f]{{32}}{re.escape(SUFFIX)}\.[0-9a-f]{{8}}\.tmp",
                                info["name"].rstrip("/").rsplit("/", 1)[-1])]

    def remove_stale_temporaries(self, older_than_s: float = 3600) -> int:
        """Remove temporaries older than ``older_than_s`` (0: all of them, for when no write is running);
        a normal write removes its own. Returns how many were removed."""
        now, removed = time.time(), 0
        for info in self.temporaries():
            if now - _mtime(info) >= older_than_s:
                with contextlib.suppress(FileNotFoundError):
                    self.fs.rm_file(info["name"])
                    removed += 1
        return removed
