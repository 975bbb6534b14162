"""REFORM: long-context inference for any HF causal LM by compress, gather and recompute."""

from .engine import Engine, HeadSpec
from .methods import Answer, Context, ReformConfig
from .pipeline import Pipeline

__all__ = ["Engine", "HeadSpec", "Answer", "Context", "ReformConfig", "Pipeline", "__version__"]
from .version import __version__
