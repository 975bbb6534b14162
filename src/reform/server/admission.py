"""Admission control for ``reform serve``: in what order requests reach the worker's queue, and for how
long they wait (who gets in at all is ``edge``'s).

- ``Line``: requests that found their tenant's share of the worker's queue full wait here, first come, first
  served (each tenant has its own line);
- ``Waiting``: one request waiting on its job, cancelling it once its client leaves or its time is up;
- ``failure``/``outcome``: a job's exception as the HTTP error it deserves.

The handlers in ``app`` use these and nothing here knows a handler (docs/architecture.md, serving).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
from collections import deque

from fastapi import Request

from ..store import ContextFileError
from .openai_schema import ApiError
from .scheduler import Cancelled, QueueFull


FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
FULL_WORDS = tuple(os.strerror(n) for n in FULL_ERRNOS)     # "No space left on device", "Disk quota exceeded"


def storage_full(e: BaseException | None) -> bool:
    """``e``, or what it was raised from, says the disk or the quota is full: an ``OSError``'s errno, or the
    OS's words in the message of a library that keeps no errno (safetensors' ``SafetensorError``)."""
    while e is not None:
        if (isinstance(e, OSError) and e.errno in FULL_ERRNOS) or any(w in str(e) for w in FULL_WORDS):
            return True
        e = e.__cause__ or e.__context__
    return False


def failure(e: BaseException) -> ApiError:
    """A job's exception as the HTTP error it deserves."""
    if isinstance(e, ApiError):
        return e
    if storage_full(e):
        return ApiError(507, "the server's storage is full; nothing was saved, try again once space is freed",
                        type="server_error", code="insufficient_storage")
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
