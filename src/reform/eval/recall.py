"""Gold recall: did the tokens a method recomputed hold the facts its answer needs?

REFORM's own job is retrieval: the gather step (paper §3.2) brings back a few context tokens, and the
recompute step (§3.3) reads only those. A wrong answer with every gold fact among the recomputed tokens
is a *reading* miss (the model's); with a gold fact left out, a *retrieval* miss (the method's).

A row's gold strings are ``row.meta["evidence"]`` where a task names the facts an answer rests on
(BABILong's supporting facts, RULER variable tracking's assignment chain), else its answers. A gold string
counts as kept when it lies inside one contiguous run of kept tokens (decoded); a string cut by a
selection boundary is not kept. A string that does not occur exactly once in the context cannot be
checked this way (bAbI's "kitchen" is in many facts) and is n/a (None), as is every string for a method
that answers from a compressed cache (``Answer.kept`` is None: each layer and head keeps other tokens).

Real text repeats its answers ("/var/log" on thirty pages), so a row may name its evidence by place
instead: ``meta["evidence_spans"]``, ``[start, end)`` character offsets in the row's context. A span is
kept when every token it overlaps was recomputed (the context's token offsets, ``documents.evidence``).
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..documents.evidence import runs
from .rows import Row


def evidence(row: Row) -> list[str]:
    """The strings an answer to ``row`` needs in view: the task's evidence, else its gold answers."""
    return list(row.meta.get("evidence") or row.answers)


def kept_runs(kept: torch.Tensor) -> list[tuple[int, int]]:
    """Maximal runs of consecutive indices in ``kept`` (ascending), as ``[start, stop)`` pairs."""
    return [(first, last + 1) for first, last in runs(kept)]


def gold_kept(tokenizer, ids: torch.Tensor, kept: torch.Tensor | None, golds: Sequence[str],
              context_text: str | None = None) -> list[bool | None]:
    """Per gold string: True if it lies inside one run of kept tokens, False if not, None when it cannot
    be checked (``kept`` is None, or the string is not exactly once in the context). ``context_text``:
    the decoded ``ids`` when the caller already has it (one decode per context, not per question)."""
    if kept is None:
        return [None] * len(golds)
    text = tokenizer.decode(ids.tolist()) if context_text is None else context_text
    runs = [tokenizer.decode(ids[a:b].tolist()) for a, b in kept_runs(kept)]   # only the kept tokens
    return [None if text.count(g) != 1 else any(g in run for run in runs) for g in golds]


def recall(flags: Sequence[bool | None]) -> float | None:
    """The fraction of checkable gold strings kept (None: none is checkable)."""
    known = [f for f in flags if f is not None]
    return sum(known) / len(known) if known else None


def miss_kind(score: float | None, row_recall: float | None) -> str | None:
    """``"reading"``: a miss (score below 1) with every gold string kept; ``"retrieval"``: a miss with some
    gold string left out; None for a full score or when recall is n/a."""
    if score is None or row_recall is None or score >= 1:
        return None
    return "reading" if row_recall >= 1 else "retrieval"


def spans_kept(token_starts: torch.Tensor, text_length: int, kept: torch.Tensor | None,
               spans: Sequence[Sequence[int]]) -> list[bool | None]:
    """Per ``[start, end)`` character span of the context text: True if every context token it overlaps is
    in ``kept``, False if not, None for all when ``kept`` is None. ``token_starts``: each context token's
    first character (-1 for the prompt template's tokens, which come first)."""
    if kept is None:
        return [None] * len(spans)
    starts = token_starts.to(torch.long)
    first_text = int((starts < 0).sum())
    text_starts = starts[first_text:]
    held = torch.zeros(starts.numel(), dtype=torch.bool)
    held[kept.cpu()] = True
    flags = []
    for a, b in spans:
        # the token holding character a, up to the token holding character b - 1
        lo = first_text + max(0, int(torch.searchsorted(text_starts, a, right=True)) - 1)
        hi = first_text + max(0, int(torch.searchsorted(text_starts, min(b, text_length) - 1, right=True)) - 1)
        flags.append(bool(held[lo:hi + 1].all()))
    return flags
