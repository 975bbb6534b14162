"""The one thread that owns the model. Requests become jobs in a bounded queue and run in order; the HTTP
side only waits for their results (or their streamed text), so a slow encode never blocks the event loop
and two requests never touch the model at once.

Questions are answered together (continuous batching, docs/architecture.md, "Answering many at once"): a
question's job gathers and prefills its prompt, then its answer joins the decoding batch at the next step
and leaves it the moment it ends, by its stop, its ``max_tokens`` or its client leaving. Each step gives
every answer in the batch its next token, reading the model's weights once for all of them.

Questions do not wait behind an encode either: between two chunks of an encode, the thread starts the
queued questions whose context is already in memory or in the store (jobs submitted with ``key``) and
decodes the batch for about as long as the chunk took, then goes on with the encode. A long upload delays
such a question by about one chunk, not by the whole encode, and answers halve its pace, never stop it.

One thread runs the model, from its load on: the worker takes a function that loads the pipeline and
calls it on its own thread. PyTorch's CPU kernels run on an OpenMP team owned by the thread that calls
them; a second thread with a team of its own (the model loaded on the main thread, say) slowed every
decoding step of both twofold on a 2-core CPU (8 answers: 188 against 85 ms), as each team's waiting
threads then sleep between kernels instead of spinning.

A context is named by its content key (``Pipeline.context_key``); the worker finds it in memory (a few
recently used ones), else in the store (a saved file: no encode), else encodes it once and saves it.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
import uuid
from collections import OrderedDict, deque
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch

from ..methods.answering import Answering, Together
from ..store import ContextFileError, ContextStore
from .tenants import DEFAULT


class Cancelled(Exception):
    """The client went away or the request timed out: the job stops at its next token or chunk."""


class QueueFull(Exception):
    """More requests are waiting than the queue holds."""


class Deferred(Exception):
    """A job taken up between two chunks of an encode needs an encode itself: it goes back to the queue."""


@dataclass
class ContextStatus:
    """What ``GET /v1/contexts/{id}`` shows."""

    id: str
    status: str                       # queued | encoding | ready | failed
    tokens: int
    tokens_encoded: int = 0
    created: int = field(default_factory=lambda: int(time.time()))
    encode_seconds: float | None = None
    bytes: int | None = None
    error: str | None = None
    method: str | None = None

    def to_json(self) -> dict:
        # the id a client knows: the store key without its tenant's folder (``tenants.public_id``)
        return {"object": "context", **asdict(self), "id": self.id.rpartition("/")[2]}


@dataclass(eq=False)        # a job is itself: found in and removed from the queue by identity
class Job:
    """Work for the model thread. ``fn(job)`` runs there; its result or exception resolves ``future`` on
    the event loop; ``emit`` sends streamed pieces to ``events``."""

    fn: Callable[["Job"], Any]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    events: asyncio.Queue | None = None
    cancel: threading.Event = field(default_factory=threading.Event)
    key: str | None = None        # the context a question reads: it may run between an encode's chunks
    no_context: bool = False      # a question asked without a context: it may run between them too
    tenant: str = DEFAULT         # whose job: the queue holds ``queue_size`` of each tenant's, served in turn
    # an encode queued for chats (not an upload): it runs while a chat waits for it, and for
    # ``ABANDONED_GRACE_S`` after the last one left (a client retrying finds it in progress), then stops
    for_chats: bool = False
    waiting: int = 0
    left_at: float | None = None

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

    def _resolve(self, ok: bool, value) -> None:
        def settle():
            if not self.future.done():
                (self.future.set_result if ok else self.future.set_exception)(value)
        try:
            self.loop.call_soon_threadsafe(settle)
        except RuntimeError:            # the event loop is gone: nobody waits for this result
            pass


@dataclass
class Underway:
    """What a job's ``fn`` returns when its answer decodes in the batch: the answer under way (prefilled),
    and what the job resolves to once it ends (``result(answer)``)."""

    answering: Answering
    result: Callable[[Any], Any]


def default_max_batch(pipe, share: float = 0.25, most: int = 32, answer_tokens: int = 512) -> int:
    """How many answers may decode at once: as many answer caches as fit in ``share`` of the memory free
    now, between 1 and ``most``. An answer's cache holds its prompt (the method's recompute or cache budget,
    else the whole window) and ``answer_tokens``."""
    from ..methods.full import available_memory
    engine, shape, config = pipe.engine, pipe.engine.shape, pipe.method.config
    per_token = shape.n_layers * 2 * shape.n_kv_heads * shape.head_dim * engine.dtype.itemsize
    prompt = getattr(config, "recompute_budget", None) or getattr(config, "cache_budget", None) or shape.window
    free = available_memory(engine.device)
    if free is None:
        return 8
    return max(1, min(most, int(free * share) // (per_token * (min(prompt, shape.window) + answer_tokens))))


_DECODING = object()    # what ``_decode`` returns for an answer that joined the batch (its job resolves later)
STALE_NOTE_S = 600      # an encode elsewhere whose note has not changed for this long is taken as dead
ABANDONED_GRACE_S = 60  # an encode no chat waits for any more goes on this long for a client's retry


def process_started(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot, Linux); None where unknown or not running."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def owner_gone(owner: dict, me: dict) -> bool:
    """Whether the process that wrote a status note is known to be gone: on this host, a pid that no longer
    runs, or that now belongs to a process started at another time (this very server restarted after a
    crash, say, with the same pid in its container). A note from another host is judged by its age alone
    (``STALE_NOTE_S``)."""
    if owner.get("host") != me["host"] or not isinstance(owner.get("pid"), int):
        return False
    started = process_started(owner["pid"])
    if started is None:
        try:
            os.kill(owner["pid"], 0)
        except ProcessLookupError:
            return True
        except OSError:           # alive, another user's
            return False
        return False
    return owner.get("started") is not None and owner["started"] != started


class Worker:
    """Owns ``pipe`` (a ``Pipeline``) and ``store`` (a ``ContextStore``); ``submit`` queues a job."""

    def __init__(self, pipe, store: ContextStore, *, queue_size: int = 16, memory_contexts: int = 4,
                 max_batch: int | None = None):
        """``pipe``: a ``Pipeline``, or a function that loads one, called on the model thread (see the
        module docstring; its exceptions are raised here)."""
        self.store = store
        self.queue_size = queue_size
        self.decoding: dict[int, tuple[Job, Underway]] = {}       # id(answering) -> its job
        self.steps = 0                                            # decoding steps run (for /metrics)
        self.step_seconds = 0.0                                   # and the time they took
        self.answers_decoded = 0
        self.pending: deque[Job | None] = deque()                # None: stop once the jobs before it ran
        self.arrived = threading.Condition()                     # guards ``pending``
        self.turns: dict[str, int] = {}                          # tenant -> when it last had a job taken
        self.turns_taken = 0
        self.encoding: str | None = None                         # the key being encoded, between its chunks
        self.memory_contexts = memory_contexts
        self.loaded: OrderedDict[str, Any] = OrderedDict()       # key -> Context, most recent last
        self.status: dict[str, ContextStatus] = {}                # contexts queued, encoding or failed here
        self.uploads: dict[str, Job] = {}                        # key -> the queued encode of an upload
        self.lock = threading.Lock()                             # guards ``status`` and ``loaded``
        self.encoded = 0                                         # contexts this worker encoded (not loaded)
        self.job_seconds = 5.0                                   # a job's running time, moving average
        self.tokens_encoded = 0                                  # over every encode here (for /metrics)
        self.encode_seconds = 0.0
        self.busy_since: float | None = None
        # who writes this process's status notes: a restarted server knows its predecessor's notes as dead
        self.owner = {"host": socket.gethostname(), "pid": os.getpid(), "started": process_started(os.getpid()),
                      "instance": uuid.uuid4().hex}
        loaded, self.pipe = threading.Event(), None
        threads = torch.get_num_threads()       # the model thread's kernels use the caller's thread count

        def own_the_model():
            torch.set_num_threads(threads)
            try:
                self.pipe = pipe() if callable(pipe) else pipe
                self.max_batch = max_batch or default_max_batch(self.pipe)
                self.together = Together(self.pipe.engine, self.max_batch)     # the answers decoding now
            except BaseException as e:
                self.pipe = e
                return
            finally:
                loaded.set()
            self._run()
        self.thread = threading.Thread(target=own_the_model, name="reform-model", daemon=True)
        self.thread.start()
        loaded.wait()
        if isinstance(self.pipe, BaseException):
            failure, self.pipe = self.pipe, None
            raise failure

    # ------------------------------------------------------------------ queue
    def submit(self, fn: Callable[[Job], Any], *, stream: bool = False, key: str | None = None,
               no_context: bool = False, tenant: str = DEFAULT) -> Job:
        """Queue ``fn`` for ``tenant``; ``key``: the context it reads, when it may answer between an encode's
        chunks (as may a question with ``no_context``)."""
        loop = asyncio.get_running_loop()
        job = Job(fn, loop, loop.create_future(), asyncio.Queue() if stream else None, key=key, no_context=no_context,
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
        """Jobs waiting (``tenant``'s only, if given)."""
        if tenant is None:
            return sum(j is not None for j in self.pending)
        return sum(j is not None and j.tenant == tenant for j in self.pending)

    def stop(self) -> None:
        self.put(None)
        self.thread.join(timeout=30)

    def _run(self) -> None:
        while True:
            with self.arrived:
                while not self.pending and not self.together:
                    self.arrived.wait()
                if self.pending and self.pending[0] is None and not self.together:
                    return                              # stop: every job before it ran, every answer ended
                job = self._next_job()
            if job is not None:
                self._execute(job)
            else:
                self._step()

    def _next_job(self) -> Job | None:
        """Take the next job to run (under ``arrived``): the first waiting job of the tenant served longest
        ago, so tenants take turns and one tenant's twenty uploads do not wait ahead of another's question.
        A question waits while the batch is full (None: decode a step instead)."""
        firsts: dict[str, Job] = {}
        for job in self.pending:
            if job is None:
                break                                   # stop: nothing after it runs
            firsts.setdefault(job.tenant, job)
        ready = [j for j in firsts.values() if self.together.room() > 0 or not self.is_question(j)]
        if not ready:
            return None
        job = min(ready, key=lambda j: self.turns.get(j.tenant, -1))
        self.pending.remove(job)
        self.turns_taken += 1
        self.turns[job.tenant] = self.turns_taken
        return job

    @staticmethod
    def is_question(job: Job) -> bool:
        return job.key is not None or job.no_context

    def _execute(self, job: Job) -> None:
        if job.cancel.is_set():
            job._resolve(False, Cancelled())
            return
        outer, self.busy_since = self.busy_since, time.monotonic()
        started = self.busy_since
        try:
            result = job.fn(job)
            if isinstance(result, Underway):
                result = self._decode(job, result)
            if result is not _DECODING:
                job._resolve(True, result)
        except Deferred:
            with self.arrived:
                self.pending.appendleft(job)
        except BaseException as e:      # every failure goes back to its request; the thread lives on
            self._fail(job, e)
        finally:
            self.busy_since = outer
            self.job_seconds += 0.2 * (time.monotonic() - started - self.job_seconds)

    @staticmethod
    def _fail(job: Job, e: BaseException) -> None:
        # without its traceback: its frames hold the generation's tensors (tens of MB) in a reference
        # cycle through this frame, which only a full garbage collection would free
        e.__traceback__ = None
        job._resolve(False, e)

    def _decode(self, job: Job, underway: Underway):
        """A prefilled answer: it joins the batch (``_DECODING``: the job resolves when it ends), ends at its
        first token, or, when it cannot decode in a batch, runs alone now."""
        answering = underway.answering
        if answering.alone:
            return underway.result(answering.run())
        if self.together.add(answering):
            return underway.result(answering.answer())
        self.decoding[id(answering)] = (job, underway)
        return _DECODING

    def _step(self) -> None:
        """One decoding step of every answer in the batch; those whose client left are dropped first."""
        for answering in list(self.together.members):
            job, _ = self.decoding[id(answering)]
            try:
                job.check()
            except Cancelled as e:
                self._leave(answering, e)
        if not self.together:
            return
        self.steps += 1
        began = time.perf_counter()
        try:
            ended = self.together.step()
        except BaseException as e:      # the step itself failed: each answer in it fails, the thread lives on
            for answering in list(self.together.members):
                self._leave(answering, e)
            return
        finally:
            self.step_seconds += time.perf_counter() - began
        for answering in ended:
            job, underway = self.decoding.pop(id(answering))
            if answering.error is not None:
                self._fail(job, answering.error)
                continue
            self.answers_decoded += 1
            try:
                job._resolve(True, underway.result(answering.answer()))
            except BaseException as e:
                self._fail(job, e)

    def _leave(self, answering: Answering, e: BaseException) -> None:
        self.together.drop(answering)
        job, _ = self.decoding.pop(id(answering))
        self._fail(job, e)

    def busy(self) -> bool:
        """The model thread runs a job or decodes answers."""
        return self.busy_since is not None or bool(self.together)

    def expected_wait(self) -> float:
        """Seconds until a job queued now would start: the queue times the average job, plus what the
        job running now has left of it."""
        running = 0.0 if self.busy_since is None else max(0.0, self.job_seconds - (time.monotonic() - self.busy_since))
        return self.queued() * self.job_seconds + running

    def progress(self, key: str) -> tuple[int, int] | None:
        """``(tokens encoded, tokens)`` of ``key``'s encode here while it runs."""
        with self.lock:
            s = self.status.get(key)
        return (s.tokens_encoded, s.tokens) if s is not None and s.status == "encoding" else None

    def _answer_waiting(self, chunk_seconds: float = 0.0) -> None:
        """Between two chunks of an encode: start the queued questions whose context is at hand (while the
        batch has room), then decode the batch for about ``chunk_seconds``, the chunk's own time."""
        with self.arrived:
            waiting = [j for j in self.pending if j is not None and (j.no_context or j.key is not None
                                                                     and j.key != self.encoding)]
        for job in waiting:
            if self.together.room() == 0:
                break
            with self.lock:
                at_hand = job.no_context or job.key in self.loaded
            try:
                at_hand = at_hand or self.store.has(job.key)
            except Exception:       # a store that fails to answer must not fail the encode: ask again later
                at_hand = False
            if not at_hand:
                continue
            with self.arrived:
                if job not in self.pending:
                    continue
                self.pending.remove(job)
            self._execute(job)
        until = time.monotonic() + chunk_seconds
        while self.together and time.monotonic() < until:
            self._step()

    # ------------------------------------------------------------------ contexts (run on the model thread)
    def context(self, key: str, text: str | None, job: Job):
        """The context ``key``: from memory, from the store, or encoded from ``text`` (and saved).
        Returns ``(context, encoded_here)``."""
        with self.lock:
            if key in self.loaded:
                self.loaded.move_to_end(key)
                self.store.touch(key)
                return self.loaded[key], False
        if self.store.has(key):
            try:
                with self.store.open_local(key) as path:
                    ctx = self.pipe.load_context(path)
                self.store.touch(key)
                self._remember(key, ctx)
                return ctx, False
            except ContextFileError as e:
                if text is None:            # listed as failed until the text comes again (upload or chat)
                    with self.lock:
                        self.status[key] = ContextStatus(key, "failed", 0, error=str(e).splitlines()[0])
                    raise
                self.store.delete(key)      # damaged: the text is here, so encode it again
        if text is None:
            raise KeyError(key)
        return self._encode(key, text, job), True

    def _encode(self, key: str, text: str, job: Job):
        if self.encoding is not None:       # taken up between another encode's chunks: wait for it to end
            raise Deferred()
        status = self.status.get(key)
        if status is None:
            status = self.status[key] = ContextStatus(key, "queued", 0, method=self.pipe.method.name)
        status.status, status.error, status.tokens_encoded = "encoding", None, 0
        tokens = self.pipe.tokenize(text)          # once: the count shown and the ids encoded
        status.tokens = int(tokens.ids.shape[0])

        self.publish(key)
        last = [time.monotonic()]
        chunk_began = [time.monotonic()]

        def progress(n: int) -> None:
            job.check()
            status.tokens_encoded += n
            if time.monotonic() - last[0] > 2:       # other replicas see the progress every few seconds
                last[0] = time.monotonic()
                self.publish(key)
            self._answer_waiting(time.monotonic() - chunk_began[0])
            chunk_began[0] = time.monotonic()

        self.encoding = key
        try:
            ctx = self.pipe.encode_tokens(tokens.ids, tokens.image_rows, progress, source=tokens.source)
            status.tokens_encoded = status.tokens
            status.bytes = self.store.put(key, ctx)
        except Cancelled:
            status.status, status.error = "failed", "cancelled before the encode finished"
            self.publish(key)
            raise
        except Exception as e:
            status.status, status.error = "failed", str(e).splitlines()[0] if str(e) else type(e).__name__
            self.publish(key)
            raise
        finally:
            self.encoding = None
        status.status, status.encode_seconds = "ready", round(ctx.encode_seconds, 3)
        self.store.drop_note(key)
        self.encoded += 1
        self.tokens_encoded += status.tokens
        self.encode_seconds += ctx.encode_seconds
        self._remember(key, ctx)
        return ctx

    def _remember(self, key: str, ctx) -> None:
        with self.lock:
            self.loaded[key] = ctx
            self.loaded.move_to_end(key)
            while len(self.loaded) > self.memory_contexts:
                self.loaded.popitem(last=False)

    def has(self, key: str) -> bool:
        """``key`` is in memory, in the store, or an upload here is queued or encoding it."""
        return key in self.loaded or self.store.has(key) or key in self.uploads

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
            self.status[key] = ContextStatus(key, "queued", tokens, method=self.pipe.method.name)
        def encode(job):
            found = self.context(key, text, job)
            with self.lock:     # found ready (a chat encoded the same text first): the store's word stands
                if (status := self.status.get(key)) is not None and status.status == "queued":
                    self.status.pop(key)
            return found
        try:
            job = self.submit(encode, tenant=tenant)
        except QueueFull:
            with self.lock:
                self.status.pop(key, None)
            raise
        job.for_chats = for_chat
        self.uploads[key] = job
        self.publish(key)
        job.future.add_done_callback(lambda f: (self.uploads.pop(key, None), f.exception()))
        return job

    def watch(self, key: str) -> Job | None:
        """A chat starts waiting for ``key``'s queued encode (event-loop side); the encode's job, if one
        runs, to hand to ``unwatch`` once the chat stops waiting."""
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
            in_memory = self.loaded.pop(key, None) is not None
            status = self.status.pop(key, None)
        return self.store.delete(key) or in_memory or status is not None

    def publish(self, key: str) -> None:
        """Tell the other processes sharing the store how ``key``'s encode here is going."""
        with self.lock:
            status = self.status.get(key)
        if status is not None:
            self.store.write_note(key, {**status.to_json(), "updated": time.time(), "owner": self.owner})

    def elsewhere(self, key: str) -> ContextStatus | None:
        """The status another process sharing the store published for ``key``: None for none (or for this
        process's own note: its status table is the truth), failed for a writer known to be gone or silent
        for ``STALE_NOTE_S``."""
        note = self.store.read_note(key)
        if note is None:
            return None
        owner = note.get("owner") if isinstance(note.get("owner"), dict) else {}
        if owner.get("instance") == self.owner["instance"]:
            return None
        fields = {k: note[k] for k in ContextStatus.__dataclass_fields__ if k in note}
        try:
            status = ContextStatus(**{"id": key, "status": "failed", "tokens": 0, **fields})
        except TypeError:
            return None
        if status.status in ("queued", "encoding"):
            if owner_gone(owner, self.owner):
                status.status, status.error = "failed", (f"the process encoding it (pid {owner['pid']}) stopped "
                                                         "before it finished; upload the text again")
            elif time.time() - float(note.get("updated", 0)) > STALE_NOTE_S:
                status.status, status.error = "failed", "the process encoding it stopped reporting"
        return status

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
            return self.elsewhere(key)
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
