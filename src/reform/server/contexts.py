"""The server's contexts: a few recently used in memory, the rest in the store, encodes under way with
their status, and uploads queued as encode jobs. A context is named by its content key
(``Pipeline.context_key``); ``context`` finds it in memory, else in the store (a saved file: no encode),
else encodes it once, chunk by chunk, giving the model thread's loop its turn between chunks
(``Scheduler.pause``), and saves it."""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from typing import Any

from ..documents import Extracted
from ..stats import peak_memory_mb
from ..store import ContextFileError, ContextStore
from .replicas import ContextStatus, Replicas
from .scheduler import ENCODER, Cancelled, Job, QueueFull, Scheduler
from .tenants import DEFAULT, public_id

LOG = logging.getLogger("reform.server")


class Contexts:
    """Contexts of ``pipe`` in ``store`` (and ``memory`` of them in memory), encoded on ``scheduler``'s loop."""

    def __init__(self, pipe, store: ContextStore, scheduler: Scheduler, memory: int = 4):
        self.pipe, self.store, self.scheduler, self.memory = pipe, store, scheduler, memory
        self.replicas = Replicas(store)
        self.loaded: OrderedDict[str, Any] = OrderedDict()       # key -> Context, most recent last
        self.status: dict[str, ContextStatus] = {}                # contexts queued, encoding or failed here
        self.uploads: dict[str, Job] = {}                        # key -> the queued encode of an upload
        self.deleted: dict[str, float] = {}     # key -> when it was deleted, for the encode under way to see
        self.lock = threading.Lock()                             # guards ``status``, ``loaded``, ``deleted``
        self.encoded = 0                                         # contexts this process encoded (not loaded)
        self.tokens_encoded = 0                                  # over every encode here (for /metrics)
        self.encode_seconds = 0.0

    # ------------------------------------------------------------------ on the model thread
    def context(self, key: str, text: str | None, job: Job):
        """The context ``key``: from memory, from the store, or encoded from ``text`` (and saved), after
        waiting, paused, for another job's encode to end. Returns ``(context, encoded_here)``."""
        while True:
            found = self.in_memory(key) or self.from_store(key, text)
            if found is not None:
                return found, False
            if text is None:
                raise KeyError(key)
            if self.scheduler.encoder is None:
                return self.encode(key, text, job), True
            if not self.scheduler.pause(job, ENCODER):
                raise RuntimeError("another encode is under way")

    def in_memory(self, key: str):
        with self.lock:
            if key not in self.loaded:
                return None
            self.loaded.move_to_end(key)
            self.store.touch(key)
            return self.loaded[key]

    def from_store(self, key: str, text: str | None):
        """The saved context ``key``, or None where the store lacks it or holds it damaged (and ``text`` is
        here to encode it again)."""
        if not self.store.has(key):
            return None
        try:
            with self.store.open_local(key) as path:
                ctx = self.pipe.load_context(path)
        except ContextFileError as e:
            if text is None:            # listed as failed until the text comes again (upload or chat)
                with self.lock:
                    self.status[key] = ContextStatus(key, "failed", 0, error=str(e).splitlines()[0])
                raise
            self.store.delete(key)      # damaged: the text is here, so encode it again
            return None
        self.store.touch(key)
        self.remember(key, ctx)
        return ctx

    def encode(self, key: str, text: str, job: Job):
        status = self.status.get(key)
        if status is None:
            status = self.status[key] = ContextStatus(key, "queued", 0, method=self.method_of(text))
        status.status, status.error, status.tokens_encoded = "encoding", None, 0
        began = time.monotonic()
        tokens = self.pipe.tokenize(text)          # once: the count shown and the ids encoded
        status.tokens = int(tokens.ids.shape[0])
        self.replicas.publish(status)
        LOG.info("encode started: context %s, %d tokens, %s", public_id(key), status.tokens, status.method)
        published = [time.monotonic()]

        def between_chunks(n: int) -> None:
            job.check()
            status.tokens_encoded += n
            if time.monotonic() - published[0] > 2:       # other replicas see the progress every few seconds
                published[0] = time.monotonic()
                self.replicas.publish(status)
            self.scheduler.pause(job)

        self.scheduler.encoder = job
        try:
            ctx = self.pipe.encode_tokens(tokens.ids, tokens.image_rows, between_chunks, source=tokens.source)
            status.tokens_encoded = status.tokens
            status.bytes = self.store.put(key, ctx)
        except Exception as e:
            if self.deleted_since(key, began):     # deleted while it ran: no failed note outlives the delete
                self.store.drop_note(key)
                raise
            status.status = "failed"
            status.error = "cancelled before the encode finished" if isinstance(e, Cancelled) else \
                (str(e).splitlines()[0] if str(e) else type(e).__name__)
            self.replicas.publish(status)
            raise
        finally:
            self.scheduler.encoder = None
        status.status, status.encode_seconds = "ready", round(ctx.encode_seconds, 3)
        self.store.drop_note(key)
        if not self.remember(key, ctx, unless_deleted_since=began):
            self.store.delete(key)                  # deleted as it was saved: the delete stands
            raise Cancelled()
        LOG.info("encode finished: context %s, %d tokens in %.1f s, %d bytes stored, peak memory %.0f MB",
                 public_id(key), status.tokens, ctx.encode_seconds, status.bytes, peak_memory_mb())
        self.encoded += 1
        self.tokens_encoded += status.tokens
        self.encode_seconds += ctx.encode_seconds
        return ctx

    def deleted_since(self, key: str, began: float) -> bool:
        with self.lock:
            return self._deleted_since(key, began)

    def _deleted_since(self, key: str, began: float) -> bool:
        """Whether ``key`` was deleted after ``began`` (``self.lock`` held). The tombstones are spent: one
        encode runs at a time, so none of them concerns the next."""
        when = self.deleted.get(key)
        self.deleted.clear()
        return when is not None and when >= began

    def method_of(self, text) -> str:
        """The method a context of ``text`` (plain text or an extracted document) is encoded with."""
        return self.pipe.method_for(text if isinstance(text, Extracted) else None).name

    def remember(self, key: str, ctx, unless_deleted_since: float | None = None) -> bool:
        """Keep ``ctx`` in memory; with ``unless_deleted_since``, only if ``key`` was not deleted since
        then (checked under the lock ``forget`` takes, so a delete lands before or after, never between)."""
        with self.lock:
            if unless_deleted_since is not None and self._deleted_since(key, unless_deleted_since):
                return False
            self.loaded[key] = ctx
            self.loaded.move_to_end(key)
            while len(self.loaded) > self.memory:
                self.loaded.popitem(last=False)
        return True

    # ------------------------------------------------------------------ from the event loop
    def at_hand(self, key: str) -> bool:
        """``key`` can be read without an encode: in memory or in the store."""
        return key in self.loaded or self.store.has(key)

    def has(self, key: str) -> bool:
        """``key`` is in memory, in the store, or an upload here is queued or encoding it."""
        return self.at_hand(key) or key in self.uploads

    def progress(self, key: str) -> tuple[int, int] | None:
        """``(tokens encoded, tokens)`` of ``key``'s encode here while it runs."""
        with self.lock:
            s = self.status.get(key)
        return (s.tokens_encoded, s.tokens) if s is not None and s.status == "encoding" else None

    def upload(self, key: str, text: str, tokens: int, *, for_chat: bool = False, tenant: str = DEFAULT) -> Job:
        """Queue the encode of an uploaded context: its status reads "queued" here and, through the store's
        note, in every process sharing the store. ``QueueFull`` when the queue is full (nothing recorded).
        ``for_chat``: the encode a chat needs, which lives on after the chat's client leaves only while
        another chat waits for it or for ``ABANDONED_GRACE_S`` (see ``watch``); an upload of the same
        text makes it an upload (kept whatever the chats do). ``tenant``: whose turn it takes in the queue."""
        if (job := self.uploads.get(key)) is not None:
            job.for_chats = job.for_chats and for_chat
            return job
        with self.lock:
            status = self.status[key] = ContextStatus(key, "queued", tokens, method=self.method_of(text))

        def encode(job):
            found = self.context(key, text, job)
            with self.lock:     # found ready (a chat encoded the same text first): the store's word stands
                if (status := self.status.get(key)) is not None and status.status == "queued":
                    self.status.pop(key)
            return found
        try:
            job = self.scheduler.submit(encode, kind="encode", key=key, tenant=tenant)
        except QueueFull:
            with self.lock:
                self.status.pop(key, None)
            raise
        job.for_chats = for_chat
        self.uploads[key] = job
        self.replicas.publish(status)
        job.future.add_done_callback(lambda f: (self.uploads.pop(key, None), f.exception()))
        return job

    def watch(self, key: str) -> Job | None:
        """A chat starts waiting for ``key``'s queued encode; the encode's job, if one runs, to hand to
        ``unwatch`` once the chat stops waiting."""
        if (job := self.uploads.get(key)) is not None:
            job.waiting += 1
            job.left_at = None
        return job

    @staticmethod
    def unwatch(job: Job) -> None:
        job.waiting -= 1
        if job.waiting <= 0:
            job.left_at = time.monotonic()

    def forget(self, key: str) -> bool:
        """Remove ``key`` from memory, the store and the status table, cancelling an upload's encode; True
        if it was anywhere."""
        if (job := self.uploads.pop(key, None)) is not None:
            job.cancel.set()
        with self.lock:
            self.deleted[key] = time.monotonic()      # an encode of it under way leaves nothing behind
            in_memory = self.loaded.pop(key, None) is not None
            status = self.status.pop(key, None)
        self.store.drop_note(key)
        return self.store.delete(key) or in_memory or status is not None

    def describe(self, key: str) -> ContextStatus | None:
        """A context's status: in progress or failed here, else what the store's manifest says, else what
        another process sharing the store reports."""
        with self.lock:
            status = self.status.get(key)
        if status is not None and status.status != "ready":
            return status
        entry = self.store.get(key)
        if entry is None:
            with self.lock:
                if status is not None and key in self.loaded:
                    return status              # removed from the store (its size budget) but still in memory
                self.status.pop(key, None)     # ready here once, since removed: not listed as ready
            return self.replicas.elsewhere(key)
        try:
            m = self.store.manifest(key)
        except ContextFileError as e:
            return ContextStatus(key, "failed", 0, error=str(e), bytes=entry.bytes, created=int(entry.last_used))
        created = status.created if status is not None else int(entry.last_used)
        return ContextStatus(key, "ready", m.get("tokens", 0), m.get("tokens", 0), created,
                             (m.get("encode") or {}).get("seconds"), entry.bytes,
                             method=(m.get("method") or {}).get("name"))

    def all_contexts(self, scope: str = "") -> list[ContextStatus]:
        """Every context of the store's ``scope`` (a tenant's folder), stored or under way here."""
        keys = {e.key for e in self.store.entries(scope)}
        with self.lock:
            keys |= {k for k in self.status if k.rpartition("/")[0] == scope}
        return [s for k in sorted(keys) if (s := self.describe(k)) is not None]
