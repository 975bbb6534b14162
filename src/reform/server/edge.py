"""The HTTP edge of ``reform serve``, as ASGI middleware around the app:

- ``Guard``: the tenant a key belongs to (``request.state.tenant``) and its requests-in-flight quota, the
  body limit by ``Content-Length``, request ids, metrics, the access log;
- ``BodyLimit``: the body limit as the bytes arrive, whatever the framing (``body_bytes`` for a handler);
- ``Internal``: an exception no handler answered, as a 500 (or 507) that keeps the connection, logged.
"""

from __future__ import annotations

import json
import logging
import math
import time
import uuid

from fastapi import Request
from fastapi.responses import JSONResponse

from .openai_schema import ApiError
from .service import Service


def service_of(request: Request):
    """The ``Service`` the app serves."""
    return request.app.state.service


def tenant_of(request: Request):
    """The tenant whose key the request carries (``Guard`` found it)."""
    return request.state.tenant


async def json_body(request: Request, model):
    """The request's JSON body as the pydantic ``model``; 400 naming the first bad field."""
    from pydantic import ValidationError
    try:
        return model.model_validate_json(await body_bytes(request, service_of(request).settings.max_body_bytes))
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise ApiError(400, f"invalid request: {f'{where}: ' if where else ''}{first.get('msg')}",
                       param=where or None) from None


async def asked(request: Request, model) -> tuple:
    """``(service, tenant, request body, deadline)`` of a request that asks the model (a chat, a response):
    the body as ``model``, its unsupported fields refused, its model and sampling checked (400s). The deadline
    counts from now: reading the request counts."""
    import asyncio

    from ..engine.sampling import Sampling
    service, tenant = service_of(request), tenant_of(request)
    deadline = asyncio.get_running_loop().time() + service.settings.request_timeout
    req = await json_body(request, model)
    req.refuse_unsupported()
    service.check_model(req.model)
    try:
        Sampling(**req.sampling())
    except ValueError as e:
        raise ApiError(400, str(e)) from None
    return service, tenant, req, deadline


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
OPERATOR_ONLY = ("/metrics", "/openapi.json")   # every tenant's names and counts; the whole API's shape
SERVER_LOG = logging.getLogger("reform.server")


def error_response(e: BaseException) -> JSONResponse:
    """What escaped every handler, as an error in the OpenAI shape: a 507 for a full disk, else a 500 that
    names the exception's type (its message may quote what a client sent or a path, so it goes to the log)."""
    from .admission import failure, storage_full
    error = failure(e) if storage_full(e) else ApiError(500, f"internal error: {type(e).__name__}", type="server_error")
    return JSONResponse(error.body(), status_code=error.status)


class Internal:
    """ASGI middleware, innermost: an exception no handler answered becomes ``error_response`` here, and its
    traceback goes to the log once with the request's path. Answered here, the connection stays usable:
    Starlette's outermost handler re-raises after answering, and uvicorn then drops the keep-alive
    connection, which resets the client's next request on it. A response already started is cut instead."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = [False]

        async def sending(message):
            started[0] = started[0] or message["type"] == "http.response.start"
            await send(message)
        try:
            await self.app(scope, receive, sending)
        except Exception as e:
            SERVER_LOG.error("unhandled error in %s %s", scope.get("method"), scope.get("path"), exc_info=e)
            if started[0]:
                raise
            await error_response(e)(scope, receive, send)


class Guard:
    """ASGI middleware (a plain one, so ``request.is_disconnected()`` still reaches the server): the tenant
    whose key a ``/v1/`` request carries (401 for none; 429 past its requests in flight), the body-size limit
    by ``Content-Length``, a request id (the client's ``X-Request-Id`` or a new one) and the answering
    process in every response, metrics, and the access log (one JSON line per request, written when its
    response ends, streams included; it names the tenant, never the key)."""

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
        tenant = service.tenants.find(request.headers.get("authorization", "")) \
            if request.url.path.startswith("/v1/") else None
        scope.setdefault("state", {})["tenant"] = tenant
        scope["state"]["operator"] = operator = service.tenants.operator(request.headers.get("authorization", ""),
                                                                         service.settings.metrics_key)
        counted = tenant is not None and not self.over_quota(tenant)
        if counted:
            service.in_flight[tenant.name] += 1
            service.metrics.tenant_in_flight.labels(tenant.name).inc()
        try:
            refusal = self.refusal(request, tenant, counted, operator)
            if refusal is not None:
                await refusal(scope, receive, sending)
            else:
                await self.app(scope, receive, sending)
        finally:
            service.metrics.in_flight.dec()
            if counted:
                service.in_flight[tenant.name] -= 1
                service.metrics.tenant_in_flight.labels(tenant.name).dec()
            if tenant is not None:
                service.metrics.tenant_requests.labels(tenant.name, str(status[0])).inc()
            path = getattr(scope.get("route"), "path", "unmatched")
            service.metrics.requests.labels(path, str(status[0])).inc()
            ACCESS_LOG.info(json.dumps({
                "time": round(time.time(), 3), "request_id": request_id, "method": request.method,
                "path": request.url.path, "status": status[0], "seconds": round(time.perf_counter() - started, 4),
                "client": request.client.host if request.client else None, "worker": service.name,
                **({"tenant": tenant.name} if tenant is not None and not service.tenants.open else {})}))

    def over_quota(self, tenant) -> bool:
        most = tenant.quotas.in_flight
        return most is not None and self.service.in_flight[tenant.name] >= most

    def refusal(self, request: Request, tenant, counted: bool, operator: bool) -> JSONResponse | None:
        settings, service = self.service.settings, self.service
        if request.url.path in OPERATOR_ONLY and not operator:
            e = ApiError(401, f"{request.url.path} is for the server's operator: send 'Authorization: Bearer KEY' "
                              "with the --metrics-key or an admin tenant's key", type="authentication_error",
                         code="operator_key_required")
            return JSONResponse(e.body(), status_code=401, headers={"WWW-Authenticate": "Bearer"})
        if request.url.path.startswith("/v1/"):
            if tenant is None:
                e = ApiError(401, "missing or wrong API key: send 'Authorization: Bearer KEY'",
                             type="authentication_error", code="invalid_api_key")
                return JSONResponse(e.body(), status_code=401, headers={"WWW-Authenticate": "Bearer"})
            if not counted:
                wait = max(1, math.ceil(min(60.0, service.worker.job_seconds)))
                e = service.refused(tenant, "in_flight", 429, f"this key has its quota of {tenant.quotas.in_flight} "
                                    f"requests in flight; retry in about {wait} s", headers={"Retry-After": str(wait)})
                return JSONResponse(e.body(), status_code=429, headers=e.headers)
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > settings.max_body_bytes:
            e = ApiError(413, f"request body of {int(length)} bytes is over the limit of {settings.max_body_bytes}",
                         code="request_too_large")
            return JSONResponse(e.body(), status_code=413)
        return None
