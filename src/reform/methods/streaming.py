"""StreamingLLM baseline (REFORM §4 baselines; Xiao et al., ICLR 2024, "Efficient Streaming Language
Models with Attention Sinks"): attention sinks + a recent window, recurrent over chunks; answer from the
compressed cache."""

from __future__ import annotations

from dataclasses import dataclass

from ..engine.policies import StreamingLLMPolicy
from .base import CachedMethod, register
from .options import CacheConfig


@dataclass
class StreamingConfig(CacheConfig):
    """``keep_first`` sink tokens (256, as the paper keeps for all baselines; W/32 for small windows) and
    the most recent ``cache_budget - keep_first`` tokens; chunk = cache = W/4."""

    def policy(self) -> StreamingLLMPolicy:
        return StreamingLLMPolicy(self.cache_budget, self.keep_first)


@register
class StreamingLLM(CachedMethod):
    """Encode recurrently over all layers keeping sinks + recent tokens, then generate from that cache."""

    name = "streaming"
    Config = StreamingConfig
