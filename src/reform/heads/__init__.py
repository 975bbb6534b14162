"""Embedding-head presets: which (layer, q|k|v, head) states build REFORM's retrieval embeddings.

Layer 2 of docs/architecture.md (model knowledge): presets are found by model id; ``select`` computes
new ones (paper §3.2, appendix C)."""

from __future__ import annotations

import json
import warnings
from importlib import resources
from pathlib import Path

from ..engine.shape import ModelShape
from ..engine.extractors import HeadSpec
from ..notes import GuessedHeadsWarning


def _norm(name: str) -> str:
    return name.lower().rstrip("/").split("/")[-1].removesuffix(".gguf")


def load_preset(path: str | Path) -> dict:
    """Read a preset JSON: ``{"model": ..., "heads": ["LAYER:KIND:HEAD", ...], "defaults": {...}}``, where the
    optional ``defaults`` are REFORM options tuned for that model (e.g. ``recompute_budget``)."""
    try:
        data = json.loads(Path(path).read_text())
        data["heads"] = [HeadSpec.parse(h) if isinstance(h, str) else HeadSpec(h["layer"], h["kind"], h["head"])
                         for h in data["heads"]]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
        raise ValueError(f"cannot read head preset {path}: {e}") from None
    return data


def shipped_presets() -> list[dict]:
    folder = resources.files(__package__) / "presets"
    return [load_preset(Path(str(f))) for f in sorted(folder.iterdir(), key=lambda f: f.name)
            if f.name.endswith(".json")]


def find_preset(model_name: str) -> dict | None:
    """The shipped preset whose model id or alias matches ``model_name`` (case-insensitive, by basename)."""
    key = _norm(model_name)
    for p in shipped_presets():
        names = [p["model"], *p.get("aliases", [])]
        if any(_norm(n) == key or _norm(n) in key for n in names):
            return p
    return None


def fallback_heads(shape: ModelShape) -> list[HeadSpec]:
    """Used when no preset exists: value heads of a layer at 40 % depth (retrieval heads concentrate in
    the lower-middle layers, REFORM §3.2). A guess; run head selection for real heads."""
    layer = int(0.4 * shape.n_layers)
    return [HeadSpec(layer, "v", h) for h in range(min(4, shape.n_kv_heads))]


def resolve_heads(spec: str | list | None, model_name: str, shape: ModelShape) -> list[HeadSpec]:
    """``spec``: None (preset for the model), a preset JSON path, heads "7:v:3,14:k:0", or the ablations
    of REFORM Table 6a: "random[:SEED]" (4 random heads below 70 % depth) and "worst" (the 4 worst by MNR
    in the model's preset)."""
    if isinstance(spec, str) and (spec == "random" or spec.startswith("random:")):
        from .select import random_heads
        seed = spec.partition(":")[2]
        if seed and not seed.isdigit():
            raise ValueError(f"bad heads '{spec}': use random or random:SEED")
        return random_heads(shape, int(seed or 0))
    if spec == "worst":
        from .select import MNRTable
        preset = find_preset(model_name)
        if preset is None or "table" not in preset:
            raise ValueError(f"--heads worst needs a preset with an MNR table for '{model_name}'")
        return MNRTable.from_json(preset["model"], preset["table"]).worst()
    if spec is None or spec == "":
        preset = find_preset(model_name)
        if preset is None:
            from ..model import PACKAGED
            heads = fallback_heads(shape)
            name = next((m.name for m in PACKAGED.values() if m.hub_id == model_name), model_name)
            warnings.warn(f"no embedding-head preset for '{model_name}': guessing heads {','.join(map(str, heads))} "
                          "(value heads at 40 % depth); compute real ones with `reform heads select --model "
                          f"{name} --out heads.json` and pass `--heads heads.json`", GuessedHeadsWarning, stacklevel=2)
        else:
            heads = preset["heads"]
    elif isinstance(spec, (list, tuple)):
        heads = [h if isinstance(h, HeadSpec) else HeadSpec.parse(h) for h in spec]
    elif spec.endswith(".json"):
        heads = load_preset(spec)["heads"]
    else:
        heads = [HeadSpec.parse(h) for h in spec.split(",") if h.strip()]
    if not heads:
        raise ValueError("no embedding heads given")
    for h in heads:
        h.check(shape)
    return list(dict.fromkeys(heads))
