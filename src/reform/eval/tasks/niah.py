"""NIAH (REFORM paper §4.1, Figure 3): one needle sentence at a chosen depth of a natural-text haystack.

Needle, question and answer prefix are :func:`reform.data.haystack.magic_number_needle`'s::

    needle:        The special magic number for {key} is {7-digit number}.
    question:      What is the special magic number for {key} mentioned in the provided text?
    answer prefix: The special magic number for {key} mentioned in the provided text is

The context is the haystack alone (no instruction). One row per (length, depth, sample); the score is
``contains``: the needle's value appears in the answer.
"""

from __future__ import annotations

from ...data.haystack import magic_number_needle
from ..rows import Row
from .seeding import sample_rng
from .haystack import build, sentence_pool

TASKS = ("niah",)
DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
MAX_NEW_TOKENS = 32


def generate(task: str, tok, length: int, samples: int, seed: int, haystack_dir=None, depths=None) -> list[Row]:
    pool = sentence_pool(tok, "natural", haystack_dir)
    rows = []
    for depth in DEPTHS if depths is None else depths:
        for s in range(samples):
            rng = sample_rng(seed, "niah", length, depth, s)
            needle = magic_number_needle(rng)
            built = build(tok, length, [(depth, needle.sentence)], pool, rng)
            rows.append(Row(built.text, needle.question, [needle.answer], task, length, needle.answer_prefix,
                            depth, MAX_NEW_TOKENS, s,
                            {"metric": "contains", "positions": built.positions, "tokens": built.n_tokens}))
    return rows
