"""Truncation baseline (REFORM §4 baselines): keep the beginning and the end of the input, drop the
middle, and answer with full attention over what is left."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ..engine.shape import ModelShape
from ..engine.layout import QuestionPart
from ..engine.policies import forced_mask
from ..stats import Timer
from .base import Context, Method, register
from .options import pick, positive, require_positive, require_room


@dataclass
class TruncateConfig:
    """``recompute_budget`` context tokens are kept: the same budget REFORM recomputes (W/2 or the model
    preset's value), so the two compare at equal cost; ``keep_first`` of them from the start (default
    half), the rest from the end."""

    recompute_budget: int | None = positive()
    keep_first: int | None = None

    def resolve(self, shape: ModelShape) -> "TruncateConfig":
        budget = pick(self.recompute_budget, shape.window // 2)
        c = replace(self, recompute_budget=budget, keep_first=pick(self.keep_first, budget // 2))
        require_positive(recompute_budget=c.recompute_budget)
        require_room(c.recompute_budget, shape)
        if not 0 <= c.keep_first <= c.recompute_budget:
            raise ValueError(f"keep_first ({c.keep_first}) must be between 0 and the budget ({c.recompute_budget})")
        return c


@register
class Truncate(Method):
    """Middle truncation: the first ``keep_first`` and last ``budget - keep_first`` context tokens."""

    name = "truncate"
    Config = TruncateConfig

    def select(self, ctx: Context, part: QuestionPart, timer: Timer) -> torch.Tensor:
        c, n = self.config, ctx.ids.shape[0]
        if n <= c.recompute_budget:
            return torch.arange(n, device=ctx.ids.device)
        keep = forced_mask(n, c.keep_first, c.recompute_budget - c.keep_first, ctx.ids.device)
        return keep.nonzero()[:, 0]
