"""A library of documents (docs/library.md; layer 4½ of docs/architecture.md, between the pipeline and the
server): many documents, each encoded once into a context of its own in a store, asked together.

REFORM's split suits it (Song et al., NeurIPS 2025, §3): a document's encode does not depend on the
question, so adding a document encodes that document only, and a question gathers from all of them.
A question runs in three stages: the library's passage index picks candidate documents (``index``), REFORM's
token gather spends one recompute budget over the candidates' tokens (``gather``), and the gathered tokens
are recomputed document by document under a line naming each, then the answer is generated."""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from ..documents import DocumentError, Limits, UnsupportedDocument, find_documents
from ..documents.evidence import passages as evidence_passages
from ..documents.folder import relative_name
from ..documents.formats import extract_bytes, kind_of, read_bytes
from ..methods import Answer, Context, Full, Reform
from ..methods.answering import Answering
from ..methods.options import options_json
from ..methods.rag import PassageIndex
from ..methods.retrievers import Dense
from ..store import ContextStore
from .catalog import Catalog, Document, Passages
from .gather import Gathered, gather
from .index import LibraryIndex

HEADER = "Document: {name}\n"
SEPARATOR = "\n\n"


@dataclass
class Added:
    """What adding one file did: ``added``, ``replaced`` (the name held other content), ``unchanged``,
    ``skipped`` (a folder's image, blank file or file of no format reform reads) or ``failed`` (with
    ``error``)."""

    name: str
    status: str
    tokens: int = 0
    seconds: float = 0.0
    error: str | None = None


class Library:
    """The library ``name`` in ``store`` (a folder, an fsspec URL or a ``ContextStore``; ``scope``: a folder
    in it) for ``pipe``: its documents are encoded with ``pipe.documents_method``, which must gather with
    REFORM's embeddings (``reform`` or ``reform+rag``); ``memory`` contexts stay loaded between questions."""

    def __init__(self, pipe, store, scope: str = "", memory: int = 8, name: str = "default",
                 keyer: Callable[[str], str] | None = None):
        self.pipe = pipe
        self.store = store if isinstance(store, ContextStore) else ContextStore(store)
        self.catalog = Catalog(self.store, scope, name, keyer)
        self.method = pipe.documents_method
        if not isinstance(self.method, Reform):
            raise ValueError(f"a library gathers with REFORM's token embeddings; method '{self.method.name}' keeps "
                             "none (use reform or reform+rag)")
        identity = pipe.identity
        self.maker = {"model": {k: v for k, v in identity.items() if k not in ("name", "source")},
                      "method": self.method.name, "options": options_json(self.method.config),
                      "model_name": pipe.model_name, "model_source": pipe.source, "dtype": identity["dtype"]}
        self.memory = memory
        self.loaded: OrderedDict[str, Context] = OrderedDict()
        self._index: tuple[tuple, LibraryIndex] | None = None

    # ------------------------------------------------------------------ what it holds
    def documents(self) -> list[Document]:
        return sorted(self.read()[1].values(), key=lambda d: d.name)

    def read(self) -> tuple[dict | None, dict[str, Document]]:
        """The catalog, refused in one line if another model or method made it."""
        maker, docs = self.catalog.read()
        self.catalog.check_maker(maker, self.maker)
        return maker, docs

    # ------------------------------------------------------------------ add and remove
    def add(self, source, *, limits: Limits = Limits(),
            progress: Callable[[str, int, int], None] | None = None) -> list[Added]:
        """Add a file, a folder (one document per file, named by its path below the folder) or a list of
        them; each is encoded alone. A file that fails is reported while the others are added; a folder's
        images (unless ``limits.ocr`` is ``always``), blank files and files of no format reform reads are
        skipped, as a folder given to ``reform ask`` skips them. ``progress(name, tokens done, tokens)``
        follows each encode."""
        self.read()
        results = []
        for location, name, in_folder in self.locations(source):
            started = time.perf_counter()
            try:
                results.append(self.add_one(location, name, limits, progress, in_folder))
            except (DocumentError, ValueError, OSError) as e:
                skip = in_folder and (isinstance(e, UnsupportedDocument) or "is empty" in str(e) or
                                      "has no text" in str(e))
                results.append(Added(name, "skipped" if skip else "failed",
                                     error=str(e).splitlines()[0] if str(e) else type(e).__name__))
            results[-1].seconds = round(time.perf_counter() - started, 3)
        return results

    @staticmethod
    def locations(source) -> list[tuple[str, str, bool]]:
        """``(location, name, in a folder)`` of every file ``source`` names (one, a folder or glob, or a
        list of them)."""
        if isinstance(source, (list, tuple)):
            return [found for one in source for found in Library.locations(one)]
        source = str(source)
        found = find_documents(source)
        if "://" not in source and Path(source).is_file():
            return [(found[0], Path(source).name, False)]
        base = source if "://" in source else str(Path(source).expanduser().absolute())
        return [(location, relative_name(location, base), True) for location in found]

    def add_one(self, location: str, name: str, limits: Limits,
                progress: Callable[[str, int, int], None] | None = None, in_folder: bool = False) -> Added:
        added, entry = self.prepare(location, name, limits, progress, in_folder)
        if entry is not None:
            self.enter([entry])
        return added

    def prepare(self, location: str, name: str, limits: Limits,
                progress: Callable[[str, int, int], None] | None = None,
                in_folder: bool = False) -> tuple[Added, Document | None]:
        """``add_one`` but the catalog: the document read, encoded unless stored, its passages written; its
        entry (None when unchanged) for ``enter``. A Ray worker prepares, the driver enters."""
        data = read_bytes(location)
        if in_folder and limits.ocr != "always" and data.strip() and kind_of(name, data) == "image":
            raise UnsupportedDocument(f"{name} is an image: a folder's images are read by OCR with --ocr always")
        document = extract_bytes(data, name, limits)
        ids, rows, source = self.pipe.tokenize(document)
        key = self.catalog.key(self.pipe.context_key(ids, document=document))
        old = self.read()[1].get(name)
        if old is not None and old.key == key and old.ready and self.store.has(key):
            return Added(name, "unchanged", int(ids.shape[0])), None
        ctx = None
        if not self.store.has(key):
            total, done = int(ids.shape[0]), [0]

            def step(n: int) -> None:
                done[0] += n
                if progress is not None:
                    progress(name, done[0], total)
            ctx = self.embedded(key, ids, source, step)
        entry = self.entry(name, document, key, int(ids.shape[0]), ctx)
        return Added(name, "added" if old is None else "replaced", int(ids.shape[0])), entry

    def register(self, name: str, document, key: str, tokens: int, ctx: Context | None = None,
                 title: str | None = None) -> Document:
        """Enter the stored context ``key`` of ``document`` (an ``Extracted``) as ``name`` (``entry``, then
        ``enter``)."""
        entry = self.entry(name, document, key, tokens, ctx, title)
        self.enter([entry])
        return entry

    def entry(self, name: str, document, key: str, tokens: int, ctx: Context | None = None,
              title: str | None = None) -> Document:
        """The catalog entry of the stored context ``key`` of ``document``, its passages for the first stage
        written (from ``ctx``, the passages another library of the scope wrote, or the stored context)."""
        if ctx is None and self.catalog.has_passages(key):
            passages = self.catalog.read_passages(key)
        else:
            if ctx is None:
                with self.store.open_local(key) as path:
                    ctx = self.pipe.load_context(path)
            if ctx.state is None:       # stored by a chat, short enough to go without embeddings
                ctx = self.embedded(key, ctx.ids, ctx.source)
            passages = self.passages_of(ctx)
        self.catalog.write_passages(key, passages)
        return Document(name, key, tokens, document.kind, document.pages, len(passages.texts), time.time(),
                        title=title)

    def enter(self, entries: list[Document]) -> None:
        """Write ``entries`` into the catalog (``Catalog.enter``), refusing one made by another model."""
        self.read()
        self.catalog.enter(self.maker, entries)

    def note(self, name: str, key: str, tokens: int, document=None, *, status: str, error: str | None = None,
             title: str | None = None) -> Document:
        """Enter ``name`` with a ``status`` other than completed: ``in_progress`` while a server encodes it,
        ``failed`` with its ``error`` (``document``: the ``Extracted`` one, when extraction got that far)."""
        entry = Document(name, key, tokens, document.kind if document else "", document.pages if document else 0,
                         0, time.time(), status=status, error=error, title=title)
        with self.catalog.lock():
            maker, docs = self.read()
            docs[name] = entry
            self.catalog.write(maker or self.maker, docs)
        return entry

    def embedded(self, key: str, ids: torch.Tensor, source, progress: Callable[[int], None] | None = None) -> Context:
        """Encode ``ids`` with every token embedded, even for a document the recompute budget covers (its
        tokens are scored against other documents'), and store it under ``key``."""
        ctx = self.pipe.encode_tokens(ids, None, progress, source=source, embed_short=True)
        self.store.put(key, ctx)
        return ctx

    def passages_of(self, ctx: Context) -> Passages:
        """The document's passages for the first stage: the dense index its context already holds
        (``reform+rag`` with a dense retriever), else one made now with the same passage size."""
        saved = ctx.extra.get("passages", {}).get("dense")
        size = getattr(self.method.config, "passage_tokens", 128)
        index = saved or PassageIndex.build(self.pipe, ctx.ids, size, Dense(self.pipe.engine.device))
        spans = torch.tensor(index.spans, dtype=torch.long).reshape(-1, 2)
        texts = [self.pipe.tokenizer.decode(ctx.ids[s:e].tolist(), skip_special_tokens=True) for s, e in index.spans]
        return Passages(spans, texts, index.index.detach().cpu())

    def remove(self, names: list[str]) -> list[str]:
        """Remove documents by name (``Catalog.remove``)."""
        self.read()
        left = self.catalog.remove(names, self.known)
        for key in [k for k in self.loaded if not any(d.key == k for d in left.values())]:
            self.loaded.pop(key)
        return names

    @staticmethod
    def known(docs: dict[str, Document]) -> str:
        names = sorted(docs)
        return f" (it has {len(names)}: {', '.join(names[:5])}{', ...' if len(names) > 5 else ''})" if names else \
            " (it is empty)"

    # ------------------------------------------------------------------ ask
    def index(self, docs: dict[str, Document]) -> tuple[list[str], LibraryIndex]:
        """The first stage's index over every document (built once per catalog state, then kept)."""
        names = sorted(docs)
        state = tuple((n, docs[n].key) for n in names)
        if self._index is None or self._index[0] != state:
            self._index = (state, LibraryIndex(names, [self.catalog.read_passages(docs[n].key) for n in names],
                                               self.pipe.engine.device))
        return names, self._index[1]

    def context(self, key: str) -> Context:
        if key in self.loaded:
            self.loaded.move_to_end(key)
            return self.loaded[key]
        with self.store.open_local(key) as path:
            ctx = self.pipe.load_context(path)
        self.loaded[key] = ctx
        while len(self.loaded) > self.memory:
            self.loaded.popitem(last=False)
        return ctx

    def ask(self, question: str, *, documents: list[str] | None = None, candidates: int = 8, **options) -> Answer:
        """Answer ``question`` from the library's documents (``documents``: only these names): the
        ``candidates`` documents whose passages score best go on to the token gather. ``options`` as
        ``Context.ask``'s. The answer's evidence names each passage's document, page and section; its
        ``stats["library"]`` has each stage's time."""
        collected = self.collect(question, documents=documents, candidates=candidates,
                                 answer_prefix=options.get("answer_prefix", ""), layout=options.get("layout", "question"))
        return self.answer(question, collected, **options)

    def collect(self, question: str, *, documents: list[str] | None = None, candidates: int = 8,
                answer_prefix: str = "", layout: str = "question", shelf: dict[str, Document] | None = None
                ) -> "Collected":
        """The first stage and the token gather of ``ask``, and the ids the answer is recomputed from.
        ``shelf``: the documents to ask instead of this library's (several libraries' together)."""
        if isinstance(candidates, bool) or not isinstance(candidates, int) or candidates < 1:
            raise ValueError(f"candidates must be a whole number of at least 1, got {candidates!r}")
        if not isinstance(question, str) or not question.strip():
            raise ValueError("the question is empty")
        docs = shelf if shelf is not None else self.read()[1]
        if documents is not None:
            if unknown := [n for n in documents if n not in docs]:
                raise ValueError(f"no document named {unknown[0]!r} in the library" + self.known(docs))
            if not documents:
                raise ValueError("no documents chosen to ask")
        docs = {n: d for n, d in docs.items() if d.ready and (documents is None or n in documents)}
        if not docs:
            raise ValueError(f"the library in {self.store.url} is empty: add documents first" if shelf is None
                             else "no document of these libraries is ready to ask yet")
        templater = self.pipe.templater
        part = templater.question(question, answer_prefix, after_context=True, layout=layout)
        t = time.perf_counter()
        names, index = self.index(docs)
        scores = index.scores(question)
        among = list(range(len(names)))
        ranked = index.rank(scores, among)[:candidates]
        first_stage = time.perf_counter() - t
        t = time.perf_counter()
        chosen = [(names[d], self.context(docs[names[d]].key), d) for d, _ in reversed(ranked)]   # best last
        load = time.perf_counter() - t
        t = time.perf_counter()
        headers = {name: templater.encode(HEADER.format(name=docs[name].title or name)) for name, _, _ in chosen}
        separator = templater.encode(SEPARATOR)
        budget = max(1, self.method.config.recompute_budget - len(templater.prefix) -
                     sum(len(h) + len(separator) for h in headers.values()))
        prepared = [(name, ctx, {k: index.of(v, d) for k, v in scores.items()}, index.spans[d])
                    for name, ctx, d in chosen]
        gathered = gather(self.method, prepared, part, budget, len(templater.prefix))
        ids = list(templater.prefix) + (templater.question_preview(part) if self.method.config.question_first else [])
        for g in gathered:
            ids += headers[g.name] + g.ctx.ids[g.kept].tolist() + separator
        gather_s = time.perf_counter() - t
        stats = {"documents": len(among), "candidates": [n for n, _, _ in reversed(chosen)],
                 "gathered_from": [g.name for g in gathered], "first_stage_s": round(first_stage, 4),
                 "load_s": round(load, 4), "gather_s": round(gather_s, 4)}
        return Collected(gathered, ids, stats)

    def answer(self, question: str, collected: "Collected", **options) -> Answer:
        """The recompute (§3.3) over what ``collect`` gathered, then the answer, with its evidence."""
        return self.finish(self.start(question, collected, **options).run(), collected)

    def start(self, question: str, collected: "Collected", **options) -> Answering:
        """``answer``'s recompute, prefilled: its tokens come one at a time (``Context.start``), alone or in a
        server's batch; hand the finished answer to ``finish``."""
        recompute = Context(self.pipe, Full(), torch.tensor(collected.ids, dtype=torch.long,
                                                            device=self.pipe.engine.device))
        return recompute.start(question, **options)

    def search(self, question: str, *, documents: list[str] | None = None, candidates: int = 8,
               shelf: dict[str, Document] | None = None) -> list:
        """The passages an answer to ``question`` would cite, best first, with nothing generated: ``ask``'s
        first stage and token gather (``collect``), then each gathered document's passages (``Passage``)."""
        return self.evidence(self.collect(question, documents=documents, candidates=candidates, shelf=shelf))

    @staticmethod
    def evidence(collected: "Collected") -> list:
        """Each gathered document's passages, best first."""
        return sorted((p for g in collected.gathered if g.ctx.source is not None
                       for p in evidence_passages(g.ctx.source, g.kept, g.scores)), key=lambda p: -(p.score or 0.0))

    def finish(self, answer: Answer, collected: "Collected") -> Answer:
        """The answer's evidence (each gathered document's passages, best first) and the stages' times."""
        answer.method = self.method.name
        answer.evidence = self.evidence(collected)
        answer.evidence_note = None if answer.evidence else "the gathered documents keep no map back to their text"
        answer.stats.pop("encode", None)             # each document's encode was paid once, when it was added
        stages = collected.stats
        answer.stats["gather"] = round(stages["first_stage_s"] + stages["load_s"] + stages["gather_s"], 4)
        answer.stats["library"] = stages
        return answer


@dataclass
class Collected:
    """A question's gather over a library: each gathered document's share (best last), the ids recomputed
    for the answer, and the stages' names and times (``stats["library"]`` of the answer)."""

    gathered: list[Gathered]
    ids: list[int]
    stats: dict


__all__ = ["Added", "Collected", "Document", "Library"]
