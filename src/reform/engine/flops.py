"""Model FLOPs actually executed by the engine, counted analytically as it runs.

The benchmark divides these by wall time and by the machine's measured matmul throughput (FLOP
efficiency). Counts follow the usual convention: a multiply-add is 2 FLOPs; only matmul work is counted
(projections, MLP, attention scores and values, eviction scores, LM head), not norms or softmax.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


def linear_flops_per_token(layer: torch.nn.Module) -> int:
    """2 x (weights of every nn.Linear in one decoder layer): the projection + MLP FLOPs of one token."""
    return 2 * sum(m.weight.numel() for m in layer.modules() if isinstance(m, torch.nn.Linear))


def qkv_flops_per_token(attn: torch.nn.Module) -> int:
    """2 x (weights of the attention module's linears but its output projection): the Q/K/V FLOPs of
    one token (separate ``q_proj``/``k_proj``/``v_proj`` or a fused ``qkv_proj``)."""
    out = getattr(attn, "o_proj", None) or getattr(attn, "dense", None)
    skip = out.weight.numel() if isinstance(out, torch.nn.Linear) else 0
    return linear_flops_per_token(attn) - 2 * skip


def causal_attention_flops(n_heads: int, head_dim: int, start: int, t: int, window: int | None = None) -> int:
    """QK^T and PV for ``t`` queries at positions start..start+t-1, each attending to the keys up to
    itself (``window``: only the last ``window`` of them, a sliding-window layer): sum_i min(start + i + 1,
    window) keys, 2 matmuls of 2 FLOPs per multiply-add."""
    first, last = start + 1, start + t               # keys the first and the last query read, unwindowed
    if window is None or last <= window:
        keys = (first + last) * t // 2
    elif first > window:
        keys = window * t
    else:
        keys = (first + window) * (window - first + 1) // 2 + window * (last - window)
    return 4 * n_heads * head_dim * keys


@dataclass
class FlopCounter:
    """Running totals by kind; ``Engine`` adds to its ``flops`` counter in every layer it runs."""

    counts: dict[str, int] = field(default_factory=dict)

    def add(self, kind: str, flops: int) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + int(flops)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def reset(self) -> None:
        self.counts.clear()
