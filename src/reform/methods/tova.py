"""TOVA baseline (REFORM §4 baselines; Oren et al., 2024, "Transformers are Multi-State RNNs"):
evict the tokens the last query attends to least, averaged over the layer's heads; answer from the
compressed cache."""

from __future__ import annotations

from dataclasses import dataclass

from ..engine.policies import TOVAPolicy
from .base import CachedMethod, register
from .options import EvictionConfig


@dataclass
class TOVAConfig(EvictionConfig):
    """Chunk = cache = W/4 and first/last 256 kept, as for every recurrent baseline in the paper."""

    def policy(self) -> TOVA:
        return TOVAPolicy(self.cache_budget, self.keep_first, self.keep_last)


@register
class TOVA(CachedMethod):
    """Encode recurrently over all layers with TOVA eviction, then generate from the compressed cache."""

    name = "tova"
    Config = TOVAConfig
