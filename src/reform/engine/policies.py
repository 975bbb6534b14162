"""Eviction policies: what a recurrent method keeps in its KV cache after each chunk.

A policy sees attention scores while a chunk runs (``observe``) and shrinks every layer's cache to its
budget afterwards (``compress``). Kept entries keep their order and are re-packed at positions 0..n-1 by
``LayerCache.keep``, so no position ever exceeds ``budget + chunk``.
"""

from __future__ import annotations

from dataclasses import dataclass
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
            if lc.length > self.budget:
                forced = forced_mask(lc.length, self.keep_first, self.keep_last, lc.keys.device)
                lc.keep(top_budget(self.rank(lc), self.budget, forced), rotary)


@dataclass
class H2O(TopBudget):
    """Heavy-Hitter Oracle (Zhang et al., 2023), as REFORM compresses with it (REFORM §3.1, §4 setup).

    Each cached token's score is the attention it has received, accumulated over chunks, per KV head
    (summed over the query heads of its group). Following REFORM, only the last ``score_window`` (128)
    queries of each chunk contribute. After a chunk, every layer and KV head keeps its ``budget`` best
    tokens plus, always, the first ``keep_first`` and last ``keep_last`` tokens.
    """

    score_window: int = 128

    def observe(self, layer: int, received: torch.Tensor, cache: LayerCache, n_new: int) -> None:
        old = cache.scores
        if old is None:
            cache.scores = received
        else:
            n_old = received.shape[1] - n_new
            cache.scores = torch.cat([old + received[:, :n_old], received[:, n_old:]], dim=1)


@dataclass
class TOVA(TopBudget):
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
class StreamingLLM(TopBudget):
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
class InfiniPot(TopBudget):
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
        if cache.length <= self.budget:
            return
        cap = _ReceivedFrom(cache.length, self.catalyst.shape[0])
        self.engine.forward(self.catalyst, cache.clone(), policy=cap)
        n_forced = self.keep_first + self.keep_last
        n_cap = n_forced + round((self.budget - n_forced) * (1 - self.nuc_share))
        for i, lc in enumerate(cache.layers):
            forced = forced_mask(lc.length, self.keep_first, self.keep_last, lc.keys.device)
            by_cap = top_budget(cap.by_layer[i], n_cap, forced)
            chosen = torch.zeros_like(lc.scores, dtype=torch.bool).scatter_(1, by_cap, True)
            lc.keep(top_budget(lc.scores, self.budget, chosen), rotary)
