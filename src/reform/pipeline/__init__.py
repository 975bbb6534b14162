"""The user-facing object: a loaded model + prompt layout + one method. Encode once, ask many (layer 4
of docs/architecture.md).

``Pipeline`` is a facade: ``load``, ``encode``, ``ask``, ``load_context`` and the few members the layers
above it share. What it delegates has a module each: ``checks`` (what is refused before a model loads),
``inputs`` (text, documents and images as ids), ``identity`` (the model's identity and the content keys of
contexts); the saved-context round trip is ``reform.methods.saved``.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path
from typing import Callable

import torch

from ..documents.evidence import Source
from ..documents.extracted import Extracted
from ..engine.core import Engine
from ..engine.layout import Templater, as_tensor
from ..methods import DOCUMENTS_METHOD, Answer, Context, Method
from ..methods.checkpoint import Checkpoint
from ..methods.full import QuestionAlone
from ..methods.saved import DTYPE_FLAGS, context_bytes, load_context, save_context
from ..model import DEFAULT_MODEL, load_model
from ..notes import PlainPromptWarning
from . import inputs
from .checks import check_load, check_method_options, make_method, method_class
from .identity import context_key, model_identity
from .inputs import Tokenized

__all__ = ["DTYPE_FLAGS", "Pipeline", "Tokenized", "check_load", "check_method_options", "make_method",
           "method_class"]


class Pipeline:
    """``pipe.encode(text)`` returns a ``Context``; ``context.ask(question)`` returns an ``Answer``.

    ``method``: what every context is encoded and asked with; None (the default) is the policy every entry
    point shares: REFORM for text and images, ``DOCUMENTS_METHOD`` for documents (files, folders, extracted
    documents), each under ``method_options``."""

    def __init__(self, model: torch.nn.Module, tokenizer, *, model_name: str | None = None,
                 method: str | None = None, use_chat_template: bool = True, source: str | None = None,
                 processor=None, **method_options):
        self.engine = Engine(model)
        self.tokenizer = tokenizer
        self.processor = processor     # a vision-language model's: images in ``encode``
        self.model_name = model_name or getattr(model.config, "_name_or_path", "") or "model"
        self.source = source or self.model_name     # what ``Pipeline.load`` / ``--model`` was given
        self.templater = Templater(tokenizer, use_chat_template)
        if use_chat_template and not self.templater.has_chat_template:
            warnings.warn(f"{self.model_name} has no chat template (a base model): questions are asked as plain "
                          "text ('<context>\\n\\nQuestion: ...\\nAnswer:') and each answer ends with its first line",
                          PlainPromptWarning, stacklevel=2)
        self.eos_ids = self.templater.eos_ids(model)
        self.method = make_method("reform" if method is None else method, self.engine, self.model_name, **method_options)
        self.documents_method = self.method if method is not None else make_method(
            DOCUMENTS_METHOD[0], self.engine, self.model_name, **{**DOCUMENTS_METHOD[1], **method_options})
        self._identity: dict | None = None
        # runs a segment-parallel encode's segments ``[(ids, skip, last), ...]`` -> ``[(embeddings, cache)]``
        # elsewhere (e.g. on Ray workers, ``reform.cluster``); None: one after another in this process
        self.segment_runner: Callable[[list], list] | None = None

    @classmethod
    def load(cls, model: str | None = None, *, device: str | None = None, dtype: str | None = None,
             **kwargs) -> "Pipeline":
        """Load ``model`` (a hub id, folder, .gguf file or packaged name; the default model when None) and
        build the pipeline; ``kwargs``: ``method``, its options, ``use_chat_template``. Everything that can
        be refused is refused before the load (``checks.check_load``)."""
        options = {k: v for k, v in kwargs.items() if k != "use_chat_template"}
        check_load(model, device=device, dtype=dtype, **options)
        loaded = load_model(str(model) if model is not None else None, device=device, dtype=dtype)
        return cls(loaded.model, loaded.tokenizer, model_name=loaded.name, source=str(model or DEFAULT_MODEL),
                   processor=loaded.processor, **kwargs)

    @property
    def identity(self) -> dict:
        """What a saved context must have been made with to be asked here (``identity.model_identity``)."""
        if self._identity is None:
            self._identity = model_identity(self)
        return self._identity

    @property
    def policy(self) -> dict:
        """Which method encodes what: ``{"text": ..., "documents": ...}`` (names)."""
        return {"text": self.method.name, "documents": self.documents_method.name}

    def method_for(self, document: Extracted | None) -> Method:
        """The method a context of ``document`` is encoded with: ``documents_method`` for a document (a file
        or folder read by ``reform.documents``), ``method`` for plain text, images and token ids."""
        return self.documents_method if document is not None and document.digest() is not None else self.method

    def context_key(self, ids: torch.Tensor, method: Method | None = None, image_rows: torch.Tensor | None = None,
                    document: Extracted | None = None) -> str:
        """The key the context of ``ids`` is stored under (``identity.context_key``)."""
        return context_key(self, ids, method, image_rows, document)

    def load_context(self, path: str | Path, *, unfinished: bool = False) -> Context:
        """A context saved by ``Context.save``, checked to belong to this model (config, weights, tokenizer,
        layout, dtype), rebuilt with the method and options it was encoded with. Raises
        ``ContextFileError`` (one line) for a missing, truncated, corrupted or foreign file, and for an
        unfinished encode's checkpoint unless ``unfinished`` (``methods/checkpoint.py`` reads those)."""
        return load_context(self, path, unfinished=unfinished)

    def save_context(self, ctx: Context, path: str | Path, *, partial: dict | None = None) -> int:
        """What ``Context.save`` runs (``methods/saved.py``)."""
        return save_context(ctx, path, partial=partial)

    def context_bytes(self, ctx: Context) -> int:
        """What ``Context.stored_bytes`` runs (``methods/saved.py``)."""
        return context_bytes(ctx)

    def tokenize(self, content) -> Tokenized:
        """``content`` (text, a document or folder, text and image parts) as the ids to encode
        (``inputs.tokenize``)."""
        return inputs.tokenize(self, content)

    def tokenize_context(self, text: str) -> torch.Tensor:
        """The ids of ``text`` laid out as a context."""
        return inputs.tokenize_context(self, text)

    def encode(self, content, progress: Callable[[int], None] | None = None,
               checkpoint: str | Path | Checkpoint | None = None) -> Context:
        """Encode ``content`` once (anything ``tokenize`` takes: text, a document's path or bytes, a folder,
        text and image parts). The tokenisation, extraction and the images' vision-tower pass are not
        included in the encode time.

        ``checkpoint`` (a path, or a ``Checkpoint`` to set the interval, default 5 min): the encode saves
        its state there every few minutes and, given a checkpoint an interrupted encode of the same input
        left, goes on from it; the file is removed once the encode is done (REFORM, one segment)."""
        ids, rows, source = inputs.tokenize(self, content)
        return self.encode_tokens(ids, rows, progress=progress, checkpoint=checkpoint, source=source)

    def encode_tokens(self, ids: torch.Tensor, image_rows: torch.Tensor | None = None,
                      progress: Callable[[int], None] | None = None,
                      checkpoint: str | Path | Checkpoint | None = None, source: Source | None = None,
                      embed_short: bool = False) -> Context:
        """Encode what ``tokenize`` returned (callers that show progress over the tokens first).
        ``embed_short``: REFORM's methods embed a context shorter than the recompute budget too (a library's
        documents)."""
        rows, resuming = image_rows, {"embed_short": True} if embed_short else {}
        method = self.method_for(source.document if source is not None else None)
        if checkpoint is not None:
            if not method.resumable:
                raise ValueError(f"method '{method.name}' cannot checkpoint its encode: REFORM's can")
            resuming["checkpoint"] = checkpoint = (checkpoint if isinstance(checkpoint, Checkpoint)
                                                   else Checkpoint(Path(checkpoint)))
            checkpoint.image_rows = rows
        t = time.perf_counter()
        with self.engine.input_rows(rows):
            ctx = method.encode(self, ids, progress, **resuming)
        ctx.image_rows = rows
        ctx.source = source
        ctx.encode_seconds = time.perf_counter() - t + (checkpoint.spent_before if checkpoint is not None else 0.0)
        if checkpoint is not None and not checkpoint.keep_when_done:
            checkpoint.discard()
        return ctx

    def without_context(self) -> Context:
        """The empty context: asking it is plain generation over the question alone (full attention over
        a short prompt), the model's own answer to a question that comes with no document."""
        return Context(self, QuestionAlone(), as_tensor(self.templater.prefix, self.engine.device))

    def ask(self, content, question: str, **kwargs) -> Answer:
        return self.encode(content).ask(question, **kwargs)
