"""A ``Context`` as named tensors and back (the file format itself is ``reform.store.format``).

Every method's context has its token ids and, for the compressing methods, the final compressed cache of
the layers it ran: per layer the pre-RoPE keys, values and eviction scores where present. Rotated keys are
stored only where re-rotating the pre-RoPE keys at positions 0..n-1 does not reproduce them bit for bit,
so a loaded cache is exactly the saved one. The rest (REFORM's embeddings, ILRe's keys, InfLLM's block
memory, ...) comes from the method's own ``saved_state``/``restore_state``.
"""

from __future__ import annotations

import torch

from typing import TYPE_CHECKING

from ..documents.evidence import Source
from ..documents.extracted import Extracted, Mark
from ..engine.cache import KVCache, LayerCache

if TYPE_CHECKING:      # type-only: ``Context`` (base.py) imports this module to save itself
    from ..engine.core import Engine
    from .base import Context

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
            "marks": [[m.start, index[m.document], m.page, m.section] for m in doc.marks]}


def restore_source(tensors: dict[str, torch.Tensor], meta: dict | None) -> Source | None:
    """The evidence map of a saved context; None for files saved before contexts kept one."""
    if meta is None or "source.text" not in tensors:
        return None
    text = bytes(tensors["source.text"].numpy()).decode("utf-8")
    names = meta["documents"]
    marks = [Mark(start, names[d], page, section) for start, d, page, section in meta["marks"]]
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
