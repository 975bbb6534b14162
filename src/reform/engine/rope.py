"""Rotary position embedding as the model itself computes it, at any positions, for any layer.

The cos/sin tables come from the model's own rotary module (so every ``rope_type`` — default, linear,
llama3, yarn, dynamic, longrope — and per-layer-type tables such as Gemma 3's local/global ones are
honoured), and they are applied with the model's own ``apply_rotary_pos_emb`` (half-split, interleaved,
or partial rotary with only the first ``rot_dim`` dimensions rotated). Layers that use no RoPE at all
(SmolLM3's NoPE layers) rotate nothing.

The engine needs two things HF's forward does not give: keys un-rotated (the cache keeps pre-RoPE keys
so that kept entries can be re-packed at new positions exactly) and keys/queries rotated at positions of
its choosing. A rotation by angle ``a`` (tables scaled by ``s``) is undone by the same formula with ``cos/s^2, -sin/s^2``.
"""

from __future__ import annotations

import inspect
import sys
from contextlib import contextmanager

import torch

_LENGTH_DEPENDENT = ("dynamic", "longrope")   # rope types whose frequencies depend on the largest position


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _half_split(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + rotate_half(x) * sin


def _rope_types(emb: torch.nn.Module) -> set[str]:
    kinds = getattr(emb, "rope_type", "default")
    return set(kinds.values()) if isinstance(kinds, dict) else {kinds}


class Rotary:
    """``rotate(x, start, layer)`` turns pre-RoPE states ``x`` (``[..., T, head_dim]``) into the states the
    model's layer ``layer`` computes at positions ``start..start+T-1``; ``unrotate`` is its inverse;
    ``cos_sin`` gives the tables the layer itself is handed (``[1, T, rot_dim]``)."""

    def __init__(self, rotary_emb: torch.nn.Module, attention: list, config):
        """``rotary_emb``: the model's rotary module; ``attention``: each layer's attention module;
        ``config``: the decoder's (text) config."""
        self.emb = rotary_emb
        self.config = config
        layer_types = getattr(self.config, "layer_types", None)
        takes_type = "layer_type" in inspect.signature(self.emb.forward).parameters
        self.table_key = [layer_types[i] if takes_type and layer_types else None for i in range(len(attention))]
        self.uses_rope = [bool(getattr(attn, "use_rope", True)) for attn in attention]
        self.length_dependent = bool(_rope_types(self.emb) & set(_LENGTH_DEPENDENT))
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self._apply, self._partial = zip(*(self._pick_apply(i, a, head_dim) for i, a in enumerate(attention)))
        self._tables: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        self._span: int | None = None

    @contextmanager
    def spanning(self, n: int | None):
        """Inside the block, length-dependent rope types use the frequencies transformers picks for a
        forward call over ``n`` positions (one sequence prefilled in chunks then equals one call over it)."""
        old, self._span = self._span, n
        try:
            yield
        finally:
            self._span = old
    def _pick_apply(self, layer: int, attn: torch.nn.Module, head_dim: int):
        """How layer ``layer`` rotates a ``[H, T, head_dim]`` tensor with its tables: the fast half-split
        formula when the module's own ``apply_rotary_pos_emb`` computes exactly that; else the module's
        function on the whole head (it may rotate part of it itself, as GLM's and Phi-3's do, or take
        half-size tables, as GPT-OSS's does); else, when it only accepts the first ``rot_dim`` dimensions
        (StableLM, Phi), the function on those, the rest passed through."""
        fn = getattr(sys.modules.get(type(attn).__module__), "apply_rotary_pos_emb", None)
        dev = next((b.device for b in self.emb.buffers()), torch.device("cpu"))   # some modules never move inv_freq
        table, _ = self._call(torch.zeros(1, device=dev), torch.arange(2, device=dev)[None], self.table_key[layer])
        r = table.shape[-1]
        g = torch.Generator().manual_seed(0)
        x, ang = torch.randn(3, 5, head_dim, generator=g), torch.rand(5, (r + 1) // 2, generator=g) * 6
        cos, sin = torch.cat([ang.cos(), ang.cos()], -1)[:, :r], torch.cat([ang.sin(), ang.sin()], -1)[:, :r]
        if fn is None:
            return _half_split, r < head_dim
        for own in (lambda x, cos, sin: fn(x, x, cos, sin, unsqueeze_dim=0)[0],
                    lambda x, cos, sin: fn(x, x, cos, sin)[0]):                 # a signature without unsqueeze_dim
            try:
                whole = own(x, cos, sin)
            except TypeError:
                continue
            except RuntimeError:                                                # only the rotated part fits
                return own, True
            return (_half_split if r == head_dim and torch.equal(whole, _half_split(x, cos, sin)) else own), False
        return _half_split, r < head_dim

    def cos_sin(self, layer: int, start: int, t: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The cos/sin the model hands layer ``layer`` for positions ``start..start+T-1``, ``[1, T, rot_dim]``.

        Length-dependent rope types (dynamic NTK, longrope) use the frequencies of a forward call whose
        last position is ``start + T - 1``, or of the whole span set by ``spanning``; the others come from
        one table."""
        kind = self.table_key[layer]
        if self.length_dependent:
            if self._span is None or start + t > self._span:
                return self._call(like, torch.arange(start, start + t, device=like.device)[None], kind)
            key = (kind, like.dtype, like.device, self._span)
            if key not in self._tables:
                self._tables = {k: v for k, v in self._tables.items() if len(k) == 3}   # one span at a time
                self._tables[key] = self._call(like, torch.arange(self._span, device=like.device)[None], kind)
            cos, sin = self._tables[key]
            return cos[:, start:start + t], sin[:, start:start + t]
        key = (kind, like.dtype, like.device)
        cos, sin = self._tables.get(key, (None, None))
        if cos is None or cos.shape[1] < start + t:
            size = max(start + t, 2 * (0 if cos is None else cos.shape[1]))
            cos, sin = self._call(like, torch.arange(size, device=like.device)[None], kind)
            self._tables[key] = cos, sin
        return cos[:, start:start + t], sin[:, start:start + t]

    def _call(self, like, pos, kind):
        cos, sin = self.emb(like, pos) if kind is None else self.emb(like, pos, kind)
        return cos.to(like.dtype), sin.to(like.dtype)

    def rotate(self, x: torch.Tensor, start: int, layer: int = 0, *, inverse: bool = False) -> torch.Tensor:
        """Rotate ``x`` (``[H, T, D]``) to positions ``start..start+T-1`` as layer ``layer`` does."""
        if not self.uses_rope[layer]:
            return x
        cos, sin = self.cos_sin(layer, start, x.shape[-2], x)
        cos, sin = cos[0], sin[0]
        if inverse:   # tables may carry an attention scale s (YaRN, longrope): undo s too, not just the angle
            norm = cos * cos + sin * sin
            cos, sin = cos / norm, -sin / norm
        return self._with(layer, x, cos, sin)

    def unrotate(self, x: torch.Tensor, start: int, layer: int = 0) -> torch.Tensor:
        """Pre-RoPE states of ``x`` rotated at ``start..``: the same rotation by minus the angle."""
        return self.rotate(x, start, layer, inverse=True)

    def at(self, x: torch.Tensor, positions: torch.Tensor, layer: int = 0) -> torch.Tensor:
        """Rotate ``x`` (``[H, T, D]``) to arbitrary ``positions`` (``[T]``)."""
        if not self.uses_rope[layer]:
            return x
        cos, sin = self._call(x, positions[None], self.table_key[layer])
        return self._with(layer, x, cos[0], sin[0])

    def _with(self, layer: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if not self._partial[layer]:
            return self._apply[layer](x, cos, sin)
        r = cos.shape[-1]
        return torch.cat([self._apply[layer](x[..., :r], cos, sin), x[..., r:]], dim=-1)   # partial rotary
