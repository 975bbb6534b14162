"""The one thread that owns the model, and what it owns: the loop that runs every job (``scheduler``) and
the contexts it reads and encodes (``contexts``). The HTTP side only queues jobs and waits for their
results (or their streamed text), so a slow encode never blocks the event loop and two requests never
touch the model at once.

One thread runs the model, from its load on: the worker takes a function that loads the pipeline and
calls it on its own thread. PyTorch's CPU kernels run on an OpenMP team owned by the thread that calls
them; a second thread with a team of its own (the model loaded on the main thread, say) slowed every
decoding step of both twofold on a 2-core CPU (8 answers: 188 against 85 ms), as each team's waiting
threads then sleep between kernels instead of spinning.
"""

from __future__ import annotations

import threading

import torch

from ..machine import available_memory
from ..methods.answering import Together
from ..store import ContextStore
from .contexts import Contexts
from .scheduler import Scheduler


def default_max_batch(pipe, share: float = 0.25, most: int = 32, answer_tokens: int = 512) -> int:
    """How many answers may decode at once: as many answer caches as fit in ``share`` of the memory free
    now, between 1 and ``most``. An answer's cache holds its prompt (the method's recompute or cache budget,
    else the whole window) and ``answer_tokens``."""
    engine, shape, config = pipe.engine, pipe.engine.shape, pipe.method.config
    per_token = shape.n_layers * 2 * shape.n_kv_heads * shape.head_dim * engine.dtype.itemsize
    prompt = getattr(config, "recompute_budget", None) or getattr(config, "cache_budget", None) or shape.window
    free = available_memory(engine.device)
    if free is None:
        return 8
    return max(1, min(most, int(free * share) // (per_token * (min(prompt, shape.window) + answer_tokens))))


class Worker(Scheduler):
    """Owns ``pipe`` (a ``Pipeline``) and its ``contexts`` in ``store``; ``submit`` queues a job, which the
    loop (``Scheduler.run``) runs on the model thread."""

    def __init__(self, pipe, store: ContextStore, *, queue_size: int = 16, memory_contexts: int = 4,
                 max_batch: int | None = None):
        """``pipe``: a ``Pipeline``, or a function that loads one, called on the model thread (see the
        module docstring; its exceptions are raised here)."""
        self.store = store
        loaded, self.pipe = threading.Event(), None
        threads = torch.get_num_threads()       # the model thread's kernels use the caller's thread count

        def own_the_model():
            torch.set_num_threads(threads)
            try:
                self.pipe = pipe() if callable(pipe) else pipe
                self.max_batch = max_batch or default_max_batch(self.pipe)
                self.contexts = Contexts(self.pipe, store, self, memory_contexts)
                Scheduler.__init__(self, Together(self.pipe.engine, self.max_batch), queue_size,
                                   self.contexts.at_hand)
            except BaseException as e:
                self.pipe = e
                return
            finally:
                loaded.set()
            self.run()
        self.thread = threading.Thread(target=own_the_model, name="reform-model", daemon=True)
        self.thread.start()
        loaded.wait()
        if isinstance(self.pipe, BaseException):
            failure, self.pipe = self.pipe, None
            raise failure

    def stop(self) -> None:
        self.put(None)
        self.thread.join(timeout=30)
