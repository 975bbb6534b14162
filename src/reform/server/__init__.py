"""An OpenAI-compatible server over one ``Pipeline`` (``reform serve``): ``app`` holds the HTTP layer,
``worker`` the single thread that owns the model, ``openai_schema`` the request format. Layer 5 of
docs/architecture.md (serving), below ``reform.cluster``."""

from __future__ import annotations

from ..store import ContextStore
from .app import Settings, create_app
from .worker import Worker

__all__ = ["Settings", "Worker", "build_app", "create_app"]


def build_app(pipe, store_dir, *, store_max_bytes: int | None = None, queue_size: int = 16,
              memory_contexts: int = 4, max_batch: int | None = None, settings: Settings | None = None):
    """The FastAPI app serving ``pipe`` (a ``Pipeline``, or a function that loads one on the model thread:
    ``Worker``) with saved contexts in ``store_dir`` (run it with uvicorn);
    ``max_batch``: answers decoding at once (default: by free memory, ``worker.default_max_batch``)."""
    store = ContextStore(store_dir, store_max_bytes)
    store.remove_stale_temporaries()
    store.enforce_budget()
    return create_app(Worker(pipe, store, queue_size=queue_size, memory_contexts=memory_contexts,
                                  max_batch=max_batch), settings)
