"""Token-exact haystacks: filler text of a requested length in a tokenizer's own tokens, with sentences
inserted at requested depths, fast enough for 1M-token contexts.

A haystack is a run of *pieces* (sentences, each stored with the whitespace that precedes it) drawn in
order from a :class:`Pool`. Every piece of a pool is tokenised once per tokenizer (batched when the
tokenizer is a fast HF one) and cached, so a context of any length is sized by summing piece counts,
never by re-tokenising the whole text. Pieces are stored with their leading separator (``" The sky is
blue."``) because byte-level BPE tokenizers split on that whitespace, which makes the sum of the piece
counts the count of their concatenation; a per-pool correction (measured once on a few hundred joined
pieces) absorbs the rest (e.g. SentencePiece's extra word-start marks).

Pools:

* ``natural``: English prose, sentence by sentence in reading order, starting at a random sentence and
  wrapping round (RULER's essay haystack and BABILong's background text are likewise continuous prose).
  The text is the built-in ``pydoc_data`` prose (see :mod:`reform.data.haystack`, PSF License) or the
  ``.txt`` files of a user's ``haystack_dir``. Sentences much longer than the median are left out so a
  boundary always lies within a few dozen tokens of any point.
* ``noise``: RULER's repeated haystack ``NOISE`` (one block per line); inserted sentences go between
  blocks, as RULER inserts them.
* :func:`custom_pool`: any generated pieces (RULER's haystack made of distractor needles).

``depth`` is measured over the filler: a sentence inserted at depth ``d`` is preceded by ``d`` of the
filler tokens (plus any sentences inserted before it), so depth 0 is the start of the haystack and depth 1
its end; :class:`Built` reports the exact token offsets. The filler is cut to within about one token of
the requested length by ending on the pool sentence whose length best fills the remainder.
"""

from __future__ import annotations

import math
import re
import weakref
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...data.haystack import builtin_paragraphs, paragraphs_from

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
"""RULER's noise haystack (niah_single_1, variable tracking), repeated to the requested length."""

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])")


def count_tokens(tok, texts: list[str]) -> np.ndarray:
    """Token counts of ``texts`` (no special tokens), in one batched call for fast HF tokenizers."""
    if not texts:
        return np.zeros(0, dtype=np.int64)
    if getattr(tok, "is_fast", False):
        ids = tok(list(texts), add_special_tokens=False)["input_ids"]
    else:
        ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    return np.fromiter((len(i) for i in ids), dtype=np.int64, count=len(texts))


@dataclass(frozen=True)
class Pool:
    """Pieces (each with its leading separator), their token counts and where insertions may go."""

    pieces: tuple[str, ...]
    counts: np.ndarray          # float tokens per piece, the join correction included
    sep: str                    # what precedes an inserted sentence
    anchors: np.ndarray         # bool: an insertion may go before this piece
    correction: float           # tokens added per piece when pieces are joined

    def piece_count(self, tok, texts: list[str]) -> np.ndarray:
        """Counts of extra pieces (inserted sentences, already carrying ``sep``) on this pool's terms."""
        return count_tokens(tok, texts) + self.correction


def join_correction(tok, pieces: list[str], counts) -> float:
    """Tokens gained per piece when ``pieces`` (with their own leading whitespace) are concatenated,
    measured on the first 400: 0 for byte-level BPE, about +-1 for tokenizers that mark word starts."""
    n = min(len(pieces), 400)
    if n == 0:
        return 0.0
    return (float(count_tokens(tok, ["".join(pieces[:n])])[0]) - float(np.sum(counts[:n]))) / n


def _make_pool(tok, pieces: list[str], sep: str, anchors=None) -> Pool:
    raw = count_tokens(tok, pieces).astype(np.float64)
    correction = join_correction(tok, pieces, raw)
    mask = np.ones(len(pieces), dtype=bool) if anchors is None else np.asarray(anchors, dtype=bool)
    return Pool(tuple(pieces), raw + correction, sep, mask, correction)


def custom_pool(tok, pieces: list[str], sep: str = "\n") -> Pool:
    """A pool of generated pieces (not cached); each piece should start with ``sep``."""
    return _make_pool(tok, pieces, sep)


_CACHE: "weakref.WeakKeyDictionary[object, dict]" = weakref.WeakKeyDictionary()


def tokenizer_cache(tok) -> dict:
    """A dict that lives as long as ``tok`` does, for anything counted once per tokenizer."""
    return _CACHE.setdefault(tok, {})


def sentence_pool(tok, kind: str = "natural", haystack_dir=None) -> Pool:
    """The cached ``natural`` or ``noise`` pool for ``tok`` (``haystack_dir``: the user's prose)."""
    key = (kind, str(Path(haystack_dir).resolve()) if haystack_dir else None)
    per_tok = tokenizer_cache(tok)
    if key not in per_tok:
        if kind == "noise":
            sents = _SENTENCE_END.split(NOISE)
            pieces = [("\n" if i == 0 else " ") + s for i, s in enumerate(sents)]
            per_tok[key] = _make_pool(tok, pieces, "\n", anchors=[i == 0 for i in range(len(pieces))])
        elif kind == "natural":
            paras = paragraphs_from(haystack_dir) if haystack_dir else builtin_paragraphs()
            per_tok[key] = _natural_pool(tok, paras)
        else:
            raise ValueError(f"unknown haystack kind {kind!r}: natural, noise")
    return per_tok[key]


def _natural_pool(tok, paragraphs) -> Pool:
    sents = [s for p in paragraphs for s in _SENTENCE_END.split(p) if s.strip()]
    pieces = [" " + s.strip() for s in sents]
    counts = count_tokens(tok, pieces)
    keep = counts <= max(2.5 * float(np.median(counts)), 8)
    return _make_pool(tok, [p for p, k in zip(pieces, keep) if k], " ")


@dataclass
class Built:
    text: str
    n_tokens: int               # estimated tokens of ``text`` (piece sums)
    positions: list[int]        # token offset of each inserted sentence in ``text``, in the given order
    depths: list[float]         # the depth each inserted sentence got (fraction of filler before it)


def build(tok, n_tokens: int, insertions: list[tuple[float, str]], pool: Pool, rng, *,
          head: str = "", tail: str = "") -> Built:
    """``head`` + filler of ``pool`` with ``insertions`` ((depth, sentence) pairs) + ``tail``, all in
    about ``n_tokens`` tokens of ``tok``. Insertions keep their given order where depths tie."""
    for d, _ in insertions:
        if not 0.0 <= d <= 1.0:
            raise ValueError(f"depth {d} is outside 0..1")
    order = sorted(range(len(insertions)), key=lambda i: (insertions[i][0], i))
    ins_text = [pool.sep + insertions[i][1] for i in order]
    ins_n = pool.piece_count(tok, ins_text)
    head_n, tail_n = (int(c) for c in count_tokens(tok, [head, tail])) if head or tail else (0, 0)
    budget = n_tokens - head_n - tail_n - float(ins_n.sum())
    if budget < 0:
        raise ValueError(f"{n_tokens} tokens cannot hold the {n_tokens - budget:.0f} tokens of the task's "
                         "own text")
    idx = _filler(pool, budget, rng)
    cum = np.concatenate([[0.0], np.cumsum(pool.counts[idx])])
    filler_total = cum[-1]
    allowed = np.flatnonzero(np.concatenate([pool.anchors[idx], [True]]))  # boundaries b: before idx[b]
    cuts, lo = [], 0
    for k in order:
        want = insertions[k][0] * filler_total
        j = int(np.searchsorted(cum[allowed], want))
        j = min(max(j, lo), len(allowed) - 1)
        if j > lo and abs(cum[allowed[j - 1]] - want) <= abs(cum[allowed[j]] - want):
            j -= 1
        cuts.append(int(allowed[j]))
        lo = j
    parts, positions, depths = [head], [0] * len(insertions), [0.0] * len(insertions)
    prev, before = 0, 0.0
    for n, (k, b) in enumerate(zip(order, cuts)):
        parts.extend(pool.pieces[i] for i in idx[prev:b])
        positions[k] = int(round(head_n + cum[b] + before))
        depths[k] = float(cum[b] / filler_total) if filler_total else 0.0
        parts.append(ins_text[n])
        before += ins_n[n]
        prev = b
    parts.extend(pool.pieces[i] for i in idx[prev:])
    body = "".join(parts[1:])
    lead = body[:len(body) - len(body.lstrip())]    # the first piece's separator is dropped
    shift = int(count_tokens(tok, [lead])[0]) if lead else 0
    positions = [max(head_n, p - shift) for p in positions]
    total = head_n + tail_n + filler_total + float(ins_n.sum()) - shift
    return Built(head + body[len(lead):] + tail, int(round(total)), positions, depths)


def _filler(pool: Pool, budget: float, rng) -> np.ndarray:
    """Piece indices (reading order from a random anchor, wrapping) summing to ``budget`` within ~1 token."""
    n = len(pool.pieces)
    start = int(rng.choice(np.flatnonzero(pool.anchors)))
    total = float(pool.counts.sum())
    reps = math.ceil(budget / total) + 1 if total > 0 else 1
    idx = (start + np.arange(n * reps)) % n
    cum = np.cumsum(pool.counts[idx])
    k = int(np.searchsorted(cum, budget, side="right"))
    gap = budget - (cum[k - 1] if k else 0.0)
    idx = idx[:k]
    if gap >= 0.5:  # end on the pool piece that best fills what is left
        best = int(np.argmin(np.abs(pool.counts - gap)))
        if abs(pool.counts[best] - gap) < gap:
            idx = np.append(idx, best)
    return idx
