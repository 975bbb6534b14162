"""The user-facing object: a loaded model + prompt layout + one method. Encode once, ask many."""

from __future__ import annotations

import time
from typing import Callable

import torch

from .engine.core import Engine
from .engine.layout import Templater, as_tensor
from .heads import find_preset
from .methods import REGISTRY, Answer, Context, Method
from .model import load_model


def method_class(name: str) -> type[Method]:
    if name not in REGISTRY:
        raise ValueError(f"unknown method '{name}'; choose one of: {', '.join(sorted(REGISTRY))}")
    return REGISTRY[name]


def check_method_options(name: str, **options) -> None:
    """Refuse an unknown method or options it does not take, before any model is loaded."""
    method_class(name).check_options(options)


def make_method(name: str, engine: Engine, model_name: str, **options) -> Method:
    """Build a registered method with its defaults scaled to the model's window; ``options`` (fields of
    the method's config dataclass, ``None`` = default) override. A model preset's tuned ``defaults`` (e.g.
    SmolLM2's recompute budget) apply to every method whose config has those fields."""
    preset = find_preset(model_name)
    return method_class(name).create(engine.shape, model_name, (preset or {}).get("defaults"), **options)


class Pipeline:
    """``pipe.encode(text)`` returns a ``Context``; ``context.ask(question)`` returns an ``Answer``."""

    def __init__(self, model: torch.nn.Module, tokenizer, *, model_name: str | None = None,
                 method: str = "reform", use_chat_template: bool = True, **method_options):
        self.engine = Engine(model)
        self.tokenizer = tokenizer
        self.model_name = model_name or getattr(model.config, "_name_or_path", "") or "model"
        self.templater = Templater(tokenizer, use_chat_template)
        self.eos_ids = self.templater.eos_ids(model)
        self.method = make_method(method, self.engine, self.model_name, **method_options)

    @classmethod
    def load(cls, model: str | None = None, *, device: str | None = None, dtype: str | None = None,
             **kwargs) -> "Pipeline":
        loaded = load_model(model, device=device, dtype=dtype)
        return cls(loaded.model, loaded.tokenizer, model_name=loaded.name, **kwargs)

    def tokenize_context(self, text: str) -> torch.Tensor:
        if not text or not text.strip():
            raise ValueError("the context is empty")
        return as_tensor(self.templater.context(text), self.engine.device)

    def encode(self, text: str, progress: Callable[[int], None] | None = None) -> Context:
        """Encode ``text`` once (tokenisation not included in the encode time)."""
        ids = self.tokenize_context(text)
        t = time.perf_counter()
        ctx = self.method.encode(self, ids, progress)
        ctx.encode_seconds = time.perf_counter() - t
        return ctx

    def ask(self, text: str, question: str, **kwargs) -> Answer:
        return self.encode(text).ask(question, **kwargs)
