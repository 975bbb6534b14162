"""The engine's plug-in contracts: a ``Hook`` sees each chunk's pre-RoPE Q/K/V (REFORM's retrieval
embeddings, ``extractors.py``), an ``EvictionPolicy`` decides what each layer's cache keeps chunk by chunk
(``policies.py`` for the shared ones, the methods' own files for the rest)."""

from __future__ import annotations

from typing import Protocol

import torch

from .cache import KVCache, LayerCache
from .rope import Rotary


class Hook(Protocol):
    """Sees each chunk as it is encoded (e.g. to store retrieval embeddings). ``on_qkv`` receives the
    pre-RoPE query, key and value states of a layer; a hook may list the ``layers`` it reads."""

    def begin(self, offset: int, length: int) -> None: ...
    def on_qkv(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None: ...


class EvictionPolicy(Protocol):
    """Scores cached tokens while a chunk runs and shrinks each layer's cache after it.

    A policy may also define ``observe_output(ids, hidden)``: ``Engine.prefill`` then hands it each
    chunk's ids and last-layer hidden states before ``compress`` (InfiniPot's novelty scores need them);
    and ``arrange(layer, q, cache, rotary)``: called in every layer with the block's pre-RoPE queries
    before it attends, it may replace the layer's cached entries (re-packed at 0..n-1), e.g. InfLLM
    loading the memory blocks those queries retrieve. Sliding-window layers are never handed to a
    policy: the engine keeps their last ``window - 1`` entries itself (see ``LayerCache.window``).
    """

    score_window: int  # how many of the chunk's last queries the policy looks at (0: none)

    def observe(self, layer: int, received: torch.Tensor, cache: LayerCache, n_new: int) -> None: ...
    def compress(self, cache: KVCache, rotary: Rotary) -> None: ...
