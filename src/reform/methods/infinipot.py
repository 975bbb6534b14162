"""InfiniPot baseline (REFORM §4 baselines; Kim et al., EMNLP 2024, "InfiniPot: Infinite Context Processing
on Memory-Constrained LLMs"): continual context distillation of a fixed-size pot by catalyst-prompt
attention and novelty under compression; answer from the distilled cache. What had to be assumed is
listed on ``reform.engine.policies.InfiniPot``."""

from __future__ import annotations

from dataclasses import dataclass

from ..engine.layout import as_tensor
from ..engine.policies import InfiniPotPolicy
from .base import CachedMethod, Runtime, register
from .options import EvictionConfig


CATALYST = ("\n\nRemember the text above: summarize it, keeping every name, number, date and fact that a "
            "question could ask about.")


@dataclass
class InfiniPotConfig(EvictionConfig):
    """Pot = cache budget (W/4, the distilled size) + chunk (W/4), as the paper's recurrent baselines;
    first/last 256 kept; ``catalyst`` is the generic prompt whose attention ranks cached tokens and
    ``nuc_share`` the part of the budget given to novelty (negative log-likelihood) instead."""

    catalyst: str = CATALYST
    nuc_share: float = 0.5

    def policy(self, engine=None, catalyst=None) -> InfiniPot:
        return InfiniPotPolicy(self.cache_budget, self.keep_first, self.keep_last, engine=engine, catalyst=catalyst,
                         nuc_share=self.nuc_share)


@register
class InfiniPot(CachedMethod):
    """Encode recurrently over all layers, distilling the pot after every chunk; generate from it."""

    name = "infinipot"
    Config = InfiniPotConfig

    def policy(self, pipe: Runtime) -> InfiniPot:
        c, engine = self.config, pipe.engine
        catalyst = as_tensor(pipe.templater.encode(c.catalyst), engine.device)
        if catalyst.shape[0] == 0:
            raise ValueError("the catalyst prompt is empty")
        if c.cache_budget + c.chunk_size + catalyst.shape[0] > engine.shape.window:
            raise ValueError(f"cache budget ({c.cache_budget}) + chunk size ({c.chunk_size}) + catalyst prompt "
                             f"({catalyst.shape[0]} tokens) must fit the model's window ({engine.shape.window})")
        return c.policy(engine, catalyst)
