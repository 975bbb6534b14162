"""Natural-text haystacks and needles, generated offline.

The default haystack is English prose that every Python installation carries: the help topics of the
Python reference manual (``pydoc_data.topics``, from the CPython documentation, PSF License). Code
blocks and tables are dropped, leaving ~500 kB of paragraphs. Users can point at their own text.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path


@lru_cache(maxsize=1)
def builtin_paragraphs() -> tuple[str, ...]:
    from pydoc_data.topics import topics

    paras = []
    for body in topics.values():
        for block in re.split(r"\n\s*\n", body):
            lines = [ln.strip() for ln in block.splitlines()]
            text = " ".join(ln for ln in lines if ln)
            # prose only: long enough, sentence punctuation, no code/table/markup lines
            if len(text) < 120 or not text.endswith(".") or any(
                    ln.startswith((">>>", "...", "+", "|", "=", "*", "-", "::")) for ln in lines) \
                    or text.count("(") > 4 or "**" in text:
                continue
            paras.append(text)
    return tuple(dict.fromkeys(paras))


def paragraphs_from(folder: str | Path) -> tuple[str, ...]:
    files = sorted(Path(folder).rglob("*.txt"))
    if not files:
        raise ValueError(f"no .txt files in {folder}")
    paras = [p.strip() for f in files for p in re.split(r"\n\s*\n", f.read_text(errors="replace")) if p.strip()]
    return tuple(" ".join(p.split()) for p in paras)


@dataclass
class Needle:
    sentence: str
    question: str
    answer: str
    answer_prefix: str = ""


def magic_number_needle(rng: random.Random) -> Needle:
    """RULER/NIAH-style single needle: "The special magic number for {word} is: {7 digits}."."""
    key = rng.choice(_KEYS) + "-" + rng.choice(_KEYS)
    value = str(rng.randint(1_000_000, 9_999_999))
    return Needle(f"The special magic number for {key} is {value}.",
                  f"What is the special magic number for {key} mentioned in the provided text?",
                  value, f"The special magic number for {key} mentioned in the provided text is")


_KEYS = ["amber", "falcon", "harbor", "juniper", "lantern", "meadow", "nebula", "orchid", "quartz", "saffron",
         "tundra", "velvet", "willow", "zephyr", "cobalt", "ember", "glacier", "hollow", "ivory", "maple"]


def haystack(n_tokens: int, count_tokens, *, rng: random.Random, paragraphs=None) -> list[str]:
    """Paragraphs (shuffled, repeated as needed) totalling about ``n_tokens`` by ``count_tokens``."""
    pool = list(paragraphs or builtin_paragraphs())
    out, total = [], 0
    while total < n_tokens:
        rng.shuffle(pool)
        for p in pool:
            out.append(p)
            total += count_tokens(p) + 1
            if total >= n_tokens:
                break
    return out


def insert_needle(paragraphs: list[str], needle: str, depth: float) -> str:
    """Join the paragraphs with ``needle`` placed as its own paragraph at ``depth`` (0..1) of the text."""
    if not 0.0 <= depth <= 1.0:
        raise ValueError("depth must be within 0..1")
    at = round(depth * len(paragraphs))
    return "\n\n".join(paragraphs[:at] + [needle] + paragraphs[at:])
