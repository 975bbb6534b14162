"""Encode a corpus into a store of saved contexts: in this process, or on a Ray cluster with one task per
document on a pool of actors that each load the model once (``reform encode DIR --store URL --ray``).

A document's key is its content address (``Pipeline.context_key``: model, method, options, token ids),
so a re-run finds what is already stored and skips it. A store write is whole or absent (see
``reform.store``); a worker that dies mid-document is restarted by Ray and its task retried, and the
hidden temporary files of killed writes are removed once every task has finished.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import asdict, dataclass
from typing import Callable

from ..documents import DocumentError, Limits, extract_bytes, read_bytes
from ..store import ContextFileError, ContextStore

# (kind, document, count, pid): "start" with the document's tokens, "tokens" with tokens just encoded
Event = tuple[str, str, int, int]
RETRIES = 3        # restarts of a dead worker, and retries of the document it held


@dataclass
class EncodeResult:
    document: str
    status: str                 # encoded | stored (already there) | failed
    key: str | None = None
    tokens: int = 0
    seconds: float = 0.0        # encode time (0 for a stored one)
    bytes: int = 0
    error: str | None = None
    entry: dict | None = None       # with a library: the document's catalog entry, for the driver to enter
    maker: dict | None = None       # and who made it (``Library.maker``)

    def to_json(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k not in ("entry", "maker")}


def load_pipeline(load: dict):
    """The ``Pipeline`` that ``load`` describes (``Pipeline.load`` keyword arguments, ``model`` among them;
    ``ocr``, the documents' OCR policy, is the encoder's)."""
    from ..pipeline import Pipeline
    options = dict(load)
    options.pop("ocr", None)
    return Pipeline.load(options.pop("model", None), **options)


class DocumentEncoder:
    """Loads the model once; ``encode(document)`` stores one document's context under its key. A plain
    class: used as is in one process and as a Ray actor on a cluster."""

    def __init__(self, load: dict, store: str, threads: int | None = None, pipe=None,
                 library: tuple[str, str] | None = None):
        """``library``: ``(name, folder)``: each document is prepared for that library of the store, named by
        its path below ``folder`` (``Library.prepare``); the driver enters the results (``enter_library``)."""
        if threads:
            import torch
            torch.set_num_threads(threads)
        self.pipe = pipe if pipe is not None else load_pipeline(load)
        self.store = ContextStore(store)
        self.limits = Limits(ocr=load.get("ocr", "auto"))
        self.library = library

    def encode(self, document: str, report: Callable[[Event], None] | None = None) -> EncodeResult:
        if self.library is not None:
            return self.prepare(document, report)
        pid = os.getpid()
        try:
            doc = extract_bytes(read_bytes(document), document, self.limits)
            ids, _, source = self.pipe.tokenize(doc)
            key = self.pipe.context_key(ids, document=doc)
            if (stored := self.store.get(key)) is not None:
                return EncodeResult(document, "stored", key, int(ids.shape[0]), bytes=stored.bytes)
            if report is not None:
                report(("start", document, int(ids.shape[0]), pid))
            progress = None if report is None else (lambda n: report(("tokens", document, n, pid)))
            ctx = self.pipe.encode_tokens(ids, progress=progress, source=source)
            size = self.store.put(key, ctx)
        except (DocumentError, ContextFileError, ValueError) as e:
            return EncodeResult(document, "failed", error=str(e).splitlines()[0] if str(e) else type(e).__name__)
        return EncodeResult(document, "encoded", key, int(ids.shape[0]), round(ctx.encode_seconds, 3), size)

    def prepare(self, document: str, report: Callable[[Event], None] | None = None) -> EncodeResult:
        """One document of a library: encoded (every token embedded) unless stored, its passages written,
        its catalog entry returned."""
        from ..documents.folder import relative_name
        from ..library import Library
        name, folder = self.library
        library, pid, done = Library(self.pipe, self.store, name=name), os.getpid(), [0]

        def progress(_, encoded: int, total: int) -> None:
            if report is not None:
                if not done[0]:
                    report(("start", document, total, pid))
                report(("tokens", document, encoded - done[0], pid))
            done[0] = encoded
        started = time.perf_counter()
        try:
            added, entry = library.prepare(document, relative_name(document, folder), self.limits, progress)
        except (DocumentError, ContextFileError, ValueError, OSError) as e:
            return EncodeResult(document, "failed", error=str(e).splitlines()[0] if str(e) else type(e).__name__)
        stored = self.store.get(entry.key) if entry is not None else None
        return EncodeResult(document, "encoded" if done[0] else "stored", entry.key if entry else None, added.tokens,
                            round(time.perf_counter() - started, 3) if done[0] else 0.0,
                            stored.bytes if stored else 0, entry=asdict(entry) if entry else None,
                            maker=library.maker)

    def encode_reporting(self, document: str, board) -> EncodeResult:
        """``encode`` with progress posted to ``board`` (an ``EventBoard`` actor; not waited for)."""
        return self.encode(document, lambda event: board.post.remote(event))

    def encode_segment(self, ids, skip: int, keep_cache: bool):
        """One segment of a segment-parallel encode (``Reform.encode_segment``) for another process."""
        return self.pipe.method.encode_segment(self.pipe, ids, skip, keep_cache=keep_cache)

    def pid(self) -> int:
        return os.getpid()


class EventBoard:
    """Progress events from every worker, collected for the driver (a Ray actor that uses no CPU)."""

    def __init__(self):
        self.events: list[Event] = []

    def post(self, event: Event) -> None:
        self.events.append(event)

    def take(self) -> list[Event]:
        events, self.events = self.events, []
        return events


def enter_library(store: str, library: str, results: list[EncodeResult]) -> int:
    """Enter the prepared documents of ``results`` into the library (one writer: this process); how many."""
    from ..library.catalog import Catalog, Document
    entries = [(Document(**r.entry), r.maker) for r in results if r.entry is not None]
    if entries:
        Catalog(ContextStore(store), name=library).enter(entries[0][1], [e for e, _ in entries])
    return len(entries)


def encode_in_process(documents: list[str], store: str, load: dict,
                      on_event: Callable[[Event], None] | None = None,
                      on_result: Callable[[EncodeResult], None] | None = None,
                      library: tuple[str, str] | None = None) -> list[EncodeResult]:
    """Every document, one after another, with one model in this process."""
    encoder, results = DocumentEncoder(load, store, library=library), []
    for document in documents:
        results.append(encoder.encode(document, on_event))
        if on_result is not None:
            on_result(results[-1])
    return results


def encode_on_ray(documents: list[str], store: str, load: dict, *, workers: int | None = None,
                  threads_per_worker: int = 1, on_event: Callable[[Event], None] | None = None,
                  on_result: Callable[[EncodeResult], None] | None = None,
                  library: tuple[str, str] | None = None) -> list[EncodeResult]:
    """Every document as one task on a pool of ``workers`` actors (default: the cluster's CPUs divided
    by ``threads_per_worker``) on the Ray cluster this process is connected to (``ray.init`` first).
    With REFORM's ``segments`` option above 1, documents go one at a time instead, each split into
    segments that the actors encode at once (``encode_split_on_ray``). Results come back in the order
    the documents finish."""
    import ray

    if (load.get("segments") or 1) > 1:
        return encode_split_on_ray(documents, store, load, workers=workers, threads_per_worker=threads_per_worker,
                                   on_result=on_result)
    board = ray.remote(num_cpus=0)(EventBoard).remote()
    todo, running, results = list(documents), {}, []

    def drain():
        for event in ray.get(board.take.remote()):
            if on_event is not None:
                on_event(event)

    with actor_pool(load, store, workers, threads_per_worker, len(documents), library) as (pool, new_actor):
        try:
            while todo or running:
                while pool and todo:
                    worker, document = pool.pop(), todo.pop(0)
                    running[worker.encode_reporting.remote(document, board)] = (document, worker)
                done, _ = ray.wait(list(running), num_returns=1, timeout=0.1)
                drain()
                for ref in done:
                    document, worker = running.pop(ref)
                    try:
                        result = ray.get(ref)
                    except ray.exceptions.RayError as e:   # the worker died more often than it may restart
                        result = EncodeResult(document, "failed", error=f"worker failed {RETRIES + 1} times: "
                                                                        f"{type(e).__name__}")
                        worker = new_actor()
                    results.append(result)
                    if on_result is not None:
                        on_result(result)
                    pool.append(worker)
            drain()
        finally:
            pool.extend(w for _, w in running.values())     # (killed with the pool)
            ray.kill(board)
    ContextStore(store).remove_stale_temporaries(older_than_s=0)    # writes of killed workers: no task runs now
    return results


def encode_split_on_ray(documents: list[str], store: str, load: dict, *, workers: int | None = None,
                        threads_per_worker: int = 1,
                        on_result: Callable[[EncodeResult], None] | None = None) -> list[EncodeResult]:
    """One document at a time, its REFORM segments spread over the actors (``Pipeline.segment_runner``);
    this process tokenizes, joins the segments' embeddings and stores the context."""
    import ray
    here = DocumentEncoder(load, store)
    results = []
    with actor_pool(load, store, workers, threads_per_worker, load.get("segments") or 1) as (pool, _):
        def run(pieces):
            return ray.get([pool[i % len(pool)].encode_segment.remote(ids, skip, last)
                            for i, (ids, skip, last) in enumerate(pieces)])
        here.pipe.segment_runner = run
        for document in documents:
            results.append(here.encode(document))
            if on_result is not None:
                on_result(results[-1])
    return results


@contextlib.contextmanager
def actor_pool(load: dict, store: str, workers: int | None, threads_per_worker: int, most: int,
               library: tuple[str, str] | None = None):
    """``(actors, new_actor)``: up to ``most`` ``DocumentEncoder`` actors (default: the cluster's CPUs /
    ``threads_per_worker``) with their model loaded, restarted by Ray when they die; all killed on exit."""
    import ray
    if not ray.is_initialized():
        raise RuntimeError("connect to a Ray cluster first (ray.init)")
    cpus = int(ray.cluster_resources().get("CPU", 1))
    count = max(1, min(workers or cpus // threads_per_worker, most))
    actor = ray.remote(num_cpus=threads_per_worker, max_restarts=RETRIES, max_task_retries=RETRIES)(DocumentEncoder)

    def new_actor():
        return actor.remote(load, store, threads_per_worker, library=library)

    pool = [new_actor() for _ in range(count)]
    try:
        ray.get([a.pid.remote() for a in pool])     # a model that cannot load fails here, once
        yield pool, new_actor
    finally:
        for a in pool:
            ray.kill(a)


def summary(results: list[EncodeResult], seconds: float) -> dict:
    """Counts, tokens and throughput of a corpus run."""
    encoded = [r for r in results if r.status == "encoded"]
    return {"documents": len(results), "encoded": len(encoded),
            "stored": sum(r.status == "stored" for r in results),
            "failed": sum(r.status == "failed" for r in results),
            "tokens_encoded": sum(r.tokens for r in encoded), "seconds": round(seconds, 2),
            "documents_per_minute": round(60 * len(encoded) / seconds, 2) if seconds > 0 else None,
            "bytes": sum(r.bytes for r in encoded)}


def timed(run: Callable[[], list[EncodeResult]]) -> tuple[list[EncodeResult], float]:
    t = time.perf_counter()
    results = run()
    return results, time.perf_counter() - t
