"""ILRe: Intermediate Layer Retrieval (Liang et al., 2025, "ILRe: Intermediate Layer Retrieval for Context
Compression in Causal Language Models", arXiv 2508.17892).

1. **Encode** (§3.3): the context streams chunk by chunk (the first chunk ``S`` tokens longer) through the
   layers below the retrieval layer l_R, each keeping only ``S`` sink tokens and a ``W``-token sliding
   window of K/V (the engine's StreamingLLM policy, the "Λ-like mask" of §3.1). At layer l_R only the keys
   of the context are kept, stored for every token in half precision, and the pass exits there: no
   layer above l_R runs, and layer l_R runs only its attention module's Q/K/V projections (the model's own
   module computes them together).
2. **Score** (Eq. 4-5): the query part (question + answer prefix) runs through the same layers as one more
   streaming chunk; its layer-l_R queries attend to all stored keys (softmax over the context, sink
   included), and each context token scores the max over heads and query tokens of that attention.
3. **Allocate** (Algorithm 1, §3.2): a bank of max-pooling (sizes 2, 4, 8, stride = size) x average-pooling
   (sizes 1..16, stride 1) kernels, 48 combinations sharing the budget; each takes its best-ranked tokens
   not taken yet; the first ``S`` tokens are always kept.
4. **Recompute** (§3.3): the selected ids (in original order) + the query part are a new prompt for the
   full model (``Method.prompt``), at fresh contiguous positions.

Choices where the paper is open (notes/ilre.md §6.3), by item:

- A1: ``retrieval_layer`` is a 0-based decoder-layer index (the paper's l_R = 3 is ``retrieval_layer=2``);
  ``reform heads select-layer`` picks it with the paper's own rule, so either reading is self-consistent.
- A2: the sink counts toward the budget, and the ``budget - S`` other tokens are split over the 48
  combinations with the remainder spread one by one over the first ones, so exactly ``budget`` tokens
  are kept (the budget is the recompute budget every method here shares).
- A3: the max-pool keeps a trailing partial window (ceil mode); the average pool is SnapKV's (padding
  ``n // 2``, zeros counted) cut back to its input length; a chosen block's tokens are taken in
  ascending order, the last block of a quota possibly in part; a combination whose ``B/m + 1`` candidate
  blocks run out continues down its full ranking.
- A4: the softmax runs over all context keys, sink included (then dropped), not over the query's own
  keys; in float32, tiled over the context with a first log-sum-exp pass.
- A6: the query part runs through the lower layers as one more streaming chunk.
- A7 and positions: the engine gives every cache entry the position of its place in the cache, so in the
  lower layers the sink sits right before the window at every chunk: a bounded distance like DCA's
  Eq. 6, which leaves D_C - W = 512 positions between them (the paper's default keeps absolute positions
  there; the engine refuses positions past the window). At layer l_R the keys are rotated at their
  absolute positions 0..L-1 and the query at L.. (the paper's default), or with ``dca`` by Eq. 7: every
  chunk but the last two moves to the position of chunk N_C - 1, so no query-key distance exceeds about
  two chunks (A8: D_i = (N_C - 1 - i) chunks, 1-based chunk i; query positions stay absolute). Keys are
  stored pre-RoPE and rotated while scoring, which equals storing them rotated and re-rotating by Eq. 7.
- A9: the query part is this tool's question part (separator, question, end of turn, assistant header,
  answer prefix); the chat template's system prefix is context and survives only in part (first ``S``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from ..engine.cache import KVCache
from ..engine.core import Engine
from ..engine.shape import ModelShape
from ..engine.layout import QuestionPart, as_tensor
from ..engine.policies import StreamingLLMPolicy
from ..stats import Timer
from .base import Context, Method, Runtime, register
from .options import pick, positive, require_chunk_size, require_positive, require_room


MAX_KERNELS = (2, 4, 8)
AVG_KERNELS = tuple(range(1, 17))


# ------------------------------------------------------------------ encode: streaming layers, keys at l_R
class LayerStates:
    """A hook that stores some layers' pre-RoPE query or key states of every token it sees: ``states[j]`` is
    layer ``layers[j]``'s, ``[heads, N, D]`` (the engine taps them from the model's own attention module,
    so q/k norms and clipping are the model's)."""

    def __init__(self, layers: Sequence[int], kind: str, n_heads: int, n_tokens: int, head_dim: int,
                 dtype: torch.dtype, device):
        self.layers, self.kind, self._at = list(layers), kind, 0
        self.states = torch.empty(len(self.layers), n_heads, n_tokens, head_dim, dtype=dtype, device=device)

    def begin(self, offset: int, length: int) -> None:
        self._at = offset

    def on_qkv(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        x = q if self.kind == "q" else k
        self.states[self.layers.index(layer), :, self._at:self._at + x.shape[1]] = x.to(self.states.dtype)


def stream(engine: Engine, ids: torch.Tensor, cache: KVCache, *, chunk_size: int, sink: int, policy, hook=None,
           progress: Callable[[int], None] | None = None, qkv_only_next: bool = False) -> None:
    """Streaming chunked prefill (§4 default settings): a first chunk of ``sink + chunk_size`` tokens, then
    chunks of ``chunk_size``, each on the sink + sliding-window cache that ``policy`` keeps (with
    ``qkv_only_next``, the layer after the cache's layers, l_R, computes only its Q/K/V for ``hook``)."""
    first = sink + chunk_size
    engine.prefill(ids[:first], cache, chunk_size=first, policy=policy, hook=hook, progress=progress,
                   qkv_only_next=qkv_only_next)
    if ids.shape[0] > first:
        engine.prefill(ids[first:], cache, chunk_size=chunk_size, policy=policy, hook=hook, offset=first,
                       progress=progress, qkv_only_next=qkv_only_next)


# ------------------------------------------------------------------ score (Eq. 4-5)
def key_positions(n: int, chunk_size: int, sink: int, dca: bool, device=None) -> torch.Tensor:
    """RoPE position of each of ``n`` context keys at layer l_R: absolute, or with DCA (Eq. 7) every chunk
    before the last two shifted by whole chunks onto chunk N_C - 1 (chunk 0 holds ``sink`` extra tokens)."""
    pos = torch.arange(n, device=device)
    if not dca:
        return pos
    chunk = torch.where(pos < sink + chunk_size, 0, (pos - sink) // chunk_size)     # 0-based chunk index
    n_chunks = int(chunk[-1]) + 1
    return pos + (n_chunks - 2 - chunk).clamp(min=0) * chunk_size


def attention_scores(engine: Engine, layer: int, q: torch.Tensor, q_pos: torch.Tensor, keys: torch.Tensor,
                     k_pos: torch.Tensor, tile: int = 1 << 14) -> torch.Tensor:
    """max over query heads and query tokens of softmax(q K^T / sqrt(d)) over all ``keys`` (Eq. 4-5), [N].

    ``q`` [H, Tq, D] and ``keys`` [H_kv, N, D] are pre-RoPE and rotated here at ``q_pos`` / ``k_pos`` with
    layer ``layer``'s own RoPE (``Rotary.at``); query
    head h reads KV head h // (H / H_kv). The [H x Tq x N] probabilities are never held at once: a first
    pass over ``tile``-key slices accumulates each row's log-sum-exp, a second takes the max of the
    normalised probabilities slice by slice (float32 throughout)."""
    h, tq, d = q.shape
    h_kv, n, _ = keys.shape
    qr = engine.rotary.at(q.float(), q_pos, layer).reshape(h_kv, -1, d) * engine.scaling   # [H_kv, rep*Tq, D]

    def logits(s: int) -> torch.Tensor:
        k = engine.rotary.at(keys[:, s:s + tile].float(), k_pos[s:s + tile], layer)
        return qr @ k.transpose(1, 2)                                              # [H_kv, rep*Tq, tile]

    lse = torch.full(qr.shape[:2], float("-inf"), device=keys.device)
    for s in range(0, n, tile):
        lse = torch.logaddexp(lse, logits(s).logsumexp(-1))
    out = torch.empty(n, dtype=torch.float32, device=keys.device)
    for s in range(0, n, tile):
        out[s:s + tile] = (logits(s) - lse[..., None]).amax(dim=(0, 1)).exp()
    return out


# ------------------------------------------------------------------ allocate (Algorithm 1)
def quotas(free: int, n_combinations: int) -> list[int]:
    """``free`` tokens split evenly over the combinations, the remainder one each to the first ones."""
    return [free // n_combinations + (i < free % n_combinations) for i in range(n_combinations)]


def block_tokens(blocks: torch.Tensor, size: int, offset: int, n: int) -> torch.Tensor:
    """Token indices of pooled ``blocks`` (in rank order, each block's tokens ascending), inside ``n``."""
    tokens = (offset + blocks[:, None] * size + torch.arange(size, device=blocks.device)).flatten()
    return tokens[tokens < n]


def allocate(scores: torch.Tensor, budget: int, sink: int, max_kernels: Sequence[int] = MAX_KERNELS,
             avg_kernels: Sequence[int] = AVG_KERNELS) -> torch.Tensor:
    """Ascending indices of exactly ``budget`` of the ``n`` tokens scored by ``scores`` (Algorithm 1): the
    first ``sink``, then per (max kernel m, avg kernel a) combination in order, its quota of the tokens of
    its top ``budget // m + 1`` pooled blocks not taken by an earlier combination."""
    n = scores.shape[0]
    if budget >= n:
        return torch.arange(n, device=scores.device)
    taken = torch.zeros(n, dtype=torch.bool, device=scores.device)
    taken[:sink] = True
    combos = [(m, a) for m in max_kernels for a in avg_kernels]
    rest = scores[None, None, sink:].float()                                     # A^C without the sink
    for (m, a), quota in zip(combos, quotas(budget - sink, len(combos))):
        pooled = F.max_pool1d(rest, m, stride=m, ceil_mode=True)
        smooth = F.avg_pool1d(pooled, a, stride=1, padding=a // 2)[0, 0, :pooled.shape[-1]]
        for k in (min(budget // m + 1, smooth.shape[0]), smooth.shape[0]):     # candidates, then all blocks
            tokens = block_tokens(smooth.topk(k).indices, m, sink, n)
            fresh = tokens[~taken[tokens]]
            if fresh.shape[0] >= quota:
                break
        taken[fresh[:quota]] = True
    return taken.nonzero()[:, 0]


# ------------------------------------------------------------------ the method
def default_layer(shape: ModelShape) -> int:
    """Without a preset: the paper's l_R = 3 of 32 layers (1-based), i.e. about a tenth of the depth."""
    return max(0, round(0.1 * shape.n_layers) - 1)


@dataclass
class ILReConfig:
    """ILRe's knobs (§4 "Default Settings"). ``None``: derived in ``resolve``.

    - ``retrieval_layer``: 0-based l_R; the model preset's (``reform heads select-layer``) or a tenth of
      the depth;
    - ``chunk_size`` 1024, ``cache_budget`` = sink + sliding window = 4 + 512, ``keep_first`` = S = 4
      sink tokens, also always kept by the allocator: the paper's values (it uses them for every model),
      shrunk to W/4, W/8 + S and W/32 only for windows too small to hold them;
    - ``recompute_budget``: the token budget B (the paper's 4K for RULER, 1-2K on LongBench); here the
      budget every recompute method shares, W/2 or the model preset's;
    - ``max_kernels`` / ``avg_kernels``: the pooling bank; ``dca``: Eq. 7 positions at layer l_R.
    """

    retrieval_layer: int | None = None
    chunk_size: int | None = positive()
    cache_budget: int | None = positive()
    keep_first: int | None = None
    recompute_budget: int | None = positive()
    max_kernels: tuple[int, ...] = MAX_KERNELS
    avg_kernels: tuple[int, ...] = AVG_KERNELS
    dca: bool = False
    key_dtype: torch.dtype = torch.float16

    def resolve(self, shape: ModelShape) -> "ILReConfig":
        w = shape.window
        sink = pick(self.keep_first, min(4, w // 32))
        c = replace(self, retrieval_layer=pick(self.retrieval_layer, default_layer(shape)),
                    chunk_size=pick(self.chunk_size, min(1024, w // 4)),
                    cache_budget=pick(self.cache_budget, sink + min(512, w // 8)), keep_first=sink,
                    recompute_budget=pick(self.recompute_budget, w // 2),
                    max_kernels=tuple(self.max_kernels), avg_kernels=tuple(self.avg_kernels))
        c.check(shape)
        return c

    def check(self, shape: ModelShape) -> None:
        if not 0 <= self.retrieval_layer < shape.n_layers:
            raise ValueError(f"retrieval layer {self.retrieval_layer} is not a layer of this model "
                             f"(0..{shape.n_layers - 1}, 0-based)")
        require_positive(chunk_size=self.chunk_size, recompute_budget=self.recompute_budget)
        require_chunk_size(self.chunk_size, shape)
        if not 0 <= self.keep_first < self.cache_budget:
            raise ValueError(f"the sliding-window cache ({self.cache_budget}) must hold the {self.keep_first} sink "
                             "tokens and at least one more")
        if self.cache_budget + self.chunk_size > shape.window:
            raise ValueError(f"sink + window cache ({self.cache_budget}) + chunk size ({self.chunk_size}) must fit "
                             f"the model's window ({shape.window})")
        require_room(self.recompute_budget, shape)
        if self.recompute_budget < self.keep_first:
            raise ValueError(f"recompute budget ({self.recompute_budget}) is smaller than the {self.keep_first} "
                             "always-kept sink tokens")
        if not self.max_kernels or not self.avg_kernels or min(self.max_kernels + self.avg_kernels) < 1:
            raise ValueError("pooling kernel sizes must be positive, with at least one max and one average kernel")


@register
class ILRe(Method):
    """Encode up to layer l_R (streaming below it, keys at it), score by the query's attention, allocate
    with the pooling bank, recompute the selected tokens + question with the full model."""

    name = "ilre"
    Config = ILReConfig

    def encode(self, pipe: Runtime, ids: torch.Tensor, progress: Callable[[int], None] | None = None) -> Context:
        c, engine, n = self.config, pipe.engine, ids.shape[0]
        if n <= c.recompute_budget:            # everything will be recomputed: nothing to retrieve from
            return Context(pipe, self, ids)
        s = engine.shape
        keys = LayerStates([c.retrieval_layer], "k", s.n_kv_heads, n, s.head_dim, c.key_dtype, engine.device)
        cache = KVCache.empty(c.retrieval_layer)        # early exit: layers > l_R never run, l_R only its Q/K/V
        policy = StreamingLLMPolicy(budget=c.cache_budget, keep_first=c.keep_first)
        stream(engine, ids, cache, chunk_size=c.chunk_size, sink=c.keep_first, policy=policy, hook=keys,
               progress=progress, qkv_only_next=True)
        return Context(pipe, self, ids, cache=cache, state=keys.states[0])

    def saved_state(self, ctx: Context) -> dict[str, torch.Tensor]:
        return {} if ctx.state is None else {"keys": ctx.state}

    def restore_state(self, ctx: Context, tensors: dict[str, torch.Tensor]) -> None:
        ctx.state = tensors.get("keys")

    def query_states(self, ctx: Context, part: QuestionPart) -> torch.Tensor:
        """The query part's layer-l_R queries, pre-RoPE [H, Tq, D]: one more streaming chunk (A6)."""
        engine, s = ctx.pipeline.engine, ctx.pipeline.engine.shape
        queries = LayerStates([self.config.retrieval_layer], "q", s.n_heads, len(part.ids), s.head_dim,
                              engine.dtype, engine.device)
        engine.forward(as_tensor(part.ids, ctx.ids.device), ctx.cache.clone(), hook=queries, qkv_only_next=True)
        return queries.states[0]

    def scores(self, ctx: Context, part: QuestionPart) -> torch.Tensor:
        c, engine, n = self.config, ctx.pipeline.engine, ctx.ids.shape[0]
        q_pos = torch.arange(n, n + len(part.ids), device=ctx.ids.device)
        k_pos = key_positions(n, c.chunk_size, c.keep_first, c.dca, ctx.ids.device)
        return attention_scores(engine, c.retrieval_layer, self.query_states(ctx, part), q_pos, ctx.state, k_pos)

    @torch.inference_mode()
    def select(self, ctx: Context, part: QuestionPart, timer: Timer) -> torch.Tensor:
        c = self.config
        if ctx.state is None:
            return torch.arange(ctx.ids.shape[0], device=ctx.ids.device)
        return allocate(self.scores(ctx, part), c.recompute_budget, c.keep_first, c.max_kernels, c.avg_kernels)
