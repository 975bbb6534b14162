"""The bridge to transformers' attention interface: while ``Engine`` drives the model's own decoder layers,
their attention modules call ``reform_attention`` (registered as ``"reform"``) and their cache updates go
to ``CacheAdapter``, which hand them to the engine's cache and attention (``Engine._attend``,
``Engine._attend_step``). ``Call`` and ``StepCall`` say what one forward or one decoding step is running."""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import torch

from .attention import DECODE_BLOCK
from .batch import DecodeBatch
from .cache import KVCache
from .plugins import EvictionPolicy, Hook
from .shape import UnsupportedModelError


class Exit(Exception):
    """Raised inside the layer loop to stop after the early-exit layer's Q/K/V."""


# Keyword arguments model attention modules pass to the attention function that the engine either
# honours (scaling, sliding_window, softcap) or that do not change the result at inference.
ATTN_KWARGS = {"dropout", "scaling", "sliding_window", "softcap", "position_ids", "cache_position", "use_cache",
                "output_attentions", "layer_idx", "cache", "past_key_values"}


@dataclass
class Call:
    """One ``Engine.forward``: what the attention function and the cache adapter need to know."""

    cache: KVCache
    starts: list[int]
    hook: Hook | None
    policy: EvictionPolicy | None
    exit_layer: int | None    # the layer whose Q/K/V alone run (early exit), or None


@dataclass
class StepCall:
    """One ``Engine.step``: one new token for each of the first ``n`` sequences of a ``DecodeBatch`` (the
    rows past ``n`` are padding, ``STEP_ROWS``)."""

    batch: DecodeBatch
    n: int
    starts: torch.Tensor      # [n, layers]: where each sequence's new token sits in each layer
    spans: list[int]          # each sequence's length once its token is in (length-dependent RoPE)


class CacheAdapter:
    """What a transformers attention module sees as its cache: appends the new keys (keeping their
    pre-RoPE copy) and values of layer ``layer_idx`` to our ``KVCache`` and returns all of them."""

    is_compileable = False

    def __init__(self, engine):
        self.engine = engine

    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        call = self.engine._call
        if isinstance(call, StepCall):           # each sequence's key and value go to its own slot
            n, at = call.n, call.starts[:, layer_idx]
            keys, values = call.batch.keys[layer_idx], call.batch.values[layer_idx]
            keys[torch.arange(n), :, at] = key_states[:n, :, -1]
            values[torch.arange(n), :, at] = value_states[:n, :, -1]
            # the slots as one view, padded to the end of the longest sequence's last block
            held = -(-(int(at.max()) + 1) // DECODE_BLOCK) * DECODE_BLOCK
            return keys[:n, :, :held], values[:n, :, :held]
        if layer_idx >= len(call.cache.layers):   # the early-exit layer: nothing is cached
            return key_states, value_states
        lc = call.cache.layers[layer_idx]
        k_rot = key_states[0]
        lc.append(self.engine.rotary.unrotate(k_rot, call.starts[layer_idx], layer_idx), k_rot, value_states[0])
        return lc.keys[None], lc.values[None]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        call = self.engine._call
        if isinstance(call, StepCall):
            return int(call.starts[:, layer_idx].max())
        return call.starts[layer_idx] if layer_idx < len(call.starts) else 0


ATTENTION_NAME = "reform"
DRIVING: ContextVar = ContextVar("reform_engine")   # the engine whose forward is running
# the input embeddings that token ids past the vocabulary stand for (image positions; ``Engine.input_rows``)
INPUT_ROWS: ContextVar["torch.Tensor | None"] = ContextVar("reform_input_rows", default=None)


def reform_attention(module, query, key, value, attention_mask, scaling=None, sliding_window=None, softcap=None,
               s_aux=None, **kwargs):
    """The attention function the model's own attention modules call while the engine drives them
    (registered in transformers' ``AttentionInterface``). Queries and keys arrive rotated by the model."""
    engine = DRIVING.get()
    unknown = sorted(k for k, v in kwargs.items() if k not in ATTN_KWARGS and v is not None)
    if unknown:
        raise UnsupportedModelError(f"its attention takes {', '.join(unknown)}, which the engine does not support")
    if isinstance(engine._call, StepCall):
        return engine._attend_step(module.layer_idx, query, key, value, scaling, sliding_window, softcap, s_aux)
    return engine._attend(module.layer_idx, query[0], key[0], value[0], scaling, sliding_window, softcap, s_aux)


def register_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, reform_attention)


@contextmanager
def driving(engine, call: Call | StepCall):
    """Route the model's attention modules to ``reform_attention`` for the duration of one forward."""
    configs = {id(c): c for c in [engine.model.config, engine.config, *(getattr(a, "config", None)
                                                                         for a in engine.attention)] if c is not None}
    saved = {k: c._attn_implementation for k, c in configs.items()}
    engine._call, token = call, DRIVING.set(engine)
    try:
        for c in configs.values():
            c._attn_implementation = ATTENTION_NAME
        yield
    finally:
        for k, c in configs.items():
            c._attn_implementation = saved[k]
        engine._call = None
        DRIVING.reset(token)
