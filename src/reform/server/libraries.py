"""A tenant's libraries as OpenAI vector stores (docs/server.md, "Vector stores"). A vector store is a library
(``reform.library``, docs/library.md) in the tenant's folder of the store: one document per uploaded file
(``/v1/files``), each encoded once, by an encode job that takes the tenant's fair turn on the model thread,
and every library of the tenant shares its contexts (and a chat's: the same file is the same context).
Questions name vector stores in the Responses API's ``file_search`` tool or in a chat's ``vector_store_ids``
(``LibraryQuestion``); the HTTP handlers are ``vector_stores.py`` and ``responses.py``."""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
import time

from starlette.concurrency import run_in_threadpool

from ..library import Library
from ..library.catalog import NAME, Catalog, Document
from .openai_schema import ApiError
from .scheduler import Underway
from .tenants import Tenant

log = logging.getLogger("reform.server")

# a vector store's id: one made here (vs_...), or any library of the tenant's folder (``reform encode --library``)
VECTOR_STORE = NAME


def last_error(entry: Document) -> dict | None:
    """OpenAI's ``last_error`` of a failed file: a file that could not be read (it has no key), else an encode
    that failed."""
    if entry.status != "failed":
        return None
    message = entry.error or "failed"
    code = "server_error" if entry.key else "unsupported_file" if "reform reads" in message else "invalid_file"
    return {"code": code, "message": message}


class VectorStores:
    """The vector stores of every tenant of ``service`` (a ``Service``)."""

    def __init__(self, service):
        self.service, self.worker = service, service.worker
        self.running: set[tuple[str, str, str]] = set()     # (scope, vector store, file) encoding here
        self.waiting: set[tuple[str, str, str]] = set()     # ... entered, waiting for its turn in ``add_later``
        self.adders: set[asyncio.Task] = set()               # the background adds (kept, or they may be collected)
        self.lock = threading.Lock()
        self.askers: dict[str, Library] = {}                 # tenant -> the library that answers its questions
        self.worker.store.pinned = self.held                 # --store-max-gb never removes a library's document

    def held(self) -> set[str]:
        """The store keys of every library's documents, in every tenant's folder."""
        store = self.worker.store
        return {d.key for scope in store.scopes() for name in Catalog(store, scope).names()
                for d in Catalog(store, scope, name).read()[1].values() if d.key}

    # ------------------------------------------------------------------ the libraries
    def library(self, tenant: Tenant, vs_id: str, *, create: bool = False) -> Library:
        """The library behind ``vs_id``; 404 when the tenant has none by that id (another tenant's included)."""
        if not isinstance(vs_id, str) or not VECTOR_STORE.fullmatch(vs_id):
            raise ApiError(404, f"vector store {vs_id} not found", code="not_found")
        try:
            library = Library(self.worker.pipe, self.worker.store, tenant.scope, name=vs_id,
                              keyer=tenant.context_key)
        except ValueError as e:
            raise ApiError(400, f"this server cannot build vector stores: {e}") from None
        if not create and not library.catalog.exists():
            raise ApiError(404, f"vector store {vs_id} not found", code="not_found")
        return library

    def create(self, tenant: Tenant, name: str | None, metadata: dict | None) -> dict:
        vs_id = "vs_" + secrets.token_hex(12)
        library = self.library(tenant, vs_id, create=True)
        library.catalog.info = {"name": name or "", "metadata": metadata or {}, "created_at": int(time.time())}
        library.catalog.write(None, {})
        return self.describe(tenant, vs_id, library)

    def describe(self, tenant: Tenant, vs_id: str, library: Library | None = None) -> dict:
        library = library or self.library(tenant, vs_id)
        _, docs = library.catalog.read()
        info = library.catalog.info
        entries = [self.status_of(tenant, vs_id, d) for d in docs.values()]
        counts = {s: sum(e.status == s for e in entries) for s in ("in_progress", "completed", "failed", "cancelled")}
        used = sum(e.bytes for d in docs.values() if (e := self.worker.store.get(d.key)) is not None)
        return {"id": vs_id, "object": "vector_store", "created_at": info.get("created_at", 0),
                "name": info.get("name", vs_id), "usage_bytes": used, "file_counts": {**counts, "total": len(entries)},
                "status": "in_progress" if counts["in_progress"] else "completed",
                "last_active_at": info.get("created_at", 0), "metadata": info.get("metadata") or {},
                "expires_after": None, "expires_at": None}

    def all(self, tenant: Tenant) -> list[dict]:
        names = Catalog(self.worker.store, tenant.scope).names()
        found = [self.describe(tenant, n) for n in names]
        return sorted(found, key=lambda v: -v["created_at"])

    def update(self, tenant: Tenant, vs_id: str, name: str | None, metadata: dict | None) -> dict:
        library = self.library(tenant, vs_id)
        with library.catalog.lock():
            maker, docs = library.catalog.read()
            if name is not None:
                library.catalog.info["name"] = name
            if metadata is not None:
                library.catalog.info["metadata"] = metadata
            library.catalog.write(maker, docs)
        return self.describe(tenant, vs_id, library)

    def drop(self, library: Library, names: list[str]) -> None:
        """Remove documents from ``library``; a context no library holds any more leaves memory too."""
        keys = {d.key for d in library.documents() if d.name in names}
        library.remove(names)
        for key in keys:
            if key and not self.worker.store.has(key):
                self.worker.contexts.forget(key)

    def delete(self, tenant: Tenant, vs_id: str) -> dict:
        library = self.library(tenant, vs_id)
        self.drop(library, [d.name for d in library.documents()])
        for path in (library.catalog.path, library.catalog.path + ".lock"):
            if self.worker.store.fs.exists(path):
                self.worker.store.fs.rm_file(path)
        return {"id": vs_id, "object": "vector_store.deleted", "deleted": True}

    # ------------------------------------------------------------------ its files
    def status_of(self, tenant: Tenant, vs_id: str, entry: Document) -> Document:
        """``entry``, where an encode this process no longer runs (a restart) left it in progress: failed."""
        here = (tenant.scope, vs_id, entry.name)
        if entry.status == "in_progress" and here not in self.running and here not in self.waiting and \
                not self.service.encoding_elsewhere(entry.key):
            entry.status, entry.error = "failed", "its encode was interrupted (a restart); add the file again"
        if entry.ready and not self.worker.store.has(entry.key):
            entry.status, entry.error = "failed", "its context was removed from the store; add the file again"
        return entry

    def file_object(self, tenant: Tenant, vs_id: str, entry: Document) -> dict:
        entry = self.status_of(tenant, vs_id, entry)
        stored = self.worker.store.get(entry.key) if entry.key else None
        return {"id": entry.name, "object": "vector_store.file", "created_at": int(entry.added),
                "vector_store_id": vs_id, "status": entry.status, "usage_bytes": stored.bytes if stored else 0,
                "last_error": last_error(entry), "attributes": {"filename": entry.title or entry.name,
                                                                "tokens": entry.tokens}}

    def files(self, tenant: Tenant, vs_id: str) -> list[dict]:
        _, docs = self.library(tenant, vs_id).catalog.read()
        return [self.file_object(tenant, vs_id, d) for d in sorted(docs.values(), key=lambda d: -d.added)]

    def file(self, tenant: Tenant, vs_id: str, file_id: str) -> dict:
        _, docs = self.library(tenant, vs_id).catalog.read()
        if file_id not in docs:
            raise ApiError(404, f"file {file_id} not found in vector store {vs_id}", code="not_found")
        return self.file_object(tenant, vs_id, docs[file_id])

    def remove_file(self, tenant: Tenant, vs_id: str, file_id: str) -> dict:
        library = self.library(tenant, vs_id)
        try:
            self.drop(library, [file_id])
        except ValueError:
            raise ApiError(404, f"file {file_id} not found in vector store {vs_id}", code="not_found") from None
        return {"id": file_id, "object": "vector_store.file.deleted", "deleted": True}

    async def add_file(self, tenant: Tenant, vs_id: str, file_id: str, still_wanted) -> dict:
        """Add an uploaded file: read and keyed here, encoded by a queued job (the tenant's quotas and fair
        turn). A file that cannot be read is entered as failed with its reason, as OpenAI's are; one that does
        not exist is a 404 and a quota refuses the request (413 or 429): both enter nothing."""
        service, library = self.service, await run_in_threadpool(self.library, tenant, vs_id)
        try:
            data, filename = await run_in_threadpool(service.files[tenant.name].content, file_id)
        except KeyError:
            raise ApiError(404, f"file {file_id} not found", param="file_id", code="file_not_found") from None
        try:
            document = await service.extract(data, filename)
            key, tokens = await service.key_of(document, tenant)
        except ApiError as e:
            why = e.message
            await run_in_threadpool(lambda: library.note(file_id, "", 0, status="failed", error=why, title=filename))
            return await run_in_threadpool(self.file, tenant, vs_id, file_id)
        charged = service.will_encode(key)
        if charged:
            await service.admit_encode(tenant, tokens)
        await run_in_threadpool(lambda: library.note(file_id, key, tokens, document, status="in_progress",
                                                     title=filename))
        running = (tenant.scope, vs_id, file_id)
        self.running.add(running)

        def encode(job):
            try:
                ctx, _ = self.worker.contexts.context(key, document, job)
                if ctx.state is None:       # short enough that a chat stored it without embeddings
                    ctx = library.embedded(key, ctx.ids, ctx.source)
                    self.worker.contexts.remember(key, ctx)
                elif not self.worker.store.has(key):      # in memory only (removed from the store meanwhile)
                    self.worker.store.put(key, ctx)
                if library.catalog.exists():        # (the vector store may be gone meanwhile)
                    library.register(file_id, document, key, tokens, ctx, title=filename)
            except Exception as e:
                if library.catalog.exists():
                    library.note(file_id, key, tokens, document, status="failed", title=filename,
                                 error=str(e).splitlines()[0] if str(e) else type(e).__name__)
            finally:
                self.running.discard(running)
        try:
            await service.enqueue(lambda: self.worker.submit(encode, kind="encode", key=key, tenant=tenant.name),
                                  still_wanted, tenant)
        except BaseException:
            self.running.discard(running)
            await run_in_threadpool(lambda: library.remove([file_id]))
            if charged:
                await service.settle(tenant, tokens, queued=False)
            raise
        if charged:
            await service.settle(tenant, tokens, queued=True)
        return await run_in_threadpool(self.file, tenant, vs_id, file_id)

    BUSY_RETRY_S = 1.0      # how long a background add waits when its tenant's line is full before trying again

    async def add_later(self, tenant: Tenant, vs_id: str, file_ids: list[str]) -> None:
        """Enter ``file_ids`` in progress now, in one catalog write, and add them one after another in the
        background (``add_file``), as OpenAI's ``file_batches.create`` does: the request answers at once and
        clients poll. Each file then takes its place in the tenant's line like any request, and whatever
        refuses one (not found, unreadable, a quota) is that file's ``failed`` status, not the request's."""
        file_ids = list(dict.fromkeys(file_ids))
        await run_in_threadpool(self.enter_waiting, tenant, vs_id, file_ids)
        task = asyncio.get_running_loop().create_task(self.add_in_turn(tenant, vs_id, file_ids))
        self.adders.add(task)
        task.add_done_callback(self.adders.discard)

    def enter_waiting(self, tenant: Tenant, vs_id: str, file_ids: list[str]) -> None:
        library = self.library(tenant, vs_id)
        with library.catalog.lock():
            maker, docs = library.read()
            for file_id in file_ids:
                docs[file_id] = Document(file_id, "", 0, "", 0, 0, time.time(), status="in_progress")
            library.catalog.write(maker or library.maker, docs)
        self.waiting |= {(tenant.scope, vs_id, f) for f in file_ids}

    async def add_in_turn(self, tenant: Tenant, vs_id: str, file_ids: list[str]) -> None:
        async def always_wanted():          # no client waits on a background add
            return None
        for file_id in file_ids:
            try:
                if file_id not in await run_in_threadpool(lambda: self.library(tenant, vs_id).catalog.read()[1]):
                    continue            # removed while it waited
                while True:
                    try:
                        await self.add_file(tenant, vs_id, file_id, always_wanted)
                        break
                    except ApiError as e:
                        if e.status != 503:         # 503: the tenant's line is full; wait for a place
                            raise
                        await asyncio.sleep(self.BUSY_RETRY_S)
            except Exception as e:
                if not isinstance(e, ApiError):
                    log.exception("adding file %s to vector store %s failed", file_id, vs_id)
                why = e.message if isinstance(e, ApiError) else str(e).splitlines()[0] if str(e) else type(e).__name__
                library = await run_in_threadpool(lambda: self.library(tenant, vs_id, create=True))
                if library.catalog.exists():
                    await run_in_threadpool(lambda: library.note(file_id, "", 0, status="failed", error=why))
            finally:
                self.waiting.discard((tenant.scope, vs_id, file_id))

    # ------------------------------------------------------------------ questions
    def shelf(self, tenant: Tenant, vs_ids: list[str], file_ids: list[str] | None = None) -> dict[str, Document]:
        """The ready documents of the vector stores ``vs_ids`` together (``file_ids``: only these); 404 for a
        store the tenant lacks, 400 for a file in none of them or when none is ready."""
        if not vs_ids or not all(isinstance(v, str) for v in vs_ids):
            raise ApiError(400, "vector_store_ids must name at least one vector store", param="vector_store_ids")
        shelf, held = {}, set()
        for vs_id in vs_ids:
            _, docs = self.library(tenant, vs_id).catalog.read()
            held |= set(docs)
            shelf |= {n: d for n, d in docs.items() if self.status_of(tenant, vs_id, d).ready
                      and (file_ids is None or n in file_ids)}
        if file_ids is not None and (missing := [f for f in file_ids if f not in held]):
            raise ApiError(400, f"file {missing[0]} is in none of vector stores {', '.join(vs_ids)}", param="file_ids")
        if not shelf:
            raise ApiError(400, f"vector store{'s' if len(vs_ids) > 1 else ''} {', '.join(vs_ids)} "
                                "hold no file ready to ask; add files and wait for them to complete",
                           param="vector_store_ids", code="empty_vector_store")
        return shelf

    def asker(self, tenant: Tenant) -> Library:
        """The tenant's library object that answers questions (it keeps recent contexts and the first stage's
        index between questions)."""
        with self.lock:
            if tenant.name not in self.askers:
                self.askers[tenant.name] = Library(self.worker.pipe, self.worker.store, tenant.scope, name="asker",
                                                   keyer=tenant.context_key)
            return self.askers[tenant.name]


class LibraryQuestion:
    """A question over vector stores on the worker, as ``ChatJob`` is over a context: ``put`` queues it, its
    work gathers (first stage, token gather) and prefills the recompute, and the answer decodes in the
    worker's batch; it then carries its evidence and stages (``Library.finish``)."""

    started_encode = False

    def __init__(self, service, library: Library, shelf: dict[str, Document] | None, question: str, *, stream: bool,
                 max_new_tokens: int | None, sampling: dict, tenant: Tenant, candidates: int = 8):
        self.service, self.library, self.shelf, self.question = service, library, shelf, question
        self.stream, self.asked, self.sampling, self.tenant = stream, max_new_tokens, sampling, tenant
        self.candidates = candidates

    def work(self, job):
        options = dict(max_new_tokens=self.asked or self.service.settings.default_max_tokens,
                       fit_window=self.asked is None, on_text=lambda s: job.emit(("text", s)), **self.sampling)
        if self.shelf is None:          # no vector store named: the model alone
            return Underway(self.service.pipe.without_context().start(self.question, **options),
                            lambda answer: (answer, False))
        try:
            collected = self.library.collect(self.question, shelf=self.shelf, candidates=self.candidates)
        except ValueError as e:
            raise ApiError(400, str(e)) from None
        answering = self.library.start(self.question, collected, **options)
        return Underway(answering, lambda answer: (self.library.finish(answer, collected), False))

    def put(self):
        return self.service.worker.submit(self.work, stream=self.stream, tenant=self.tenant.name)

    def done_waiting(self) -> None:
        pass
