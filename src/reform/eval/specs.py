"""What an evaluation is asked to run: lengths ("8k", "1M") and methods with options
(``"reform:recompute_budget=512"``), parsed and checked before any model is loaded."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Iterable


# ---------------------------------------------------------------- lengths ("8k", "1M")
_LENGTH = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmM]?)\s*$")


def parse_length(text: str) -> int:
    """``"8k"`` -> 8192, ``"1M"`` -> 1048576, ``"3000"`` -> 3000 (k = 1024, as RULER's lengths)."""
    m = _LENGTH.match(str(text))
    if not m:
        raise ValueError(f"bad length '{text}': use a token count such as 4096, 8k or 1M")
    n = int(float(m.group(1)) * {"": 1, "k": 1024, "m": 1024 ** 2}[m.group(2).lower()])
    if n < 1:
        raise ValueError(f"bad length '{text}': it must be at least 1 token")
    return n


def parse_lengths(text: str) -> list[int]:
    items = [t for t in text.split(",") if t.strip()]
    if not items:
        raise ValueError("no lengths given: use e.g. --lengths 8k,16k,32k")
    return sorted(set(map(parse_length, items)))


def format_length(n: int) -> str:
    for unit, size in (("M", 1024 ** 2), ("k", 1024)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


# ---------------------------------------------------------------- methods with options
def option_value(text: str):
    """A method option's value from the command line: int, float, true/false, else the string."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


RUN_OPTIONS = {"query_aware": bool}
"""Options of how the evaluation runs a method rather than of the method: ``query_aware=true`` encodes
each context with its first question appended, as query-aware compression (SnapKV-style) sees the
question while it compresses; every question, the first included, is then asked as usual."""


@dataclass(frozen=True)
class MethodSpec:
    """A method by name plus options (fields of its config, or ``RUN_OPTIONS``); ``label`` names it in
    every output."""

    name: str
    options: tuple = ()      # sorted (key, value) pairs, so specs hash and compare by value

    @classmethod
    def of(cls, item) -> "MethodSpec":
        """From ``"reform"``, ``"reform:recompute_budget=512"``, ``("reform", {...})`` or
        ``{"name": "reform", "recompute_budget": 512}``."""
        if isinstance(item, MethodSpec):
            return item
        if isinstance(item, dict):
            item = dict(item)
            return cls.of((item.pop("name", ""), item))
        if isinstance(item, tuple):
            name, options = item
            return cls(str(name).strip(), tuple(sorted((k, v) for k, v in options.items() if v is not None)))
        return cls.parse(str(item))

    @classmethod
    def parse(cls, text: str) -> "MethodSpec":
        name, *parts = text.strip().split(":")
        options = {}
        for part in parts:
            key, eq, value = part.partition("=")
            if not eq or not key.strip():
                raise ValueError(f"bad method option '{part}' in '{text}': use NAME:OPTION=VALUE[:OPTION=VALUE]")
            options[key.strip()] = option_value(value.strip())
        return cls.of((name, options))

    @property
    def label(self) -> str:
        if not self.options:
            return self.name
        return f"{self.name}({','.join(f'{k}={v}' for k, v in self.options)})"

    @property
    def method_options(self) -> dict:
        """The options that go to the method (``RUN_OPTIONS`` left out)."""
        return {k: v for k, v in self.options if k not in RUN_OPTIONS}

    @property
    def query_aware(self) -> bool:
        return bool(dict(self.options).get("query_aware", False))

    def check(self) -> None:
        """Refuse an unknown method or options it does not take (no model needed)."""
        from ..pipeline import check_method_options
        if not self.name:
            raise ValueError("a method name is empty")
        for key, kind in RUN_OPTIONS.items():
            value = dict(self.options).get(key, kind())
            if not isinstance(value, kind):
                raise ValueError(f"option {key} of '{self.label}' must be true or false, got {value!r}")
        check_method_options(self.name, **self.method_options)

    def config_hash(self, model_name: str, use_chat_template: bool = True) -> str:
        """What the predictions depend on besides the row: model, method, options, prompt layout."""
        key = json.dumps({"model": model_name, "method": self.name, "options": [list(o) for o in self.hashed_options],
                          "chat_template": use_chat_template}, sort_keys=True, default=str)
        return hashlib.sha1(key.encode()).hexdigest()[:12]

    @property
    def hashed_options(self) -> list:
        """The options as the behaviour they select (``as_behaviour``): ``reform`` answered before
        ``run_peaks`` was on by default hashes as ``reform:run_peaks=0`` does today, and not as ``reform``."""
        from ..methods.base import REGISTRY
        from ..methods.options import as_behaviour
        config_cls = getattr(REGISTRY.get(self.name), "Config", None)
        given = dict(self.options)
        run = {k: v for k, v in given.items() if k in RUN_OPTIONS}
        return sorted((as_behaviour(config_cls, self.method_options) | run).items())

    def to_json(self, model_name: str, use_chat_template: bool = True) -> dict:
        return {"label": self.label, "name": self.name, "options": dict(self.options),
                "config_hash": self.config_hash(model_name, use_chat_template)}


def method_specs(methods: Iterable) -> list[MethodSpec]:
    """Normalise and check a method list (names, "name:opt=value" strings, tuples or dicts)."""
    specs = [MethodSpec.of(m) for m in methods]
    if not specs:
        raise ValueError("no methods given: use e.g. --methods reform,truncate")
    labels = [s.label for s in specs]
    if len(set(labels)) < len(labels):
        raise ValueError(f"a method is listed twice: {', '.join(sorted({x for x in labels if labels.count(x) > 1}))}")
    for spec in specs:
        spec.check()
    return specs
