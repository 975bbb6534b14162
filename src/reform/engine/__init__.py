from .cache import KVCache, LayerCache
from .core import Engine, ModelShape, UnsupportedModelError, model_shape
from .extractors import HeadEmbeddings, HeadSpec
from .policies import H2OPolicy, InfiniPotPolicy, InfLLMPolicy, StreamingLLMPolicy, TOVAPolicy

__all__ = ["KVCache", "LayerCache", "Engine", "ModelShape", "UnsupportedModelError", "model_shape",
           "HeadEmbeddings", "HeadSpec", "H2OPolicy", "TOVAPolicy", "StreamingLLMPolicy", "InfiniPotPolicy",
           "InfLLMPolicy"]
