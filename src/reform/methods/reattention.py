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

import copy
from dataclasses import dataclass, replace

import torch

from ..engine.cache import KVCache, LayerCache
from ..engine.rope import Rotary
from ..engine.shape import ModelShape
from .base import CachedMethod, Context, register
from .options import pick, positive, require_chunk_size, require_positive


# ------------------------------------------------------------------ ReAttention's selection (§2.1; methods/reattention.py)
def votes(q: torch.Tensor, keys: torch.Tensor, top_k: int, tile: int) -> torch.Tensor:
    """How often each of the ``keys`` ([H_kv, M, D], pre-RoPE) is among the ``top_k`` by q·k of a (query
    head, query) pair of ``q`` ([H, T, D], pre-RoPE); [M] counts. Keys are scored ``tile`` at a time and
    merged into a running top-k, so no [H x T x M] matrix exists."""
    h_kv, m, d = keys.shape
    qg = q.reshape(h_kv, -1, d)                                   # query head h reads KV head h // rep
    k = min(top_k, m)
    best_v = torch.empty(*qg.shape[:2], 0, dtype=q.dtype, device=q.device)
    best_i = torch.empty(*qg.shape[:2], 0, dtype=torch.long, device=q.device)
    for s in range(0, m, tile):
        v, i = (qg @ keys[:, s:s + tile].transpose(1, 2)).topk(min(k, keys[:, s:s + tile].shape[1]), dim=-1)
        best_v, j = torch.cat([best_v, v], -1).topk(min(k, best_v.shape[-1] + v.shape[-1]), dim=-1)
        best_i = torch.cat([best_i, i + s], -1).gather(-1, j)
    return torch.bincount(best_i.flatten(), minlength=m)


def spans(counts: torch.Tensor, winners: int, span: int) -> torch.Tensor:
    """The ``winners`` most voted tokens (ties: earlier first; unvoted never win), each expanded to the
    ``span`` tokens centred on it, clamped to ``[0, M)``, deduplicated, ascending."""
    m = counts.shape[0]
    rank = counts.long() * m + torch.arange(m - 1, -1, -1, device=counts.device)   # count, then earlier
    top = rank.topk(min(winners, int((counts > 0).sum()))).indices
    offsets = torch.arange(-(span // 2), (span + 1) // 2, device=counts.device)
    return torch.unique((top[:, None] + offsets).clamp(0, m - 1))


class KVStore:
    """One layer's full pre-RoPE keys and values, ``[H_kv, n, D]``, grown by doubling. A ``fork`` shares
    the buffers: it writes only past the original's end, so forks (one question at a time) leave the
    context's cache untouched."""

    def __init__(self):
        self.keys = self.values = None
        self.n = 0

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        t = keys.shape[1]
        if self.keys is None or self.n + t > self.keys.shape[1]:
            cap = max(self.n + t, 2 * self.n, 1024)
            self.keys, self.values = self._grown(self.keys, keys, cap), self._grown(self.values, values, cap)
        self.keys[:, self.n:self.n + t] = keys
        self.values[:, self.n:self.n + t] = values
        self.n += t

    def _grown(self, old: torch.Tensor | None, like: torch.Tensor, cap: int) -> torch.Tensor:
        new = like.new_empty(like.shape[0], cap, like.shape[2])
        if self.n:
            new[:, :self.n] = old[:, :self.n]
        return new

    @property
    def nbytes(self) -> int:
        """Bytes of the entries held (spare capacity not counted)."""
        if self.keys is None:
            return 0
        return 2 * self.n * self.keys.shape[0] * self.keys.shape[2] * self.keys.element_size()

    def fork(self) -> "KVStore":
        return copy.copy(self)


@dataclass
class ReAttentionPolicy:
    """Engine policy: ``arrange`` fills a layer's cache with [global | selected spans | local] from its full
    store before each block attends; the block's own entries join the store afterwards (``compress`` after
    a prefill chunk, or the next ``arrange``)."""

    global_size: int
    local_size: int
    winners: int
    span_size: int
    top_k: int = 4
    tile_elems: int = 1 << 23          # scores per top-k tile
    stores: list[KVStore] | None = None
    score_window: int = 0              # no eviction scores

    def __post_init__(self):
        self.stores = [] if self.stores is None else self.stores
        self._from_store: dict[int, int] = {}     # layer -> leading cache entries that came from its store

    def fork(self) -> "ReAttentionPolicy":
        return replace(self, stores=[s.fork() for s in self.stores])

    def _absorb(self, layer: int, cache: LayerCache) -> KVStore:
        while len(self.stores) <= layer:
            self.stores.append(KVStore())
        store, old = self.stores[layer], self._from_store.pop(layer, 0)
        if cache.length > old:
            store.append(cache.keys_pre[:, old:], cache.values[:, old:])
        return store

    def selection(self, q: torch.Tensor, store: KVStore) -> torch.Tensor:
        """Store indices the block of queries ``q`` attends to before itself: global, spans, local."""
        n, t = store.n, q.shape[1]
        g = min(self.global_size, n)
        local = min(max(0, self.local_size - t), n - g)          # the block itself is part of the window
        middle = store.keys[:, g:n - local]
        parts = [torch.arange(g, device=q.device)]
        if middle.shape[1]:
            tile = max(1, self.tile_elems // (q.shape[0] * t))
            parts.append(g + spans(votes(q, middle, self.top_k, tile), self.winners, self.span_size))
        return torch.cat(parts + [torch.arange(n - local, n, device=q.device)])

    @torch.inference_mode()
    def arrange(self, layer: int, q: torch.Tensor, cache: LayerCache, rotary: Rotary) -> None:
        store = self._absorb(layer, cache)
        if store.n == 0:                  # the input's first block: nothing to attend to before it
            return
        idx = self.selection(q, store)
        cache.keys_pre, cache.values, cache.scores = store.keys[:, idx], store.values[:, idx], None
        cache.keys = rotary.rotate(cache.keys_pre, 0, layer)              # fresh contiguous positions (Eq. 3)
        self._from_store[layer] = idx.shape[0]

    def observe(self, layer: int, received: torch.Tensor, cache: LayerCache, n_new: int) -> None:
        pass

    @torch.inference_mode()
    def compress(self, cache: KVCache, rotary: Rotary) -> None:
        """The block's entries go to the stores; the caches empty until the next block arranges them."""
        for i, lc in enumerate(cache.layers):
            self._absorb(i, lc)
            lc.keys_pre = lc.keys = lc.values = lc.scores = None


@dataclass
class ReAttentionConfig:
    """ReAttention's knobs (§3.1). ``cache_budget`` is the attention scope (W by default: the paper's
    8192 for LLaMA3-8B-8K); ``keep_first`` the global tokens (32); ``local_size`` the local window (W/2,
    the paper's 4096 of 8192); ``span_size`` 32; ``top_k`` 4; k' = ``spans`` what the scope leaves;
    ``chunk_size`` 512 (below the local size, as the paper requires). Global and span sizes shrink to
    W/16 for windows under 512."""

    chunk_size: int | None = positive()
    cache_budget: int | None = positive()
    keep_first: int | None = None
    local_size: int | None = positive()
    span_size: int | None = positive()
    top_k: int = positive(4)

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
