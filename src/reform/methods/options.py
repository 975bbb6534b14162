"""Method options: each method's config dataclass says which options it takes; defaults scale with the
model's window W the way the REFORM paper's settings do for 128k-window models (chunk = cache = 32k = W/4,
recompute / retrieval budget 8k-16k ~ W/2, always-kept first/last 256 tokens)."""

from __future__ import annotations

import math
import types
import typing
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, fields, replace

from ..engine.shape import ModelShape


class OptionError(ValueError):
    """A method was given options its config does not have."""

    def __init__(self, method: str, unknown: list[str], accepted: list[str]):
        self.method, self.unknown, self.accepted = method, unknown, accepted
        takes = f"its options are {', '.join(accepted)}" if accepted else "it takes no options"
        super().__init__(f"method '{method}' does not take {', '.join(unknown)}; {takes}")


def option_names(config_cls: type | None) -> list[str]:
    return [f.name for f in fields(config_cls)] if config_cls is not None else []


def given(options: dict) -> dict:
    """The options actually set (``None`` means: use the default)."""
    return {k: v for k, v in options.items() if v is not None}


def check_names(method: str, config_cls: type | None, options: dict) -> None:
    accepted = option_names(config_cls)
    unknown = sorted(k for k in given(options) if k not in accepted)
    if unknown:
        raise OptionError(method, unknown, accepted)


def positive(default=None):
    """A config field that, when given, must be at least 1 (a size, a budget, a count); every other
    whole-number option (keep_first, keep_last, retrieval_layer) must be at least 0. The constraint lives
    in the field's metadata, where ``typed_options`` reads it."""
    return field(default=default, metadata={"positive": True})

DTYPE_NAMES = {"float16": "float16", "fp16": "float16", "half": "float16", "bfloat16": "bfloat16",
               "bf16": "bfloat16", "float32": "float32", "fp32": "float32", "float": "float32"}


def typed_options(method: str, config_cls: type | None, options: dict) -> dict:
    """The given options checked against the types of the config's fields and normalised (a dtype by
    name becomes a ``torch.dtype``, a list a tuple): the one place every option value is validated
    before a model is loaded, for the CLI, the eval specs, the server and the Python API alike. Checks
    that need the model's window (budgets that fit it) run when the config is resolved."""
    check_names(method, config_cls, options)
    if config_cls is None:
        return {}
    hints, declared = typing.get_type_hints(config_cls), {f.name: f for f in fields(config_cls)}
    return {k: _typed(method, k, hints[k], v, declared[k].metadata.get("positive", False))
            for k, v in given(options).items()}


def _typed(method: str, name: str, hint, value, positive: bool = False):
    import torch
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1:
        hint = args[0]
    what = f"option {name} of {method}"
    if hint is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{what} must be true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{what} must be a whole number, got {value!r}")
        if value < 1 and positive:
            raise ValueError(f"{what} must be positive, got {value}")
        if value < 0:
            raise ValueError(f"{what} cannot be negative, got {value}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"{what} must be a number, got {value!r}")
        return float(value)
    if typing.get_origin(hint) is typing.Literal:
        if value not in typing.get_args(hint):
            raise ValueError(f"{what} must be one of {', '.join(map(str, typing.get_args(hint)))}, got {value!r}")
        return value
    if hint is str:
        if not isinstance(value, str):
            raise ValueError(f"{what} must be text, got {value!r}")
        return value
    if hint is torch.dtype:
        if isinstance(value, torch.dtype) and str(value).removeprefix("torch.") in DTYPE_NAMES.values():
            return value
        if isinstance(value, str) and value.lower().removeprefix("torch.") in DTYPE_NAMES:
            return getattr(torch, DTYPE_NAMES[value.lower().removeprefix("torch.")])
        raise ValueError(f"{what} must be one of float16, bfloat16, float32, got {value!r}")
    if typing.get_origin(hint) is tuple:
        item = typing.get_args(hint)[0]
        if item is int:     # kernel sizes: "3,5,7" from the command line, or a list
            parts = value.split(",") if isinstance(value, str) else value if isinstance(value, (list, tuple)) else None
            try:
                numbers = tuple(int(p) for p in parts) if parts is not None and not isinstance(value, bool) else None
            except (TypeError, ValueError):
                numbers = None
            if not numbers or any(isinstance(p, (bool, float)) or int(p) < 1 for p in parts):
                raise ValueError(f"{what}: kernel sizes must be positive whole numbers such as 3,5,7, got {value!r}")
            return numbers
        if isinstance(value, str) or isinstance(value, (list, tuple)) and all(isinstance(v, (str, item))
                                                                            for v in value):
            return value                            # heads: parsed (and checked) by the method
        raise ValueError(f"{what} must be text such as 5:v:2,12:k:0, got {value!r}")
    return value


def build_config(method: str, config_cls: type | None, options: dict, defaults: dict | None = None):
    """``config_cls(**options)``, refusing options it does not have; ``defaults`` (e.g. a model preset's
    tuned values) fill the fields they name that the options leave unset and are ignored otherwise. A
    ``defaults[method]`` section holds values for that method alone, over the shared ones (a preset can
    tune ReAttention's ``cache_budget`` without touching H2O's)."""
    options = typed_options(method, config_cls, options)
    if config_cls is None:
        return None
    names = set(option_names(config_cls))
    defaults = defaults or {}
    scoped = {**defaults, **defaults.get(method, {})}
    base = {k: v for k, v in scoped.items() if k in names}
    return config_cls(**{**base, **options})


def keep_default(shape: ModelShape) -> int:
    """Tokens always kept at each end: 256 as in the paper, W/32 for windows under 8k."""
    return min(256, shape.window // 32)


def pick(value, default):
    return default if value is None else value


def require_positive(**values: int) -> None:
    if any(v < 1 for v in values.values()):
        names = [k.replace("_", " ") for k in values]
        label = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
        raise ValueError(f"{label} must be positive")


def min_chunk(shape: ModelShape) -> int:
    """The smallest chunk worth encoding: every chunk is one pass through the model, so a chunk of a few
    tokens makes the encode hundreds of times slower (64 tokens, or W/128 for windows under 8k)."""
    return max(1, min(64, shape.window // 128))


def require_chunk_size(chunk_size: int, shape: ModelShape) -> None:
    if chunk_size < min_chunk(shape):
        raise ValueError(f"chunk size {chunk_size} is below this model's minimum of {min_chunk(shape)} tokens: "
                         "every chunk is one pass through the model, so tiny chunks make the encode hundreds "
                         "of times slower")


def require_chunk_fits(cache_budget: int, chunk_size: int, shape: ModelShape) -> None:
    require_chunk_size(chunk_size, shape)
    if cache_budget + chunk_size > shape.window:
        raise ValueError(f"cache budget ({cache_budget}) + chunk size ({chunk_size}) must fit the model's "
                         f"window ({shape.window})")


def require_room(budget: int, shape: ModelShape, name: str = "recompute") -> None:
    if budget >= shape.window:
        raise ValueError(f"{name} budget ({budget}) must leave room in the model's window ({shape.window}) "
                         "for the question and the answer")


def require_keep(name: str, budget: int, keep_first: int, keep_last: int) -> None:
    if keep_first < 0 or keep_last < 0:
        raise ValueError("always-kept token counts cannot be negative")
    if budget < keep_first + keep_last:
        raise ValueError(f"{name} budget ({budget}) is smaller than the always-kept first+last tokens "
                         f"({keep_first}+{keep_last})")


@dataclass
class CacheConfig(ABC):
    """Options of a recurrent method that answers from its compressed cache. The paper runs its
    recurrent baselines with chunk = cache budget = 32k (W/4) and the first/last 256 tokens always kept."""

    chunk_size: int | None = positive()
    cache_budget: int | None = positive()
    keep_first: int | None = None

    def defaults(self, shape: ModelShape) -> dict:
        return {"chunk_size": shape.window // 4, "cache_budget": shape.window // 4, "keep_first": keep_default(shape)}

    def resolve(self, shape: ModelShape):
        c = replace(self, **{k: pick(getattr(self, k), v) for k, v in self.defaults(shape).items()})
        c.check(shape)
        return c

    def check(self, shape: ModelShape) -> None:
        require_positive(chunk_size=self.chunk_size, cache_budget=self.cache_budget)
        require_chunk_fits(self.cache_budget, self.chunk_size, shape)
        self.policy()   # the policy validates its own budgets

    @abstractmethod
    def policy(self):
        """The eviction policy this method compresses with (each concrete config defines it)."""


@dataclass
class EvictionConfig(CacheConfig):
    """A cache method that keeps the best-scored tokens plus the first and last ``keep_*`` ones."""

    keep_last: int | None = None

    def defaults(self, shape: ModelShape) -> dict:
        return {**super().defaults(shape), "keep_last": keep_default(shape)}

    def check(self, shape: ModelShape) -> None:
        require_keep("cache", self.cache_budget, self.keep_first, self.keep_last)
        super().check(shape)


# Options as JSON (saved contexts' manifests, eval configs) and back --------------------------------
def to_json_value(value):
    """A resolved option as plain JSON: dtypes by name ("float16"), heads as "LAYER:KIND:HEAD", tuples as lists."""
    import torch
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if isinstance(value, (list, tuple)):
        return [to_json_value(v) for v in value]
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    return str(value)      # e.g. a HeadSpec


INPUT_ONLY = {"input_only": True}   # field metadata: resolving turns the field into other fields' values


def added_later(before) -> dict:
    """Field metadata for an option added after contexts were first saved: ``before`` is how the method
    behaved before the option existed. At that value the option is left out of the saved options (and of
    the content key, and of an eval's config hash), so contexts saved before it existed load and keep their
    store keys; a saved file without it is rebuilt at ``before``, whatever today's default, so a default
    that changes later never passes old records off as new behaviour."""
    return {"added_later": True, "before": before}


def before_added(f) -> object:
    """The value an ``added_later`` field stands for when a saved file does not name it."""
    return f.metadata.get("before", f.default)


def as_behaviour(config_cls: type | None, given: dict) -> dict:
    """The ``given`` options of a method as the behaviour they select, for keys that say which records
    are the same run (an eval's config hash): an ``added_later`` option given at the value it stands for
    when absent is dropped (it is how the method ran before the option existed), and one left out whose
    default has since moved away from that value is added at its default."""
    out = dict(given)
    for f in fields(config_cls) if config_cls is not None else ():
        if not f.metadata.get("added_later"):
            continue
        if f.name in out and out[f.name] == before_added(f):
            del out[f.name]
        elif f.name not in out and f.default != before_added(f):
            out[f.name] = f.default
    return out


def options_json(config, saved: dict | None = None) -> dict:
    """Every field of a (resolved) method config as plain JSON, but the input-only ones (``INPUT_ONLY``:
    already spelled out in the fields they set) and the ``added_later`` ones at the value they stand for
    when absent; ``{}`` for a method without options. With ``saved`` (options read from a file): those
    options in the same form (an ``added_later`` field written at that value dropped), to compare with the
    config's."""
    if config is None:
        return {}
    later_as_before = {f.name for f in fields(config) if f.metadata.get("added_later")
                       and (getattr(config, f.name) if saved is None else saved.get(f.name, before_added(f)))
                       == before_added(f)}
    if saved is not None:
        return {k: v for k, v in saved.items() if k not in later_as_before}
    return {f.name: to_json_value(getattr(config, f.name)) for f in fields(config)
            if not f.metadata.get("input_only") and f.name not in later_as_before}


def options_from_json(config_cls: type | None, data: dict) -> dict:
    """The inverse of ``options_json`` for ``config_cls``: keyword arguments that rebuild the config."""
    import torch
    if config_cls is None:
        return {}
    out = {}
    for f in fields(config_cls):
        if f.name not in data:
            if f.metadata.get("added_later") and before_added(f) != f.default:
                out[f.name] = before_added(f)   # saved before the option existed: rebuilt as it behaved then
            continue
        value, default = data[f.name], f.default
        if isinstance(default, torch.dtype):
            value = getattr(torch, str(value), None)
            if not isinstance(value, torch.dtype):
                raise ValueError(f"option {f.name}: unknown dtype {data[f.name]!r}")
        elif isinstance(value, list):
            value = ",".join(value) if f.name == "heads" else tuple(value)
        out[f.name] = value
    return out
