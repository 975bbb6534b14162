"""InfiniPot baseline (REFORM §4 baselines; Kim et al., EMNLP 2024, "InfiniPot: Infinite Context Processing
on Memory-Constrained LLMs"): continual context distillation of a fixed-size pot by catalyst-prompt
attention and novelty under compression; answer from the distilled cache. What had to be assumed is
listed on ``InfiniPotPolicy``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..engine.cache import KVCache, LayerCache
from ..engine.layout import as_tensor
from ..engine.policies import TopBudget, forced_mask, top_budget
from ..engine.rope import Rotary
from .base import CachedMethod, Runtime, register
from .options import EvictionConfig

if TYPE_CHECKING:
    from ..engine.core import Engine

CATALYST = ("\n\nRemember the text above: summarize it, keeping every name, number, date and fact that a "
            "question could ask about.")


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


@dataclass
class InfiniPotConfig(EvictionConfig):
    """Pot = cache budget (W/4, the distilled size) + chunk (W/4), as the paper's recurrent baselines;
    first/last 256 kept; ``catalyst`` is the generic prompt whose attention ranks cached tokens and
    ``nuc_share`` the part of the budget given to novelty (negative log-likelihood) instead."""

    catalyst: str = CATALYST
    nuc_share: float = 0.5

    def policy(self, engine=None, catalyst=None) -> InfiniPotPolicy:
        return InfiniPotPolicy(self.cache_budget, self.keep_first, self.keep_last, engine=engine, catalyst=catalyst,
                         nuc_share=self.nuc_share)


@register
class InfiniPot(CachedMethod):
    """Encode recurrently over all layers, distilling the pot after every chunk; generate from it."""

    name = "infinipot"
    Config = InfiniPotConfig

    def policy(self, pipe: Runtime) -> InfiniPotPolicy:
        c, engine = self.config, pipe.engine
        catalyst = as_tensor(pipe.templater.encode(c.catalyst), engine.device)
        if catalyst.shape[0] == 0:
            raise ValueError("the catalyst prompt is empty")
        if c.cache_budget + c.chunk_size + catalyst.shape[0] > engine.shape.window:
            raise ValueError(f"cache budget ({c.cache_budget}) + chunk size ({c.chunk_size}) + catalyst prompt "
                             f"({catalyst.shape[0]} tokens) must fit the model's window ({engine.shape.window})")
        return c.policy(engine, catalyst)
