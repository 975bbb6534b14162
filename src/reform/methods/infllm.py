"""InfLLM baseline (REFORM §4, the random-access baseline; Xiao et al., 2024, "InfLLM: Unveiling the
Intrinsic Capacity of LLMs for Understanding Extremely Long Sequences with Training-Free Memory"): sinks +
local window + every evicted token kept in 128-token memory blocks with 4 representative keys each; every
chunk, and then the question, retrieves the most relevant blocks per layer into its attention."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..engine.layout import QuestionPart, as_tensor
from ..engine.policies import InfLLMPolicy
from ..stats import Timer
from .base import CachedMethod, Context, Prompt, register
from .options import CacheConfig, keep_default, pick, require_positive



@dataclass
class InfLLMConfig(CacheConfig):
    """``cache_budget`` is the active cache (REFORM gives InfLLM 32k = W/4): ``keep_first`` sinks (the paper's
    128; 256 here as every baseline keeps, W/32 for small windows) + ``local_size`` recent tokens (the
    paper's 4096 of 32k, i.e. budget/8; up to a block more while a block fills) + as many retrieved
    ``block_size`` (128) blocks as fit the rest; ``repr_tokens`` (4) representative keys per block;
    chunk = W/4."""

    local_size: int | None = None
    block_size: int = 128
    repr_tokens: int = 4
    score_window: int = 128

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

    def policy(self, memory=None, score_window: int | None = None) -> InfLLM:
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
