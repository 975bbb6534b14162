"""Gather variants for REFORM, measured against the paper's on saved contexts (``scripts/recall_lab.py``).

The paper's gather (§3.3, appendix C.6) scores each context token by its best cosine to any one question
token. Two kinds of needle defeat that:

- **keys made of common pieces** (RULER's UUID keys among UUID distractors): every piece of the asked
  key (``7f``, ``-``, ``9e``) also occurs in every other key, so each question token finds its best
  match anywhere. What singles the asked key out is its pieces *in order*. ``aligned``: a context token
  scores by ``ordered_run_scores`` (the mean over a run of consecutive context tokens against as many
  consecutive question tokens), alone or added to the paper's score (REFORM's ``match_run`` option).
  ``runpeaks``: the paper's gather, with the ``peaks`` best distinct ordered-run windows taken first (a
  span around each, ``RUN_BEFORE`` tokens before the run's peak and ``RUN_AFTER`` after, where a needle's
  value follows its key), so the paper's ranking still fills most of the budget.
- **chains** (RULER's variable tracking: ``VAR A = 12345`` ... ``VAR B = VAR A``): the question names only
  the value, so only the first hop resembles it. ``rounds2``: a second round asks with the rare tokens
  (at most ``RARE`` occurrences in the context) around the first round's best windows, and the rest of
  the budget goes to what they match.

Each function returns the indices (ascending) of the gathered tokens with the method's budget and ends.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ..engine.policies import forced_mask
from ..stats import Timer
from .reform import gather_indices, max_pool, ordered_run_scores, token_scores

RARE = 8             # a token id seen at most this often in the context is "rare" (a name, a key, a number)
EXPAND = 32          # tokens on each side of a first-round peak that may join the second round's query
PEAKS = 2            # first-round peaks whose rare tokens ask the second round
RUN_BEFORE, RUN_AFTER = 32, 64   # runpeaks: the span kept around an ordered-run peak


def paper(ctx, part) -> torch.Tensor:
    return ctx.method.select(ctx, part, Timer())


def gather(ctx, scores: torch.Tensor) -> torch.Tensor:
    c = ctx.method.config
    return gather_indices(max_pool(scores, c.pool_window), c.recompute_budget, c.gather_keep, c.gather_keep)


def aligned(ctx, part, run: int) -> torch.Tensor:
    """The ordered-run score alone (REFORM's ``match_run`` adds it to the paper's: ``matched``)."""
    return gather(ctx, ordered_run_scores(ctx.state.data, ctx.method.query_embeddings(ctx, part), run))


def matched(ctx, part, run: int) -> torch.Tensor:
    """REFORM's own gather with ``match_run`` = ``run``."""
    return type(ctx.method)(replace(ctx.method.config, match_run=run)).select(ctx, part, Timer())


def run_peaks(ctx, part, run: int, peaks: int) -> torch.Tensor:
    """The paper's gather after the ``peaks`` best distinct ordered-run windows (``run`` tokens) are kept."""
    c, n = ctx.method.config, ctx.ids.shape[0]
    query = ctx.method.query_embeddings(ctx, part)
    scores = max_pool(token_scores(ctx.state.data, query), c.pool_window)
    runs = ordered_run_scores(ctx.state.data, query, run)
    forced = forced_mask(n, c.gather_keep, c.gather_keep, scores.device)
    for p in distinct_peaks(runs, c.pool_window, peaks, forced):
        scores[max(0, p - RUN_BEFORE):p + RUN_AFTER + 1] = float("inf")
    return gather_indices(scores, c.recompute_budget, c.gather_keep, c.gather_keep)


def distinct_peaks(scores: torch.Tensor, window: int, count: int, skip: torch.Tensor,
                   floor: float = float("-inf")) -> list[int]:
    """Up to ``count`` positions of the highest ``scores`` above ``floor``, at least ``window`` apart and
    outside ``skip`` (the always-kept ends): the best distinct windows."""
    found: list[int] = []
    for p in torch.argsort(scores, descending=True).tolist():
        if scores[p] <= floor or len(found) == count:
            break
        if skip[p] or any(abs(p - q) < window for q in found):
            continue
        found.append(p)
    return found


def rounds2(ctx, part) -> torch.Tensor:
    """Half the budget (beyond the ends) from the paper's scores, half from a second round asked with the
    rare tokens around the first round's ``PEAKS`` best windows."""
    c, ids, n = ctx.method.config, ctx.ids, ctx.ids.shape[0]
    first = ctx.method.similarities(ctx, part)
    forced = forced_mask(n, c.gather_keep, c.gather_keep, first.device)
    counts = torch.bincount(ids, minlength=int(ids.max()) + 1)
    near = torch.zeros(n, dtype=torch.bool)
    for p in distinct_peaks(first, c.pool_window, PEAKS, forced):
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
            **{f"paper+aligned{run}": (lambda run: lambda ctx, part: matched(ctx, part, run))(run) for run in (8, 16)},
            **{f"runpeaks{k}": (lambda k: lambda ctx, part: run_peaks(ctx, part, 16, k))(k) for k in (1, 2)}}
