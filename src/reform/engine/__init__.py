from .cache import KVCache, LayerCache
from .core import Engine, ModelShape, UnsupportedModelError, model_shape
from .extractors import HeadEmbeddings, HeadSpec
from .policies import H2O, TOVA, StreamingLLM

__all__ = ["KVCache", "LayerCache", "Engine", "ModelShape", "UnsupportedModelError", "model_shape",
           "HeadEmbeddings", "HeadSpec", "H2O", "TOVA", "StreamingLLM"]
