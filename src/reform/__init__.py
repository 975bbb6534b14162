"""REFORM: long-context inference for any HF causal LM by compress, gather and recompute.

The public names load on first use (PEP 562), so ``import reform`` and the command line start without
importing torch; ``from reform import Pipeline`` works as before."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from .version import __version__

if TYPE_CHECKING:
    from .engine import Engine, HeadSpec
    from .methods import Answer, Context, ReformConfig
    from .methods.checkpoint import Checkpoint
    from .pipeline import Pipeline

_PUBLIC = {"Engine": ".engine", "HeadSpec": ".engine", "Answer": ".methods", "Context": ".methods",
           "ReformConfig": ".methods", "Pipeline": ".pipeline", "Checkpoint": ".methods.checkpoint"}

__all__ = [*_PUBLIC, "__version__"]


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'reform' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name], __name__), name)
    globals()[name] = value                  # later lookups skip this function
    return value


def __dir__():
    return sorted([*globals(), *_PUBLIC])
