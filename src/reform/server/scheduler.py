"""The model thread's one loop: take the next unit of work, run it, decode the batch, wait when idle
(vLLM's ``EngineCore.step``: schedule, execute, update; llama.cpp's ``server_queue::start_loop``).

A job is a question (it prefills its prompt, then its answer joins the decoding batch: continuous
batching, docs/architecture.md, "Answering many at once") or an encode (an upload's context, chunk by
chunk). Each job runs in a greenlet of its own on the model thread, so an encode gives its turn back
between two chunks (``pause``) and goes on where it stopped when its turn comes again. Greenlets, not
threads: every kernel still runs on the one thread whose OpenMP team owns the cores (a second thread's
team slowed each decoding step twofold on a 2-core CPU, see ``worker``).

A unit is one job's work up to its next pause: a question's whole prefill, an encode's next chunk. After
an encode's chunk the batch decodes for about as long as the chunk took, so answers and encodes share
the model evenly; otherwise the batch decodes a step whenever no job is ready.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from greenlet import greenlet

from ..methods.answering import Answering, Together
from .tenants import DEFAULT

LOG = logging.getLogger("reform.server")
ABANDONED_GRACE_S = 60  # an encode no chat waits for any more goes on this long for a client's retry

# why a paused job waits: for its next turn, for the encoder to be free, for room in the batch
TURN, ENCODER, ROOM = "turn", "encoder", "room"


class Cancelled(Exception):
    """The client went away or the request timed out: the job stops at its next token or chunk."""


class QueueFull(Exception):
    """More requests are waiting than the queue holds."""


@dataclass(eq=False)        # a job is itself: found in and removed from the queue by identity
class Job:
    """Work for the model thread. ``fn(job)`` runs there, in its own greenlet; its result or exception
    resolves ``future`` on the event loop; ``emit`` sends streamed pieces to ``events``."""

    fn: Callable[["Job"], Any]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    events: asyncio.Queue | None = None
    cancel: threading.Event = field(default_factory=threading.Event)
    kind: str = "question"        # "question" (joins the batch) | "encode" (an upload's context)
    key: str | None = None        # the context a question reads, or an encode writes
    tenant: str = DEFAULT         # whose job: the queue holds ``queue_size`` of each tenant's, served in turn
    # an encode queued for chats (not an upload): it runs while a chat waits for it, and for
    # ``ABANDONED_GRACE_S`` after the last one left (a client retrying finds it in progress), then stops
    for_chats: bool = False
    waiting: int = 0
    left_at: float | None = None
    runner: greenlet | None = None    # started: where it goes on
    until: str = TURN                 # paused: what it waits for
    seconds: float = 0.0              # its units' running time

    def check(self) -> None:
        if self.cancel.is_set():
            raise Cancelled()
        if self.for_chats and self.waiting <= 0 and self.left_at is not None \
                and time.monotonic() - self.left_at > ABANDONED_GRACE_S:
            raise Cancelled()

    def emit(self, item) -> None:
        self.check()
        if self.events is not None:
            try:
                self.loop.call_soon_threadsafe(self.events.put_nowait, item)
            except RuntimeError:        # the event loop is gone (server shutting down): nobody listens
                raise Cancelled() from None

    def resolve(self, ok: bool, value) -> None:
        def settle():
            if not self.future.done():
                (self.future.set_result if ok else self.future.set_exception)(value)
        try:
            self.loop.call_soon_threadsafe(settle)
        except RuntimeError:            # the event loop is gone: nobody waits for this result
            pass

    def fail(self, e: BaseException) -> None:
        if not expected(e):          # a fault, not a refusal: the operator gets its traceback, once
            LOG.error("%s job failed (context %s)", self.kind, (self.key or "-").rpartition("/")[2], exc_info=e)
        # without its traceback: its frames hold the generation's tensors (tens of MB) in a reference
        # cycle through this frame, which only a full garbage collection would free
        e.__traceback__ = None
        self.resolve(False, e)


def expected(e: BaseException) -> bool:
    """A job's end that is no fault of the server: the client left, or the request was refused (our one-line
    ``ValueError``/``TypeError``, a missing context's ``KeyError``, an HTTP error below 500)."""
    return isinstance(e, (Cancelled, KeyError, ValueError, TypeError)) or getattr(e, "status", 500) < 500


@dataclass
class Underway:
    """What a question's ``fn`` returns: its answer, prefilled, and what the job resolves to once the
    answer ends (``result(answer)``)."""

    answering: Answering
    result: Callable[[Any], Any]


class Scheduler:
    """Jobs in tenant-fair queues, the decoding batch, and the loop that runs them (``run``)."""

    def __init__(self, together: Together, queue_size: int, at_hand: Callable[[str], bool]):
        """``at_hand(key)``: whether a question on ``key`` can start without an encode."""
        self.together, self.queue_size, self.at_hand = together, queue_size, at_hand
        self.pending: deque[Job | None] = deque()                # None: stop once the jobs before it ran
        self.paused: list[Job] = []                              # started jobs between two units
        self.arrived = threading.Condition()                     # guards ``pending`` and ``paused``
        self.turns: dict[str, int] = {}                          # tenant -> when it last had a unit run
        self.turns_taken = 0
        self.encoder: Job | None = None                          # the job encoding now, between its chunks
        self.decoding: dict[int, tuple[Job, Underway]] = {}       # id(answering) -> its job
        self.steps = 0                                            # decoding steps run (for /metrics)
        self.step_seconds = 0.0                                   # and the time they took
        self.answers_decoded = 0
        self.job_seconds = 5.0                                   # a job's running time, moving average
        self.busy_since: float | None = None
        self.owed = 0.0                                          # decoding time owed for encode chunks run

    # ------------------------------------------------------------------ the loop
    def run(self) -> None:
        """Until a stop is queued and every job before it ended: schedule, execute one unit, decode."""
        while True:
            with self.arrived:
                while not self.pending and not self.paused and not self.together:
                    self.arrived.wait()
                if self.pending and self.pending[0] is None and not self.paused and not self.together:
                    return                              # stop: every job before it ran, every answer ended
                pending, paused = list(self.pending), list(self.paused)
            job = self.schedule(pending, paused)       # outside the lock: readiness may ask the store
            if job is None and not self.together:       # whatever waits, waits on a job not queued yet
                with self.arrived:
                    self.arrived.wait(0.05)
                continue
            if job is None or job is self.encoder:
                self.decode(self.owed)      # the batch's turn: a step, or as long as the encode's last chunk
                self.owed = 0.0
            if job is not None:
                self.owed += self.execute(job)

    def schedule(self, pending: list[Job | None], paused: list[Job]) -> Job | None:
        """The next job to run a unit of, taken off its queue, or None: decode a step instead. ``pending``
        and ``paused``: the queues as they were (only this thread takes jobs off them).

        Invariant: at most one job encodes at a time; a question starts only while the batch has room;
        each tenant's jobs start in arrival order among those ready; of the ready ones, the tenant whose
        unit ran longest ago goes first, a new job before a paused one of the same tenant."""
        candidates: dict[str, Job] = {}
        for job in pending:
            if job is None:
                break                                   # stop: nothing after it starts
            if job.tenant not in candidates and self.ready_to_start(job):
                candidates[job.tenant] = job
        ready = list(candidates.values()) + [j for j in paused if self.ready_to_go_on(j)]
        if not ready:
            return None
        job = min(ready, key=lambda j: (self.turns.get(j.tenant, -1), j.runner is not None))
        with self.arrived:
            (self.paused if job.runner is not None else self.pending).remove(job)
        self.turns_taken += 1
        self.turns[job.tenant] = self.turns_taken
        return job

    def ready_to_start(self, job: Job) -> bool:
        if job.cancel.is_set():
            return True                                 # it ends at once
        if job.kind == "encode":
            return self.encoder is None
        if self.together.room() == 0:
            return False
        return job.key is None or self.encoder is None or self.key_at_hand(job.key)

    def ready_to_go_on(self, job: Job) -> bool:
        if job.cancel.is_set() or job.until == TURN:
            return True
        return self.encoder is None if job.until == ENCODER else self.together.room() > 0

    def key_at_hand(self, key: str) -> bool:
        try:
            return key != (self.encoder.key if self.encoder else None) and self.at_hand(key)
        except Exception:       # a store that fails to answer must not stop the loop: ask again later
            return False

    def execute(self, job: Job) -> float:
        """Run ``job`` up to its next pause or its end; the unit's seconds when it paused between an
        encode's chunks (the batch then decodes as long), else 0."""
        began = self.busy_since = time.monotonic()
        if job.runner is None:
            job.runner = greenlet(self.body)
            paused = job.runner.switch(job)
        else:
            paused = job.runner.switch()
        took = time.monotonic() - began
        self.busy_since, job.seconds = None, job.seconds + took
        if job.runner.dead:
            job.runner = None
            self.job_seconds += 0.2 * (job.seconds - self.job_seconds)
            return 0.0
        with self.arrived:
            self.paused.append(job)
        return took if paused == TURN else 0.0

    def body(self, job: Job) -> None:
        """A job's greenlet: its work, then its answer into the batch (or its result to its future)."""
        try:
            job.check()
            result = job.fn(job)
            if isinstance(result, Underway):
                self.join(job, result)
            else:
                job.resolve(True, result)
        except BaseException as e:      # every failure goes back to its request; the thread lives on
            job.fail(e)

    def join(self, job: Job, underway: Underway) -> None:
        """A prefilled answer: it runs alone now when it cannot decode in a batch, ends at its first token,
        or joins the batch (its job resolves when it ends)."""
        answering = underway.answering
        while self.together.room() == 0 and not answering.alone:   # only after an encode of its own
            if not self.pause(job, ROOM):
                raise RuntimeError("the decoding batch is full")
        if (answer := self.together.admit(answering)) is not None:
            job.resolve(True, underway.result(answer))
        else:
            self.decoding[id(answering)] = (job, underway)

    def pause(self, job: Job, until: str = TURN) -> bool:
        """From inside ``job``: give the loop its turn back; returns True when the loop resumes ``job``
        (``until`` holds: its next turn, a free encoder, room in the batch). Outside a job's greenlet (no
        loop to go back to): False at once."""
        if job.runner is None or greenlet.getcurrent() is not job.runner:
            return False
        job.until = until
        job.runner.parent.switch(until)
        job.check()
        return True

    def decode(self, seconds: float) -> None:
        """Decoding steps for about ``seconds`` (at least one) of every answer in the batch."""
        until = time.monotonic() + seconds
        self.step()
        while self.together and time.monotonic() < until:
            self.step()

    def step(self) -> None:
        """One decoding step of every answer in the batch; those whose client left are dropped first."""
        for answering in list(self.together.members):
            job, _ = self.decoding[id(answering)]
            try:
                job.check()
            except Cancelled as e:
                self.leave(answering, e)
        if not self.together:
            return
        self.steps += 1
        began = time.perf_counter()
        try:
            ended = self.together.step()
        except BaseException as e:      # the step itself failed: each answer in it fails, the thread lives on
            for answering in list(self.together.members):
                self.leave(answering, e)
            return
        finally:
            self.step_seconds += time.perf_counter() - began
        for answering in ended:
            job, underway = self.decoding.pop(id(answering))
            if answering.error is not None:
                job.fail(answering.error)
                continue
            self.answers_decoded += 1
            try:
                job.resolve(True, underway.result(answering.answer()))
            except BaseException as e:
                job.fail(e)

    def leave(self, answering: Answering, e: BaseException) -> None:
        self.together.drop(answering)
        job, _ = self.decoding.pop(id(answering))
        job.fail(e)

    # ------------------------------------------------------------------ the queue (event-loop side)
    def submit(self, fn: Callable[[Job], Any], *, stream: bool = False, kind: str = "question",
               key: str | None = None, tenant: str = DEFAULT) -> Job:
        """Queue ``fn`` for ``tenant``: a question on context ``key`` (None: none, or one it encodes from its
        own parts), or an encode of ``key``."""
        loop = asyncio.get_running_loop()
        job = Job(fn, loop, loop.create_future(), asyncio.Queue() if stream else None, kind=kind, key=key,
                  tenant=tenant)
        # a job whose client left resolves with nobody awaiting it: mark its exception seen (no asyncio
        # "Future exception was never retrieved" traceback per disconnect)
        job.future.add_done_callback(lambda f: f.cancelled() or f.exception())
        self.put(job)
        return job

    def put(self, job: Job | None) -> None:
        """Queue ``job`` (None: stop once the jobs before it ran); ``QueueFull`` when its tenant already has
        ``queue_size`` jobs waiting."""
        with self.arrived:
            if job is not None and self.queued(job.tenant) >= self.queue_size:
                raise QueueFull()
            self.pending.append(job)
            self.arrived.notify()

    def queued(self, tenant: str | None = None) -> int:
        """Jobs waiting to start (``tenant``'s only, if given)."""
        waiting = list(self.pending)      # one step under the GIL: callers off the lock may see it grow
        if tenant is None:
            return sum(j is not None for j in waiting)
        return sum(j is not None and j.tenant == tenant for j in waiting)

    def busy(self) -> bool:
        """The model thread runs a unit, has a job under way, or decodes answers."""
        return self.busy_since is not None or bool(self.paused) or bool(self.together)

    def expected_wait(self) -> float:
        """Seconds until a job queued now would start: the queue times the average job, plus what the
        unit running now has left of it."""
        running = 0.0 if self.busy_since is None else max(0.0, self.job_seconds - (time.monotonic() - self.busy_since))
        return self.queued() * self.job_seconds + running
