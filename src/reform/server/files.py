"""``/v1/files``: documents uploaded once (as the official ``openai`` client's ``client.files.create`` sends
them) and named in chats by ``file_id``. They live beside the saved contexts, in the store's ``files/``
folder (local or any fsspec URL), one ``.bin`` and one ``.json`` per file, each written atomically, so every
replica over one store sees the same files."""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import time

from ..store import ContextStore

FILE_ID = re.compile(r"file-[0-9a-f]{24}")


class FileStore:
    """One tenant's files: the ``files/`` folder of its scope in the store (``ContextStore.folder``)."""

    def __init__(self, store: ContextStore, scope: str = ""):
        self.fs = store.fs
        self.root = store.folder(scope).rstrip("/") + "/files"
        self.fs.makedirs(self.root, exist_ok=True)

    def _path(self, file_id: str, suffix: str) -> str:
        if not FILE_ID.fullmatch(file_id or ""):
            raise KeyError(file_id)
        return f"{self.root}/{file_id}{suffix}"

    def _write(self, path: str, data: bytes) -> None:
        temporary = f"{path}.tmp-{secrets.token_hex(4)}"
        try:
            with self.fs.open(temporary, "wb") as f:
                f.write(data)
            self.fs.mv(temporary, path)
        finally:                    # a full disk or a failed move leaves no part behind
            with contextlib.suppress(OSError):
                if self.fs.exists(temporary):
                    self.fs.rm_file(temporary)

    def create(self, data: bytes, filename: str, purpose: str) -> dict:
        file_id = "file-" + secrets.token_hex(12)
        meta = {"id": file_id, "object": "file", "bytes": len(data), "created_at": int(time.time()),
                "filename": filename, "purpose": purpose, "status": "processed", "status_details": None}
        self._write(self._path(file_id, ".bin"), data)
        try:
            self._write(self._path(file_id, ".json"), json.dumps(meta).encode())
        except BaseException:       # a file without its object is never listed: remove its bytes
            with contextlib.suppress(OSError):
                self.fs.rm_file(self._path(file_id, ".bin"))
            raise
        return meta

    def get(self, file_id: str) -> dict:
        """The file's object; ``KeyError`` when there is none."""
        try:
            with self.fs.open(self._path(file_id, ".json"), "rb") as f:
                return json.loads(f.read())
        except (FileNotFoundError, ValueError):
            raise KeyError(file_id) from None

    def content(self, file_id: str) -> tuple[bytes, str]:
        meta = self.get(file_id)
        try:
            with self.fs.open(self._path(file_id, ".bin"), "rb") as f:
                return f.read(), meta["filename"]
        except FileNotFoundError:
            raise KeyError(file_id) from None

    def all(self) -> list[dict]:
        found = []
        for path in self.fs.glob(f"{self.root}/file-*.json"):
            name = path.rsplit("/", 1)[-1][:-len(".json")]
            try:
                found.append(self.get(name))
            except KeyError:
                continue
        return sorted(found, key=lambda m: m["created_at"], reverse=True)

    def total_bytes(self) -> int:
        """Bytes of every file here (their contents)."""
        return sum(int(self.fs.info(path).get("size") or 0) for path in self.fs.glob(f"{self.root}/file-*.bin"))

    def delete(self, file_id: str) -> bool:
        removed = False
        for suffix in (".json", ".bin"):
            try:
                self.fs.rm_file(self._path(file_id, suffix))
                removed = True
            except (FileNotFoundError, KeyError):
                pass
        return removed
