"""What can be refused before a model loads (the method, its options, the model's path, the device and
dtype), and building a method for a loaded model."""

from __future__ import annotations

from pathlib import Path

from ..engine.core import Engine
from ..heads import find_preset
from ..methods import DOCUMENTS_METHOD, REGISTRY, Method


def method_class(name: str) -> type[Method]:
    if name not in REGISTRY:
        raise ValueError(f"unknown method '{name}'; choose one of: {', '.join(sorted(REGISTRY))}")
    return REGISTRY[name]


def check_method_options(name: str, **options) -> None:
    """Refuse an unknown method, options it does not take or values of the wrong type, before any model
    is loaded."""
    if not isinstance(name, str):
        raise TypeError(f"method must be a name such as 'reform', got {name!r}")
    method_class(name).check_options(options)


def check_load(model=None, *, device=None, dtype=None, method: str | None = None, **options) -> None:
    """Everything about ``Pipeline.load(model, device=, dtype=, method=, **options)`` that can be refused
    without loading the model: the model's path (or that the hub is reachable for an id not cached), the
    device, the dtype, the method and its option values. The CLI, the eval runner and ``Pipeline.load``
    all call it first, so a bad input costs no load and leaves no output behind. Raises ``ValueError``
    (``TypeError`` for arguments of the wrong type) with a one-line message."""
    from ..model import pick_device, pick_dtype, resolve
    if model is not None and not isinstance(model, (str, Path)):
        raise TypeError(f"model must be a hub id, folder or .gguf path, got {model!r}")
    check_method_options("reform" if method is None else method, **options)
    if method is None:      # the documents method too (``Pipeline``'s policy), under the same options
        check_method_options(DOCUMENTS_METHOD[0], **{**DOCUMENTS_METHOD[1], **options})
    pick_dtype(pick_device(device), dtype)
    resolve(str(model) if model is not None else None, assemble=False)


def make_method(name: str, engine: Engine, model_name: str, **options) -> Method:
    """Build a registered method with its defaults scaled to the model's window; ``options`` (fields of
    the method's config dataclass, ``None`` = default) override. A model preset's tuned ``defaults`` (e.g.
    SmolLM2's recompute budget) apply to every method whose config has those fields."""
    preset = find_preset(model_name)
    return method_class(name).create(engine.shape, model_name, (preset or {}).get("defaults"), **options)
