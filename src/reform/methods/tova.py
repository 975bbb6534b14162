"""TOVA baseline (REFORM §4 baselines; Oren et al., 2024, "Transformers are Multi-State RNNs"):
evict the tokens the last query attends to least, averaged over the layer's heads; answer from the
compressed cache."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..engine.cache import LayerCache
from ..engine.policies import TopBudget
from .base import CachedMethod, register
from .options import EvictionConfig


@dataclass
class TOVAPolicy(TopBudget):
    """Token Omission Via Attention (Oren et al., 2024, "Transformers are Multi-State RNNs").

    TOVA drops the token the current query attends to least, attention averaged over all heads of the
    layer, so every head of a layer keeps the same tokens and scores are not accumulated. Chunked, as
    the REFORM paper runs its recurrent baselines: after each chunk the layer keeps the ``budget`` tokens
    that the chunk's last query (``score_window`` = 1) attends to most, plus the forced first/last ones.
    """

    score_window: int = 1

    def observe(self, layer: int, received: torch.Tensor, cache: LayerCache, n_new: int) -> None:
        # received is summed over each KV group's query heads: summing the groups is the head average
        # up to a constant factor, which does not change the ranking
        cache.scores = received.sum(0, keepdim=True).expand_as(received)


@dataclass
class TOVAConfig(EvictionConfig):
    """Chunk = cache = W/4 and first/last 256 kept, as for every recurrent baseline in the paper."""

    def policy(self) -> TOVAPolicy:
        return TOVAPolicy(self.cache_budget, self.keep_first, self.keep_last)


@register
class TOVA(CachedMethod):
    """Encode recurrently over all layers with TOVA eviction, then generate from the compressed cache."""

    name = "tova"
    Config = TOVAConfig
