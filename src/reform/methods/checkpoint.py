"""Resumable encodes: REFORM's chunk loop (§3.1) saves its state to a checkpoint file every few minutes,
and an encode given the same file goes on after the last chunk saved, with the result of one run.

The state after a chunk is all a later chunk reads: the compressed cache of the encoder layers (pre-RoPE
keys, values, H2O scores) and the retrieval embeddings of the tokens so far. A checkpoint is a saved
context of that state (``Context.save``: one safetensors file, written atomically, checksummed) whose
manifest says how many tokens it holds; ``Pipeline.load_context`` refuses it as a context to ask. A
loaded cache is exactly the saved one and the chunks keep their boundaries, so the resumed encode computes
what an uninterrupted one does, bit for bit (tests/test_checkpoint.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import torch

from ..engine.cache import KVCache

if TYPE_CHECKING:
    from ..engine.extractors import HeadEmbeddings
    from .base import Method, Runtime


@dataclass
class Checkpoint:
    """Where an encode keeps its state (``path``) and how often (``every_s`` seconds of encoding; 0:
    after every chunk). ``on_saved(tokens done, tokens in all)`` is told after each save. The file is
    removed when the encode is done, or, with ``keep_when_done``, when the caller says so (``discard``,
    e.g. once the finished context is saved: a failed save then loses nothing)."""

    path: Path
    every_s: float = 300.0
    on_saved: Callable[[int, int], None] | None = None
    keep_when_done: bool = False
    spent_before: float = field(default=0.0, init=False)    # encode seconds of the runs before this one
    # the input's image rows (``Pipeline.encode_tokens``), saved with the state: same ids with other
    # pictures are another input
    image_rows: torch.Tensor | None = field(default=None, init=False, repr=False)
    _ours: bool = field(default=False, init=False, repr=False)   # the file is this encode's to remove
    _start: float = field(default=0.0, init=False, repr=False)
    _last: float = field(default=0.0, init=False, repr=False)

    def __post_init__(self):
        self.path = Path(self.path)
        if self.every_s < 0:
            raise ValueError(f"checkpoint interval must be >= 0 seconds, got {self.every_s}")

    def resume(self, pipe: Runtime, method: Method, ids: torch.Tensor, emb: HeadEmbeddings) -> tuple[int, KVCache]:
        """Tokens already encoded and the cache to go on from: the checkpoint's (its embeddings copied into
        ``emb``), or ``0`` and an empty cache when there is no checkpoint yet. A checkpoint made for
        another input, model or options is refused (``ContextFileError``), never mixed in."""
        from ..store.format import ContextFileError, ids_sha256, read_manifest
        self._start = self._last = time.monotonic()
        if not self.path.exists():
            return 0, KVCache.empty(emb.exit_layer)
        manifest = read_manifest(self.path)
        done = (manifest.get("partial") or {}).get("tokens")
        if not isinstance(done, int):
            raise ContextFileError(f"{self.path} is a finished saved context, not an encode's checkpoint")
        another = ContextFileError(f"{self.path} is the checkpoint of another input; delete it to encode this one")
        if manifest.get("ids_sha256") != ids_sha256(ids):
            raise another
        saved = pipe.load_context(self.path, unfinished=True)
        if (saved.image_rows is None) != (self.image_rows is None) or (
                self.image_rows is not None and not torch.equal(saved.image_rows, self.image_rows)):
            raise another
        if saved.method.name != method.name or saved.method.config != method.config:
            raise ContextFileError(f"{self.path} was encoded with other options ({saved.method.name}); delete it "
                                   "or encode with the same options")
        chunk = method.config.chunk_size
        if not (0 < done < ids.shape[0] and done % chunk == 0 and saved.state.data.shape[0] == done):
            raise ContextFileError(f"{self.path} is corrupted: it claims {done} tokens done")
        emb.data[:done] = saved.state.data.to(emb.data.device)
        self.spent_before = float(manifest["partial"].get("seconds") or 0.0)
        self._ours = True
        return done, saved.cache

    def chunk_done(self, done: int, total: int, partial: Callable[[], object]) -> None:
        """After a chunk: save ``partial()`` (the context so far) if ``every_s`` has passed since the last
        save (or the start) and the encode is not finished."""
        now = time.monotonic()
        if done >= total or now - self._last < self.every_s:
            return
        ctx = partial()
        ctx.image_rows = self.image_rows
        seconds = self.spent_before + now - self._start
        ctx.save(self.path, partial={"tokens": done, "seconds": round(seconds, 3)})
        self._last, self._ours = time.monotonic(), True
        if self.on_saved is not None:
            self.on_saved(done, total)

    def discard(self) -> None:
        """The encode finished: the checkpoint it wrote or went on from has served (any other file at
        ``path`` is left alone)."""
        if self._ours:
            self.path.unlink(missing_ok=True)
