"""REFORM + RAG hybrid (REFORM §4.4, Table 5): REFORM's token-level importance scores combined with a
dense retriever's passage scores by a weighted sum; gather and recompute as REFORM does."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from ..engine.layout import QuestionPart
from .base import Context, Runtime, register
from .checkpoint import Checkpoint
from .options import added_later, positive, require_positive
from .rag import PassageIndex
from .reform import Reform, ReformConfig, max_pool
from .retrievers import BM25, Dense, Retriever



def standardize(x: torch.Tensor) -> torch.Tensor:
    return (x - x.mean()) / x.std().clamp_min(1e-6)


def mixed_ranking(reform: torch.Tensor, passages: list[torch.Tensor], weight: float, pool_window: int | None,
                  segments: list[int] | None = None) -> torch.Tensor:
    """``(1 - weight) * standardize(reform) + weight * mean(standardize(p) for p in passages)``, the passage
    part max-pooled over ``pool_window`` (None: not pooled) within each of ``segments`` (token counts of
    contexts laid end to end, as a library's documents are; None: one)."""
    mixed = sum(standardize(p.to(reform.device)) for p in passages) / len(passages)
    if pool_window:
        mixed = torch.cat([max_pool(part, pool_window) for part in mixed.split(segments or [mixed.shape[0]])])
    return (1 - weight) * standardize(reform) + weight * mixed


RETRIEVERS = {"dense": ("dense",), "bm25": ("bm25",), "dense+bm25": ("dense", "bm25")}


def retriever(kind: str, device) -> Retriever:
    return Dense(device) if kind == "dense" else BM25()


@dataclass
class ReformRagConfig(ReformConfig):
    """REFORM's options plus ``weight`` of the dense scores (0: REFORM alone, 1: dense retrieval alone)
    and the retriever's passage size. The paper does not give its weight or how the two scales are
    matched; here both score vectors are standardised (zero mean, unit variance over the context) before
    ``(1 - weight) * reform + weight * dense``."""

    weight: float = 0.5
    passage_tokens: int = positive(128)
    # which passage scores are mixed in: the paper's dense retriever, BM25 (no model: an index in well under
    # a second where the dense one takes minutes on a CPU), or both, each standardised and weighed equally
    retriever: str = field(default="dense", metadata=added_later("dense"))
    # REFORM's run_peaks, off here by default: its recall was measured on REFORM's ranking, not on this mix
    run_peaks: int = field(default=0, metadata=added_later(0))
    # REFORM's query_tokens, every question token here: ``content`` was measured on REFORM's ranking alone
    query_tokens: str = field(default="all", metadata=added_later("all"))
    # REFORM's query_aggregate, the paper's max here: maxsim was measured on REFORM's ranking alone, and
    # under this mix it kept one evidence span fewer on the docs suite (docs/results/gather-maxsim)
    query_aggregate: str = field(default="max", metadata=added_later("max"))
    # the mixed passage scores max-pooled over ``pool_window`` before the mix, as REFORM pools its own token
    # scores (§3.3): a needle a few tokens past a passage boundary then scores with the passage that holds
    # its key, not with its own (docs/methods.md, "Documents"). Not in the paper; off here, on for documents
    pool_passages: bool = field(default=False, metadata=added_later(False))

    def check(self, shape) -> None:
        super().check(shape)
        require_positive(passage_tokens=self.passage_tokens)
        if not 0.0 <= self.weight <= 1.0:
            raise ValueError(f"weight must be between 0 and 1, got {self.weight}")
        if self.retriever not in RETRIEVERS:
            raise ValueError(f"retriever must be one of {', '.join(RETRIEVERS)}, got {self.retriever!r}")


@register
class ReformRag(Reform):
    name = "reform+rag"
    takes_images = False     # its retriever reads the context as text
    Config = ReformRagConfig

    def encode(self, pipe: Runtime, ids: torch.Tensor, progress: Callable[[int], None] | None = None,
               checkpoint: Checkpoint | None = None, embed_short: bool = False) -> Context:
        ctx = super().encode(pipe, ids, progress, checkpoint, embed_short)
        if ctx.state is not None:
            ctx.extra["passages"] = self.indexes(pipe, ids)
        return ctx

    def indexes(self, pipe: Runtime, ids: torch.Tensor, saved: dict | None = None) -> dict[str, PassageIndex]:
        """One passage index per retriever; a dense index is a tensor a saved context keeps, a BM25 index is
        rebuilt from the ids (cheap and deterministic) rather than stored as a Python object."""
        return {kind: PassageIndex.build(pipe, ids, self.config.passage_tokens, retriever(kind, pipe.engine.device),
                                         (saved or {}).get(kind))
                for kind in RETRIEVERS[self.config.retriever]}

    def saved_state(self, ctx: Context) -> dict[str, torch.Tensor]:
        saved = super().saved_state(ctx)
        if "passages" not in ctx.extra:      # an unfinished encode's checkpoint: passages come at the end
            return saved
        dense = ctx.extra["passages"].get("dense")
        return saved if dense is None else {**saved, "passages": dense.index}

    def restore_state(self, ctx: Context, tensors: dict[str, torch.Tensor]) -> None:
        super().restore_state(ctx, tensors)
        if ctx.state is not None and ("passages" in tensors or "dense" not in RETRIEVERS[self.config.retriever]):
            ctx.extra["passages"] = self.indexes(ctx.pipeline, ctx.ids, {"dense": tensors.get("passages")})

    def ranking(self, ctx: Context, part: QuestionPart, query: torch.Tensor) -> torch.Tensor:
        """REFORM's ranking mixed with the retrievers' passage scores, each standardised; several retrievers
        share the ``weight`` equally, and ``pool_passages`` max-pools their mean as REFORM's scores are
        pooled (``run_peaks`` then lifts what this misses)."""
        reform = super().ranking(ctx, part, query)
        question = ctx.pipeline.tokenizer.decode(part.question, skip_special_tokens=True)
        c = self.config
        return mixed_ranking(reform, [p.token_scores(question, reform.shape[0]) for p in ctx.extra["passages"].values()],
                             c.weight, c.pool_window if c.pool_passages else None)
