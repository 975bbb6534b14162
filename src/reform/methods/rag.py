"""RAG baselines, OP-RAG style (REFORM §4.4 and appendix C.4; Yu et al., 2024, "In Defense of RAG in the
Era of Long-Context Language Models"): the context is split into 128-token passages, the question
retrieves passages until REFORM's recompute budget is filled, and the chosen passages are kept in their
original order (not by score) and recomputed with the question, like REFORM's gathered tokens.
``rag-bm25`` retrieves with BM25, ``rag-dense`` with all-MiniLM-L6-v2 embeddings."""

from __future__ import annotations

from abc import ABC, abstractmethod

from dataclasses import dataclass, replace
from typing import Callable

import torch

from ..engine.shape import ModelShape
from ..engine.layout import QuestionPart
from ..stats import Timer
from .base import Context, Method, Runtime, register
from .options import pick, positive, require_positive, require_room
from .retrievers import BM25, Dense, Retriever



@dataclass
class PassageIndex:
    """The context's passages (``[start, end)`` spans of context ids after the ``prefix`` template
    tokens) indexed by a retriever; built at encode time, independent of any question."""

    prefix: int
    spans: list[tuple[int, int]]
    retriever: Retriever
    index: object

    @classmethod
    def build(cls, pipe: Runtime, ids: torch.Tensor, size: int, retriever: Retriever,
              index: object = None) -> "PassageIndex":
        """Split ``ids`` into passages and index them (or take the ``index`` a saved context kept)."""
        prefix = min(len(pipe.templater.prefix), ids.shape[0])
        spans = [(s, min(s + size, ids.shape[0])) for s in range(prefix, ids.shape[0], size)]
        if index is None:
            texts = [pipe.tokenizer.decode(ids[s:e].tolist(), skip_special_tokens=True) for s, e in spans]
            index = retriever.index(texts)
        return cls(prefix, spans, retriever, index)

    def scores(self, query: str) -> torch.Tensor:
        """One score per passage."""
        return self.retriever.scores(self.index, query)

    def token_scores(self, query: str, n: int) -> torch.Tensor:
        """Every context token gets its passage's score (template prefix tokens: the passages' mean)."""
        return passage_token_scores(self.scores(query), torch.tensor(self.spans).reshape(-1, 2), n)


def passage_token_scores(scores: torch.Tensor, spans: torch.Tensor, n: int) -> torch.Tensor:
    """Each of ``n`` context tokens gets the score of its passage (``spans`` [P, 2], contiguous from the
    first), and the template's tokens before the first passage the mean over the passages' tokens."""
    per_token = scores.repeat_interleave(spans[:, 1] - spans[:, 0])
    prefix = int(spans[0, 0]) if spans.numel() else n
    return torch.cat([per_token.mean().expand(prefix), per_token])[:n]


def pick_passages(scores: torch.Tensor, sizes: list[int], budget: int) -> list[int]:
    """Passages by descending score while they fit in ``budget`` tokens; returned in original order."""
    chosen, used = [], 0
    for i in torch.argsort(scores, descending=True, stable=True).tolist():
        if used + sizes[i] <= budget:
            chosen.append(i)
            used += sizes[i]
        if used == budget:
            break
    return sorted(chosen)


@dataclass
class RagConfig:
    """``recompute_budget`` context tokens are retrieved: REFORM's recompute budget (W/2 or the model
    preset's value), as the paper matches RAG's 8k retrieved tokens to REFORM's; passages of 128 tokens."""

    recompute_budget: int | None = positive()
    passage_tokens: int = positive(128)

    def resolve(self, shape: ModelShape) -> "RagConfig":
        c = replace(self, recompute_budget=pick(self.recompute_budget, shape.window // 2))
        require_positive(recompute_budget=c.recompute_budget, passage_tokens=c.passage_tokens)
        require_room(c.recompute_budget, shape)
        return c


class Rag(Method, ABC):
    """Index passages at encode time; at question time recompute the template prefix + the retrieved
    passages (in order) + the question, and generate."""

    takes_images = False     # passages are retrieved as text

    Config = RagConfig

    @abstractmethod
    def retriever(self, pipe: Runtime) -> Retriever:
        """The passage scorer (BM25 or dense); each concrete RAG method defines it."""

    def encode(self, pipe: Runtime, ids: torch.Tensor, progress: Callable[[int], None] | None = None) -> Context:
        if ids.shape[0] <= self.config.recompute_budget:     # everything will be recomputed: no retrieval
            return Context(pipe, self, ids)
        index = PassageIndex.build(pipe, ids, self.config.passage_tokens, self.retriever(pipe))
        if progress is not None:
            progress(ids.shape[0])
        return Context(pipe, self, ids, state=index)

    def saved_state(self, ctx: Context) -> dict[str, torch.Tensor]:
        """A dense index is a tensor and is saved; a BM25 index is rebuilt from the ids on load (cheap and
        deterministic) rather than stored as a Python object."""
        index = getattr(ctx.state, "index", None)
        return {"passages": index} if isinstance(index, torch.Tensor) else {}

    def restore_state(self, ctx: Context, tensors: dict[str, torch.Tensor]) -> None:
        if ctx.ids.shape[0] > self.config.recompute_budget:      # as ``encode``: otherwise nothing is indexed
            pipe = ctx.pipeline
            ctx.state = PassageIndex.build(pipe, ctx.ids, self.config.passage_tokens, self.retriever(pipe),
                                           tensors.get("passages"))

    def select(self, ctx: Context, part: QuestionPart, timer: Timer) -> torch.Tensor:
        return self.select_scored(ctx, part, timer)[0]

    def select_scored(self, ctx: Context, part: QuestionPart, timer: Timer) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The prefix and the best passages that fit the budget, in context order; each token scored by its
        passage's retrieval score (the prefix by the lowest of them)."""
        p, device = ctx.state, ctx.ids.device
        if p is None:
            return torch.arange(ctx.ids.shape[0], device=device), None
        budget = self.config.recompute_budget - p.prefix
        if budget <= 0:
            raise ValueError(f"the recompute budget ({self.config.recompute_budget}) leaves no room for passages "
                             f"after the {p.prefix} template tokens")
        query = ctx.pipeline.tokenizer.decode(part.question, skip_special_tokens=True)
        passage_scores = p.scores(query)
        chosen = pick_passages(passage_scores, [e - s for s, e in p.spans], budget)
        spans = [torch.arange(*p.spans[i]) for i in chosen]
        floor = float(passage_scores.min()) if passage_scores.numel() else 0.0
        scores = torch.cat([torch.full((p.prefix,), floor)] +
                           [torch.full((len(s),), float(passage_scores[i])) for i, s in zip(chosen, spans)])
        return torch.cat([torch.arange(p.prefix)] + spans).to(device), scores


@register
class RagBM25(Rag):
    name = "rag-bm25"

    def retriever(self, pipe: Runtime) -> Retriever:
        return BM25()


@register
class RagDense(Rag):
    name = "rag-dense"

    def retriever(self, pipe: Runtime) -> Retriever:
        return Dense(pipe.engine.device)
