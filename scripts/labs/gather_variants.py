"""Gather variants for REFORM, measured against the paper's on saved contexts (``scripts/recall_lab.py``); a lab,
not part of the library.

The paper's gather (§3.3, appendix C.6) scores each context token by its best cosine to any one question
token. Two kinds of needle defeat that:

- **keys made of common pieces** (RULER's UUID keys among UUID distractors): every piece of the asked
  key (``7f``, ``-``, ``9e``) also occurs in every other key, so each question token finds its best
  match anywhere. What singles the asked key out is its pieces *in order*. ``aligned``: a context token
  scores by ``ordered_run_scores`` (the mean over a run of consecutive context tokens against as many
  consecutive question tokens), alone or added to the paper's score (REFORM's ``match_run`` option).
  ``runpeaks``: the paper's gather, with the windows around the best distinct ordered runs it does not hold
  whole taken first, so the paper's ranking still fills most of the budget, all of it where the best run's
  window is already gathered (REFORM's ``run_peaks`` option); ``forcedpeaks``: those windows taken first whether or
  not the paper's gather has them.
- **chains** (RULER's variable tracking: ``VAR A = 12345`` ... ``VAR B = VAR A``): the question names only
  the value, so only the first hop resembles it. ``rounds2``: a second round asks with the rare tokens
  (at most ``RARE`` occurrences in the context) around the first round's best windows, and the rest of
  the budget goes to what they match.

``rag`` and ``ragpeaks1``: REFORM+RAG's gather (its dense passage scores mixed into REFORM's) without and
with ``run_peaks``, to decide whether the hybrid takes it by default too. ``ragboth``: the documents gather
(``retriever=dense+bm25``); ``ragbothpool``: the same with ``pool_passages``, the passage scores max-pooled
as REFORM's are, so a needle just past a passage boundary keeps the score of the passage that names it.

Each function returns the indices (ascending) of the gathered tokens with the method's budget and ends.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from dataclasses import fields, replace
from functools import partial

import torch
import torch.nn.functional as F

from reform.engine.extractors import HeadEmbeddings, HeadSpec
from reform.engine.policies import forced_mask
from reform.eval.recall import kept_runs
from reform.stats import Timer
from reform.methods.reform import (PEAK_RUN, distinct_peaks, gather_indices, max_pool, ordered_run_scores, raise_run_windows,
                     token_scores)
from reform.methods.rag import PassageIndex
from reform.methods.reform_rag import RETRIEVERS, ReformRag, ReformRagConfig, retriever

RARE = 8             # a token id seen at most this often in the context is "rare" (a name, a key, a number)
EXPAND = 32          # tokens on each side of a first-round peak that may join the second round's query
PEAKS = 2            # first-round peaks whose rare tokens ask the second round


def reform_with(ctx, **options):
    """REFORM with the paper's gather (``match_run`` and ``run_peaks`` off, the max over question tokens,
    whatever the context was encoded with), then ``options``."""
    return type(ctx.method)(replace(ctx.method.config, **{"match_run": 0, "run_peaks": 0, "query_aggregate": "max",
                                                          **options}))


def head_subset(ctx, names: str):
    """``ctx`` seen through a subset of its heads (``3:q:3+7:v:0``): their columns of the stored embeddings
    and REFORM's config with those heads, so the question's embeddings are computed for them alone. One
    encode with the union of several head sets measures each set's gather."""
    specs = [HeadSpec.parse(h) for h in names.split("+")]
    heads, d = list(ctx.method.config.heads), ctx.pipeline.engine.shape.head_dim
    cols = torch.cat([torch.arange(heads.index(h) * d, (heads.index(h) + 1) * d) for h in specs])
    view = copy.copy(ctx)
    view.state = HeadEmbeddings.from_data(specs, ctx.pipeline.engine.shape, ctx.state.data[:, cols])
    view.method = type(ctx.method)(replace(ctx.method.config, heads=tuple(specs)))
    return view


@contextmanager
def stop_words(name: str):
    """REFORM's ``content_tokens`` with another English stop-word list while inside: ``bm25s`` (the
    default, Lucene's 33 words) or ``sklearn`` (scikit-learn's 318, the Glasgow IR group's list, which also
    holds the question words: what, which, when, from, did ...)."""
    import reform.methods.reform as module
    original = module.content_tokens
    if name == "sklearn":
        from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS
        module.content_tokens = partial(original, stop_words=ENGLISH_STOP_WORDS)
    elif name != "bm25s":
        raise ValueError(f"stop-word list must be bm25s or sklearn, got {name!r}")
    try:
        yield
    finally:
        module.content_tokens = original


NULL_QUESTION = "N/A"      # ICR's content-free query (Chen et al., 2024, arXiv 2410.02642)


@contextmanager
def null_question(weight: float, text: str = NULL_QUESTION):
    """REFORM's MaxSim ranking calibrated by a content-free question while inside: each context token's best
    cosine to the tokens of ``text`` (asked in the question's place, every token searching), times
    ``weight``, is subtracted from its cosines to the real question before the windows are scored, so a
    token that matches any question at all (a hub) no longer tops the gather (ICR's calibration; QRHead's
    "N/A" baseline)."""
    from reform.engine.layout import QuestionPart
    from reform.methods.reform import Reform, window_maxsim
    original = Reform.ranking

    def ranking(self, ctx, part, query):
        c = self.config
        if c.query_aggregate != "maxsim":
            return original(self, ctx, part, query)
        null = QuestionPart(part.separator, ctx.pipeline.templater.encode(text), part.suffix)
        plain = type(self)(replace(c, query_tokens="all"))
        offsets = weight * token_scores(ctx.state.data, plain.query_embeddings(ctx, null))
        return window_maxsim(ctx.state.data, query, c.pool_window, top=c.maxsim_top, offsets=offsets)

    Reform.ranking = ranking
    try:
        yield
    finally:
        Reform.ranking = original


GAP_MARK = " ...\n"     # where text was left out, as an excerpt marks it


@contextmanager
def gap_marks(mark: str = GAP_MARK):
    """REFORM's recompute with ``mark``'s tokens between gathered runs that are not contiguous in the context,
    while inside: the reader sees where text was left out, as a RAG prompt sees where its passages break,
    instead of the paper's runs joined end to end (§3.3). The gather is unchanged; the marks add a few
    tokens per run to the prompt."""
    from reform.methods.base import Prompt
    from reform.methods.reform import Reform
    original = Reform.prompt

    def prompt(self, ctx, part, timer):
        ids, cache, keep, scores = original(self, ctx, part, timer)
        if keep is None or keep.shape[0] == 0:
            return Prompt(ids, cache, keep, scores)
        mark_ids = torch.tensor(ctx.pipeline.templater.encode(mark), dtype=ids.dtype, device=ids.device)
        breaks = (torch.nonzero(keep[1:] != keep[:-1] + 1).flatten() + 1).tolist()
        runs = torch.tensor_split(ids[:keep.shape[0]], breaks)
        pieces = [piece for run in runs[:-1] for piece in (run, mark_ids)] + [runs[-1], ids[keep.shape[0]:]]
        return Prompt(torch.cat(pieces), cache, keep, scores)

    Reform.prompt = prompt
    try:
        yield
    finally:
        Reform.prompt = original


@contextmanager
def pooled_windows(width: int = 1):
    """REFORM's maxsim gather with each token scored by the best window that holds it, while inside: the
    window scores (``window_maxsim``, one per window centre) max-pooled over the same window, so every token
    of a window takes that window's score, as the paper's max-pool gives every token within reach of a peak
    the peak's score (§3.3). Without it a token scores only as the centre of its window, and where window
    scores hover at the budget's cut-off the gather keeps combs of 1-20-token pieces. ``width`` > 1 (odd):
    pool over that many tokens instead, which fills a comb's gaps narrower than it and widens each run by
    ``width - 1`` tokens only."""
    from reform.methods import reform as module
    original = module.window_maxsim

    def pooled(context, query, window, **options):
        return module.max_pool(original(context, query, window, **options), width if width > 1 else window)

    module.window_maxsim = pooled
    try:
        yield
    finally:
        module.window_maxsim = original


def paper(ctx, part) -> torch.Tensor:
    return reform_with(ctx).select(ctx, part, Timer())


def gather(ctx, scores: torch.Tensor) -> torch.Tensor:
    c = ctx.method.config
    return gather_indices(max_pool(scores, c.pool_window), c.recompute_budget, c.gather_keep, c.gather_keep)


def aligned(ctx, part, run: int) -> torch.Tensor:
    """The ordered-run score alone (REFORM's ``match_run`` adds it to the paper's: ``matched``)."""
    return gather(ctx, ordered_run_scores(ctx.state.data, ctx.method.query_embeddings(ctx, part), run))


def matched(ctx, part, run: int) -> torch.Tensor:
    """REFORM's own gather with ``match_run`` = ``run``."""
    return reform_with(ctx, match_run=run).select(ctx, part, Timer())


def run_peaks(ctx, part, peaks: int) -> torch.Tensor:
    """REFORM's own gather with ``run_peaks`` = ``peaks``."""
    return reform_with(ctx, run_peaks=peaks).select(ctx, part, Timer())


def forced_peaks(ctx, part, peaks: int) -> torch.Tensor:
    """The windows around the ``peaks`` best ordered runs gathered first whether or not the paper's gather
    has them (``run_peaks`` before it learned to leave gathered runs alone), the paper's ranking after."""
    c, query = ctx.method.config, ctx.method.query_embeddings(ctx, part)
    pooled = ctx.method.ranking(ctx, part, query)
    raise_run_windows(pooled, ordered_run_scores(ctx.state.data, query, PEAK_RUN), c, peaks)
    return gather_indices(pooled, c.recompute_budget, c.gather_keep, c.gather_keep)


def with_rag(ctx, part, peaks: int, **options) -> torch.Tensor:
    """REFORM+RAG's gather (REFORM §4.4) on a REFORM context, with ``run_peaks`` = ``peaks`` and the hybrid's
    ``options`` (``retriever``, ``pool_passages``): REFORM's options, the hybrid's own defaults otherwise.
    Each passage index is built on first use and kept in ``ctx.extra`` (REFORM+RAG builds them at encode
    time)."""
    c = ctx.method.config
    config = ReformRagConfig(**{f.name: getattr(c, f.name) for f in fields(c)})
    method = ReformRag(replace(config, match_run=0, run_peaks=peaks, query_tokens=ReformRagConfig().query_tokens,
                               query_aggregate=ReformRagConfig().query_aggregate,
                               **options))
    built = ctx.extra.setdefault("all_passages", {})      # every retriever's index, whichever variant asked
    for kind in RETRIEVERS[method.config.retriever]:
        if kind not in built:
            built[kind] = PassageIndex.build(ctx.pipeline, ctx.ids, config.passage_tokens,
                                             retriever(kind, ctx.pipeline.engine.device))
    ctx.extra["passages"] = {kind: built[kind] for kind in RETRIEVERS[method.config.retriever]}
    return method.select(ctx, part, Timer())


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
            **{f"runpeaks{k}": (lambda k: lambda ctx, part: run_peaks(ctx, part, k))(k) for k in (1, 2)},
            **{f"forcedpeaks{k}": (lambda k: lambda ctx, part: forced_peaks(ctx, part, k))(k) for k in (1, 2)},
            "rag": lambda ctx, part: with_rag(ctx, part, 0), "ragpeaks1": lambda ctx, part: with_rag(ctx, part, 1),
            "ragboth": lambda ctx, part: with_rag(ctx, part, 0, retriever="dense+bm25"),
            "ragbothpool": lambda ctx, part: with_rag(ctx, part, 0, retriever="dense+bm25", pool_passages=True),
            # the pooled documents mix with less weight on the retrievers (0.3 against the default 0.5)
            "ragbothpool.3": lambda ctx, part: with_rag(ctx, part, 0, retriever="dense+bm25", pool_passages=True,
                                                        weight=0.3)}


def whole_windows(scores: torch.Tensor, budget: int, keep: int, window: int) -> torch.Tensor:
    """The budget as whole windows instead of the best tokens: the ends, then the ``window`` tokens centred
    on the best-scoring token, then those centred on the best token outside them, and so on; the last
    window cut to what is left, nearest its centre first. A window's score (MaxSim's) rates the window
    centred on a token, so this keeps what was rated, and no budget goes to runs of a few tokens whose
    centred windows score a hair above the cut."""
    n = scores.shape[0]
    taken = forced_mask(n, keep, keep, scores.device)
    left, half = budget - int(taken.sum()), window // 2
    for p in torch.argsort(scores, descending=True, stable=True).tolist():
        if left <= 0:
            break
        if taken[p]:
            continue
        lo = max(0, p - half)
        free = torch.nonzero(~taken[lo:p + half + 1]).flatten() + lo
        if free.numel() > left:
            free = free[(free - p).abs().argsort(stable=True)[:left]]
        taken[free] = True
        left -= free.numel()
    return torch.nonzero(taken).flatten()


def without_fragments(scores: torch.Tensor, budget: int, keep: int, shortest: int = 16) -> torch.Tensor:
    """REFORM's gather with its runs of fewer than ``shortest`` tokens (the ends aside) given back, and the
    budget they held spent growing the kept runs: each time the best-scoring token next to a kept run."""
    n = scores.shape[0]
    kept = gather_indices(scores, budget, keep, keep)
    taken = torch.zeros(n, dtype=torch.bool, device=scores.device)
    taken[kept] = True
    forced = forced_mask(n, keep, keep, scores.device)
    for start, stop in kept_runs(kept):
        if stop - start < shortest and not forced[start:stop].any():
            taken[start:stop] = False
    for _ in range(budget - int(taken.sum())):
        edge = ~taken & (F.pad(taken[1:], (0, 1)) | F.pad(taken[:-1], (1, 0)))
        taken[int(scores.masked_fill(~edge, float("-inf")).argmax())] = True
    return torch.nonzero(taken).flatten()
