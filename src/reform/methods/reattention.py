"""ReAttention (Liu et al., ICLR 2025, "ReAttention: Training-Free Infinite Context with Finite Attention
Scope", arXiv 2407.15176).

Every layer keeps the full KV cache of the input, keys without rotary positions (§2.1). Before each
block of queries attends (each 512-token prefill chunk, the question, every generated token; Algorithms
1-2), the layer selects from that cache by itself:

1. **Position-agnostic top-k** (§2.1, Eq. 2): every (query head, query) pair takes its ``top_k`` (4)
   middle keys by the plain dot product q·k of pre-RoPE states, the middle being the cache between the
   ``global`` first tokens and the ``local`` window;
2. **Vote**: the pairs' picks are counted and the ``k'`` most voted tokens win, one selection shared by
   every head of the layer (count-based, as the authors' code; ties go to the earlier token);
3. **Spans**: each winner brings the ``span_size`` (32) tokens centred on it, clamped to the middle,
   deduplicated, in original order;
4. **Attention** (§2.2, Eq. 3) over [global | selected spans | local window incl. the block itself] with
   positions rotated afresh at 0..n-1: the scope never exceeds the window, so no position is unseen.

Scaled as the paper sets it for LLaMA3-8B-8K, with the scope equal to the window W: global = span = 32,
local = W/2, k' = (W - global - local) / span (127 for W = 8192), chunk 512. The top-k scoring runs over
key tiles with a running top-k, never holding the full query x middle score matrix.

Not modelled: the fused Triton kernel (and its approximation of at most one pick per 128-key tile);
the authors' 128-alignment of chunk and local sizes. GQA maps query head h to KV head h // (H / H_kv)
(the released decode path pairs it with h % H_kv, which the notes flag as a bug).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ..engine.shape import ModelShape
from ..engine.policies import KVStore, ReAttentionPolicy
from .base import CachedMethod, Context, register
from .options import pick, require_chunk_size, require_positive


@dataclass
class ReAttentionConfig:
    """ReAttention's knobs (§3.1). ``cache_budget`` is the attention scope (W by default: the paper's
    8192 for LLaMA3-8B-8K); ``keep_first`` the global tokens (32); ``local_size`` the local window (W/2,
    the paper's 4096 of 8192); ``span_size`` 32; ``top_k`` 4; k' = ``spans`` what the scope leaves;
    ``chunk_size`` 512 (below the local size, as the paper requires). Global and span sizes shrink to
    W/16 for windows under 512."""

    chunk_size: int | None = None
    cache_budget: int | None = None
    keep_first: int | None = None
    local_size: int | None = None
    span_size: int | None = None
    top_k: int = 4

    @property
    def spans(self) -> int:
        return (self.cache_budget - self.keep_first - self.local_size) // self.span_size

    def resolve(self, shape: ModelShape) -> "ReAttentionConfig":
        w = shape.window
        local = pick(self.local_size, w // 2)
        c = replace(self, chunk_size=pick(self.chunk_size, min(512, local // 2)),
                    cache_budget=pick(self.cache_budget, w), keep_first=pick(self.keep_first, min(32, w // 16)),
                    local_size=local, span_size=pick(self.span_size, min(32, w // 16)))
        c.check(shape)
        return c

    def check(self, shape: ModelShape) -> None:
        require_positive(chunk_size=self.chunk_size, cache_budget=self.cache_budget, local_size=self.local_size,
                         span_size=self.span_size, top_k=self.top_k)
        require_chunk_size(self.chunk_size, shape)
        if self.keep_first < 0:
            raise ValueError("the global token count cannot be negative")
        if self.cache_budget > shape.window:
            raise ValueError(f"attention scope ({self.cache_budget}) must fit the model's window ({shape.window})")
        if self.chunk_size >= self.local_size:
            raise ValueError(f"chunk size ({self.chunk_size}) must be smaller than the local window "
                             f"({self.local_size}): each chunk attends inside it")
        if self.spans < 1:
            raise ValueError(f"attention scope ({self.cache_budget}) leaves no room for a {self.span_size}-token span "
                             f"after {self.keep_first} global and {self.local_size} local tokens")

    def policy(self) -> ReAttentionPolicy:
        return ReAttentionPolicy(self.keep_first, self.local_size, self.spans, self.span_size, self.top_k)


@register
class ReAttention(CachedMethod):
    """Encode chunk by chunk through all layers, each selecting from its full pre-RoPE cache; the question
    and every generated token select again, layer by layer."""

    name = "reattention"
    sliding_windows = False   # its arrangement splices retrieved entries into every layer
    Config = ReAttentionConfig

    def state(self, policy: ReAttentionPolicy) -> ReAttentionPolicy:
        return policy

    def saved_state(self, ctx: Context) -> dict[str, torch.Tensor]:
        """Each layer's full pre-RoPE keys and values (the stores the question and answer select from)."""
        return {f"store.{i}.{name}": getattr(s, name)[:, :s.n] for i, s in enumerate(ctx.state.stores) if s.n
                for name in ("keys", "values")}

    def restore_state(self, ctx: Context, tensors: dict[str, torch.Tensor]) -> None:
        policy = self.config.policy()
        for i in range(ctx.pipeline.engine.shape.n_layers):
            policy.stores.append(KVStore())
            if f"store.{i}.keys" in tensors:
                policy.stores[i].append(tensors[f"store.{i}.keys"], tensors[f"store.{i}.values"])
        ctx.state = policy

    def generation_policy(self, ctx: Context) -> ReAttentionPolicy:
        """The question and every generated token select again from (a fork of) the context's stores."""
        return ctx.state.fork()
