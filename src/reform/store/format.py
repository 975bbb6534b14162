"""One saved context = one safetensors file: named tensors (no pickle anywhere) and, in the header's
metadata, a JSON manifest (format version, library version, model fingerprint, method and its resolved
options, token count, sha256 of the token ids, creation time, encode stats, sha256 of all tensor bytes).

Writes go to a temporary file in the same folder, are fsynced and renamed over the target, so a reader
sees the old file or the new one, never half of one, and a failed write leaves the old file untouched.
Reads check the manifest before touching the tensors and the checksum after, so a truncated or
corrupted file is refused with one line instead of answering from damaged data.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import BinaryIO

import torch

from ..outputs import OutputError, check_output_file, write_atomic

FORMAT = "reform-context"
FORMAT_VERSION = 1
MANIFEST_KEY = "reform"


class ContextFileError(ValueError):
    """A saved context that cannot be used: unreadable, corrupted, or made for something else."""


def tensors_sha256(tensors: dict[str, torch.Tensor]) -> str:
    """One digest over every tensor's name, dtype, shape and bytes, in name order."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}\n".encode())
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy())   # hashed in place: no second copy of the bytes
    return h.hexdigest()


def ids_sha256(ids: torch.Tensor) -> str:
    """The token ids' digest, independent of their dtype and device (int32 little-endian bytes). The
    conversion is numpy's: a server computes keys off its model thread, where a parallel torch op would
    start a second OpenMP team (``server/worker.py``, "one thread runs the model")."""
    return hashlib.sha256(ids.detach().cpu().numpy().astype("<i4").tobytes()).hexdigest()


def _own_storage(t: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU tensor that owns its storage (safetensors refuses views into shared buffers)."""
    t = t.detach().to("cpu").contiguous()
    return t if t.untyped_storage().nbytes() == t.nbytes else t.clone()


def write_context_file(path: str | os.PathLike, tensors: dict[str, torch.Tensor], manifest: dict) -> int:
    """Write ``tensors`` with ``manifest`` (plus format fields and the tensors' checksum) to ``path``
    atomically; returns the file's size in bytes."""
    from safetensors.torch import save_file

    try:
        path = check_output_file(path, "context file")
    except OutputError as e:
        raise ContextFileError(str(e)) from None
    tensors = {k: _own_storage(v) for k, v in tensors.items()}
    manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, **manifest,
                "tensors_sha256": tensors_sha256(tensors)}
    metadata = {MANIFEST_KEY: json.dumps(manifest, sort_keys=True)}
    try:
        return write_atomic(path, lambda tmp: save_file(tensors, str(tmp), metadata=metadata))
    except OSError as e:
        raise ContextFileError(f"cannot write {path}: {e.strerror or e}") from None


def _unreadable(path, why: object) -> ContextFileError:
    first = str(why).strip().splitlines()[0] if str(why).strip() else type(why).__name__
    return ContextFileError(f"{path} is not a readable saved context (truncated or corrupted?): {first}")


def read_manifest(path: str | os.PathLike) -> dict:
    """The manifest of a saved context, checked for format and version (tensors are not read)."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise ContextFileError(f"saved context not found: {path}")
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
    except Exception as e:   # safetensors raises its own error type for every malformed header
        raise _unreadable(path, e) from None
    return _checked_manifest(metadata, path)


MAX_HEADER = 100 << 20     # safetensors' own cap on a header's size


def read_manifest_bytes(f: BinaryIO, name: str) -> dict:
    """The manifest from an open file (e.g. on a remote store), reading only the safetensors header: an
    8-byte little-endian length, then that many bytes of JSON whose ``__metadata__`` holds the manifest."""
    head = f.read(8)
    size = int.from_bytes(head, "little") if len(head) == 8 else -1
    if not 0 < size <= MAX_HEADER:
        raise _unreadable(name, "no safetensors header")
    raw = f.read(size)
    try:
        header = json.loads(raw) if len(raw) == size else None
    except ValueError:
        header = None
    if not isinstance(header, dict):
        raise _unreadable(name, "its safetensors header is cut off or not JSON")
    return _checked_manifest(header.get("__metadata__") or {}, name)


def _checked_manifest(metadata: dict, path) -> dict:
    try:
        manifest = json.loads(metadata[MANIFEST_KEY])
    except (KeyError, ValueError, TypeError):
        raise ContextFileError(f"{path} is a safetensors file but not a saved reform context") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ContextFileError(f"{path} is a safetensors file but not a saved reform context")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ContextFileError(f"{path} has context format version {manifest.get('format_version')} (written by "
                               f"reform {manifest.get('library_version', '?')}); this reform reads version "
                               f"{FORMAT_VERSION}: encode the document again")
    return manifest


def read_tensors(path: str | os.PathLike, manifest: dict) -> dict[str, torch.Tensor]:
    """Every tensor of the file (on the CPU), verified against the manifest's checksum."""
    from safetensors.torch import load_file

    path = Path(path)
    try:
        tensors = load_file(str(path))     # memory-mapped, not read into a second buffer
    except Exception as e:
        raise _unreadable(path, e) from None
    if tensors_sha256(tensors) != manifest.get("tensors_sha256"):
        raise ContextFileError(f"{path} is corrupted: its tensors do not match the checksum in its manifest")
    return tensors
