"""What ``reform serve``'s handlers share: the settings, the content keys of texts (tokenised off the model
thread), and ``Service``, which plans a chat (which stored context answers it) and queues work on the
``Worker`` through the admission ``Line`` (docs/architecture.md, serving)."""

from __future__ import annotations

import asyncio
import bisect
import copy
import hashlib
import math
import os
import socket
import threading
import time
from dataclasses import dataclass, field

from starlette.concurrency import run_in_threadpool

from ..documents import DocumentError, Extracted, Limits, UnsupportedDocument, extract_bytes
from ..documents.folder import join
from ..engine.layout import as_tensor
from ..pipeline.inputs import check_takes_images
from .admission import Line
from .files import FileStore
from .libraries import VectorStores
from .metrics import Metrics
from .openai_schema import SEPARATOR, ApiError, Conversation, context_text, history_question
from .tenants import DailyTokens, Tenant, Tenants, seconds_to_next_day
from .replicas import ContextStatus
from .scheduler import QueueFull, Underway
from .worker import Worker


@dataclass
class Settings:
    api_key: str | None = None              # one key: the single tenant ``default``
    keys_file: str | None = None            # tenants, their keys and quotas (``tenants.read_keys_file``)
    metrics_key: str | None = None          # the operator's key for /metrics, /health's counts, /openapi.json
    max_body_bytes: int = 64 << 20          # 413 above this
    max_context_tokens: int = 2_000_000     # 413 above this
    request_timeout: float = 900.0          # 504 after this many seconds (encode included)
    default_max_tokens: int = 512
    model_id: str | None = None             # the name /v1/models lists (default: the pipeline's model name)
    allowed_origins: tuple[str, ...] = ()   # CORS: web origins whose pages may call the API ("*": any)
    max_waiting: int = 256                  # requests waiting in line for a queue place; 503 beyond
    limits: Limits = field(default_factory=Limits)   # what extracting one uploaded document may cost

    @classmethod
    def from_json(cls, fields: dict) -> "Settings":
        """The settings ``dataclasses.asdict`` gave (as a Ray replica receives them)."""
        fields = dict(fields)
        if isinstance(fields.get("limits"), dict):
            fields["limits"] = Limits(**fields["limits"])
        if isinstance(fields.get("allowed_origins"), list):
            fields["allowed_origins"] = tuple(fields["allowed_origins"])
        return cls(**fields)


class Keys:
    """Content keys of context texts, computed off the model thread and remembered by text digest. Each
    thread tokenises with its own copy of the tokenizer (one object is not safe to share between threads),
    so two uploads are tokenised at once rather than one behind the other."""

    PIECE_CHARS = 1 << 18          # tokens are counted this many characters at a time, to stop early

    def __init__(self, pipe):
        self.pipe = pipe
        self.local = threading.local()
        self.lock = threading.Lock()              # guards ``memo`` only
        self.memo: dict[str, tuple[str, int]] = {}

    @property
    def templater(self):
        if not hasattr(self.local, "templater"):
            templater = copy.copy(self.pipe.templater)
            templater.tok = copy.deepcopy(self.pipe.tokenizer)
            self.local.templater = templater
        return self.local.templater

    def of(self, content: str | Extracted, limit: int | None = None, tenant: str = "") -> tuple[str, int]:
        """``(key, tokens)`` of the context ``content`` (text or an extracted document) would encode to; past
        ``limit`` tokens, ``(None, n)`` with n > limit as soon as the count passes it (a 50 MB text is not
        tokenised whole to refuse it). Remembered per ``tenant``: a text another tenant sent is counted
        again, in the time any new text takes."""
        document = content if isinstance(content, Extracted) else None
        text = content.text if document is not None else content
        digest = hashlib.sha256(tenant.encode() + b"\0" + text.encode() +
                                ((document.digest() or "") if document else "").encode()).hexdigest()
        with self.lock:
            if digest in self.memo:
                return self.memo[digest]
        if limit is not None and (n := self.count_up_to(text, limit)) > limit:
            return None, n
        ids = self.templater.context(text)
        found = (self.pipe.context_key(as_tensor(ids, "cpu"), document=document), len(ids))
        with self.lock:
            self.memo[digest] = found
        return found

    def count_up_to(self, text: str, limit: int) -> int:
        """Tokens of ``text``, counted piece by piece (cut at whitespace), stopping once past ``limit``."""
        n, start = 0, 0
        while start < len(text) and n <= limit:
            end = min(len(text), start + self.PIECE_CHARS)
            if end < len(text):
                end = max(text.rfind(" ", start, end), text.rfind("\n", start, end)) + 1 or end
            n += len(self.templater.encode(text[start:end]))
            start = end
        return n

    def tokens(self, text: str) -> int:
        return len(self.templater.encode(text))

    def prefix_keys(self, texts: list[str], later_limit: int, tenant: Tenant) -> list[tuple[int, str]]:
        """``(j, store key)`` for each prefix of the messages ``texts`` whose later messages may fit in
        ``later_limit`` tokens, longest first: the key ``context_text`` of the first j would be stored under.
        One tokenisation of the whole conversation gives every prefix's ids, so a chat of thousands of
        messages costs what one text does; a prefix whose last token runs into the separator gets no key
        here (the caller's exact check, ``of``, is the truth for the one it uses)."""
        full = SEPARATOR.join(texts)
        ids, starts = self.templater.context_offsets(full)
        lead, keys, end, every = len(self.templater.prefix), [], len(full), as_tensor(ids, "cpu")
        for j in range(len(texts), 0, -1):
            later = len(ids) - bisect.bisect_left(starts, end + len(SEPARATOR), lo=lead) if j < len(texts) else 0
            if later > later_limit + 2:      # +2: the suffix alone may tokenise a token or two apart
                break
            cut = bisect.bisect_left(starts, end, lo=lead)
            if cut == len(ids) or starts[cut] == end:
                keys.append((j, tenant.context_key(self.pipe.context_key(every[:cut]))))
            end -= len(texts[j - 1]) + len(SEPARATOR)
        return keys


class Service:
    """What the HTTP handlers share for one served ``Worker``: the settings, the tenants and their quotas,
    the names it answers to, the content keys of texts, and the waiting on jobs. State changes are the
    worker's own methods."""

    def __init__(self, worker: Worker, settings: Settings):
        self.worker, self.settings, self.pipe = worker, settings, worker.pipe
        self.tenants = Tenants.of(settings.api_key, settings.keys_file)
        self.model_id = settings.model_id or self.pipe.model_name
        self.keys = Keys(self.pipe)
        self.served_names = (self.model_id, self.pipe.model_name, self.pipe.source, "reform")  # a request's "model"
        self.history_limit = self.pipe.engine.shape.window // 8   # tokens of later turns riding with a question
        self.name = f"{socket.gethostname()}/{os.getpid()}"
        self.lines = {t.name: Line(settings.max_waiting) for t in self.tenants.all}   # each tenant waits in its own
        self.metrics = Metrics(worker, self.lines, self.tenants)
        self.files = {t.name: FileStore(worker.store, t.scope) for t in self.tenants.all}
        self.usage = DailyTokens(worker.store, worker.contexts.replicas.owner["instance"])
        self.in_flight = {t.name: 0 for t in self.tenants.all}      # requests being answered, by tenant
        self.vector_stores = VectorStores(self)
        worker.store.room = self.room_for_context
        self.model_card = {"id": self.model_id, "object": "model", "created": 0, "owned_by": "reform",
                           "method": self.pipe.method.name, "documents_method": self.pipe.documents_method.name,
                           "window": self.pipe.engine.shape.window,
                           # the longest input taken (vLLM's field, which clients budget by), not the window
                           "max_model_len": settings.max_context_tokens}

    async def extract(self, data: bytes, filename: str) -> Extracted:
        """A document's bytes as text with its map (off the event loop); 415 for a type reform does not
        read, 413 past an extraction limit, 400 for a damaged or empty file."""
        try:
            return await run_in_threadpool(extract_bytes, data, filename, self.settings.limits)
        except DocumentError as e:
            raise document_error(e) from None

    async def document_of(self, conv: Conversation, tenant: Tenant) -> Extracted:
        """The context of a chat with file parts: the earlier messages' text (if any) and each file, in order,
        one document each; a single file alone is that document."""
        named = [("messages", Extracted.plain(context_text(conv.earlier), "messages"))] if conv.earlier else []
        for part in conv.files:
            if part.file_id is not None:
                try:
                    data, filename = await run_in_threadpool(self.files[tenant.name].content, part.file_id)
                except KeyError:
                    raise ApiError(404, f"file {part.file_id} not found", param="messages",
                                   code="file_not_found") from None
            else:
                data, filename = part.data, part.filename
            named.append((filename, await self.extract(data, filename)))
        if len(named) == 1 and conv.files:
            return named[0][1]
        return join(named)

    def check_model(self, name: str) -> None:
        if name not in self.served_names:
            raise ApiError(404, f"model '{name}' is not served here; this server serves '{self.model_id}'",
                           param="model", code="model_not_found")

    async def key_of(self, text: str | Extracted, tenant: Tenant) -> tuple[str, int]:
        """``(store key, tokens)`` of a context text or document for ``tenant``; 413 past the token limit."""
        key, n = await run_in_threadpool(self.keys.of, text, self.settings.max_context_tokens, tenant.name)
        if key is None or n > self.settings.max_context_tokens:
            raise ApiError(413, f"the context has {'at least ' if key is None else ''}{n} tokens, over this "
                                f"server's limit of {self.settings.max_context_tokens}", code="context_too_large")
        return tenant.context_key(key), n

    def will_encode(self, key: str) -> bool:
        """``key`` is nowhere yet: asking for it starts an encode."""
        return not self.worker.contexts.has(key) and not self.encoding_elsewhere(key)

    async def admit_encode(self, tenant: Tenant, tokens: int) -> None:
        """Charge a new encode of ``tokens`` to ``tenant``: 413 while its store is at its quota of contexts or
        bytes, 429 (``Retry-After``: the next UTC day) past its daily tokens. Then ``settle`` it."""
        quotas = tenant.quotas
        if quotas.contexts is not None:
            stored = await run_in_threadpool(self.worker.store.entries, tenant.scope)
            under_way = {s.id for s in self.worker.contexts.all_contexts(tenant.scope) if s.status in ("queued", "encoding")}
            if len({e.key for e in stored} | under_way) >= quotas.contexts:
                raise self.refused(tenant, "contexts", 413, f"this key's store holds its quota of {quotas.contexts} "
                                   "contexts; delete some (DELETE /v1/contexts/ID) to upload more")
        await self.check_store_bytes(tenant)
        total = await run_in_threadpool(self.usage.take, tenant.scope, tokens, quotas.daily_tokens)
        if total is None:
            wait = seconds_to_next_day()
            raise self.refused(tenant, "daily_tokens", 429, f"this context's {tokens} tokens would pass this key's quota "
                               f"of {quotas.daily_tokens} tokens encoded per day (UTC); retry in {wait} s",
                               headers={"Retry-After": str(wait)})

    async def check_store_bytes(self, tenant: Tenant) -> None:
        """413 while ``tenant``'s saved contexts and files take its ``store_bytes`` quota or more."""
        await run_in_threadpool(self.check_room, tenant, 0)

    def check_room(self, tenant: Tenant, adding: int) -> None:
        """413 when ``adding`` more bytes would pass ``tenant``'s ``store_bytes`` quota (0: while it is at it)."""
        if (most := tenant.quotas.store_bytes) is None:
            return
        used = sum(e.bytes for e in self.worker.store.entries(tenant.scope)) + self.files[tenant.name].total_bytes()
        if (used >= most) if adding == 0 else (used + adding > most):
            raise self.refused(tenant, "store_bytes", 413, f"this key's store holds {used} bytes of contexts and "
                               f"files{f' and this context needs {adding} more, past' if adding else ', at'} its "
                               f"quota of {most}; delete some (DELETE /v1/contexts/ID, /v1/files/ID) to upload more")

    def room_for_context(self, key: str, size: int) -> None:
        """The store's check before it writes a context (``ContextStore.room``): its tenant's quota counts
        the bytes first, so an encode that would pass it is refused and nothing is written."""
        for tenant in self.tenants.all:
            if tenant.owns(key):
                self.check_room(tenant, size)

    async def settle(self, tenant: Tenant, tokens: int, queued: bool) -> None:
        """After ``admit_encode``: count the tokens of an encode that was queued, give back those of one that
        never was (its request refused or gone first)."""
        if queued:
            self.metrics.tenant_tokens.labels(tenant.name).inc(tokens)
        else:
            await run_in_threadpool(self.usage.take, tenant.scope, -tokens, None)

    def refused(self, tenant: Tenant, quota: str, status: int, message: str, headers: dict | None = None) -> ApiError:
        self.metrics.tenant_refused.labels(tenant.name, quota).inc()
        return ApiError(status, message, type="rate_limit_error" if status == 429 else "invalid_request_error",
                        code="quota_exceeded", headers=headers)

    def encoding_elsewhere(self, key: str) -> bool:
        """Another process sharing the store (a replica) has ``key`` queued or encoding."""
        s = self.worker.contexts.replicas.elsewhere(key)
        return s is not None and s.status in ("queued", "encoding")

    async def stored_elsewhere(self, key: str) -> bool:
        """Wait while another replica encodes ``key``; True once it is stored."""
        deadline = time.monotonic() + self.settings.request_timeout
        while self.encoding_elsewhere(key):
            if time.monotonic() > deadline:
                raise ApiError(504, f"context {key} is still being encoded by another replica", code="timeout")
            await asyncio.sleep(0.5)
            if self.worker.store.has(key):
                return True
        return self.worker.store.has(key)

    def busy(self, tenant: Tenant) -> ApiError:
        # when a place is likely free: the queue's expected wait, plus the line's share of jobs before it
        line_wait = len(self.lines[tenant.name]) * self.worker.job_seconds
        wait = min(600, max(1, math.ceil(self.worker.expected_wait() + line_wait)))
        return ApiError(503, f"the server is busy: too many requests are waiting; retry in about {wait} s",
                        type="server_error", code="queue_full", headers={"Retry-After": str(wait)})

    async def enqueue(self, put, still_wanted, tenant: Tenant):
        """``put()``'s result once the worker's queue takes it (``put`` raises ``QueueFull`` while ``tenant``'s
        share of the queue is full): a request that finds it full waits in its tenant's line for a place
        instead of being refused, and 503 (``busy``) comes only when that line is full too."""
        try:
            return await self.lines[tenant.name].join(put, still_wanted)
        except QueueFull:
            raise self.busy(tenant) from None

    def status_of(self, key: str) -> ContextStatus:
        """``key``'s status (a store key: the tenant's folder and id); 404 for one that is nowhere."""
        s = self.worker.contexts.describe(key) if self.worker.store.valid_key(key) else None
        if s is None:
            raise ApiError(404, f"context {key.rpartition('/')[2]} not found", code="context_not_found")
        return s

    async def plan(self, conv: Conversation, context_id: str | None,
                   tenant: Tenant) -> tuple[str | None, str | None, str]:
        """``(context key, context text (None for an uploaded context_id), question)``: the longest stored
        prefix of the earlier messages whose later turns fit beside the question, else all earlier messages
        (encoded once); no earlier messages: ``(None, None, question)``, asked without a context."""
        earlier, worker = conv.earlier, self.worker
        if context_id is not None:
            key = tenant.stored_key(context_id)
            if not worker.store.valid_key(key) or not (worker.contexts.has(key) or await self.stored_elsewhere(key)):
                raise ApiError(404, f"context {context_id} not found", param="context_id", code="context_not_found")
            return key, None, await self.fit_history(earlier, conv.question)
        if not earlier:         # a question alone (a chat UI's first message): the model answers it
            return None, None, conv.question
        whole = context_text(earlier)
        whole_key, _ = await self.key_of(whole, tenant)        # 413 past the limit, before any other work
        candidates = await run_in_threadpool(self.keys.prefix_keys, [text for _, text in earlier],
                                             self.history_limit, tenant)
        for j, key in candidates:
            if not worker.contexts.has(key):
                continue
            text, later = context_text(earlier[:j]), earlier[j:]
            # the one prefix used is checked exactly: its own key, its later turns within the limit
            if (await self.key_of(text, tenant))[0] == key and not (
                    later and await run_in_threadpool(self.keys.tokens, context_text(later)) > self.history_limit):
                return key, text, history_question(later, conv.question)   # the text goes along: a damaged
        return whole_key, whole, conv.question                               # or evicted file is encoded again

    async def check_images(self, parts: list, context_id: str | None) -> None:
        """400 for images this server cannot take: a text-only model or method, an uploaded context beside
        them, bytes that are no image; a 413 for a conversation whose text alone is over the token limit."""
        from ..documents import DocumentError, read_image
        if context_id is not None:
            raise ApiError(400, "images cannot be sent with a context_id; send the document in the messages",
                           param="context_id")
        try:
            check_takes_images(self.pipe)
        except ValueError as e:
            raise ApiError(400, str(e), param="messages") from None
        for part in parts:
            if isinstance(part, bytes):
                try:
                    await run_in_threadpool(read_image, part)
                except DocumentError as e:
                    raise ApiError(400, str(e), param="messages") from None
        n = await run_in_threadpool(self.keys.tokens, "".join(p for p in parts if isinstance(p, str)))
        if n > self.settings.max_context_tokens:
            raise ApiError(413, f"the context has {n} text tokens, over this server's limit of "
                                f"{self.settings.max_context_tokens}", code="context_too_large")

    async def fit_history(self, turns, question: str) -> str:
        if turns and await run_in_threadpool(self.keys.tokens, context_text(turns)) > self.history_limit:
            raise ApiError(400, f"the messages besides an uploaded context_id are over {self.history_limit} tokens; "
                                "upload them as part of the context", param="messages")
        return history_question(turns, question)


class ChatJob:
    """One chat's work on the worker: its encode (if its text is not stored yet) and its answer. ``put``
    queues it (raising ``QueueFull`` while the queue is full); ``done_waiting`` releases the encode it
    watched, once, whichever way the request ends."""

    def __init__(self, service: Service, req, conv: Conversation, key: str | None, text: str | None,
                 question: str, tokens: int, tenant: Tenant):
        self.service, self.req, self.conv, self.tenant = service, req, conv, tenant
        self.key, self.text, self.question, self.tokens = key, text, question, tokens
        self.asked = req.max_new_tokens()     # unset: up to the default, fewer where the window has less room
        self.started_encode, self.watched = False, []

    def work(self, job):
        pipe, worker, conv = self.service.pipe, self.service.worker, self.conv
        if conv.parts is not None:
            ctx, encoded = pipe.encode(conv.parts), True
        elif self.key is not None:
            ctx, encoded = worker.contexts.context(self.key, self.text, job)
        else:
            ctx, encoded = pipe.without_context(), False
        answering = ctx.start(self.question, max_new_tokens=self.asked or self.service.settings.default_max_tokens,
                              fit_window=self.asked is None, on_text=lambda s: job.emit(("text", s)),
                              **self.req.sampling())
        encoded = encoded or self.started_encode
        return Underway(answering, lambda answer: (answer, encoded))     # it decodes in the worker's batch

    def put(self):
        worker, key = self.service.worker, self.key
        if self.text is not None and not worker.contexts.has(key) and not self.service.encoding_elsewhere(key):
            # the encode runs as a job of its own, so that it outlives this request if its client leaves and
            # another chat (or the same client, retrying) wants the same text (``Worker.upload``)
            worker.contexts.upload(key, self.text, self.tokens, for_chat=True, tenant=self.tenant.name)
            self.started_encode = True
        if key is not None and not self.watched and (encode := worker.contexts.watch(key)) is not None:
            self.watched.append(encode)
        return worker.submit(self.work, stream=self.req.stream, key=key, tenant=self.tenant.name)

    def done_waiting(self) -> None:
        while self.watched:
            self.service.worker.contexts.unwatch(self.watched.pop())


def document_error(e: DocumentError) -> ApiError:
    """A document reform cannot take, as the HTTP error it deserves."""
    if isinstance(e, UnsupportedDocument):
        return ApiError(415, str(e), param="file", code="unsupported_media_type")
    if "over the limit" in str(e) or "longer than" in str(e) or "past the limit" in str(e):
        return ApiError(413, str(e), param="file", code="document_too_large")
    return ApiError(400, str(e), param="file", code="invalid_document")
