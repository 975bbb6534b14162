"""``reform serve``: an OpenAI-compatible HTTP API over one ``Pipeline`` (FastAPI; run by uvicorn).

- ``POST /v1/chat/completions`` — the OpenAI schema, streamed as server-sent ``chat.completion.chunk``
  events ending with ``[DONE]``; earlier messages are the context (encoded once, kept in the store by
  content), the last user message the question; ``context_id`` names an uploaded context.
- ``POST /v1/contexts`` (JSON ``{"text": ...}``, one multipart ``file`` or form field ``text``, or a text
  body) answers an id at once and encodes in the background; ``GET /v1/contexts[/{id}]`` shows status and
  progress; ``DELETE`` removes.
- ``GET /v1/models[/{id}]``, ``GET /health``, ``GET /metrics`` (Prometheus), and ``GET /`` the web page.

Every response names the process that answered in an ``X-Reform-Worker: HOST/PID`` header (behind a load
balancer or Ray Serve, which replica it was).

Every error is one JSON object in OpenAI's error shape with a fitting status: 400 bad request, 401
without the API key, 404 unknown model, context or endpoint, 405 wrong method, 413 too large, 503 (with
``Retry-After``) when the queue and the line of requests waiting for it are full, 504 past the per-request
timeout. A chat whose only message is the question is answered by the model without a context. Talks to the model only through
``Worker``.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hashlib
import hmac
import json
import logging
import math
import os
import socket
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from fastapi import APIRouter, FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..engine.layout import as_tensor
from ..engine.sampling import Sampling
from ..store import ContextFileError
from .metrics import Metrics
from .openai_schema import ApiError, ChatRequest, Conversation, context_text, history_question
from .worker import Cancelled, ContextStatus, QueueFull, Worker


@dataclass
class Settings:
    api_key: str | None = None
    max_body_bytes: int = 64 << 20          # 413 above this
    max_context_tokens: int = 2_000_000     # 413 above this
    request_timeout: float = 900.0          # 504 after this many seconds (encode included)
    default_max_tokens: int = 512
    model_id: str | None = None             # the name /v1/models lists (default: the pipeline's model name)
    allowed_origins: tuple[str, ...] = ()   # CORS: web origins whose pages may call the API ("*": any)
    max_waiting: int = 256                  # requests waiting in line for a queue place; 503 beyond


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

    def of(self, text: str, limit: int | None = None) -> tuple[str, int]:
        """``(key, tokens)`` of the context ``text`` would encode to; past ``limit`` tokens, ``(None, n)``
        with n > limit as soon as the count passes it (a 50 MB text is not tokenised whole to refuse it)."""
        digest = hashlib.sha256(text.encode()).hexdigest()
        with self.lock:
            if digest in self.memo:
                return self.memo[digest]
        if limit is not None and (n := self.count_up_to(text, limit)) > limit:
            return None, n
        ids = self.templater.context(text)
        found = (self.pipe.context_key(as_tensor(ids, "cpu")), len(ids))
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


class Service:
    """What the HTTP handlers share for one served ``Worker``: the settings, the names it answers to, the
    content keys of texts, and the waiting on jobs. State changes are the worker's own methods."""

    def __init__(self, worker: Worker, settings: Settings):
        self.worker, self.settings, self.pipe = worker, settings, worker.pipe
        self.model_id = settings.model_id or self.pipe.model_name
        self.keys = Keys(self.pipe)
        self.served_names = (self.model_id, self.pipe.model_name, self.pipe.source, "reform")  # a request's "model"
        self.history_limit = self.pipe.engine.shape.window // 8   # tokens of later turns riding with a question
        self.name = f"{socket.gethostname()}/{os.getpid()}"
        self.line = Line(settings.max_waiting)
        self.metrics = Metrics(worker, self.line)
        self.model_card = {"id": self.model_id, "object": "model", "created": 0, "owned_by": "reform",
                           "method": self.pipe.method.name, "window": self.pipe.engine.shape.window}

    def check_model(self, name: str) -> None:
        if name not in self.served_names:
            raise ApiError(404, f"model '{name}' is not served here; this server serves '{self.model_id}'",
                           param="model", code="model_not_found")

    async def key_of(self, text: str) -> tuple[str, int]:
        """``(content key, tokens)`` of a context text; 413 past the token limit."""
        key, n = await run_in_threadpool(self.keys.of, text, self.settings.max_context_tokens)
        if key is None or n > self.settings.max_context_tokens:
            raise ApiError(413, f"the context has {'at least ' if key is None else ''}{n} tokens, over this "
                                f"server's limit of {self.settings.max_context_tokens}", code="context_too_large")
        return key, n

    def encoding_elsewhere(self, key: str) -> bool:
        """Another process sharing the store (a replica) has ``key`` queued or encoding."""
        s = self.worker.elsewhere(key)
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

    def busy(self) -> ApiError:
        # when a place is likely free: the queue's expected wait, plus the line's share of jobs before it
        line_wait = len(self.line) * self.worker.job_seconds
        wait = min(600, max(1, math.ceil(self.worker.expected_wait() + line_wait)))
        return ApiError(503, f"the server is busy: too many requests are waiting; retry in about {wait} s",
                        type="server_error", code="queue_full", headers={"Retry-After": str(wait)})

    async def enqueue(self, put, still_wanted):
        """``put()``'s result once the worker's queue takes it (``put`` raises ``QueueFull`` while the queue is
        full): a request that finds it full waits in ``line`` for a place instead of being refused, and 503
        (``busy``) comes only when the line is full too."""
        try:
            return await self.line.join(put, still_wanted)
        except QueueFull:
            raise self.busy() from None

    def status_of(self, key: str) -> ContextStatus:
        s = self.worker.describe(key)
        if s is None:
            raise ApiError(404, f"context {key} not found", code="context_not_found")
        return s

    async def plan(self, conv: Conversation, context_id: str | None) -> tuple[str | None, str | None, str]:
        """``(context key, context text (None for an uploaded context_id), question)``: the longest stored
        prefix of the earlier messages whose later turns fit beside the question, else all earlier messages
        (encoded once); no earlier messages: ``(None, None, question)``, asked without a context."""
        earlier, worker = conv.earlier, self.worker
        if context_id is not None:
            if not worker.store.valid_key(context_id) or not (worker.has(context_id)
                                                                or await self.stored_elsewhere(context_id)):
                raise ApiError(404, f"context {context_id} not found", param="context_id", code="context_not_found")
            return context_id, None, await self.fit_history(earlier, conv.question)
        if not earlier:         # a question alone (a chat UI's first message): the model answers it
            return None, None, conv.question
        for j in range(len(earlier), 0, -1):
            later = earlier[j:]
            if later and await run_in_threadpool(self.keys.tokens, context_text(later)) > self.history_limit:
                break
            text = context_text(earlier[:j])
            key, _ = await self.key_of(text)
            if worker.has(key):    # the text still goes along: a damaged or evicted file is encoded again
                return key, text, history_question(later, conv.question)
        text = context_text(earlier)
        key, _ = await self.key_of(text)
        return key, text, conv.question

    async def check_images(self, parts: list, context_id: str | None) -> None:
        """400 for images this server cannot take: a text-only model or method, an uploaded context beside
        them, bytes that are no image; a 413 for a conversation whose text alone is over the token limit."""
        from ..documents import DocumentError, read_image
        if context_id is not None:
            raise ApiError(400, "images cannot be sent with a context_id; send the document in the messages",
                           param="context_id")
        try:
            self.pipe.check_takes_images()
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


# ---------------------------------------------------------------------- jobs as HTTP outcomes
def failure(e: BaseException) -> ApiError:
    """A job's exception as the HTTP error it deserves."""
    if isinstance(e, ApiError):
        return e
    if isinstance(e, KeyError):
        return ApiError(404, f"context {e.args[0]} not found (deleted, or removed by the store's size budget)",
                        param="context_id", code="context_not_found")
    if isinstance(e, ContextFileError):
        return ApiError(500, f"stored context is unreadable: {e}; upload the text again", type="server_error",
                        code="context_unreadable")
    if isinstance(e, (ValueError, TypeError)):     # our one-line refusals of bad input
        return ApiError(400, str(e).splitlines()[0] if str(e) else "bad request")
    return ApiError(500, f"internal error: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
                    type="server_error")


def outcome(job):
    if (e := job.future.exception()) is not None:
        raise failure(e)
    return job.future.result()


async def still_wanted(request: Request, deadline: float, timeout: float) -> None:
    """Raise ``Cancelled`` once the client has left, a 504 once the request is past its deadline."""
    if await request.is_disconnected():
        raise Cancelled()
    if asyncio.get_running_loop().time() > deadline:
        raise ApiError(504, f"the request took longer than {timeout:.0f} s", type="server_error", code="timeout")


class Line:
    """Requests that found the worker's queue full, each waiting for a place in arrival order: only the
    first in line may take a freed place, so no later request (or a client retrying at a lucky moment)
    overtakes one that waits, and every client is served first come, first served. ``size`` requests
    at most wait; one more is refused (``QueueFull``)."""

    POLL_S = 0.05        # how often the first in line looks for a place (the queue frees them on another thread)

    def __init__(self, size: int):
        self.size, self.waiting = size, deque()

    def __len__(self) -> int:
        return len(self.waiting)

    async def join(self, put, still_wanted):
        """``put()``'s result, at once when nobody waits and the queue has room, else when this request's
        turn comes; ``still_wanted()`` raises to leave the line (the client left, the deadline passed)."""
        if not self.waiting:
            try:
                return put()
            except QueueFull:
                pass
        if len(self.waiting) >= self.size:
            raise QueueFull()
        turn = asyncio.Event()
        self.waiting.append(turn)
        try:
            while True:
                if self.waiting[0] is turn:
                    try:
                        return put()
                    except QueueFull:
                        await asyncio.sleep(self.POLL_S)
                else:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(turn.wait(), 0.5)
                await still_wanted()
        finally:
            first = self.waiting[0] is turn
            self.waiting.remove(turn)
            if first and self.waiting:
                self.waiting[0].set()


class Waiting:
    """One request waiting on its job: cancels the job once the client has left or the time is up."""

    def __init__(self, job, request: Request, deadline: float, timeout: float):
        self.job, self.request, self.deadline, self.timeout = job, request, deadline, timeout

    async def still_wanted(self) -> None:
        try:
            await still_wanted(self.request, self.deadline, self.timeout)
        except BaseException:
            self.job.cancel.set()
            raise

    async def result(self):
        """The job's result."""
        while not (await asyncio.wait({self.job.future}, timeout=0.25))[0]:
            await self.still_wanted()
        return outcome(self.job)

    async def next_event(self, within: float | None = None):
        """``("text", piece)`` or ``("done", result)`` from a streaming job; errors raise. ``within``
        seconds passed without one: None."""
        job, until = self.job, None if within is None else asyncio.get_running_loop().time() + within
        while True:
            if until is not None and asyncio.get_running_loop().time() > until:
                return None
            if not job.events.empty():
                return job.events.get_nowait()
            if job.future.done():
                return "done", outcome(job)
            getter = asyncio.ensure_future(job.events.get())
            done, _ = await asyncio.wait({getter, job.future}, timeout=0.25, return_when=asyncio.FIRST_COMPLETED)
            if getter in done:
                return getter.result()
            getter.cancel()
            await self.still_wanted()


# ---------------------------------------------------------------------- request bodies
async def body_bytes(request: Request, limit: int) -> bytes:
    """The whole body, refused with 413 as soon as it passes ``limit`` bytes."""
    pieces, size = [], 0
    async for piece in request.stream():
        pieces.append(piece)
        size += len(piece)
        if size > limit:
            raise too_large(limit)
    return b"".join(pieces)


def too_large(limit: int) -> ApiError:
    return ApiError(413, f"request body is over the limit of {limit} bytes", code="request_too_large")


async def upload_text(request: Request, limit: int) -> str:
    """The one document of a ``POST /v1/contexts`` body: JSON ``{"text": ...}``, one multipart ``file`` or
    form field ``text``, or the body itself; UTF-8, not binary, not empty."""
    kind = request.headers.get("content-type", "")
    if kind.startswith(("multipart/form-data", "application/x-www-form-urlencoded")):
        form = await request.form(max_part_size=limit)
        items = form.getlist("file") + form.getlist("text")
        if len(items) != 1:       # several documents in one upload: which one was meant is unknowable
            raise ApiError(400, "send the context as one 'file' or 'text' form field" +
                           (f" (got {len(items)}); upload each document on its own" if items else ""),
                           param="file")
        item = items[0]
        data = await item.read() if hasattr(item, "read") else item.encode()
    else:
        raw = await body_bytes(request, limit)
        if kind.startswith("application/json"):
            try:
                payload = json.loads(raw)
            except (ValueError, RecursionError):        # RecursionError: nested past Python's limit
                raise ApiError(400, "the body is not valid JSON") from None
            if not isinstance(payload, dict) or not isinstance(payload.get("text"), str):
                raise ApiError(400, "send {\"text\": \"...\"} (or a multipart 'file')", param="text")
            if unknown := sorted(set(payload) - {"text"}):       # as the chat endpoint: nothing ignored
                raise ApiError(400, f"unknown field {unknown[0]!r}: send {{\"text\": \"...\"}}", param=unknown[0])
            try:
                data = payload["text"].encode()
            except UnicodeEncodeError as e:              # JSON may escape a lone surrogate (\ud800)
                raise ApiError(400, f"the text is not valid Unicode (a lone surrogate at character {e.start})",
                               param="text") from None
        else:
            data = raw        # text/plain or anything else: the body is the text
    if b"\x00" in data[:1 << 20]:
        raise ApiError(400, "the context looks binary (it contains NUL bytes); send UTF-8 text", param="file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ApiError(400, f"the context is not valid UTF-8 (byte {e.start})", param="file") from None
    if not text.strip():
        raise ApiError(400, "the context is empty", param="text")
    return text


async def chat_request(request: Request, limit: int) -> ChatRequest:
    try:
        return ChatRequest.model_validate_json(await body_bytes(request, limit))
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        at = f"{where}: " if where else ""           # a body that is no JSON object has no field to name
        raise ApiError(400, f"invalid request: {at}{first.get('msg')}", param=where or None) from None


# ---------------------------------------------------------------------- chat
class Completion:
    """The OpenAI shape of one chat completion: the whole answer, or its stream of chunks."""

    def __init__(self, model_id: str, key: str, streams):
        self.id, self.created, self.model_id, self.key = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time()), model_id, key
        self.streams = streams          # the open-streams gauge

    @staticmethod
    def usage(answer) -> dict:
        return {"prompt_tokens": answer.input_tokens, "completion_tokens": len(answer.tokens),
                "total_tokens": answer.input_tokens + len(answer.tokens)}

    def extension(self, answer, encoded: bool) -> dict:
        return {"context_id": self.key, "encoded": encoded, "stats": answer.stats}

    def whole(self, answer, encoded: bool) -> dict:
        return {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.model_id,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": answer.text},
                             "finish_reason": answer.finish_reason, "logprobs": None}],
                "usage": self.usage(answer), "reform": self.extension(answer, encoded)}

    def chunk(self, delta: dict | None, finish: str | None = None, **more) -> str:
        choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]
        body = {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model_id,
                "choices": choices, **more}
        return f"data: {json.dumps(body)}\n\n"

    async def events(self, first, waiting: Waiting, include_usage: bool, progress=lambda: None,
                     finished=lambda: None):
        """Server-sent events from the job's first event on, ending with ``[DONE]``. Until the first event
        (``first`` None: the context is still encoding), an SSE comment every ``KEEP_ALIVE_S`` keeps
        proxies from dropping the connection and carries the encode's progress."""
        event = first
        self.streams.inc()
        try:
            yield self.chunk({"role": "assistant", "content": ""})
            while event is None:
                done = progress()
                yield ": " + json.dumps({"reform": {"encoding": None if done is None else
                                                    {"tokens_encoded": done[0], "tokens": done[1]}}}) + "\n\n"
                event = await waiting.next_event(within=KEEP_ALIVE_S)
            while True:
                kind, value = event
                if kind == "done":
                    answer, encoded = value
                    yield self.chunk({}, answer.finish_reason, usage=self.usage(answer),
                                     reform=self.extension(answer, encoded))
                    if include_usage:
                        yield self.chunk(None, usage=self.usage(answer))
                    break
                yield self.chunk({"content": value})
                event = await waiting.next_event()
        except ApiError as e:
            yield f"data: {json.dumps(e.body())}\n\n"
        except Cancelled:
            return
        finally:
            self.streams.dec()
            finished()
            waiting.job.cancel.set()        # a client that left frees the worker at the next token
        yield "data: [DONE]\n\n"


KEEP_ALIVE_S = 5.0        # a streamed chat waiting for its encode sends a comment this often
FIRST_EVENT_S = 1.0       # ... after waiting this long for a first event (errors before it get a real status)


def service_of(request: Request) -> Service:
    return request.app.state.service


router = APIRouter()


@router.post("/v1/chat/completions")
async def chat(request: Request):
    service = service_of(request)
    settings, worker = service.settings, service.worker
    deadline = asyncio.get_running_loop().time() + settings.request_timeout   # reading the request counts
    req = await chat_request(request, settings.max_body_bytes)
    req.refuse_unsupported()
    service.check_model(req.model)
    try:
        Sampling(**req.sampling())
    except ValueError as e:
        raise ApiError(400, str(e)) from None
    conv = Conversation.of(req.messages)
    if conv.parts is not None:      # images: the conversation is encoded as it is, in the job (not stored)
        await service.check_images(conv.parts, req.context_id)
        key, text, question = None, None, conv.question
    else:
        key, text, question = await service.plan(conv, req.context_id)
    tokens = 0 if text is None else (await service.key_of(text))[1]
    asked = req.max_new_tokens()     # unset: up to the default, fewer where the window has less room

    def work(job):
        if conv.parts is not None:
            ctx, encoded = service.pipe.encode(conv.parts), True
        else:
            ctx, encoded = (worker.context(key, text, job) if key is not None
                            else (service.pipe.without_context(), False))
        answer = ctx.ask(question, max_new_tokens=asked or settings.default_max_tokens, fit_window=asked is None,
                         on_text=lambda s: job.emit(("text", s)), **req.sampling())
        return answer, encoded or started_encode

    started_encode, watched = False, []

    def put():
        nonlocal started_encode
        if text is not None and not worker.has(key) and not service.encoding_elsewhere(key):
            # the encode runs as a job of its own, so that it outlives this request if its client leaves and
            # another chat (or the same client, retrying) wants the same text (``Worker.upload``)
            worker.upload(key, text, tokens, for_chat=True)
            started_encode = True
        if key is not None and not watched and (encode := worker.watch(key)) is not None:
            watched.append(encode)
        # with key: may answer during another's encode (as may a question without a context)
        return worker.submit(work, stream=req.stream, key=key, no_context=key is None and conv.parts is None)

    def done_waiting() -> None:      # once per request, whichever way it ends
        while watched:
            worker.unwatch(watched.pop())
    completion = Completion(service.model_id, key, service.metrics.streams)
    try:    # errors before the first token (unknown context, question too long) get a real status
        job = await service.enqueue(put, lambda: still_wanted(request, deadline, settings.request_timeout))
        waiting = Waiting(job, request, deadline, settings.request_timeout)
        if not req.stream:
            try:
                return completion.whole(*await waiting.result())
            finally:
                done_waiting()
        first = await waiting.next_event(within=FIRST_EVENT_S)
    except Cancelled:
        done_waiting()
        return JSONResponse({}, status_code=499)
    except BaseException:
        done_waiting()
        raise
    include_usage = req.stream_options is not None and bool(req.stream_options.include_usage)
    return StreamingResponse(completion.events(first, waiting, include_usage, lambda: worker.progress(key),
                                               done_waiting),
                             media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


# ---------------------------------------------------------------------- contexts
@router.post("/v1/contexts")
async def create_context(request: Request):
    service = service_of(request)
    settings = service.settings
    deadline = asyncio.get_running_loop().time() + settings.request_timeout
    text = await upload_text(request, settings.max_body_bytes)
    key, n = await service.key_of(text)
    if service.worker.has(key) or service.encoding_elsewhere(key):   # (another replica's encode is not repeated)
        s = service.status_of(key)
        if s.status != "failed":
            return JSONResponse(s.to_json(), status_code=200 if s.status == "ready" else 202)
        service.worker.forget(key)       # failed, or its file unreadable: replaced by a fresh encode
    try:
        await service.enqueue(lambda: service.worker.upload(key, text, n),
                              lambda: still_wanted(request, deadline, settings.request_timeout))
    except Cancelled:
        return JSONResponse({}, status_code=499)
    return JSONResponse(service.status_of(key).to_json(), status_code=202)


@router.get("/v1/contexts")
async def list_contexts(request: Request):
    return {"object": "list", "data": [s.to_json() for s in service_of(request).worker.all_contexts()]}


@router.get("/v1/contexts/{key}")
async def get_context(key: str, request: Request):
    return service_of(request).status_of(key).to_json()


@router.delete("/v1/contexts/{key}")
async def delete_context(key: str, request: Request):
    worker = service_of(request).worker
    if not worker.store.valid_key(key) or not worker.forget(key):
        raise ApiError(404, f"context {key} not found", code="context_not_found")
    return {"id": key, "object": "context.deleted", "deleted": True}


# ---------------------------------------------------------------------- models, health
@router.get("/v1/models")
async def models(request: Request):
    return {"object": "list", "data": [service_of(request).model_card]}


@router.get("/v1/models/{name:path}")           # model ids may hold slashes (Qwen/Qwen2.5-7B-Instruct)
async def retrieve_model(name: str, request: Request):
    service = service_of(request)
    service.check_model(name)
    return service.model_card


@router.get("/health")
async def health(request: Request):
    service = service_of(request)
    worker = service.worker
    return {"status": "ok", "model": service.model_id, "method": service.pipe.method.name, "queued": worker.queued(),
            "busy": worker.busy_since is not None, "contexts_encoded": worker.encoded,
            "stored_contexts": len(worker.store.entries())}


STATIC = Path(__file__).parent / "static"


@router.get("/", include_in_schema=False)
async def page():
    """The web page (static files, no build step): upload, watch the encode, chat, manage contexts."""
    return FileResponse(STATIC / "index.html")


@router.get("/metrics")
async def metrics(request: Request):
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
    return Response(generate_latest(service_of(request).metrics.registry), media_type=CONTENT_TYPE_LATEST)


# ---------------------------------------------------------------------- errors and the guard
async def api_error(request: Request, e: ApiError):
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


async def routing_error(request: Request, e: StarletteHTTPException):
    """Routing's own 404 and 405 in the same shape as every other error (OpenAI clients read
    ``error.message``); 405 keeps its ``Allow`` header."""
    where = f"{request.method} {request.url.path}"
    message = {404: f"no such endpoint: {where}", 405: f"method not allowed: {where}"}.get(e.status_code, str(e.detail))
    error = ApiError(e.status_code, message, code={404: "not_found", 405: "method_not_allowed"}.get(e.status_code))
    return JSONResponse(error.body(), status_code=e.status_code, headers=getattr(e, "headers", None))


async def internal_error(request: Request, e: Exception):
    """Whatever escaped every handler: a 500 in the same JSON shape, never a plain-text traceback."""
    error = ApiError(500, f"internal error: {type(e).__name__}", type="server_error")
    return JSONResponse(error.body(), status_code=500)


class BodyLimit:
    """ASGI middleware: counts a request's body as it arrives, whatever its framing (``Content-Length`` or
    chunked, JSON, text or multipart), and answers 413 once it passes the limit, so no body larger than
    the limit is ever held. (The read fails inside the handler; the 413 is sent from here, because an
    error raised while reading can surface wrapped by the middleware between.)"""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        seen, exceeded, started = 0, False, False

        async def counted():
            nonlocal seen, exceeded
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    exceeded = True
                    raise too_large(self.limit)
            return message

        async def sending(message):
            nonlocal started
            if message["type"] == "http.response.start":
                if exceeded:         # a handler's own answer to the failed read (the same 413)
                    message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
                started = True
            await send(message)

        try:
            await self.app(scope, counted, sending)
        except BaseException:
            if not exceeded or started:
                raise
            error = too_large(self.limit)
            await JSONResponse(error.body(), status_code=413, headers={"Connection": "close"})(scope, receive, send)


ACCESS_LOG = logging.getLogger("reform.access")


class Guard:
    """ASGI middleware (a plain one, so ``request.is_disconnected()`` still reaches the server): the API key,
    the body-size limit by ``Content-Length``, a request id (the client's ``X-Request-Id`` or a new one) and
    the answering process in every response, metrics, and the access log (one JSON line per request,
    written when its response ends, streams included)."""

    def __init__(self, app, service: Service):
        self.app, self.service = app, service

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        service, request = self.service, Request(scope)
        request_id = request.headers.get("x-request-id", "")[:64] or uuid.uuid4().hex
        started, status = time.perf_counter(), [500]

        async def sending(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                message = {**message, "headers": [*message.get("headers", []),
                                                  (b"x-reform-worker", service.name.encode()),
                                                  (b"x-request-id", request_id.encode())]}
            await send(message)
        service.metrics.in_flight.inc()
        try:
            refusal = self.refusal(request)
            if refusal is not None:
                await refusal(scope, receive, sending)
            else:
                await self.app(scope, receive, sending)
        finally:
            service.metrics.in_flight.dec()
            path = getattr(scope.get("route"), "path", "unmatched")
            service.metrics.requests.labels(path, str(status[0])).inc()
            ACCESS_LOG.info(json.dumps({
                "time": round(time.time(), 3), "request_id": request_id, "method": request.method,
                "path": request.url.path, "status": status[0], "seconds": round(time.perf_counter() - started, 4),
                "client": request.client.host if request.client else None, "worker": service.name}))

    def refusal(self, request: Request) -> JSONResponse | None:
        settings = self.service.settings
        if request.url.path.startswith("/v1/") and settings.api_key:
            given = request.headers.get("authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {settings.api_key}".encode()):
                e = ApiError(401, "missing or wrong API key: send 'Authorization: Bearer KEY'",
                             type="authentication_error", code="invalid_api_key")
                return JSONResponse(e.body(), status_code=401, headers={"WWW-Authenticate": "Bearer"})
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > settings.max_body_bytes:
            e = ApiError(413, f"request body of {int(length)} bytes is over the limit of {settings.max_body_bytes}",
                         code="request_too_large")
            return JSONResponse(e.body(), status_code=413)
        return None


def create_app(worker: Worker, settings: Settings | None = None) -> FastAPI:
    """The FastAPI app serving ``worker``'s pipeline: the handlers above over one ``Service``."""
    app = FastAPI(title="reform", version="1", docs_url=None, redoc_url=None)
    app.state.service = Service(worker, settings or Settings())
    app.state.worker, app.state.settings = worker, app.state.service.settings
    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(StarletteHTTPException, routing_error)
    app.add_exception_handler(Exception, internal_error)
    app.add_middleware(Guard, service=app.state.service)
    app.add_middleware(BodyLimit, limit=app.state.settings.max_body_bytes)
    if app.state.settings.allowed_origins:      # outermost: preflight requests answered before the API key
        app.add_middleware(CORSMiddleware, allow_origins=list(app.state.settings.allowed_origins),
                           allow_methods=["GET", "POST", "DELETE", "OPTIONS"],
                           allow_headers=["Authorization", "Content-Type", "X-Request-Id"],
                           expose_headers=["X-Request-Id", "X-Reform-Worker", "Retry-After"])
    app.include_router(router)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app
