"""Gather variants for REFORM, measured against the paper's on saved contexts (``scripts/recall_lab.py``).

The paper's gather (§3.3, appendix C.6) scores each context token by its best cosine to any one question
token. Two kinds of needle defeat that:

- **keys made of common pieces** (RULER's UUID keys among UUID distractors): every piece of the asked
  key (``7f``, ``-``, ``9e``) also occurs in every other key, so each question token finds its best
  match anywhere. What singles the asked key out is its pieces *in order*. ``aligned``: a context token
  scores by the mean cosine of a run of ``run`` consecutive context tokens to a run of as many
  consecutive question tokens (the best such pair of runs covering it), so a key matches only where its
  pieces follow each other as in the question.
- **chains** (RULER's variable tracking: ``VAR A = 12345`` ... ``VAR B = VAR A``): the question names only
  the value, so only the first hop resembles it. ``rounds2``: a second round asks with the rare tokens
  (at most ``RARE`` occurrences in the context) around the first round's best windows, and the rest of
  the budget goes to what they match.

Each function returns the indices (ascending) of the gathered tokens with the method's budget and ends.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..engine.policies import forced_mask
from ..stats import Timer
from .reform import gather_indices, max_pool, token_scores

RARE = 8             # a token id seen at most this often in the context is "rare" (a name, a key, a number)
EXPAND = 32          # tokens on each side of a first-round peak that may join the second round's query
PEAKS = 2            # first-round peaks whose rare tokens ask the second round


def paper(ctx, part) -> torch.Tensor:
    return ctx.method.select(ctx, part, Timer())


def similarity_matrix(ctx, part) -> torch.Tensor:
    """``[N, Q]``: each context token's score against each question token (per-head cosines summed)."""
    query = ctx.method.query_embeddings(ctx, part).float()
    data = ctx.state.data
    return torch.cat([data[s:s + 65536].float() @ query.T for s in range(0, data.shape[0], 65536)])


def aligned_scores(sim: torch.Tensor, run: int) -> torch.Tensor:
    """Per context token: the best mean of ``sim`` along ``run`` steps of a diagonal (context token t+k
    against question token j+k) among the diagonals through it."""
    n, q = sim.shape
    run = min(run, q)
    diag = sum(sim[k:n - run + 1 + k, k:q - run + 1 + k] for k in range(run)) / run     # [n-run+1, q-run+1]
    start = diag.amax(dim=1)                                     # the run starting at each context token
    # a token inside a run takes the run's score: max over the runs that cover it
    return F.max_pool1d(F.pad(start, (run - 1, run - 1), value=float("-inf"))[None, None], run, 1)[0, 0]


def gather(ctx, scores: torch.Tensor) -> torch.Tensor:
    c = ctx.method.config
    return gather_indices(max_pool(scores, c.pool_window), c.recompute_budget, c.gather_keep, c.gather_keep)


def aligned(ctx, part, run: int, with_paper: bool = False) -> torch.Tensor:
    """The aligned-run score alone, or added to the paper's (``with_paper``: a key's template words still
    count, its pieces in order add to them)."""
    sim = similarity_matrix(ctx, part)
    scores = aligned_scores(sim, run)
    return gather(ctx, scores + sim.amax(dim=1) if with_paper else scores)


def rounds2(ctx, part) -> torch.Tensor:
    """Half the budget (beyond the ends) from the paper's scores, half from a second round asked with the
    rare tokens around the first round's ``PEAKS`` best windows."""
    c, ids, n = ctx.method.config, ctx.ids, ctx.ids.shape[0]
    first = ctx.method.similarities(ctx, part)
    forced = forced_mask(n, c.gather_keep, c.gather_keep, first.device)
    counts = torch.bincount(ids, minlength=int(ids.max()) + 1)
    near = torch.zeros(n, dtype=torch.bool)
    order, peaks = torch.argsort(first.masked_fill(forced, float("-inf")), descending=True), []
    for p in order.tolist():
        if len(peaks) == PEAKS:
            break
        if all(abs(p - q) >= c.pool_window for q in peaks):
            peaks.append(p)
            near[max(0, p - EXPAND):p + EXPAND + 1] = True
    asking = torch.nonzero(near & (counts[ids] <= RARE)).flatten()
    if asking.numel() == 0:
        return paper(ctx, part)
    second = token_scores(ctx.state.data, ctx.state.data[asking])
    half = (c.recompute_budget - 2 * c.gather_keep) // 2
    pooled1, pooled2 = max_pool(first, c.pool_window), max_pool(second, c.pool_window)
    kept = gather_indices(pooled1, c.recompute_budget - half, c.gather_keep, c.gather_keep)
    taken = torch.zeros(n, dtype=torch.bool)
    taken[kept] = True
    extra = torch.topk(pooled2.masked_fill(taken, float("-inf")), min(half, int((~taken).sum()))).indices
    return torch.sort(torch.cat([kept, extra])).values


VARIANTS = {"paper": paper, "rounds2": rounds2,
            **{f"aligned{run}": (lambda run: lambda ctx, part: aligned(ctx, part, run))(run) for run in (4, 8, 16)},
            **{f"paper+aligned{run}": (lambda run: lambda ctx, part: aligned(ctx, part, run, True))(run)
               for run in (8, 16)}}
