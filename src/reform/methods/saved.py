"""A ``Context`` to a file and back: the saved-context round trip (the file format itself is
``reform.store.format``). ``Context.save`` and ``Pipeline.load_context`` both come here.

Every method's context has its token ids and, for the compressing methods, the final compressed cache of
the layers it ran: per layer the pre-RoPE keys, values and eviction scores where present. Rotated keys are
stored only where re-rotating the pre-RoPE keys at positions 0..n-1 does not reproduce them bit for bit,
so a loaded cache is exactly the saved one. The rest (REFORM's embeddings, ILRe's keys, InfLLM's block
memory, ...) comes from the method's own ``saved_state``/``restore_state``. A file is read back only by
the model, tokenizer, prompt layout and dtype it was made with (``check_identity``).
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from ..documents.evidence import Source
from ..documents.extracted import Extracted, Mark
from ..engine.cache import KVCache, LayerCache
from ..engine.core import Engine
from ..store.format import ContextFileError, ids_sha256, read_manifest, read_tensors, write_context_file
from ..version import __version__
from .base import REGISTRY, Context, Method, Runtime
from .options import options_from_json, options_json

DTYPE_FLAGS = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}

_CACHE_PARTS = ("keys_pre", "keys", "values", "scores")


def context_tensors(ctx: Context) -> tuple[dict[str, torch.Tensor], dict]:
    """``(tensors, cache layout)``: what a saved context file holds besides its manifest."""
    if int(ctx.ids.max()) >= 2**31:
        raise ValueError("token ids beyond int32 cannot be saved")
    tensors = {"ids": ctx.ids.to(torch.int32)}
    layout = None
    if ctx.cache is not None:
        rotary, layout = ctx.pipeline.engine.rotary, []
        for i, lc in enumerate(ctx.cache.layers):
            keys = "absent"
            if lc.keys is not None:
                keys = "rotated" if torch.equal(rotary.rotate(lc.keys_pre, 0, lc.layer), lc.keys) else "stored"
            layout.append({"layer": lc.layer, "window": lc.window, "keys": keys})
            for part in _CACHE_PARTS:
                t = getattr(lc, part)
                if t is not None and not (part == "keys" and keys == "rotated"):
                    tensors[f"cache.{i}.{part}"] = t
    if ctx.image_rows is not None:       # what the context's image ids stand for (recomputed from them)
        tensors["image_rows"] = ctx.image_rows
    state = ctx.method.saved_state(ctx)
    tensors.update({f"state.{k}": v for k, v in state.items()})
    meta = {"cache": layout}
    if ctx.source is not None:         # the evidence map: the extracted text, its marks, token -> character
        tensors["source.text"] = torch.frombuffer(bytearray(ctx.source.document.text.encode("utf-8")), dtype=torch.uint8)
        tensors["source.token_starts"] = ctx.source.token_starts.to(torch.int32)
        meta["source"] = source_manifest(ctx.source)
    return tensors, meta


def source_manifest(source: Source) -> dict:
    doc = source.document
    names = list(dict.fromkeys(m.document for m in doc.marks))
    index = {n: i for i, n in enumerate(names)}
    return {"kind": doc.kind, "pages": doc.pages, "documents": names,
            "marks": [m.stored(index[m.document]) for m in doc.marks]}


def restore_source(tensors: dict[str, torch.Tensor], meta: dict | None) -> Source | None:
    """The evidence map of a saved context; None for files saved before contexts kept one."""
    if meta is None or "source.text" not in tensors:
        return None
    text = bytes(tensors["source.text"].numpy()).decode("utf-8")
    names = meta["documents"]
    marks = [Mark(start, names[d], page, section, *unit) for start, d, page, section, *unit in meta["marks"]]
    return Source(Extracted(text, marks, meta.get("kind", "text"), meta.get("pages", 0)),
                  tensors["source.token_starts"].to(torch.int32))


def restore_parts(engine: Engine, tensors: dict[str, torch.Tensor], layout: list | None
                  ) -> tuple[torch.Tensor, KVCache | None, dict[str, torch.Tensor]]:
    """``(ids, cache, method state)`` from ``context_tensors``' output, on ``engine``'s device; the caller
    builds the ``Context`` and hands the state to its method's ``restore_state``."""
    device, rotary = engine.device, engine.rotary
    on_device = lambda t: t.to(device)
    cache = None
    if layout is not None:
        cache = KVCache([])
        for i, entry in enumerate(layout):
            parts = {p: on_device(tensors[f"cache.{i}.{p}"]) for p in _CACHE_PARTS if f"cache.{i}.{p}" in tensors}
            lc = LayerCache(window=entry["window"], layer=entry["layer"], **parts)
            if entry["keys"] == "rotated":
                lc.keys = rotary.rotate(lc.keys_pre, 0, lc.layer)
            cache.layers.append(lc)
    state = {k[len("state."):]: on_device(v) for k, v in tensors.items() if k.startswith("state.")}
    return on_device(tensors["ids"].long()), cache, state


def context_bytes(ctx: Context) -> int:
    """The bytes of ``ctx``'s tensors as ``save_context`` writes them (the file adds its small manifest)."""
    return sum(t.numel() * t.element_size() for t in context_tensors(ctx)[0].values())


def save_context(ctx: Context, path: str | Path, *, partial: dict | None = None) -> int:
    """Write ``ctx`` to ``path`` (one safetensors file with a JSON manifest, atomically); returns bytes
    written. ``partial``: this is an unfinished encode's state (``methods/checkpoint.py``)."""
    tensors, layout = context_tensors(ctx)
    manifest = {"library_version": __version__, "model": ctx.pipeline.identity,
                "method": {"name": ctx.method.name, "options": options_json(ctx.method.config)},
                "tokens": int(ctx.ids.shape[0]), "ids_sha256": ids_sha256(ctx.ids),
                "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "encode": {"seconds": round(ctx.encode_seconds, 3)}, **layout,
                **({"partial": partial} if partial is not None else {})}
    return write_context_file(path, tensors, manifest)


def load_context(pipe: Runtime, path: str | Path, *, unfinished: bool = False) -> Context:
    """The context saved at ``path``, checked to belong to ``pipe``'s model (config, weights, tokenizer,
    layout, dtype), rebuilt with the method and options it was encoded with. Raises ``ContextFileError``
    (one line) for a missing, truncated, corrupted or foreign file, and for an unfinished encode's
    checkpoint unless ``unfinished``."""
    t = time.perf_counter()
    manifest = read_manifest(path)
    if "partial" in manifest and not unfinished:
        done = (manifest["partial"] or {}).get("tokens", "?")
        raise ContextFileError(f"{path} is an unfinished encode ({done} of {manifest.get('tokens', '?')} tokens): "
                               "run the encode again with it as its checkpoint to finish it")
    check_identity(pipe.identity, manifest.get("model") or {}, path)
    try:
        method = method_from(pipe, manifest.get("method") or {})
    except ValueError as e:
        raise ContextFileError(f"{path}: {e}") from None
    tensors = read_tensors(path, manifest)
    if "ids" not in tensors or ids_sha256(tensors["ids"]) != manifest.get("ids_sha256"):
        raise ContextFileError(f"{path} is corrupted: its token ids do not match their digest")
    engine = pipe.engine
    try:
        ids, cache, state = restore_parts(engine, tensors, manifest.get("cache"))
        ctx = Context(pipe, method, ids, cache=cache, image_rows=tensors.get("image_rows"),
                      source=restore_source(tensors, manifest.get("source")))
        if ctx.image_rows is not None:
            ctx.image_rows = ctx.image_rows.to(engine.device, engine.dtype)
        if int(ids.max()) >= engine.vocab + (0 if ctx.image_rows is None else ctx.image_rows.shape[0]):
            raise ValueError("its token ids name image positions it holds no embeddings for")
        method.restore_state(ctx, state)
    except (KeyError, ValueError, RuntimeError) as e:
        raise ContextFileError(f"{path} is corrupted: {e}") from None
    ctx.load_seconds = time.perf_counter() - t
    return ctx


def check_identity(mine: dict, saved: dict, path) -> None:
    """Refuse, in one line, a context made with another model, tokenizer, layout or dtype."""
    made = saved.get("name", "another model")
    if saved.get("tokenizer_sha256") != mine["tokenizer_sha256"]:
        raise ContextFileError(f"{path} was encoded with another tokenizer (model {made}); ask it with "
                               f"--model {saved.get('source', made)}")
    if saved.get("config_sha256") != mine["config_sha256"] or saved.get("weights_sha256") != mine["weights_sha256"]:
        raise ContextFileError(f"{path} was encoded with another model ({made}); ask it with "
                               f"--model {saved.get('source', made)}")
    if saved.get("layout_sha256") != mine["layout_sha256"]:
        raise ContextFileError(f"{path} was encoded with another prompt layout (chat template on/off)")
    if saved.get("dtype") != mine["dtype"]:
        raise ContextFileError(f"{path} was encoded in {saved.get('dtype')} and this model runs in "
                               f"{mine['dtype']}; load it with --dtype {DTYPE_FLAGS.get(saved.get('dtype'), '?')}")


def method_from(pipe: Runtime, spec: dict) -> Method:
    """The method a saved context names, rebuilt from its resolved options."""
    name = spec.get("name")
    if name not in REGISTRY:
        raise ValueError(f"method '{name}' is not known to this version of reform")
    cls = REGISTRY[name]
    method = cls.create(pipe.engine.shape, pipe.model_name, None,
                        **options_from_json(cls.Config, spec.get("options") or {}))
    if options_json(method.config) != options_json(method.config, spec.get("options") or {}):
        raise ValueError(f"method '{name}' cannot be rebuilt with the saved options {spec.get('options')}")
    return method
