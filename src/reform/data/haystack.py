"""Natural-text haystacks and needles, generated offline.

The default haystack is English prose: the help topics of the Python reference manual
(``pydoc_data.topics``, from the CPython documentation, PSF License), code blocks and tables dropped,
~150 kB of paragraphs frozen into ``prose.txt`` from CPython 3.11 (each Python release ships different
topics, and rows built from the running interpreter's copy differed between 3.11 and 3.12). Users can
point at their own text.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path


@lru_cache(maxsize=1)
def builtin_paragraphs() -> tuple[str, ...]:
    """The built-in prose paragraphs (``prose.txt``: frozen from CPython 3.11's ``pydoc_data``, so rows do
    not change with the Python that runs them; ``scripts/make_prose.py`` made it)."""
    text = resources.files(__package__).joinpath("prose.txt").read_text(encoding="utf-8")
    return tuple(p.strip() for p in text.split("\n\n") if p.strip())


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
