"""Extractors: what the engine stores per input token while it encodes (REFORM §3.1-3.2)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from .shape import ModelShape

Kind = Literal["q", "k", "v"]


@dataclass(frozen=True)
class HeadSpec:
    """One embedding head: decoder ``layer`` (0-based), projection ``kind`` and head index.

    For ``q`` the index is a query head; for ``k``/``v`` it is a KV head (``0 .. n_kv_heads-1``).
    """

    layer: int
    kind: Kind
    head: int

    def __str__(self) -> str:
        return f"{self.layer}:{self.kind}:{self.head}"

    @classmethod
    def parse(cls, text: str) -> "HeadSpec":
        """Parse ``LAYER:KIND:HEAD``, e.g. ``7:v:3``."""
        parts = text.strip().split(":")
        if len(parts) != 3 or parts[1] not in ("q", "k", "v") or not (parts[0].isdigit() and parts[2].isdigit()):
            raise ValueError(f"bad head '{text}': expected LAYER:KIND:HEAD with KIND one of q,k,v (e.g. 7:v:3)")
        return cls(int(parts[0]), parts[1], int(parts[2]))  # type: ignore[arg-type]

    def check(self, shape: ModelShape) -> None:
        limit = shape.n_heads if self.kind == "q" else shape.n_kv_heads
        if not 0 <= self.layer < shape.n_layers:
            raise ValueError(f"head {self}: layer must be in 0..{shape.n_layers - 1}")
        if not 0 <= self.head < limit:
            raise ValueError(f"head {self}: a {self.kind} head index must be in 0..{limit - 1}")


class HeadEmbeddings:
    """Per-token retrieval embeddings from a few attention heads (REFORM §3.2).

    Each head's pre-RoPE Q, K or V state is L2-normalised and the heads are concatenated, so the dot
    product of two embeddings divided by the head count is the mean of per-head cosines. Stored in half
    precision, ``len(heads) * head_dim`` numbers per token: the only state that grows with the input.
    """

    def __init__(self, heads: list[HeadSpec], shape: ModelShape, n_tokens: int, device=None,
                 dtype: torch.dtype = torch.float16):
        for h in heads:
            h.check(shape)
        self.heads, self.d = heads, shape.head_dim
        # (layer, kind) -> (slots in the concatenation, head indices), so each group is one batched write
        self.groups: dict[int, list[tuple[str, torch.Tensor, torch.Tensor]]] = {}
        for layer in sorted({h.layer for h in heads}):
            for kind in "qkv":
                slots = [j for j, h in enumerate(heads) if h.layer == layer and h.kind == kind]
                if slots:
                    self.groups.setdefault(layer, []).append(
                        (kind, torch.tensor(slots), torch.tensor([heads[j].head for j in slots])))
        self.data = torch.empty(n_tokens, len(heads) * self.d, dtype=dtype, device=device)
        self._span = slice(0, 0)

    @classmethod
    def from_data(cls, heads: list[HeadSpec], shape: ModelShape, data: torch.Tensor) -> "HeadEmbeddings":
        """Embeddings stored before (a saved context's), ``[n_tokens, len(heads) * head_dim]``."""
        emb = cls(heads, shape, 0, data.device, data.dtype)
        if data.shape[1:] != emb.data.shape[1:]:
            raise ValueError(f"embeddings of width {data.shape[1]} do not match {len(heads)} heads of {emb.d} dims")
        emb.data = data
        return emb

    @property
    def nbytes(self) -> int:
        """Memory the stored embeddings take (what REFORM keeps per input token)."""
        return self.data.numel() * self.data.element_size()

    @property
    def layers(self) -> set[int]:
        """The layers whose Q/K/V states this extractor reads (the engine taps no others)."""
        return set(self.groups)

    @property
    def exit_layer(self) -> int:
        """The deepest embedding head's layer (early exit): the encoder runs the layers below it in full
        and of this one only the Q/K/V projections (``Engine.forward(..., qkv_only_next=True)``)."""
        return max(h.layer for h in self.heads)

    def begin(self, offset: int, length: int) -> None:
        self._span = slice(offset, offset + length)

    def on_qkv(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        rows = self.data[self._span].view(-1, len(self.heads), self.d)            # [T, heads, D] view
        for kind, slots, idx in self.groups.get(layer, ()):
            state = {"q": q, "k": k, "v": v}[kind][idx.to(q.device)]              # [n, T, D]
            rows[:, slots.to(rows.device)] = F.normalize(state.float(), dim=-1).transpose(0, 1).to(rows.dtype)
