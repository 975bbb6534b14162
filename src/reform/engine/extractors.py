"""Extractors: what the engine stores per input token while it encodes (REFORM §3.1-3.2)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from .core import ModelShape

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
        self.by_layer: dict[int, list[tuple[int, HeadSpec]]] = {}
        for j, h in enumerate(heads):
            self.by_layer.setdefault(h.layer, []).append((j, h))
        self.data = torch.empty(n_tokens, len(heads) * self.d, dtype=dtype, device=device)
        self._span = slice(0, 0)

    @property
    def exit_layers(self) -> int:
        """Number of layers the encoder must run: up to the deepest embedding head (early exit)."""
        return max(h.layer for h in self.heads) + 1

    def begin(self, offset: int, length: int) -> None:
        self._span = slice(offset, offset + length)

    def on_qkv(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        for j, h in self.by_layer.get(layer, ()):
            state = {"q": q, "k": k, "v": v}[h.kind][h.head]                    # [T, D]
            self.data[self._span, j * self.d:(j + 1) * self.d] = F.normalize(state.float(), dim=-1)
