"""Admission control for ``reform serve``: who gets in, in what order, and for how long.

- ``Guard`` (ASGI): the tenant a key belongs to (``request.state.tenant``) and its requests-in-flight quota,
  the body limit by ``Content-Length``, request ids, metrics, the access log;
- ``BodyLimit`` (ASGI): the body limit as the bytes arrive, whatever the framing;
- ``Line``: requests that found their tenant's share of the worker's queue full wait here, first come, first
  served (each tenant has its own line);
- ``Waiting``: one request waiting on its job, cancelling it once its client leaves or its time is up;
- ``failure``/``outcome``: a job's exception as the HTTP error it deserves.

The handlers in ``app`` use these and nothing here knows a handler (docs/architecture.md, serving).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
import uuid
from collections import deque
from typing import TYPE_CHECKING

from fastapi import Request
from fastapi.responses import JSONResponse

from ..store import ContextFileError
from .openai_schema import ApiError
from .scheduler import Cancelled, QueueFull

if TYPE_CHECKING:
    from .service import Service


def failure(e: BaseException) -> ApiError:
    """A job's exception as the HTTP error it deserves."""
    if isinstance(e, ApiError):
        return e
    if isinstance(e, KeyError):
        return ApiError(404, f"context {str(e.args[0]).rpartition('/')[2]} not found (deleted, or removed by the "
                             "store's size budget)",
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



# ---------------------------------------------------------------------- bodies
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
        counted = tenant is not None and not self.over_quota(tenant)
        if counted:
            service.in_flight[tenant.name] += 1
            service.metrics.tenant_in_flight.labels(tenant.name).inc()
        try:
            refusal = self.refusal(request, tenant, counted)
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

    def refusal(self, request: Request, tenant, counted: bool) -> JSONResponse | None:
        settings, service = self.service.settings, self.service
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
