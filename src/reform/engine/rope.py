"""Rotary position embedding, computed with the model's own rotary module (so scaled RoPE variants
such as Llama-3's are honoured) and applied with the ``rotate_half`` layout used by HF checkpoints."""

from __future__ import annotations

import torch


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Rotary:
    """Wraps ``model.model.rotary_emb``; ``rotate(x, start)`` rotates ``x[..., t, :]`` to position ``start + t``."""

    def __init__(self, rotary_emb: torch.nn.Module, head_dim: int):
        self.emb = rotary_emb
        self.head_dim = head_dim
        self._cos = self._sin = None  # table for positions [0, len)

    def table(self, n: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin for positions 0..n-1, ``[n, head_dim]``, cached and grown on demand."""
        if self._cos is None or self._cos.shape[0] < n or self._cos.dtype != like.dtype \
                or self._cos.device != like.device:
            size = max(n, 2 * (0 if self._cos is None else self._cos.shape[0]))
            pos = torch.arange(size, device=like.device).unsqueeze(0)
            cos, sin = self.emb(like, pos)
            self._cos, self._sin = cos[0].to(like.dtype), sin[0].to(like.dtype)
        return self._cos[:n], self._sin[:n]

    def rotate(self, x: torch.Tensor, start: int) -> torch.Tensor:
        """Rotate ``x`` (``[..., T, head_dim]``) to positions ``start..start+T-1``."""
        t = x.shape[-2]
        cos, sin = self.table(start + t, x)
        cos, sin = cos[start:start + t], sin[start:start + t]
        return x * cos + rotate_half(x) * sin
