"""``reform serve``: an OpenAI-compatible HTTP API over one ``Pipeline`` (FastAPI; run by uvicorn).

- ``POST /v1/chat/completions`` — the OpenAI schema, streamed as server-sent ``chat.completion.chunk``
  events ending with ``[DONE]``; earlier messages are the context (encoded once, kept in the store by
  content), the last user message the question; ``context_id`` names an uploaded context.
- ``POST /v1/contexts`` (JSON ``{"text": ...}``, one multipart ``file`` or form field ``text``, or a text
  body) answers an id at once and encodes in the background; ``GET /v1/contexts[/{id}]`` shows status and
  progress; ``DELETE`` removes.
- ``GET /v1/models[/{id}]``, ``GET /health``, ``GET /metrics`` (Prometheus), and ``GET /`` the web page.

Several tenants may share one server (``--keys``, ``tenants``): each request acts for the tenant whose
key it carries, and sees only that tenant's contexts and files; another tenant's are 404, as ones that do
not exist.

Every response names the process that answered in an ``X-Reform-Worker: HOST/PID`` header (behind a load
balancer or Ray Serve, which replica it was).

Every error is one JSON object in OpenAI's error shape with a fitting status: 400 bad request, 401
without the API key, 404 unknown model, context or endpoint, 405 wrong method, 413 too large or past a
store quota, 429 (with ``Retry-After``) past a tenant's requests in flight or daily tokens, 503 (with
``Retry-After``) when the queue and the line of requests waiting for it are full, 504 past the per-request
timeout. A chat whose only message is the question is answered by the model without a context. Talks to the model only through
``Worker``.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path

from fastapi import APIRouter, FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from .admission import Waiting, still_wanted
from .edge import BodyLimit, Guard, Internal, asked, body_bytes, error_response, service_of, tenant_of
from ..documents import DocumentError, Extracted, decode_text
from .openai_schema import MEDIA_SUFFIX, ApiError, ChatRequest, Conversation
from .libraries import LibraryQuestion
from .service import ChatJob, Keys, Service, Settings
from .tenants import public_id
from .scheduler import Cancelled
from .worker import Worker
from .responses import router as responses_router
from .vector_stores import router as vector_stores_router

__all__ = ["Keys", "Service", "Settings", "create_app"]


# ---------------------------------------------------------------------- request bodies
async def upload_document(request: Request, service: Service) -> Extracted:
    """The one document of a ``POST /v1/contexts`` body: a multipart ``file`` of any supported type (PDF,
    DOCX, HTML, EPUB, Markdown, text, code), a form field ``text``, JSON ``{"text": ...}``, or the body itself
    (its ``Content-Type`` says what it is: ``application/pdf``, ``text/plain`` ...)."""
    limit = service.settings.max_body_bytes
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind in ("multipart/form-data", "application/x-www-form-urlencoded"):
        form = await request.form(max_part_size=limit)
        items = form.getlist("file") + form.getlist("text")
        if len(items) != 1:       # several documents in one upload: which one was meant is unknowable
            raise ApiError(400, "send the context as one 'file' or 'text' form field" +
                           (f" (got {len(items)}); upload each document on its own" if items else ""),
                           param="file")
        item = items[0]
        if not hasattr(item, "read"):
            return plain_text(item)
        doc = await service.extract(await item.read(), item.filename or "the upload")
        if doc.kind == "text" and [(m.page, m.section) for m in doc.marks] == [(None, None)]:
            return Extracted.plain(doc.text)     # a plain .txt file: the same id as its text sent as JSON
        return doc
    raw = await body_bytes(request, limit)
    if kind == "application/json":
        try:
            payload = json.loads(raw)
        except (ValueError, RecursionError):        # RecursionError: nested past Python's limit
            raise ApiError(400, "the body is not valid JSON") from None
        if not isinstance(payload, dict) or not isinstance(payload.get("text"), str):
            raise ApiError(400, "send {\"text\": \"...\"} (or a multipart 'file')", param="text")
        if unknown := sorted(set(payload) - {"text"}):       # as the chat endpoint: nothing ignored
            raise ApiError(400, f"unknown field {unknown[0]!r}: send {{\"text\": \"...\"}}", param=unknown[0])
        return plain_text(payload["text"])
    if kind in ("", "text/plain"):      # plain text: the same text gives the same id however it is sent
        try:
            return plain_text(decode_text(raw, "the context"))
        except DocumentError as e:
            raise ApiError(400, str(e), param="file") from None
    return await service.extract(raw, "the upload" + MEDIA_SUFFIX.get(kind, ""))


def plain_text(text: str) -> Extracted:
    try:
        text.encode()
    except UnicodeEncodeError as e:              # JSON may escape a lone surrogate (\ud800)
        raise ApiError(400, f"the text is not valid Unicode (a lone surrogate at character {e.start})",
                       param="text") from None
    if not text.strip():
        raise ApiError(400, "the context is empty", param="text")
    return Extracted.plain(text)


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
        return {"context_id": self.key, "encoded": encoded, "stats": answer.stats,
                "evidence": [p.to_json() for p in answer.evidence],
                **({"evidence_note": answer.evidence_note} if answer.evidence_note else {})}

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
                    # usage once, in a last chunk with no choices, and only when asked: as OpenAI sends it
                    # (clients that sum usage over chunks, langchain-openai's, would count it twice)
                    yield self.chunk({}, answer.finish_reason, reform=self.extension(answer, encoded))
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


router = APIRouter()


@router.post("/v1/chat/completions")
async def chat(request: Request):
    service, tenant, req, deadline = await asked(request, ChatRequest)
    settings = service.settings
    conv = Conversation.of(req.messages)
    shelf = None
    if req.file_ids is not None and req.vector_store_ids is None:
        raise ApiError(400, "file_ids chooses files of vector stores: send vector_store_ids too", param="file_ids")
    if req.vector_store_ids is not None:      # questions over vector stores: their files are the context
        if conv.parts is not None or conv.files or req.context_id is not None:
            raise ApiError(400, "vector_store_ids cannot be sent with files, images or a context_id",
                           param="vector_store_ids")
        shelf = await run_in_threadpool(service.vector_stores.shelf, tenant, req.vector_store_ids, req.file_ids)
        key, text, question = None, None, await service.fit_history(conv.earlier, conv.question)
    elif conv.parts is not None:      # images: the conversation is encoded as it is, in the job (not stored)
        await service.check_images(conv.parts, req.context_id)
        key, text, question = None, None, conv.question
    elif conv.files:                # documents: they and the earlier messages are the context, stored by content
        if req.context_id is not None:
            raise ApiError(400, "files cannot be sent with a context_id; send the documents in the messages",
                           param="context_id")
        text = await service.document_of(conv, tenant)
        key, question = (await service.key_of(text, tenant))[0], conv.question
    else:
        key, text, question = await service.plan(conv, req.context_id, tenant)
    tokens = 0 if text is None else (await service.key_of(text, tenant))[1]
    charged = text is not None and service.will_encode(key)     # (a new document: its encode is charged)
    if charged:
        await service.admit_encode(tenant, tokens)
    chat_job = ChatJob(service, req, conv, key, text, question, tokens, tenant) if shelf is None else \
        LibraryQuestion(service, service.vector_stores.asker(tenant), shelf, question, stream=req.stream,
                        max_new_tokens=req.max_new_tokens(), sampling=req.sampling(), tenant=tenant)
    completion = Completion(service.model_id, key and public_id(key), service.metrics.streams)
    try:    # errors before the first token (unknown context, question too long) get a real status
        job = await service.enqueue(chat_job.put, lambda: still_wanted(request, deadline, settings.request_timeout),
                                    tenant)
        if charged:
            await service.settle(tenant, tokens, queued=True)
            charged = False
        waiting = Waiting(job, request, deadline, settings.request_timeout)
        if not req.stream:
            try:
                return completion.whole(*await waiting.result())
            finally:
                chat_job.done_waiting()
        first = await waiting.next_event(within=FIRST_EVENT_S)
    except BaseException as e:
        chat_job.done_waiting()
        if charged:              # refused or gone before the question was queued
            await service.settle(tenant, tokens, queued=chat_job.started_encode)
        if isinstance(e, Cancelled):
            return JSONResponse({}, status_code=499)
        raise
    include_usage = req.stream_options is not None and bool(req.stream_options.include_usage)
    return StreamingResponse(completion.events(first, waiting, include_usage, lambda: service.worker.contexts.progress(key),
                                               chat_job.done_waiting),
                             media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


# ---------------------------------------------------------------------- contexts
@router.post("/v1/contexts")
async def create_context(request: Request):
    service, tenant = service_of(request), tenant_of(request)
    settings = service.settings
    deadline = asyncio.get_running_loop().time() + settings.request_timeout
    text = await upload_document(request, service)
    key, n = await service.key_of(text, tenant)
    if service.worker.contexts.has(key) or service.encoding_elsewhere(key):   # (another replica's encode is not repeated)
        s = service.status_of(key)
        if s.status != "failed":
            return JSONResponse(s.to_json(), status_code=200 if s.status == "ready" else 202)
        service.worker.contexts.forget(key)       # failed, or its file unreadable: replaced by a fresh encode
    await service.admit_encode(tenant, n)
    try:
        await service.enqueue(lambda: service.worker.contexts.upload(key, text, n, tenant=tenant.name),
                              lambda: still_wanted(request, deadline, settings.request_timeout), tenant)
    except BaseException as e:
        await service.settle(tenant, n, queued=False)        # nothing will be encoded
        if isinstance(e, Cancelled):
            return JSONResponse({}, status_code=499)
        raise
    await service.settle(tenant, n, queued=True)
    return JSONResponse(service.status_of(key).to_json(), status_code=202)


@router.get("/v1/contexts")
async def list_contexts(request: Request):
    contexts = await run_in_threadpool(service_of(request).worker.contexts.all_contexts, tenant_of(request).scope)
    return {"object": "list", "data": [s.to_json() for s in contexts]}


@router.get("/v1/contexts/{context_id}")
async def get_context(context_id: str, request: Request):
    return service_of(request).status_of(tenant_of(request).stored_key(context_id)).to_json()


@router.delete("/v1/contexts/{context_id}")
async def delete_context(context_id: str, request: Request):
    worker, key = service_of(request).worker, tenant_of(request).stored_key(context_id)
    if not worker.store.valid_key(key) or not worker.contexts.forget(key):
        raise ApiError(404, f"context {context_id} not found", code="context_not_found")
    return {"id": context_id, "object": "context.deleted", "deleted": True}


# ---------------------------------------------------------------------- files
@router.post("/v1/files")
async def create_file(request: Request):
    """A document uploaded once (multipart ``file`` and ``purpose``, as ``client.files.create`` sends it),
    checked to be one reform reads, then named in chats by its ``file_id``."""
    service, tenant_files = service_of(request), files_of(request)
    form = await request.form(max_part_size=service.settings.max_body_bytes)
    files, purpose = form.getlist("file"), form.get("purpose")
    if len(files) != 1 or not hasattr(files[0], "read"):
        raise ApiError(400, "send one multipart 'file' (and a 'purpose')", param="file")
    if not isinstance(purpose, str) or not purpose:
        raise ApiError(400, "a 'purpose' is required (user_data, assistants, ...)", param="purpose")
    data, filename = await files[0].read(), files[0].filename or "the upload"
    await service.check_store_bytes(tenant_of(request))
    await service.extract(data, filename)               # refused now, not at the first chat that names it
    return await run_in_threadpool(tenant_files.create, data, filename, purpose)


def files_of(request: Request):
    """The files of the request's tenant."""
    return service_of(request).files[tenant_of(request).name]


@router.get("/v1/files")
async def list_files(request: Request):
    return {"object": "list", "data": await run_in_threadpool(files_of(request).all), "has_more": False}


@router.get("/v1/files/{file_id}")
async def get_file(file_id: str, request: Request):
    try:
        return await run_in_threadpool(files_of(request).get, file_id)
    except KeyError:
        raise ApiError(404, f"file {file_id} not found", code="file_not_found") from None


@router.get("/v1/files/{file_id}/content")
async def file_content(file_id: str, request: Request):
    try:
        data, _ = await run_in_threadpool(files_of(request).content, file_id)
    except KeyError:
        raise ApiError(404, f"file {file_id} not found", code="file_not_found") from None
    return Response(data, media_type="application/octet-stream")


@router.delete("/v1/files/{file_id}")
async def delete_file(file_id: str, request: Request):
    if not await run_in_threadpool(files_of(request).delete, file_id):
        raise ApiError(404, f"file {file_id} not found", code="file_not_found")
    return {"id": file_id, "object": "file", "deleted": True}


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
    """Liveness for anyone; the counts (every tenant's together) only for the operator (``Tenants.operator``)."""
    if not request.state.operator:
        return {"status": "ok"}
    service = service_of(request)
    worker = service.worker
    return {"status": "ok", "model": service.model_id, "method": service.pipe.method.name,
            "documents_method": service.pipe.documents_method.name, "queued": worker.queued(),
            "busy": worker.busy(), "contexts_encoded": worker.contexts.encoded,
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


# ---------------------------------------------------------------------- errors
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
    """An exception in the edge itself (``Internal`` answers the app's): the same JSON shape, never a
    plain-text traceback."""
    return error_response(e)


def create_app(worker: Worker, settings: Settings | None = None) -> FastAPI:
    """The FastAPI app serving ``worker``'s pipeline: the handlers above over one ``Service``."""
    app = FastAPI(title="reform", version="1", docs_url=None, redoc_url=None)
    app.state.service = Service(worker, settings or Settings())
    app.state.worker, app.state.settings = worker, app.state.service.settings
    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(StarletteHTTPException, routing_error)
    app.add_exception_handler(Exception, internal_error)
    app.add_middleware(Internal)                 # innermost: the app's unhandled errors, answered and logged
    app.add_middleware(Guard, service=app.state.service)
    app.add_middleware(BodyLimit, limit=app.state.settings.max_body_bytes)
    if app.state.settings.allowed_origins:      # outermost: preflight requests answered before the API key
        app.add_middleware(CORSMiddleware, allow_origins=list(app.state.settings.allowed_origins),
                           allow_methods=["GET", "POST", "DELETE", "OPTIONS"],
                           allow_headers=["Authorization", "Content-Type", "X-Request-Id"],
                           expose_headers=["X-Request-Id", "X-Reform-Worker", "Retry-After"])
    app.include_router(router)
    app.include_router(vector_stores_router)
    app.include_router(responses_router)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app
