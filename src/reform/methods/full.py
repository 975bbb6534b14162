"""Full attention: the whole prompt through the model at once; the reference every method approaches
(REFORM §4 compares against it inside the window)."""

from __future__ import annotations

import warnings
from typing import Callable

import torch

from ..engine.core import Engine
from ..engine.layout import QuestionPart
from ..machine import available_memory
from ..notes import PastWindowWarning
from .answering import Answering
from .base import Context, Method, Runtime, register


def full_attention_bytes(engine: Engine, n: int) -> int:
    """Rough memory full attention over ``n`` tokens needs on top of the model: the KV cache of every layer
    (pre-RoPE keys, rotated keys, values) plus one layer's transient attention state (KV repeated per
    query head, and the chunk x cache mask off-CPU)."""
    s = engine.shape
    size = torch.empty((), dtype=engine.dtype).element_size()
    cache = 3 * s.n_layers * s.n_kv_heads * s.head_dim * n * size
    transient = 2 * s.n_heads * s.head_dim * n * size + (s.window * n if engine.device.type != "cpu" else 0)
    return cache + transient


@register
class Full(Method):
    """Plain generation over the whole input. Past the model's window it still runs (with a warning:
    the model never saw such positions, so expect worse answers); it refuses inputs whose KV cache would
    not fit in the memory that is free."""

    name = "full"

    def encode(self, pipe: Runtime, ids: torch.Tensor, progress: Callable[[int], None] | None = None) -> Context:
        engine, n = pipe.engine, ids.shape[0]
        need, free = full_attention_bytes(engine, n), available_memory(engine.device)
        if free is not None and need > free:
            raise ValueError(f"full attention over {n} tokens needs about {need / 2**30:.1f} GiB for its KV cache, "
                             f"but only {free / 2**30:.1f} GiB is free on {engine.device}; use a method that "
                             "bounds memory (e.g. --method reform)")
        if n > engine.shape.window:
            warnings.warn(f"the input ({n} tokens) is longer than the model's window ({engine.shape.window}): "
                          "full attention runs at positions the model was not trained on; expect degraded "
                          "answers", PastWindowWarning, stacklevel=2)
        return Context(pipe, self, ids)

    def start(self, ctx: Context, part: QuestionPart, *, max_new_tokens: int, **kwargs) -> Answering:
        positions = ctx.ids.shape[0] + len(part.ids) + max_new_tokens
        with ctx.pipeline.engine.past_window(positions):        # past the window, it then decodes alone
            return super().start(ctx, part, max_new_tokens=max_new_tokens, **kwargs)


class QuestionAlone(Method):
    """The model alone over a prompt that holds no context (``Pipeline.without_context``): the prompt is
    the question, computed in full, and unlike ``Full`` never past the model's window (not registered:
    nothing to encode)."""

    name = "no-context"
