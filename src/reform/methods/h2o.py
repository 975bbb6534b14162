"""H2O baseline: heavy-hitter eviction, answered from the compressed cache (REFORM §4 baselines; Zhang
et al., NeurIPS 2023, "H2O: Heavy-Hitter Oracle for Efficient Generative Inference of LLMs")."""

from __future__ import annotations

from dataclasses import dataclass

from ..engine.policies import H2OPolicy
from .base import CachedMethod, register
from .options import EvictionConfig, positive, require_positive


@dataclass
class H2OConfig(EvictionConfig):
    """The same scorer REFORM compresses with: accumulated attention from the last ``score_window``
    (128, REFORM §4 setup) queries of every chunk; chunk = cache = W/4, first/last 256 kept."""

    score_window: int = positive(128)

    def check(self, shape) -> None:
        require_positive(score_window=self.score_window)
        super().check(shape)

    def policy(self) -> H2OPolicy:
        return H2OPolicy(self.cache_budget, self.keep_first, self.keep_last, self.score_window)


@register
class H2O(CachedMethod):
    """Encode recurrently over all layers with H2O eviction, then generate from the compressed cache."""

    name = "h2o"
    Config = H2OConfig
