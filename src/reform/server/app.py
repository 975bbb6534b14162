"""``reform serve``: an OpenAI-compatible HTTP API over one ``Pipeline`` (FastAPI; run by uvicorn).

- ``POST /v1/chat/completions`` — the OpenAI schema, streamed as server-sent ``chat.completion.chunk``
  events ending with ``[DONE]``; earlier messages are the context (encoded once, kept in the store by
  content), the last user message the question; ``context_id`` names an uploaded context.
- ``POST /v1/contexts`` (JSON ``{"text": ...}``, one multipart ``file`` or form field ``text``, or a text
  body) answers an id at once and encodes in the background; ``GET /v1/contexts[/{id}]`` shows status and
  progress; ``DELETE`` removes.
- ``GET /v1/models[/{id}]``, ``GET /health``.

Every response names the process that answered in an ``X-Reform-Worker: HOST/PID`` header (behind a load
balancer or Ray Serve, which replica it was).

Every error is one JSON object in OpenAI's error shape with a fitting status: 400 bad request, 401
without the API key, 404 unknown model, context or endpoint, 405 wrong method, 413 too large, 503 (with
``Retry-After``) when the queue is full, 504 past the per-request timeout. Talks to the model only through
``Worker``.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import hmac
import json
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..engine.layout import as_tensor
from ..engine.sampling import Sampling
from ..store import ContextFileError
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


class Keys:
    """Content keys of context texts, computed off the model thread with the server's own copy of the
    tokenizer (a tokenizer object is not safe to share between threads) and remembered by text digest."""

    def __init__(self, pipe):
        self.pipe = pipe
        self.templater = copy.copy(pipe.templater)
        self.templater.tok = copy.deepcopy(pipe.tokenizer)
        self.lock = threading.Lock()
        self.memo: dict[str, tuple[str, int]] = {}

    def of(self, text: str) -> tuple[str, int]:
        """``(key, tokens)`` of the context ``text`` would encode to."""
        digest = hashlib.sha256(text.encode()).hexdigest()
        with self.lock:
            if digest not in self.memo:
                ids = self.templater.context(text)
                self.memo[digest] = (self.pipe.context_key(as_tensor(ids, "cpu")), len(ids))
            return self.memo[digest]

    def tokens(self, text: str) -> int:
        with self.lock:
            return len(self.templater.encode(text))


def create_app(worker: Worker, settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    pipe = worker.pipe
    model_id = settings.model_id or pipe.model_name
    keys = Keys(pipe)
    served_names = (model_id, pipe.model_name, pipe.source, "reform")   # what a request's "model" may say
    history_limit = pipe.engine.shape.window // 8     # tokens of later turns that may ride with a question
    pending: dict[str, object] = {}                    # key -> background encode job
    worker_name = f"{socket.gethostname()}/{os.getpid()}"
    app = FastAPI(title="reform", version="1", docs_url=None, redoc_url=None)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, e: ApiError):
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(StarletteHTTPException)
    async def routing_error(request: Request, e: StarletteHTTPException):
        """Routing's own 404 and 405 in the same shape as every other error (OpenAI clients read
        ``error.message``); 405 keeps its ``Allow`` header."""
        where = f"{request.method} {request.url.path}"
        message = {404: f"no such endpoint: {where}", 405: f"method not allowed: {where}"}.get(e.status_code, str(e.detail))
        error = ApiError(e.status_code, message, code={404: "not_found", 405: "method_not_allowed"}.get(e.status_code))
        return JSONResponse(error.body(), status_code=e.status_code, headers=getattr(e, "headers", None))

    @app.middleware("http")
    async def guard(request: Request, call_next):
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
        response = await call_next(request)
        response.headers["X-Reform-Worker"] = worker_name
        return response

    # ------------------------------------------------------------------ helpers
    async def body_bytes(request: Request) -> bytes:
        data = b""
        async for piece in request.stream():
            data += piece
            if len(data) > settings.max_body_bytes:
                raise ApiError(413, f"request body is over the limit of {settings.max_body_bytes} bytes",
                               code="request_too_large")
        return data

    async def key_of(text: str) -> tuple[str, int]:
        key, n = await run_in_threadpool(keys.of, text)
        if n > settings.max_context_tokens:
            raise ApiError(413, f"the context has {n} tokens, over this server's limit of "
                                f"{settings.max_context_tokens}", code="context_too_large")
        return key, n

    def not_served(name: str) -> ApiError:
        return ApiError(404, f"model '{name}' is not served here; this server serves '{model_id}'", param="model",
                        code="model_not_found")

    def known(key: str) -> bool:
        return key in worker.loaded or worker.store.has(key) or key in pending

    def encoding_elsewhere(key: str) -> bool:
        """Another process sharing the store (a replica) has ``key`` queued or encoding."""
        s = worker.elsewhere(key)
        return s is not None and s.status in ("queued", "encoding")

    async def stored_elsewhere(key: str) -> bool:
        """Wait while another replica encodes ``key``; True once it is stored."""
        deadline = time.monotonic() + settings.request_timeout
        while encoding_elsewhere(key):
            if time.monotonic() > deadline:
                raise ApiError(504, f"context {key} is still being encoded by another replica", code="timeout")
            await asyncio.sleep(0.5)
            if worker.store.has(key):
                return True
        return worker.store.has(key)

    def submit(fn, *, stream: bool = False, key: str | None = None):
        try:
            return worker.submit(fn, stream=stream, key=key)
        except QueueFull:
            raise ApiError(503, "the server is busy: too many requests are waiting; retry later",
                           type="server_error", code="queue_full",
                           headers={"Retry-After": str(max(1, worker.queued()))}) from None

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

    async def still_wanted(job, request: Request, deadline: float) -> None:
        """Cancel the job (and stop waiting) once its client has left or its time is up."""
        if await request.is_disconnected():
            job.cancel.set()
            raise Cancelled()
        if asyncio.get_running_loop().time() > deadline:
            job.cancel.set()
            raise ApiError(504, f"the request took longer than {settings.request_timeout:.0f} s",
                           type="server_error", code="timeout")

    def outcome(job):
        if (e := job.future.exception()) is not None:
            raise failure(e)
        return job.future.result()

    async def wait(job, request: Request, deadline: float):
        """The job's result; cancels it if the client leaves or the deadline passes."""
        while not (await asyncio.wait({job.future}, timeout=0.25))[0]:
            await still_wanted(job, request, deadline)
        return outcome(job)

    async def next_event(job, request: Request, deadline: float):
        """``("text", piece)`` or ``("done", result)`` from a streaming job; errors raise."""
        while True:
            if not job.events.empty():
                return job.events.get_nowait()
            if job.future.done():
                return "done", outcome(job)
            getter = asyncio.ensure_future(job.events.get())
            done, _ = await asyncio.wait({getter, job.future}, timeout=0.25, return_when=asyncio.FIRST_COMPLETED)
            if getter in done:
                return getter.result()
            getter.cancel()
            await still_wanted(job, request, deadline)

    # ------------------------------------------------------------------ chat
    async def plan(conv: Conversation, context_id: str | None) -> tuple[str, str | None, str]:
        """``(context key, context text (None for an uploaded context_id), question)``: the longest stored prefix of the earlier
        messages whose later turns fit beside the question, else all earlier messages (encoded once)."""
        earlier = conv.earlier
        if context_id is not None:
            if not worker.store.valid_key(context_id) or not (known(context_id) or await stored_elsewhere(context_id)):
                raise ApiError(404, f"context {context_id} not found", param="context_id", code="context_not_found")
            return context_id, None, await fit_history(earlier, conv.question)
        if not earlier:
            raise ApiError(400, "no context: send the document as an earlier message (e.g. a system or user "
                                "message before the question) or name an uploaded one with context_id",
                           param="messages")
        for j in range(len(earlier), 0, -1):
            later = earlier[j:]
            if later and await run_in_threadpool(keys.tokens, context_text(later)) > history_limit:
                break
            text = context_text(earlier[:j])
            key, _ = await key_of(text)
            if known(key):    # the text still goes along: a damaged or evicted file is encoded again
                return key, text, history_question(later, conv.question)
        text = context_text(earlier)
        key, _ = await key_of(text)
        return key, text, conv.question

    async def fit_history(turns, question: str) -> str:
        if turns and await run_in_threadpool(keys.tokens, context_text(turns)) > history_limit:
            raise ApiError(400, f"the messages besides an uploaded context_id are over {history_limit} tokens; "
                                "upload them as part of the context", param="messages")
        return history_question(turns, question)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        deadline = asyncio.get_running_loop().time() + settings.request_timeout
        try:
            req = ChatRequest.model_validate_json(await body_bytes(request))
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ()))
            at = f"{where}: " if where else ""           # a body that is no JSON object has no field to name
            raise ApiError(400, f"invalid request: {at}{first.get('msg')}", param=where or None) from None
        req.refuse_unsupported()
        if req.model not in served_names:
            raise not_served(req.model)
        try:
            Sampling(**req.sampling())
        except ValueError as e:
            raise ApiError(400, str(e)) from None
        key, text, question = await plan(Conversation.of(req.messages), req.context_id)
        asked = req.max_new_tokens()     # unset: up to the default, fewer where the window has less room

        def work(job):
            ctx, encoded = worker.context(key, text, job)
            answer = ctx.ask(question, max_new_tokens=asked or settings.default_max_tokens, fit_window=asked is None,
                             on_text=lambda s: job.emit(("text", s)), **req.sampling())
            return answer, encoded

        job = submit(work, stream=req.stream, key=key)    # with key: may answer during another's encode
        cid, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())

        def usage(answer) -> dict:
            return {"prompt_tokens": answer.input_tokens, "completion_tokens": len(answer.tokens),
                    "total_tokens": answer.input_tokens + len(answer.tokens)}

        def extension(answer, encoded) -> dict:
            return {"context_id": key, "encoded": encoded, "stats": answer.stats}

        if not req.stream:
            try:
                answer, encoded = await wait(job, request, deadline)
            except Cancelled:
                return JSONResponse({}, status_code=499)
            return {"id": cid, "object": "chat.completion", "created": created, "model": model_id,
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": answer.text},
                                 "finish_reason": answer.finish_reason, "logprobs": None}],
                    "usage": usage(answer), "reform": extension(answer, encoded)}

        def chunk(delta: dict, finish: str | None = None, **more) -> str:
            body = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model_id,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}], **more}
            return f"data: {json.dumps(body)}\n\n"

        try:    # errors before the first token (unknown context, question too long) get a real status
            first = await next_event(job, request, deadline)
        except Cancelled:
            return JSONResponse({}, status_code=499)

        async def events():
            event = first
            try:
                yield chunk({"role": "assistant", "content": ""})
                while True:
                    kind, value = event
                    if kind == "done":
                        answer, encoded = value
                        yield chunk({}, answer.finish_reason, usage=usage(answer), reform=extension(answer, encoded))
                        if req.stream_options is not None and req.stream_options.include_usage:
                            body = {"id": cid, "object": "chat.completion.chunk", "created": created,
                                    "model": model_id, "choices": [], "usage": usage(answer)}
                            yield f"data: {json.dumps(body)}\n\n"
                        break
                    yield chunk({"content": value})
                    event = await next_event(job, request, deadline)
            except ApiError as e:
                yield f"data: {json.dumps(e.body())}\n\n"
            except Cancelled:
                return
            finally:
                job.cancel.set()        # a client that left frees the worker at the next token
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    # ------------------------------------------------------------------ contexts
    async def upload_text(request: Request) -> str:
        kind = request.headers.get("content-type", "")
        if kind.startswith(("multipart/form-data", "application/x-www-form-urlencoded")):
            form = await request.form(max_part_size=settings.max_body_bytes)
            items = form.getlist("file") + form.getlist("text")
            if len(items) != 1:       # several documents in one upload: which one was meant is unknowable
                raise ApiError(400, "send the context as one 'file' or 'text' form field" +
                               (f" (got {len(items)}); upload each document on its own" if items else ""),
                               param="file")
            item = items[0]
            data = await item.read() if hasattr(item, "read") else item.encode()
        else:
            raw = await body_bytes(request)
            if kind.startswith("application/json"):
                try:
                    payload = json.loads(raw)
                except ValueError:
                    raise ApiError(400, "the body is not valid JSON") from None
                if not isinstance(payload, dict) or not isinstance(payload.get("text"), str):
                    raise ApiError(400, "send {\"text\": \"...\"} (or a multipart 'file')", param="text")
                if unknown := sorted(set(payload) - {"text"}):       # as the chat endpoint: nothing ignored
                    raise ApiError(400, f"unknown field {unknown[0]!r}: send {{\"text\": \"...\"}}", param=unknown[0])
                data = payload["text"].encode()
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

    def status_of(key: str) -> ContextStatus:
        s = worker.describe(key)
        if s is None:
            raise ApiError(404, f"context {key} not found", code="context_not_found")
        return s

    @app.post("/v1/contexts")
    async def create_context(request: Request):
        text = await upload_text(request)
        key, n = await key_of(text)
        if known(key) or encoding_elsewhere(key):         # (another replica's encode is not repeated)
            s = status_of(key)
            return JSONResponse(s.to_json(), status_code=200 if s.status == "ready" else 202)
        worker.status[key] = ContextStatus(key, "queued", n, method=pipe.method.name)
        try:
            job = submit(lambda job: worker.context(key, text, job))
        except ApiError:
            worker.status.pop(key, None)
            raise
        pending[key] = job
        worker.publish(key)
        job.future.add_done_callback(lambda f: (pending.pop(key, None), f.exception()))
        return JSONResponse(status_of(key).to_json(), status_code=202)

    @app.get("/v1/contexts")
    async def list_contexts():
        return {"object": "list", "data": [s.to_json() for s in worker.all_contexts()]}

    @app.get("/v1/contexts/{key}")
    async def get_context(key: str):
        return status_of(key).to_json()

    @app.delete("/v1/contexts/{key}")
    async def delete_context(key: str):
        if (job := pending.pop(key, None)) is not None:
            job.cancel.set()
        if not worker.store.valid_key(key) or not worker.forget(key):
            raise ApiError(404, f"context {key} not found", code="context_not_found")
        return {"id": key, "object": "context.deleted", "deleted": True}

    # ------------------------------------------------------------------ models, health
    model_card = {"id": model_id, "object": "model", "created": 0, "owned_by": "reform", "method": pipe.method.name,
                  "window": pipe.engine.shape.window}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_card]}

    @app.get("/v1/models/{name:path}")           # model ids may hold slashes (Qwen/Qwen2.5-7B-Instruct)
    async def retrieve_model(name: str):
        if name not in served_names:
            raise not_served(name)
        return model_card

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": model_id, "method": pipe.method.name, "queued": worker.queued(),
                "busy": worker.busy_since is not None, "contexts_encoded": worker.encoded,
                "stored_contexts": len(worker.store.entries())}

    app.state.worker, app.state.settings = worker, settings
    return app
