"""The one recurrent engine every method plugs into (layer 1 of docs/architecture.md): it drives the
model's own decoder layers chunk by chunk over a KV cache with pre-RoPE keys (early exit, re-packed
positions, Q/K/V taps, eviction scores), and refuses what it cannot run exactly. REFORM §3.1."""

from .cache import KVCache, LayerCache
from .core import Engine
from .shape import ModelShape, UnsupportedModelError, model_shape
from .extractors import HeadEmbeddings, HeadSpec
from .policies import H2OPolicy, StreamingLLMPolicy, TopBudget

__all__ = ["KVCache", "LayerCache", "Engine", "ModelShape", "UnsupportedModelError", "model_shape",
           "HeadEmbeddings", "HeadSpec", "H2OPolicy", "StreamingLLMPolicy", "TopBudget"]
