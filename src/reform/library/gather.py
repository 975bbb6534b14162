"""REFORM's gather over several documents at once (docs/library.md). Each candidate document is its own
context; a question scores every token of every candidate as REFORM scores one context's (§3.3: cosine of
the selected heads' embeddings to the question's tokens, max over them, max-pooled), and the documents
method's passage scores come from the library's one index, so the scores of two documents compare. One
recompute budget is then spent on the best tokens of all candidates together, and the gathered tokens are
recomputed document by document, each under a line naming its document.

How this differs from one context of the same documents laid end to end: each document is encoded alone
(its compressed cache never holds another's tokens, so a question's embeddings are computed on top of each
document's own cache), no first or last tokens are kept by force, and only the first stage's candidates are
scored token by token."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..engine.layout import QuestionPart
from ..methods import Context, Reform, ReformRag
from ..methods.reform import gather_indices
from ..methods.whole_runs import whole_runs
from ..methods.rag import passage_token_scores
from ..methods.reform_rag import RETRIEVERS, mixed_ranking


@dataclass
class Gathered:
    """One candidate document's share of the gather: its context, the kept token indices (ascending) and
    their scores."""

    name: str
    ctx: Context
    kept: torch.Tensor
    scores: torch.Tensor


def token_scores(method: Reform, ctx: Context, part: QuestionPart, passages: dict[str, torch.Tensor],
                 spans: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One document's raw REFORM ranking (pooled cosine, comparable across documents) and its tokens'
    passage scores by each retriever the method mixes in (none for REFORM alone)."""
    if ctx.state is None:
        raise ValueError("a library document's context keeps no token embeddings; add the document again")
    query = method.query_embeddings(ctx, part)
    reform = Reform.ranking(method, ctx, part, query)
    if not isinstance(method, ReformRag):
        return reform, []
    n = ctx.ids.shape[0]
    return reform, [passage_token_scores(passages[kind], spans, n) for kind in RETRIEVERS[method.config.retriever]]


def gather(method: Reform, documents: list[tuple[str, Context, dict[str, torch.Tensor], torch.Tensor]],
           part: QuestionPart, budget: int, prefix: int) -> list[Gathered]:
    """The ``budget`` best tokens of ``documents`` (``(name, context, passage scores by retriever, passage
    spans)``), scored as one context of them would be by ``method``'s ranking, with no tokens kept by force;
    each context's first ``prefix`` tokens (the prompt template's) are never gathered."""
    reform, passages, sizes = [], [], []
    for _, ctx, scores, spans in documents:
        r, p = token_scores(method, ctx, part, scores, spans)
        reform.append(r)
        passages.append(p)
        sizes.append(r.shape[0])
    c = method.config
    if isinstance(method, ReformRag):
        per_retriever = [torch.cat([p[i] for p in passages]) for i in range(len(passages[0]))]
        scores = mixed_ranking(torch.cat(reform), per_retriever, c.weight,
                               c.pool_window if c.pool_passages else None, sizes)
    else:
        scores = torch.cat(reform)
    starts = torch.tensor([0, *sizes[:-1]]).cumsum(0)
    for start in starts.tolist():
        scores[start:start + prefix] = float("-inf")
    keep = gather_indices(scores, budget, 0, 0)
    if c.min_run:
        keep = whole_runs(scores, keep, c.min_run, torch.zeros_like(scores, dtype=torch.bool))
    keep = keep[torch.isfinite(scores[keep])]
    out, start = [], 0
    for (name, ctx, _, _), size in zip(documents, sizes):
        mine = keep[(keep >= start) & (keep < start + size)]
        if mine.numel():
            out.append(Gathered(name, ctx, mine - start, scores[mine]))
        start += size
    return out

