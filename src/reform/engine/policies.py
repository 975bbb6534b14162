"""Eviction policies: what a recurrent method keeps in its KV cache after each chunk.

A policy sees attention scores while a chunk runs (``observe``) and shrinks every layer's cache to its
budget afterwards (``compress``). Kept entries keep their order and are re-packed at positions 0..n-1 by
``LayerCache.keep``, so no position ever exceeds ``budget + chunk``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .cache import KVCache, LayerCache
from .rope import Rotary


def forced_mask(n: int, keep_first: int, keep_last: int, device) -> torch.Tensor:
    """True for the first ``keep_first`` and the last ``keep_last`` of ``n`` cache entries."""
    pos = torch.arange(n, device=device)
    return (pos < keep_first) | (pos >= n - keep_last)


def top_budget(scores: torch.Tensor, budget: int, forced: torch.Tensor) -> torch.Tensor:
    """Per row of ``scores`` ([rows, n]): the ``budget`` best indices, ``forced`` ones always, ascending."""
    ranked = scores.masked_fill(forced, float("inf"))
    return ranked.topk(budget, dim=-1).indices.sort(dim=-1).values


@dataclass
class H2O:
    """Heavy-Hitter Oracle (Zhang et al., 2023), as REFORM compresses with it (REFORM §3.1, §4 setup).

    Each cached token's score is the attention it has received, accumulated over chunks, per KV head
    (summed over the query heads of its group). Following REFORM, only the last ``score_window`` (128)
    queries of each chunk contribute. After a chunk, every layer and KV head keeps its ``budget`` best
    tokens plus, always, the first ``keep_first`` and last ``keep_last`` tokens.
    """

    budget: int
    keep_first: int = 256
    keep_last: int = 256
    score_window: int = 128

    def __post_init__(self):
        if self.budget < self.keep_first + self.keep_last:
            raise ValueError(f"cache budget {self.budget} is smaller than the always-kept first+last tokens "
                             f"({self.keep_first}+{self.keep_last})")

    def observe(self, layer: int, received: torch.Tensor, cache: LayerCache, n_new: int) -> None:
        old = cache.scores
        if old is None:
            cache.scores = received
        else:
            n_old = received.shape[1] - n_new
            cache.scores = torch.cat([old + received[:, :n_old], received[:, n_old:]], dim=1)

    def compress(self, cache: KVCache, rotary: Rotary) -> None:
        for lc in cache.layers:
            if lc.length > self.budget:
                forced = forced_mask(lc.length, self.keep_first, self.keep_last, lc.scores.device)
                lc.keep(top_budget(lc.scores, self.budget, forced), rotary)
