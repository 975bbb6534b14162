"""What a library holds (docs/library.md): its documents by name, each a context in the store under its
content key, and each document's passages (their token spans, text and dense embeddings) for the first
stage of a question. The catalog is one small JSON file in the store, written whole; a document's passages
are one safetensors file beside its context, so a question reads every document's passages and no
document's per-token embeddings."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from dataclasses import dataclass
from typing import Callable

import torch

from ..store import ContextFileError, ContextStore

LIBRARIES = "libraries"          # the catalogs' folder in a scope: NAME.json each
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
PASSAGES = ".passages.safetensors"
VERSION = 1
MADE_BY = ("model", "method", "options")      # what a library's documents must all be encoded with


@dataclass
class Document:
    """One document of a library: ``name`` (its path below the folder it was added from, or its file
    name), the store ``key`` of its context, its tokens, extracted kind and pages, passages, when added."""

    name: str
    key: str
    tokens: int
    kind: str
    pages: int
    passages: int
    added: float
    status: str = "completed"       # in_progress while a server encodes it, failed (with ``error``), completed
    error: str | None = None
    title: str | None = None        # what a person calls it where ``name`` is an id (the server's file name)

    @property
    def ready(self) -> bool:
        return self.status == "completed"


@dataclass
class Passages:
    """A document's passages: ``spans`` [P, 2] of context token indices, their ``texts`` (what BM25 reads)
    and ``dense`` [P, D] L2-normalised embeddings (all-MiniLM-L6-v2)."""

    spans: torch.Tensor
    texts: list[str]
    dense: torch.Tensor


class Catalog:
    """The documents of the library ``name`` in ``store`` (its folder ``scope``: a tenant's) and who made them:
    ``maker`` (the model's identity and the documents method with its options) must match to add or ask.
    Several libraries of a scope share its contexts: the same content is encoded once, whichever library
    adds it, and removed only once no library holds it."""

    def __init__(self, store: ContextStore, scope: str = "", name: str = "default",
                 keyer: Callable[[str], str] | None = None):
        """``keyer``: the store key of a content key (default: the content key in ``scope``'s folder; the
        server's tenants mix in their name)."""
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise ValueError(f"a library's name is 1 to 64 letters, digits, '.', '_' or '-' (starting with a "
                             f"letter or digit), not {name!r}")
        self.store, self.scope, self.name = store, scope, name
        self.keyer = keyer
        self.info: dict = {}        # what the catalog says of itself (a vector store's name, metadata, ...)
        self.folder = f"{store.folder(scope)}/{LIBRARIES}"
        self.path = f"{self.folder}/{name}.json"

    def names(self) -> list[str]:
        """Every library of this scope."""
        try:
            found = self.store.fs.ls(self.folder, detail=False)
        except FileNotFoundError:
            return []
        return sorted(Path(str(f)).name[:-5] for f in found if str(f).endswith(".json"))

    def key(self, key: str) -> str:
        """The store key of the context whose content key is ``key``."""
        if self.keyer is not None:
            return self.keyer(key)
        return f"{self.scope}/{key}" if self.scope else key

    def exists(self) -> bool:
        return self.store.fs.isfile(self.path)

    def read(self) -> tuple[dict | None, dict[str, Document]]:
        """``(maker, documents by name)``; ``(None, {})`` for a library not made yet."""
        try:
            data = json.loads(self.store.read_whole(self.path))
        except FileNotFoundError:
            return None, {}
        except (OSError, ValueError) as e:
            raise ContextFileError(f"{self.path} is not a readable library catalog: {e}") from None
        if not isinstance(data, dict) or data.get("version") != VERSION:
            raise ContextFileError(f"{self.path} is not a library catalog of this reform (version {VERSION})")
        self.info = data.get("info") or {}
        return data["maker"], {d["name"]: Document(**d) for d in data["documents"]}

    def write(self, maker: dict | None, documents: dict[str, Document]) -> None:
        body = {"version": VERSION, "maker": maker, "updated": time.time(), "info": self.info,
                "documents": [dict(vars(d)) for d in sorted(documents.values(), key=lambda d: d.name)]}
        self.store.fs.makedirs(self.folder, exist_ok=True)      # (vars, not asdict: 6x faster at 500 documents)
        self.store.write_whole(self.path, json.dumps(body).encode())

    def lock(self):
        """Catalog updates one at a time: a lock file beside it on a local store (an object store's
        catalog is written whole, the last writer's)."""
        import contextlib

        from filelock import FileLock
        if not self.store.local:
            return contextlib.nullcontext()
        self.store.fs.makedirs(self.folder, exist_ok=True)
        return FileLock(self.path + ".lock")

    def remove(self, names: list[str], known: Callable[[dict], str]) -> dict[str, Document]:
        """Remove documents by name, and their contexts and passages unless another name holds the same
        content; an unknown name is refused (``ValueError``, ``known`` saying what there is) before
        anything is removed. Returns the documents left."""
        with self.lock():
            maker, docs = self.read()
            if unknown := [n for n in names if n not in docs]:
                raise ValueError(f"no document named {unknown[0]!r} in the library" + known(docs))
            for name in names:
                self.drop_unused(docs.pop(name).key, docs)
            self.write(maker, docs)
        return docs

    def enter(self, maker: dict, entries: list[Document]) -> None:
        """Add or replace ``entries`` by name, under the lock; the context a replaced entry held is deleted
        unless still held. ``ValueError`` when the catalog was made by another model or method."""
        with self.lock():
            made, docs = self.read()
            self.check_maker(made, maker)
            old = {e.name: docs[e.name].key for e in entries if e.name in docs}
            docs |= {e.name: e for e in entries}
            self.write(made or maker, docs)
            for key in set(old.values()) - {e.key for e in entries}:
                self.drop_unused(key, docs)

    def check_maker(self, made: dict | None, maker: dict) -> None:
        """Refuse (``ValueError``, one line) a library ``made`` by another model or documents method than
        ``maker``."""
        if made is not None and any(made.get(k) != maker.get(k) for k in MADE_BY):
            what = "model" if made.get("model") != maker.get("model") else "documents method or its options"
            raise ValueError(f"the library {self.name} in {self.store.url} was built with another {what} "
                             f"({made.get('model_name')}, {made.get('method')}); use the model and method it was "
                             "built with")

    def drop_unused(self, key: str, docs: dict[str, Document]) -> None:
        """Delete ``key``'s context and passages unless one of ``docs`` or another library still holds it."""
        others = (Catalog(self.store, self.scope, n, self.keyer).read()[1] for n in self.names() if n != self.name)
        if not any(d.key == key for held in (docs, *others) for d in held.values()):
            self.store.delete(key)
            self.delete_passages(key)

    def passages_path(self, key: str) -> str:
        return f"{self.store.root}/{key}{PASSAGES}"      # keys hold their scope

    def write_passages(self, key: str, passages: Passages) -> None:
        from safetensors.torch import save
        data = save({"spans": passages.spans.to(torch.int32).contiguous(),
                     "dense": passages.dense.to(torch.float32).contiguous()},
                    metadata={"texts": json.dumps(passages.texts)})
        self.store.write_whole(self.passages_path(key), data)

    def has_passages(self, key: str) -> bool:
        return self.store.fs.isfile(self.passages_path(key))

    def read_passages(self, key: str) -> Passages:
        from safetensors.torch import load
        try:
            data = self.store.read_whole(self.passages_path(key))
        except FileNotFoundError:
            raise ContextFileError(f"the passages of library context {key} are missing; add its document "
                                   "again") from None
        tensors = load(data)
        texts = json.loads(_metadata(data)["texts"])
        return Passages(tensors["spans"].long(), texts, tensors["dense"])

    def delete_passages(self, key: str) -> None:
        import contextlib
        with contextlib.suppress(OSError, FileNotFoundError):
            self.store.fs.rm_file(self.passages_path(key))


def _metadata(data: bytes) -> dict:
    """The ``__metadata__`` of safetensors bytes (its JSON header)."""
    size = int.from_bytes(data[:8], "little")
    return json.loads(data[8:8 + size]).get("__metadata__") or {}
