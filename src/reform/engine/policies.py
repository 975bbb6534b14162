"""Eviction policies: what a recurrent method keeps in its KV cache after each chunk.

A policy sees attention scores while a chunk runs (``observe``) and shrinks every layer's cache to its
budget afterwards (``compress``). Kept entries keep their order and are re-packed at positions 0..n-1 by
``LayerCache.keep``, so no position ever exceeds ``budget + chunk``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from .cache import KVCache, LayerCache
from .rope import Rotary

if TYPE_CHECKING:
    from .core import Engine


def forced_mask(n: int, keep_first: int, keep_last: int, device) -> torch.Tensor:
    """True for the first ``keep_first`` and the last ``keep_last`` of ``n`` cache entries."""
    pos = torch.arange(n, device=device)
    return (pos < keep_first) | (pos >= n - keep_last)


def top_budget(scores: torch.Tensor, budget: int, forced: torch.Tensor) -> torch.Tensor:
    """Per row of ``scores`` ([rows, n]): the ``budget`` best indices, ``forced`` ones always, ascending."""
    ranked = scores.masked_fill(forced, float("inf"))
    return ranked.topk(budget, dim=-1).indices.sort(dim=-1).values


def accumulate(received: torch.Tensor, cache: LayerCache, n_new: int) -> None:
    """Add the attention received by the cached entries to their scores; the ``n_new`` entries the chunk
    just appended start from what they received."""
    old = cache.scores
    if old is None:
        cache.scores = received
    else:
        n_old = received.shape[1] - n_new
        cache.scores = torch.cat([old + received[:, :n_old], received[:, n_old:]], dim=1)


@dataclass
class TopBudget:
    """Base of the score-based policies: after a chunk, every layer and KV head keeps its ``budget``
    best-ranked entries (``rank``), always including the first ``keep_first`` and the last ``keep_last``."""

    budget: int
    keep_first: int = 256
    keep_last: int = 256

    def __post_init__(self):
        if self.budget < self.keep_first + self.keep_last:
            raise ValueError(f"cache budget {self.budget} is smaller than the always-kept first+last tokens "
                             f"({self.keep_first}+{self.keep_last})")

    def rank(self, cache: LayerCache) -> torch.Tensor:
        """Per KV head, how much each cached entry is worth keeping, ``[n_kv_heads, length]``."""
        return cache.scores

    def compress(self, cache: KVCache, rotary: Rotary) -> None:
        for lc in cache.layers:
            if lc.window is None and lc.length > self.budget:   # sliding-window layers trim themselves
                forced = forced_mask(lc.length, self.keep_first, self.keep_last, lc.keys.device)
                lc.keep(top_budget(self.rank(lc), self.budget, forced), rotary)


@dataclass
class H2OPolicy(TopBudget):
    """Heavy-Hitter Oracle (Zhang et al., 2023), as REFORM compresses with it (REFORM §3.1, §4 setup).

    Each cached token's score is the attention it has received, accumulated over chunks, per KV head
    (summed over the query heads of its group). Following REFORM, only the last ``score_window`` (128)
    queries of each chunk contribute. After a chunk, every layer and KV head keeps its ``budget`` best
    tokens plus, always, the first ``keep_first`` and last ``keep_last`` tokens.
    """

    score_window: int = 128

    def observe(self, layer: int, received: torch.Tensor, cache: LayerCache, n_new: int) -> None:
        accumulate(received, cache, n_new)


@dataclass
class TOVAPolicy(TopBudget):
    """Token Omission Via Attention (Oren et al., 2024, "Transformers are Multi-State RNNs").

    TOVA drops the token the current query attends to least, attention averaged over all heads of the
    layer, so every head of a layer keeps the same tokens and scores are not accumulated. Chunked, as
    the REFORM paper runs its recurrent baselines: after each chunk the layer keeps the ``budget`` tokens
    that the chunk's last query (``score_window`` = 1) attends to most, plus the forced first/last ones.
    """

    score_window: int = 1

    def observe(self, layer: int, received: torch.Tensor, cache: LayerCache, n_new: int) -> None:
        # received is summed over each KV group's query heads: summing the groups is the head average
        # up to a constant factor, which does not change the ranking
        cache.scores = received.sum(0, keepdim=True).expand_as(received)


@dataclass
class StreamingLLMPolicy(TopBudget):
    """Attention sinks + recent window (Xiao et al., 2024, "Efficient Streaming Language Models with
    Attention Sinks"): keep the first ``keep_first`` tokens (the sinks) and the most recent
    ``budget - keep_first``; no scores. ``keep_last`` is derived from the budget. Positions are re-packed
    after eviction, as the paper assigns positions by place in the cache, not in the original text."""

    score_window: int = 0

    def __post_init__(self):
        if not 0 <= self.keep_first < self.budget:
            raise ValueError(f"StreamingLLM keeps {self.keep_first} sink tokens, which leaves no recent window "
                             f"in a cache budget of {self.budget}")
        self.keep_last = self.budget - self.keep_first
        super().__post_init__()

    def rank(self, cache: LayerCache) -> torch.Tensor:
        return torch.zeros(cache.keys.shape[:2], device=cache.keys.device)   # only forced entries survive


def token_nll(engine: "Engine", ids: torch.Tensor, hidden: torch.Tensor, prev: torch.Tensor | None,
              block: int = 512) -> torch.Tensor:
    """Negative log-likelihood of each of ``ids`` given what precedes it, from the last-layer ``hidden``
    states of the same chunk; ``prev`` is the previous chunk's last hidden state (None: the input's first
    token, scored 0). LM-head logits are computed ``block`` rows at a time. Returns [T] float32."""
    h = hidden[:-1] if prev is None else torch.cat([prev, hidden[:-1]])
    targets = (ids[1:] if prev is None else ids).to(hidden.device)
    out = [torch.zeros(1 if prev is None else 0, device=hidden.device)]
    for s in range(0, h.shape[0], block):
        logp = engine.logits(h[s:s + block]).log_softmax(-1)
        out.append(-logp.gather(1, targets[s:s + block, None])[:, 0])
    return torch.cat(out)


class _ReceivedFrom:
    """A policy that only records, per layer, the attention the first ``n_cached`` entries receive from the
    last ``score_window`` queries (InfiniPot's catalyst prompt)."""

    def __init__(self, n_cached: int, n_queries: int):
        self.n_cached, self.score_window, self.by_layer = n_cached, n_queries, {}

    def observe(self, layer: int, received: torch.Tensor, cache: LayerCache, n_new: int) -> None:
        self.by_layer[layer] = received[:, :self.n_cached]

    def compress(self, cache: KVCache, rotary: Rotary) -> None:
        pass


@dataclass
class InfiniPotPolicy(TopBudget):
    """InfiniPot's continual context distillation (Kim et al., EMNLP 2024, "InfiniPot: Infinite Context
    Processing on Memory-Constrained LLMs"). The pot is the cache plus the incoming chunk; when it is full
    (after every chunk) it is distilled back to ``budget`` entries per layer and KV head:

    - forced first/last entries as for every baseline in REFORM's setup;
    - Catalyst Prompt (CaP): the ``catalyst`` token ids run through the model on a copy of the pot, and
      the attention each cached entry receives from them (summed over the prompt's queries and the
      group's query heads) ranks it; ``1 - nuc_share`` of the free budget goes to the best by CaP;
    - Novelty under Compression (NuC): the negative log-likelihood of each token when the model read it
      on the compressed cache (high = the compressed past did not predict it); the rest of the budget
      goes to the most novel remaining entries. NuC is per token and travels with it through evictions.
    - CR-RoPE: positions are re-packed 0..n-1 after each distillation (``LayerCache.keep``).

    Assumed where the paper leaves it open here: the catalyst text, splitting the budget between the two
    scores (CaP first, then NuC) rather than another combination, and half of it each by default.
    """

    engine: "Engine | None" = None
    catalyst: torch.Tensor | None = None
    nuc_share: float = 0.5
    score_window: int = 0

    def __post_init__(self):
        super().__post_init__()
        if not 0.0 <= self.nuc_share <= 1.0:
            raise ValueError(f"nuc_share must be between 0 and 1, got {self.nuc_share}")
        self._prev, self._nll = None, None

    def observe_output(self, ids: torch.Tensor, hidden: torch.Tensor) -> None:
        self._nll = token_nll(self.engine, ids, hidden, self._prev)
        self._prev = hidden[-1:]

    def compress(self, cache: KVCache, rotary: Rotary) -> None:
        for lc in cache.layers:   # the chunk's NuC scores join its entries
            new = self._nll.expand(lc.keys.shape[0], -1)
            lc.scores = new if lc.scores is None else torch.cat([lc.scores, new], dim=1)
        if max((lc.length for lc in cache.layers if lc.window is None), default=0) <= self.budget:
            return
        cap = _ReceivedFrom(cache.length, self.catalyst.shape[0])
        self.engine.forward(self.catalyst, cache.clone(), policy=cap)
        n_forced = self.keep_first + self.keep_last
        n_cap = n_forced + round((self.budget - n_forced) * (1 - self.nuc_share))
        for i, lc in enumerate(cache.layers):
            if lc.window is not None:     # sliding-window layers trim themselves
                continue
            forced = forced_mask(lc.length, self.keep_first, self.keep_last, lc.keys.device)
            by_cap = top_budget(cap.by_layer[i], n_cap, forced)
            chosen = torch.zeros_like(lc.scores, dtype=torch.bool).scatter_(1, by_cap, True)
            lc.keep(top_budget(lc.scores, self.budget, chosen), rotary)


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
