"""InfLLM baseline (REFORM §4, the random-access baseline; Xiao et al., 2024, "InfLLM: Unveiling the
Intrinsic Capacity of LLMs for Understanding Extremely Long Sequences with Training-Free Memory"): sinks +
local window + every evicted token kept in 128-token memory blocks with 4 representative keys each; every
chunk, and then the question, retrieves the most relevant blocks per layer into its attention."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..engine.cache import KVCache, LayerCache
from ..engine.layout import QuestionPart, as_tensor
from ..engine.policies import accumulate
from ..engine.rope import Rotary
from ..stats import Timer
from .base import CachedMethod, Context, Prompt, register
from .options import CacheConfig, keep_default, pick, positive, require_positive


class BlockMemory:
    """InfLLM's context memory for one layer: pre-RoPE keys, values and accumulated attention scores of
    every token that left the local window, read as blocks of ``block_size`` tokens, each represented by
    the ``repr_tokens`` keys (per KV head) that received the most attention while they were in the cache.
    (``InfLLMPolicy`` adds whole blocks only, so every layer retrieves the same number of tokens.)"""

    def __init__(self, block_size: int, repr_tokens: int):
        self.block_size, self.repr_tokens = block_size, repr_tokens
        self.keys = self.values = self.scores = None
        self._reprs, self._done = None, 0      # representatives of the first ``_done`` (full) blocks are final

    @property
    def length(self) -> int:
        return 0 if self.keys is None else self.keys.shape[1]

    def add(self, keys: torch.Tensor, values: torch.Tensor, scores: torch.Tensor) -> None:
        cat = lambda old, new: new if old is None else torch.cat([old, new], dim=1)
        self.keys, self.values, self.scores = cat(self.keys, keys), cat(self.values, values), cat(self.scores, scores)

    def representatives(self) -> torch.Tensor:
        """``[n_kv_heads, n_blocks, repr_tokens, head_dim]``; a partial last block counts as a block."""
        b, m = self.block_size, self.length
        n_blocks, start = -(-m // b), self._done * b
        scores = torch.full((self.scores.shape[0], n_blocks * b - start), float("-inf"), device=self.scores.device)
        scores[:, :m - start] = self.scores[:, start:].float()
        keys = torch.zeros(self.keys.shape[0], n_blocks * b - start, self.keys.shape[2], dtype=self.keys.dtype,
                           device=self.keys.device)
        keys[:, :m - start] = self.keys[:, start:]
        h, d, r = keys.shape[0], keys.shape[2], min(self.repr_tokens, b)
        top = scores.view(h, -1, b).topk(r, dim=-1).indices                                # [H, B', r]
        new = keys.view(h, -1, b, d).gather(2, top.unsqueeze(-1).expand(-1, -1, -1, d))   # [H, B', r, D]
        reprs = new if self._reprs is None else torch.cat([self._reprs[:, :self._done], new], dim=1)
        self._reprs, self._done = reprs, m // b
        return reprs

    def retrieve(self, query: torch.Tensor, k: int) -> torch.Tensor:
        """Ascending token indices of the ``k`` blocks most relevant to ``query`` ([n_kv_heads, head_dim]):
        relevance = query . representative keys, summed over representatives and heads."""
        reprs = self.representatives()
        relevance = torch.einsum("hd,hbrd->b", query.float(), reprs.float())
        top = relevance.topk(min(k, relevance.shape[0])).indices.sort().values
        b = self.block_size
        return torch.cat([torch.arange(i * b, min((i + 1) * b, self.length), device=self.keys.device)
                          for i in top.tolist()])


@dataclass
class InfLLMPolicy:
    """InfLLM's block memory (Xiao et al., 2024, "InfLLM: Unveiling the Intrinsic Capacity of LLMs for
    Understanding Extremely Long Sequences with Training-Free Memory"; REFORM §4, the random-access
    baseline). Each layer's cache holds the
    first ``sinks`` tokens and the ``local`` most recent ones (up to ``block_size - 1`` more: tokens leave
    the local window a whole block at a time); what leaves goes to a ``BlockMemory``. Before a block of queries attends (``arrange``, every layer), the ``blocks`` memory
    blocks most relevant to the block's mean pre-RoPE query are spliced in between sinks and local window,
    in their original order, and the layer's entries are re-packed at positions 0..n-1 like every cache of
    this engine (InfLLM instead gives all memory tokens one shared distance). Representative tokens are the
    ones that received the
    most attention (H2O-style, from the last ``score_window`` queries of each chunk) while cached.

    Not modelled: GPU/CPU offloading and its block cache (everything stays on the model's device), and
    retrieval per generated token (answers attend to the blocks the question retrieved).
    """

    sinks: int
    local: int
    blocks: int
    block_size: int = 128
    repr_tokens: int = 4
    score_window: int = 128
    memory: list[BlockMemory] | None = None

    def __post_init__(self):
        if min(self.sinks, self.local, self.blocks) < 0 or min(self.block_size, self.repr_tokens) < 1:
            raise ValueError("InfLLM sizes must be positive")
        self.memory = [] if self.memory is None else self.memory
        self._layout: dict[int, tuple[int, int]] = {}      # layer -> (sinks, retrieved entries) in its cache

    def _memory(self, layer: int) -> BlockMemory:
        while len(self.memory) <= layer:
            self.memory.append(BlockMemory(self.block_size, self.repr_tokens))
        return self.memory[layer]

    def arrange(self, layer: int, q: torch.Tensor, cache: LayerCache, rotary: Rotary) -> None:
        mem, n_sink = self._memory(layer), min(self.sinks, cache.length)
        if mem.length == 0 or self.blocks == 0:
            self._layout[layer] = (n_sink, 0)
            return
        h_kv, d = cache.keys.shape[0], q.shape[-1]
        query = q.float().mean(1).view(h_kv, -1, d).sum(1)            # mean query of each KV head's group
        idx = mem.retrieve(query, self.blocks)
        splice = lambda old, new: torch.cat([old[:, :n_sink], new, old[:, n_sink:]], dim=1)
        cache.keys_pre, cache.values = splice(cache.keys_pre, mem.keys[:, idx]), splice(cache.values, mem.values[:, idx])
        if cache.scores is not None:
            cache.scores = splice(cache.scores, mem.scores[:, idx])
        cache.keys = rotary.rotate(cache.keys_pre, 0, layer)
        self._layout[layer] = (n_sink, idx.shape[0])

    def observe(self, layer: int, received: torch.Tensor, cache: LayerCache, n_new: int) -> None:
        accumulate(received, cache, n_new)

    def compress(self, cache: KVCache, rotary: Rotary) -> None:
        """Back to sinks + local window; what left the window goes to memory (retrieved blocks are
        copies and are simply dropped)."""
        for i, lc in enumerate(cache.layers):
            n_sink, n_ret = self._layout.pop(i)
            start, device = n_sink + n_ret, lc.keys.device
            grow = min(self.sinks - n_sink, lc.length - start)                 # early tokens become sinks
            rest = torch.arange(start + grow, lc.length, device=device)
            n_gone = max(0, rest.shape[0] - self.local) // self.block_size * self.block_size   # whole blocks
            gone = rest[:n_gone]
            if gone.numel():
                scores = lc.scores[:, gone] if lc.scores is not None else torch.zeros(lc.keys.shape[0], gone.numel(),
                                                                                      device=device)
                self._memory(i).add(lc.keys_pre[:, gone], lc.values[:, gone], scores)
            keep = torch.cat([torch.arange(n_sink, device=device), torch.arange(start, start + grow, device=device),
                              rest[n_gone:]])
            lc.keep(keep.expand(lc.keys.shape[0], -1), rotary)


@dataclass
class InfLLMConfig(CacheConfig):
    """``cache_budget`` is the active cache (REFORM gives InfLLM 32k = W/4): ``keep_first`` sinks (the paper's
    128; 256 here as every baseline keeps, W/32 for small windows) + ``local_size`` recent tokens (the
    paper's 4096 of 32k, i.e. budget/8; up to a block more while a block fills) + as many retrieved
    ``block_size`` (128) blocks as fit the rest; ``repr_tokens`` (4) representative keys per block;
    chunk = W/4."""

    local_size: int | None = positive()
    block_size: int = positive(128)
    repr_tokens: int = positive(4)
    score_window: int = positive(128)

    def defaults(self, shape) -> dict:
        budget = pick(self.cache_budget, shape.window // 4)
        return {**super().defaults(shape), "local_size": max(keep_default(shape), budget // 8)}

    @property
    def blocks(self) -> int:
        """Memory blocks retrieved per chunk: what the active budget leaves after sinks and the local window
        (which may hold a block more while that block fills)."""
        return (self.cache_budget - self.keep_first - self.local_size) // self.block_size - 1

    def check(self, shape) -> None:
        require_positive(local_size=self.local_size, block_size=self.block_size, repr_tokens=self.repr_tokens,
                         score_window=self.score_window)
        if self.blocks < 1:
            raise ValueError(f"cache budget ({self.cache_budget}) leaves no room for a {self.block_size}-token "
                             f"memory block after {self.keep_first} sinks and a {self.local_size}"
                             f"(+{self.block_size - 1})-token local window")
        super().check(shape)

    def policy(self, memory=None, score_window: int | None = None) -> InfLLMPolicy:
        return InfLLMPolicy(self.keep_first, self.local_size, self.blocks, self.block_size, self.repr_tokens,
                      pick(score_window, self.score_window), memory)


@register
class InfLLM(CachedMethod):
    """Encode chunk by chunk with block retrieval in every layer; the question retrieves its own blocks,
    and the answer is generated from sinks + those blocks + local window + question."""

    name = "infllm"
    sliding_windows = False   # its arrangement splices retrieved entries into every layer
    Config = InfLLMConfig

    def state(self, policy: InfLLMPolicy):
        return policy.memory

    def saved_state(self, ctx: Context) -> dict[str, torch.Tensor]:
        """Each layer's block memory: pre-RoPE keys, values and the scores its representatives come from."""
        return {f"memory.{i}.{name}": getattr(m, name) for i, m in enumerate(ctx.state) if m.length
                for name in ("keys", "values", "scores")}

    def restore_state(self, ctx: Context, tensors: dict[str, torch.Tensor]) -> None:
        policy = self.config.policy()
        for i in range(ctx.pipeline.engine.shape.n_layers):
            if f"memory.{i}.keys" in tensors:
                policy._memory(i).add(*(tensors[f"memory.{i}.{name}"] for name in ("keys", "values", "scores")))
        ctx.state = policy.memory

    def prompt(self, ctx: Context, part: QuestionPart, timer: Timer) -> Prompt:
        """The question but its last token runs with retrieval (timed as "gather"); generation continues
        from that cache with the last token (so "recomputed_tokens" is 1)."""
        ids, cache = as_tensor(part.ids, ctx.ids.device), ctx.cache.clone()
        with timer.stage("gather"):      # the question's queries retrieve memory blocks in every layer
            if ids.shape[0] > 1:
                ctx.pipeline.engine.forward(ids[:-1], cache, policy=self.config.policy(ctx.state, score_window=0))
        return Prompt(ids[-1:], cache)
