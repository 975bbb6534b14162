"""REFORM: compress, gather, recompute (Song et al., NeurIPS 2025, arXiv 2506.01215).

1. **Compress** (§3.1): the context runs chunk by chunk through the decoder layers up to the deepest
   embedding head (early exit) on an H2O-compressed cache whose positions are re-packed after every
   chunk; the pre-RoPE Q/K/V states of a few selected heads are stored per token as L2-normalised,
   concatenated retrieval embeddings (§3.2).
2. **Gather** (§3.3, appendix C.6): the question's tokens run on top of the final compressed cache; every
   context token is scored by cosine similarity to each question token, max over question tokens,
   max-pooled over a 129-token window (``query_aggregate="max"``; the default here, ``maxsim``, takes each
   question token's best cosine in the window and their mean); the top ``recompute_budget`` tokens, always including the first
   and last ``gather_keep`` (the paper's 256, capped at an eighth of the budget), are kept in their
   original order.
3. **Recompute** (§3.3): the gathered tokens + the question run through the full model at fresh
   contiguous positions, and the answer is generated from that cache.

Experimental, not in the paper: ``segments`` = S > 1 splits the input into S segments that are encoded
independently, each after the input's first chunk as an anchor (as Star Attention, arXiv 2411.17116,
does for full attention), so S workers can encode one document at once (``Pipeline.segment_runner``);
their embeddings are concatenated and the last segment's cache serves the question. S = 1 is the
sequential encode above.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Literal

import torch
import torch.nn.functional as F

from ..engine.cache import KVCache
from ..engine.shape import ModelShape
from ..engine.extractors import HeadEmbeddings, HeadSpec
from ..engine.layout import QuestionPart, as_tensor
from ..engine.policies import H2OPolicy, forced_mask, top_budget
from ..heads import load_preset, resolve_heads
from ..stats import Timer
from .base import Context, Method, Prompt, Runtime, register
from .checkpoint import Checkpoint
from .options import (INPUT_ONLY, added_later, keep_default, pick, positive, require_chunk_fits, require_keep,
                      require_positive, require_room)
from .query_words import QUERY_WEIGHTS, content_tokens, rarity_weights
from .whole_runs import whole_runs



def token_scores(context: torch.Tensor, query: torch.Tensor, offsets: torch.Tensor | None = None,
                 block: int = 1 << 16) -> torch.Tensor:
    """Max over query tokens of the mean per-head cosine similarity, for every context token.

    ``context`` [N, E] and ``query`` [Q, E] hold per-head L2-normalised states concatenated, so a dot
    product divided by the head count is the mean of the per-head cosines. Blockwise over N.
    ``offsets`` [Q]: subtracted from each query token's similarities before the max (``query_offsets``).
    """
    q = query.float().T
    out = torch.empty(context.shape[0], dtype=torch.float32, device=context.device)
    for s in range(0, context.shape[0], block):
        sim = context[s:s + block].float() @ q
        out[s:s + block] = (sim if offsets is None else sim - offsets).amax(dim=-1)
    return out


def query_offsets(context: torch.Tensor, query: torch.Tensor, quantile: float, sample: int = 1 << 14) -> torch.Tensor:
    """Each query token's ``quantile`` of its similarities over the context, read on an evenly strided
    sample of at most ``sample`` context tokens: how strongly that token matches an ordinary window."""
    picked = context[:: max(1, context.shape[0] // sample)][:sample]
    return torch.quantile(picked.float() @ query.float().T, quantile, dim=0)


def window_maxsim(context: torch.Tensor, query: torch.Tensor, window: int, weights: torch.Tensor | None = None,
                  top: int = 0, offsets: torch.Tensor | None = None, block: int = 1 << 15) -> torch.Tensor:
    """Per context token: the mean over query tokens of each query token's best cosine within the ``window``
    (odd) tokens centred on it, weighted by ``weights`` [Q] when given: ColBERT's MaxSim (Khattab and
    Zaharia, SIGIR 2020) over a sliding window, so a window scores by how many of the question's words it
    matches, not by its single best match. ``top`` > 0: the mean over the ``top`` query tokens that match
    the window best. ``offsets`` [N]: subtracted from each context token's cosines before the max (a
    per-token calibration, as ICR subtracts a content-free query's attention). Same scale as
    ``token_scores``. Blockwise over N with a halo of ``window // 2`` tokens,
    never the whole [N, Q] matrix."""
    n, half = context.shape[0], window // 2
    q = query.float().T
    w = torch.ones(q.shape[1]) if weights is None else weights.float()
    w = (w / w.sum()).to(context.device)
    out = torch.empty(n, dtype=torch.float32, device=context.device)
    for s in range(0, n, block):
        lo, hi = max(0, s - half), min(n, s + block + half)
        sim = context[lo:hi].float() @ q                                         # [b + 2 half, Q]
        if offsets is not None:
            sim -= offsets[lo:hi, None].to(sim)
        pooled = F.max_pool1d(sim.T[None], window, 1, padding=half)[0]          # [Q, b + 2 half]
        e = min(n, s + block)
        pooled = pooled[:, s - lo:e - lo] * w[:, None] * q.shape[1]
        out[s:e] = pooled.topk(min(top, q.shape[1]), dim=0).values.mean(0) if top else pooled.mean(0)
    return out


QUERY_TOKENS = ("all", "content")
QUERY_AGGREGATES = ("max", "maxsim")


def ordered_run_scores(context: torch.Tensor, query: torch.Tensor, run: int, block: int = 1 << 13) -> torch.Tensor:
    """Per context token: the best mean score of ``run`` consecutive context tokens against as many
    consecutive question tokens in the same order (context token t+k against question token j+k), among
    the runs that cover it. Scores are on ``token_scores``' scale. Blockwise over N (a block reads
    ``run - 1`` tokens past its end), never the whole [N, Q] matrix."""
    n, q = context.shape[0], query.shape[0]
    run = max(1, min(run, q, n))
    qt = query.float().T
    starts = torch.empty(n - run + 1, dtype=torch.float32, device=context.device)
    for s in range(0, n - run + 1, block):
        sim = context[s:s + block + run - 1].float() @ qt                      # [b + run - 1, Q]
        b = sim.shape[0] - run + 1
        diag = sim[:b, :q - run + 1].clone()                                   # [b, Q - run + 1]
        for k in range(1, run):     # summed in place: one buffer, not a new [b, Q] tensor per step
            diag += sim[k:k + b, k:q - run + 1 + k]
        starts[s:s + b] = diag.amax(dim=1) / run    # the max commutes with the division: the same floats
    # a token takes the best run covering it: the max over the runs starting up to run - 1 tokens before
    padded = F.pad(starts, (run - 1, run - 1), value=float("-inf"))
    return F.max_pool1d(padded[None, None], run, 1)[0, 0]


def distinct_peaks(scores: torch.Tensor, window: int, count: int, skip: torch.Tensor,
                   floor: float = float("-inf")) -> list[int]:
    """Up to ``count`` positions of the highest ``scores`` above ``floor``, at least ``window`` apart and
    outside ``skip`` (the always-kept ends): the best distinct windows."""
    found: list[int] = []
    for p in torch.argsort(scores, descending=True, stable=True).tolist():   # ties (a run's tokens): the first
        if scores[p] <= floor or len(found) == count:
            break
        if skip[p] or any(abs(p - q) < window for q in found):
            continue
        found.append(p)
    return found


def raise_run_windows(pooled: torch.Tensor, runs: torch.Tensor, c: "ReformConfig", peaks: int,
                      only_missed: bool = False) -> None:
    """Lift the windows around the ``peaks`` best distinct ordered runs (``RUN_BEFORE`` tokens before a run's
    best token, ``RUN_AFTER`` after it; the always-kept ends aside) above every other score, in place, in
    ``window_order``;
    ``only_missed``: of the best runs anywhere, only those whose window the paper's gather of ``pooled``
    does not hold whole (a key kept as part of the always-kept start, its value cut off after it, counts
    as missed)."""
    n = pooled.shape[0]
    ends = forced_mask(n, c.gather_keep, c.gather_keep, pooled.device)
    held = torch.zeros(n, dtype=torch.bool, device=pooled.device)
    if only_missed:     # the best runs anywhere, the ends included: one already gathered needs no window
        held[gather_tokens(pooled, c)] = True
        ends = torch.zeros_like(ends)
    lifted = float(pooled.max()) + 1.0 + window_order()
    for p in distinct_peaks(runs, c.pool_window, peaks, ends):
        lo, hi = max(0, p - RUN_BEFORE), min(n, p + RUN_AFTER + 1)
        if not held[lo:hi].all():
            part = lifted[lo - (p - RUN_BEFORE):hi - (p - RUN_BEFORE)].to(pooled)
            pooled[lo:hi] = torch.maximum(pooled[lo:hi], part)


def window_order() -> torch.Tensor:
    """Scores in (0, 1] over a run window's ``RUN_BEFORE + 1 + RUN_AFTER`` tokens, highest first for the
    run's best token, then the tokens after it in order (where a needle's value follows its key), then
    those before it, nearest first: a budget too small for a whole window keeps its key and value."""
    offsets = torch.arange(-RUN_BEFORE, RUN_AFTER + 1)
    order = torch.where(offsets >= 0, offsets, RUN_AFTER - offsets)
    return 1.0 - order / float(offsets.numel())


def max_pool(scores: torch.Tensor, window: int) -> torch.Tensor:
    """Each token takes the maximum score within ``window`` (odd) tokens centred on it."""
    return F.max_pool1d(scores[None, None], kernel_size=window, stride=1, padding=window // 2)[0, 0]


def gather_indices(scores: torch.Tensor, budget: int, keep_first: int, keep_last: int) -> torch.Tensor:
    """Ascending indices of the ``budget`` best tokens, the first/last ``keep_*`` tokens always among them."""
    n = scores.shape[0]
    if budget >= n:
        return torch.arange(n, device=scores.device)
    forced = forced_mask(n, keep_first, keep_last, scores.device)
    return top_budget(scores[None], budget, forced[None])[0]


def gather_tokens(scores: torch.Tensor, c: "ReformConfig") -> torch.Tensor:
    """The gather (§3.3): ascending indices of the ``recompute_budget`` best tokens, the first and last
    ``gather_keep`` among them; with ``min_run``, without the runs shorter than that (``whole_runs``)."""
    keep = gather_indices(scores, c.recompute_budget, c.gather_keep, c.gather_keep)
    if not c.min_run or keep.numel() >= scores.shape[0]:
        return keep
    return whole_runs(scores, keep, c.min_run, forced_mask(scores.shape[0], c.gather_keep, c.gather_keep, scores.device))


def segment_pieces(ids: torch.Tensor, segments: int, anchor: int) -> list[tuple[torch.Tensor, int, bool]]:
    """The inputs of a segment-parallel encode: ``(ids, skip, last)`` per segment, where every segment
    after the first starts with the ``anchor`` first tokens (``skip`` of them, whose embeddings are not
    kept) and segment boundaries fall on multiples of ``anchor`` (the chunk size). Fewer segments when the
    input is too short for ``segments`` of at least one chunk each."""
    n = ids.shape[0]
    chunks = -(-n // anchor)
    segments = max(1, min(segments, chunks))
    starts = [anchor * (chunks * i // segments) for i in range(segments)] + [n]
    return [(ids[a:b] if a == 0 else torch.cat([ids[:anchor], ids[a:b]]), 0 if a == 0 else anchor,
             i == segments - 1) for i, (a, b) in enumerate(zip(starts, starts[1:]))]


# Encode profiles: chunk = cache = window / divisor unless given. "fast" halves both, which more than halves
# attention's FLOPs per token; measured on SmolLM2 (docs/benchmarks.md, "A cheaper encode, measured for accuracy"): 1.3-1.4x
# faster encode, the NIAH grid still 25/25, the RULER-style mean +4.4 points at 32k and -2.3 at 64k (noise).
PROFILES: dict[str, int] = {"default": 4, "fast": 8}
# run_peaks: runs of PEAK_RUN tokens; the window kept spans RUN_BEFORE tokens before a run's best token and
# RUN_AFTER after it, where a needle's value follows its key (measured on RULER's UUID keys at 32k and 64k)
PEAK_RUN, RUN_BEFORE, RUN_AFTER = 16, 32, 64
Profile = Literal[tuple(PROFILES)]      # the names, for the option check before a model loads


@dataclass
class ReformConfig:
    """REFORM's knobs. ``None`` means: derive from the model's window (``resolve``).

    The paper uses 32k chunks and a 32k cache for 128k-window models and an 8k-16k recompute budget;
    scaled to a window W that is chunk = cache = W/4 and recompute = W/2. ``profile="fast"``: chunk = cache
    = W/8 (``PROFILES``); resolving turns the profile into those numbers and is left out of the saved
    options, so a context encoded with it is the same (same store key) as one encoded with the numbers.
    """

    heads: tuple[HeadSpec, ...] = ()
    chunk_size: int | None = positive()
    cache_budget: int | None = positive()
    recompute_budget: int | None = positive()
    keep_first: int | None = None       # the compressed cache's always-kept first/last tokens (§3.1)
    keep_last: int | None = None
    # tokens always gathered at each end of the context (§3.3); default: the cache's keep, at most
    # recompute_budget / 8, so that at small budgets the two ends leave room for the facts (the paper's
    # 256 is 1/32-1/64 of its budgets; docs/evaluation.md, gather sweep)
    gather_keep: int | None = None
    pool_window: int = positive(129)
    # > 0: each token's score adds its best ordered run of this many tokens matching the question's in
    # order (``ordered_run_scores``), for keys made of pieces every other key has too (RULER's UUIDs). Not
    # in the paper (docs/evaluation.md, "Retrieval at 64k and 128k").
    match_run: int = field(default=0, metadata=added_later(0))
    # > 0: the windows around this many of the best distinct ordered runs (``PEAK_RUN`` tokens in the
    # question's order) that the paper's ranking leaves out are gathered first; the ranking fills the rest,
    # so wherever it already holds the best run this is the paper's gather. Not in the paper
    # (docs/evaluation.md, "run_peaks"); 0 is the paper's gather, and what older saved files stand for.
    run_peaks: int = field(default=1, metadata=added_later(0))
    # in (0, 1): each question token's cosine less its own quantile over the context (``query_offsets``),
    # so a word that matches every window (a book's recurring names) does not outscore the rare word asked
    # about. Not in the paper; off by default (docs/results/documents-debian-reference).
    query_baseline: float = field(default=0.0, metadata=added_later(0.0))
    # which question tokens search: ``all`` (the paper's), or ``content`` (the default since 2026-11-29):
    # those that are neither an English stop word nor whitespace or punctuation alone (``content_tokens``),
    # so the line breaks of a benchmark's instruction, which match every document header, do not decide the
    # gather (docs/results/hubs-lab-ruler). Not in the paper.
    query_tokens: str = field(default="content", metadata=added_later("all"))
    # how a window's score combines the question tokens: ``max`` (the paper's: the best cosine to any of
    # them, then max-pooled), or ``maxsim`` (the default since 2026-11-29): the mean over question tokens of
    # each one's best cosine in the window (``window_maxsim``), so the window that holds most of the
    # question's words wins, not the one that matches a single word best (docs/results/gather-maxsim).
    # Not in the paper.
    query_aggregate: str = field(default="maxsim", metadata=added_later("max"))
    # how loudly each question token votes in maxsim: ``uniform``, or ``idf``: by how rare its token is in
    # the context (``rarity_weights``), so a book's recurring names do not outvote the word asked about
    query_weights: str = field(default="uniform", metadata=added_later("uniform"))
    # > 0: maxsim's mean over only the ``maxsim_top`` question tokens that match each window best, for
    # prompts whose instruction is not told apart from their question (docs/results/gather-maxsim)
    maxsim_top: int = field(default=0, metadata=added_later(0))
    # > 0: runs of the gather shorter than this many tokens are dropped and their budget grows the runs
    # kept (``whole_runs``), so a small reader is not handed combs of pieces. Not in the paper; off by
    # default (SmolLM2 with 32: docs/results/whole-runs-smollm2).
    min_run: int = field(default=0, metadata=added_later(0))
    # the question also before the gathered tokens (``Question: ...``), so a small reader knows what it
    # reads for and does not copy a quoted word of the text (Liu et al. 2023, "Lost in the Middle", §4.3:
    # query-aware contextualization). Costs the question's tokens in the recompute. Not in the paper.
    question_first: bool = field(default=False, metadata=added_later(False))
    score_window: int = positive(128)
    embed_dtype: torch.dtype = torch.float16
    segments: int = 1                   # experimental segment-parallel encode (module docstring)
    profile: Profile = field(default="default", metadata=INPUT_ONLY)

    def resolve(self, shape: ModelShape) -> "ReformConfig":
        w, keep, part = shape.window, keep_default(shape), PROFILES[self.profile]
        c = replace(self, chunk_size=pick(self.chunk_size, w // part), cache_budget=pick(self.cache_budget, w // part),
                    recompute_budget=pick(self.recompute_budget, w // 2),
                    keep_first=pick(self.keep_first, keep), keep_last=pick(self.keep_last, keep))
        c.gather_keep = pick(c.gather_keep, min(c.keep_first, c.keep_last, c.recompute_budget // 8))
        c.check(shape)
        return c

    def check(self, shape: ModelShape) -> None:
        if not self.heads:
            raise ValueError("REFORM needs at least one embedding head")
        for h in self.heads:
            h.check(shape)
        require_positive(chunk_size=self.chunk_size, cache_budget=self.cache_budget,
                         recompute_budget=self.recompute_budget)
        require_chunk_fits(self.cache_budget, self.chunk_size, shape)
        require_room(self.recompute_budget, shape)
        require_keep("cache", self.cache_budget, self.keep_first, self.keep_last)
        require_keep("recompute", self.recompute_budget, self.gather_keep, self.gather_keep)
        if self.pool_window < 1 or self.pool_window % 2 == 0:
            raise ValueError(f"pool window must be a positive odd number, got {self.pool_window}")
        if self.segments < 1:
            raise ValueError(f"segments must be at least 1, got {self.segments}")
        if self.match_run < 0:
            raise ValueError(f"match_run must be 0 (off) or a number of tokens, got {self.match_run}")
        if self.run_peaks < 0:
            raise ValueError(f"run_peaks must be 0 (off) or a number of windows, got {self.run_peaks}")
        if not 0 <= self.query_baseline < 1:
            raise ValueError(f"query_baseline must be 0 (off) or a quantile below 1, got {self.query_baseline}")
        if self.query_aggregate not in QUERY_AGGREGATES:
            raise ValueError(f"query_aggregate must be {' or '.join(QUERY_AGGREGATES)}, got {self.query_aggregate!r}")
        if self.query_aggregate == "maxsim" and (self.query_baseline or self.match_run):
            raise ValueError("query_baseline and match_run adjust the paper's per-token max: use them with "
                             "query_aggregate=max (maxsim, the default, scores whole windows)")
        if self.query_weights not in QUERY_WEIGHTS or (self.query_weights != "uniform" and self.query_aggregate != "maxsim"):
            raise ValueError(f"query_weights must be {' or '.join(QUERY_WEIGHTS)} (idf with query_aggregate=maxsim), "
                             f"got {self.query_weights!r}")
        if self.query_tokens not in QUERY_TOKENS:
            raise ValueError(f"query_tokens must be {' or '.join(QUERY_TOKENS)}, got {self.query_tokens!r}")


@register
class Reform(Method):
    name = "reform"
    Config = ReformConfig
    resumable = True

    @classmethod
    def create(cls, shape: ModelShape, model_name: str, defaults: dict | None = None, heads=None,
               **options) -> "Reform":
        """``heads``: None (the model's preset), a preset JSON path, "LAYER:KIND:HEAD,..." or a list.
        The model preset's tuned budgets stay whatever heads are given (they fit the model's reading, not
        the heads); a preset JSON passed as ``heads`` brings its own ``defaults`` where it has them. Only
        an option given explicitly overrides a tuned value."""
        cls.check_options({"heads": heads, **options})      # types first: heads are read right here
        if isinstance(heads, str) and heads.endswith(".json"):
            defaults = load_preset(heads).get("defaults") or defaults
        heads = tuple(resolve_heads(heads, model_name, shape))
        return super().create(shape, model_name, defaults, heads=heads, **options)

    def encode(self, pipe: Runtime, ids: torch.Tensor, progress: Callable[[int], None] | None = None,
               checkpoint: Checkpoint | None = None, embed_short: bool = False) -> Context:
        """``checkpoint``: save the chunk loop's state there now and then, and go on from it if it holds
        some (``methods/checkpoint.py``; one segment only). ``embed_short``: compress and embed a context
        that the recompute budget covers too (a library compares every document's token scores)."""
        c = self.config
        if ids.shape[0] <= c.recompute_budget and not embed_short:   # all will be recomputed: nothing to compress
            return Context(pipe, self, ids)
        pieces = segment_pieces(ids, c.segments, c.chunk_size)
        if checkpoint is not None and len(pieces) > 1:
            raise ValueError("a segment-parallel encode (segments > 1) cannot be checkpointed: use segments=1")
        if len(pieces) == 1:
            data, cache = self.encode_segment(pipe, ids, 0, progress, checkpoint=checkpoint)
        else:
            run = pipe.segment_runner or (lambda todo: [self.encode_segment(pipe, p, skip, progress, last)
                                                        for p, skip, last in todo])
            parts = run(pieces)
            data, cache = torch.cat([d.to(ids.device) for d, _ in parts]), parts[-1][1]
        emb = HeadEmbeddings.from_data(list(c.heads), pipe.engine.shape, data)
        return Context(pipe, self, ids, cache=cache, state=emb)

    def encode_segment(self, pipe: Runtime, ids: torch.Tensor, skip: int,
                       progress: Callable[[int], None] | None = None, keep_cache: bool = True,
                       checkpoint: Checkpoint | None = None):
        """Compress ``ids`` chunk by chunk (§3.1) and return the retrieval embeddings of ``ids[skip:]``
        (``skip``: the anchor's tokens) and the final compressed cache (None unless ``keep_cache``)."""
        c = self.config
        emb = HeadEmbeddings(list(c.heads), pipe.engine.shape, ids.shape[0], ids.device, c.embed_dtype)
        cache = KVCache.empty(emb.exit_layer)
        policy = H2OPolicy(c.cache_budget, c.keep_first, c.keep_last, c.score_window)
        done = 0
        if checkpoint is not None:
            done, cache = checkpoint.resume(pipe, self, ids, emb)
            if progress is not None and done:
                progress(done)
            progress = self._saving(pipe, ids, cache, emb, done, checkpoint, progress)
        if progress is not None and skip:          # the anchor is not part of this segment's progress
            left, report = [skip], progress

            def progress(n: int) -> None:
                counted = max(0, n - left[0])
                left[0] = max(0, left[0] - n)
                if counted:
                    report(counted)
        pipe.engine.prefill(ids[done:], cache, chunk_size=c.chunk_size, hook=emb, policy=policy, offset=done,
                            qkv_only_next=True, progress=progress)
        return emb.data[skip:], (cache if keep_cache else None)

    def _saving(self, pipe, ids, cache, emb, done, checkpoint, progress):
        """``progress`` that also hands the state after each chunk to ``checkpoint``."""
        count = [done]

        def after_chunk(n: int) -> None:
            count[0] += n
            checkpoint.chunk_done(count[0], ids.shape[0], lambda: Context(
                pipe, self, ids, cache=cache, state=HeadEmbeddings.from_data(emb.heads, pipe.engine.shape,
                                                                             emb.data[:count[0]])))
            if progress is not None:
                progress(n)
        return after_chunk

    def saved_state(self, ctx: Context) -> dict[str, torch.Tensor]:
        return {} if ctx.state is None else {"embeddings": ctx.state.data}

    def restore_state(self, ctx: Context, tensors: dict[str, torch.Tensor]) -> None:
        if "embeddings" in tensors:
            ctx.state = HeadEmbeddings.from_data(list(self.config.heads), ctx.pipeline.engine.shape,
                                                 tensors["embeddings"])

    def select(self, ctx: Context, part: QuestionPart, timer: Timer) -> torch.Tensor:
        return self.select_scored(ctx, part, timer)[0]

    def select_scored(self, ctx: Context, part: QuestionPart, timer: Timer) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The gather (§3.3): the budget's best-scoring tokens plus the first and last ``gather_keep``, with
        their scores (a context short enough to be recomputed whole has none)."""
        c, n = self.config, ctx.ids.shape[0]
        if ctx.state is None:
            return torch.arange(n, device=ctx.ids.device), None
        scores = self.scores(ctx, part)
        keep = gather_tokens(scores, c)
        return keep, scores[keep]

    def prompt(self, ctx: Context, part: QuestionPart, timer: Timer) -> Prompt:
        """The recompute's input (§3.3): the gathered tokens, then the question; with ``question_first``,
        the question also right after the template's prefix."""
        prompt = super().prompt(ctx, part, timer)
        if not self.config.question_first:
            return prompt
        templater = ctx.pipeline.templater
        at = len(templater.prefix) if prompt.ids[:len(templater.prefix)].tolist() == templater.prefix else 0
        preview = as_tensor(templater.question_preview(part), prompt.ids.device)
        return prompt._replace(ids=torch.cat([prompt.ids[:at], preview, prompt.ids[at:]]))

    def scores(self, ctx: Context, part: QuestionPart) -> torch.Tensor:
        """Every context token's importance for the question: ``ranking``; with ``run_peaks``, the windows
        around the best ordered runs that ranking's gather misses above everything else."""
        c, query = self.config, self.query_embeddings(ctx, part)
        scores = self.ranking(ctx, part, query)
        if c.run_peaks:
            raise_run_windows(scores, ordered_run_scores(ctx.state.data, query, PEAK_RUN), c, c.run_peaks,
                              only_missed=True)
        return scores

    def ranking(self, ctx: Context, part: QuestionPart, query: torch.Tensor) -> torch.Tensor:
        """The paper's scores (§3.3): max-pooled cosine to the question tokens; with
        ``query_aggregate="maxsim"``, each window's mean over the question tokens of their best cosine."""
        c = self.config
        if c.query_aggregate == "maxsim":
            weights = None if c.query_weights == "uniform" else rarity_weights(
                ctx.ids, torch.as_tensor(part.search_question)[self.searching(ctx, part)], c.pool_window)
            return window_maxsim(ctx.state.data, query, c.pool_window, weights, top=c.maxsim_top)
        return max_pool(self.similarities(ctx, part, query), self.config.pool_window)

    def similarities(self, ctx: Context, part: QuestionPart, query: torch.Tensor | None = None) -> torch.Tensor:
        """Every context token's cosine to the question tokens (max over them), before pooling; with
        ``match_run``, plus its best ordered run against the question."""
        query = self.query_embeddings(ctx, part) if query is None else query
        offsets = query_offsets(ctx.state.data, query, self.config.query_baseline) if self.config.query_baseline else None
        scores = token_scores(ctx.state.data, query, offsets)
        if self.config.match_run:
            scores += ordered_run_scores(ctx.state.data, query, self.config.match_run)
        return scores

    def query_embeddings(self, ctx: Context, part: QuestionPart) -> torch.Tensor:
        """The question tokens' retrieval embeddings ``[Q, E]``, computed on top of the compressed cache."""
        c, engine = self.config, ctx.pipeline.engine
        if ctx.cache.length + len(part.ids) > engine.shape.window:
            raise ValueError(f"the question ({len(part.ids)} tokens) does not fit the window next to the "
                             f"compressed cache ({ctx.cache.length}); shorten it or lower the cache budget")
        ids = part.search_ids           # without an instruction: it is read, not searched with
        q_emb = HeadEmbeddings(list(c.heads), engine.shape, len(ids), ctx.ids.device, c.embed_dtype)
        q_emb.begin(0, len(ids))
        engine.forward(as_tensor(ids, ctx.ids.device), ctx.cache.clone(), hook=q_emb, qkv_only_next=True)
        query = q_emb.data[part.search_span]
        if query.shape[0] == 0:
            raise ValueError("the question has no tokens to search with")
        return query[self.searching(ctx, part).to(query.device)]

    def searching(self, ctx: Context, part: QuestionPart) -> torch.Tensor:
        """Which of the question's tokens (``part.search_question``) search the context, a bool mask."""
        ids = list(part.search_question)
        if self.config.query_tokens == "content":
            return content_tokens(ctx.pipeline.tokenizer, ids)
        return torch.ones(len(ids), dtype=torch.bool)
