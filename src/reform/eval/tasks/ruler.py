"""RULER-style synthetic tasks (Hsieh et al., 2024, "RULER: What's the Real Context Size of Your
Long-Context Language Models?", arXiv 2404.06654; task settings of NVIDIA/RULER ``scripts/synthetic.yaml``,
templates of its ``scripts/data/synthetic/constants.py``), generated offline in the model's tokens.

Every RULER prompt is "instruction, context, question, answer prefix"; here the instruction opens the
row's ``context`` (so it is encoded with the haystack), ``question`` and ``answer_prefix`` are RULER's,
and ``length`` counts the whole ``context``. All tasks are scored with RULER's ``string_match_all``
(the fraction of gold strings found in the answer, case-insensitive).

Retrieval (NIAH), needle ``One of the special magic {numbers|uuids} for {key} is: {value}.``:

=================  ===========  =====  ======  ====================================================
task               haystack     key    value   needles
=================  ===========  =====  ======  ====================================================
niah_single_1      noise        word   number  1
niah_single_2      natural      word   number  1
niah_single_3      natural      word   uuid    1
niah_multikey_1    natural      word   number  4 keys, one asked (3 distractor needles)
niah_multikey_2    needles      word   number  1; the haystack is distractor needles of other keys
niah_multikey_3    needles      uuid   uuid    1; as multikey_2 with UUID keys and values
niah_multivalue    natural      word   number  4 values of one key, all asked
niah_multiquery    natural      word   number  4 keys, all asked in one question
=================  ===========  =====  ======  ====================================================

Needles go at depths drawn from RULER's 40-point grid (0-100 %), sorted; ``row.depth`` is the depth of
the first needle that answers the question.

* ``vt`` (variable tracking, 1 chain of 4 hops in the noise haystack): ``VAR ABCDE = 12345`` then
  ``VAR FGHIJ = VAR ABCDE`` ... at increasing random depths; answer: the 5 variable names.
* ``cwe`` (common words extraction): a numbered word list ``1. word 2. word ...`` in which 10 words
  appear 30 times and every other word 3 times (2 and 1 when 300 entries would fill over half of a
  short context); answer: the 10 common words. The list grows with the length (more uncommon words).
* ``fwe`` (frequent words extraction): ``N`` coded 6-letter words whose counts follow Zipf's law with
  alpha = 2 (count of rank k = floor(N k^-2 / zeta(2)), as RULER), rank 1 replaced by ``...``; answer: the
  words of ranks 2-4. ``N`` is sized to the length.

Deviations from RULER: natural text instead of Paul Graham essays; ``adjective-noun`` keys from our own
lists instead of wonderwords; cwe words are English words of the built-in prose topped up with
pronounceable made-up words at long lengths (RULER's list is a large English dictionary); no in-context
example before vt/cwe; depths and lengths are set by summed token counts, not binary search over
re-tokenised prompts; ``max_new_tokens`` is smaller for the NIAH tasks (32-64, RULER 128).
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ...data.haystack import builtin_paragraphs
from ..rows import Row
from .seeding import DEPTHS_40, random_key, random_number, random_uuid, sample_rng
from .haystack import build, count_tokens, custom_pool, join_correction, sentence_pool, tokenizer_cache

NIAH_HEAD = ("Some special magic {v} are hidden within the following text. Make sure to memorize it. "
             "I will quiz you about the {v} afterwards.\n")
NIAH_QUESTION = "What are all the special magic {v} for {query} mentioned in the provided text?"
NIAH_PREFIX = "The special magic {v} for {query} mentioned in the provided text are"
NEEDLE = "One of the special magic {v} for {key} is: {value}."

VT_HEAD = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
VT_QUESTION = "Question: Find all variables that are assigned the value {value} in the text above."
VT_PREFIX = ("Answer: According to the chain(s) of variable assignment in the text above, {n} variables are "
             "assigned the value {value}, they are:")

CWE_HEAD = ("Below is a numbered list of words. In these words, some appear more often than others. "
            "Memorize the ones that appear most often.\n")
CWE_QUESTION = "Question: What are the 10 most common words in the above list?"
CWE_PREFIX = "Answer: The top 10 words that appear most often in the list are:"

FWE_HEAD = ("Read the following coded text and track the frequency of each coded word. Find the three most "
            "frequently appeared coded words. ")
FWE_QUESTION = ("Question: Do not provide any explanation. Please ignore the dots '....'. What are the three "
                "most frequently appeared words in the above coded text?")
FWE_PREFIX = "Answer: According to the coded text above, the three most frequently appeared words are:"


@dataclass(frozen=True)
class Niah:
    haystack: str            # "noise", "natural" or "needles"
    uuid_keys: bool = False
    uuid_values: bool = False
    num_k: int = 1           # keys with needles
    num_v: int = 1           # values (needles) per key
    num_q: int = 1           # keys asked
    max_new_tokens: int = 32


NIAH_TASKS = {
    "niah_single_1": Niah("noise"),
    "niah_single_2": Niah("natural"),
    "niah_single_3": Niah("natural", uuid_values=True, max_new_tokens=64),
    "niah_multikey_1": Niah("natural", num_k=4),
    "niah_multikey_2": Niah("needles"),
    "niah_multikey_3": Niah("needles", uuid_keys=True, uuid_values=True, max_new_tokens=64),
    "niah_multivalue": Niah("natural", num_v=4, max_new_tokens=64),
    "niah_multiquery": Niah("natural", num_k=4, num_q=4, max_new_tokens=64),
}
TASKS = (*NIAH_TASKS, "vt", "cwe", "fwe")


def generate(task: str, tok, length: int, samples: int, seed: int, haystack_dir=None, depths=None) -> list[Row]:
    """Rows of one RULER task (``depths`` is NIAH-only and ignored here: RULER draws needle depths)."""
    rows = []
    for s in range(samples):
        rng = sample_rng(seed, "ruler", task, length, s)
        if task in NIAH_TASKS:
            row = _niah(NIAH_TASKS[task], tok, length, rng, haystack_dir)
        else:
            row = {"vt": _vt, "cwe": _cwe, "fwe": _fwe}[task](tok, length, rng)
        row.task, row.length, row.sample = f"ruler/{task}", length, s
        row.meta["metric"] = "string_match_all"
        rows.append(row)
    return rows


def _distinct(make, rng, n: int, avoid=()) -> list[str]:
    out, seen = [], set(avoid)
    while len(out) < n:
        x = make(rng)
        if x not in seen:
            seen.add(x)
            out.append(x)
    return out


def _niah(cfg: Niah, tok, length: int, rng, haystack_dir) -> Row:
    make_key = random_uuid if cfg.uuid_keys else random_key
    make_value = random_uuid if cfg.uuid_values else random_number
    v = "uuids" if cfg.uuid_values else "numbers"
    keys = _distinct(make_key, rng, cfg.num_k)
    values = [_distinct(make_value, rng, cfg.num_v) for _ in keys]
    needles = [(k, val) for k, vals in zip(keys, values) for val in vals]
    rng.shuffle(needles)
    asked = rng.sample(range(cfg.num_k), cfg.num_q)
    queries = [keys[i] for i in asked]
    answers = [val for i in asked for val in values[i]]
    query = queries[0] if len(queries) == 1 else ", ".join(queries[:-1]) + ", and " + queries[-1]
    if cfg.haystack == "needles":
        gold = {val for vals in values for val in vals}
        pool = _needle_pool(tok, length, rng, v, make_key, make_value, set(keys), gold)
    else:
        pool = sentence_pool(tok, cfg.haystack, haystack_dir)
    depths = sorted(rng.sample(DEPTHS_40, len(needles)))
    texts = [NEEDLE.format(v=v, key=k, value=val) for k, val in needles]
    built = build(tok, length, list(zip(depths, texts)), pool, rng, head=NIAH_HEAD.format(v=v))
    first = min(d for d, (k, _) in zip(built.depths, needles) if k in queries)
    return Row(built.text, NIAH_QUESTION.format(v=v, query=query), answers, "", length,
               NIAH_PREFIX.format(v=v, query=query), first, cfg.max_new_tokens,
               meta={"positions": built.positions, "needles": texts, "tokens": built.n_tokens})


def _needle_pool(tok, length: int, rng, v: str, make_key, make_value, keys: set, gold: set):
    """RULER's ``needle`` haystack: distractor needles of other keys (and values), one per line."""
    def piece():
        return "\n" + NEEDLE.format(v=v, key=_distinct(make_key, rng, 1, keys)[0],
                                    value=_distinct(make_value, rng, 1, gold)[0])
    probe = [piece() for _ in range(16)]
    per = float(np.mean(count_tokens(tok, probe)))
    return custom_pool(tok, probe + [piece() for _ in range(int(length / per * 1.05) + 8)])


def _vt(tok, length: int, rng) -> Row:
    names = _distinct(lambda r: "".join(r.choices(string.ascii_uppercase, k=5)), rng, 5)
    value = random_number(rng, 5)
    chain = [f"VAR {names[0]} = {value}"] + [f"VAR {b} = VAR {a}" for a, b in zip(names, names[1:])]
    depths = sorted(rng.sample(DEPTHS_40, len(chain)))
    built = build(tok, length, list(zip(depths, chain)), sentence_pool(tok, "noise"), rng, head=VT_HEAD)
    return Row(built.text, VT_QUESTION.format(value=value), names, "", length,
               VT_PREFIX.format(n=len(names), value=value), built.depths[0], 30,
               meta={"positions": built.positions, "chain": chain, "evidence": chain, "tokens": built.n_tokens})


def _cwe(tok, length: int, rng) -> Row:
    budget = length - int(count_tokens(tok, [CWE_HEAD])[0])
    words = list(_english_words())
    rng.shuffle(words)
    n_common, words_needed = 10, 64
    while True:
        vocab = words[:words_needed] if words_needed <= len(words) else \
            words + _made_up_words(rng, words_needed - len(words), set(words))
        counts = count_tokens(tok, [" " + w for w in vocab]).astype(np.float64)
        for freq_cw, freq_ucw in ((30, 3), (2, 1)):
            cost = _EntryCost(tok, counts, n_common, freq_cw, freq_ucw)
            if cost(0) <= budget / 2:
                break
        if cost(0) > budget:
            raise ValueError(f"{length} tokens cannot hold a common-words list")
        n_uncommon = len(vocab) - n_common
        if cost(n_uncommon) >= budget:
            break
        per_word = (cost(n_uncommon) - cost(0)) / n_uncommon
        words_needed = n_common + int((budget - cost(0)) / per_word * 1.1) + 64
    lo, hi = 0, n_uncommon  # largest number of uncommon words that fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if cost(mid) <= budget else (lo, mid - 1)
    listed = vocab[:n_common] * freq_cw + vocab[n_common:n_common + lo] * freq_ucw
    rng.shuffle(listed)
    text = CWE_HEAD + " ".join(f"{i + 1}. {w}" for i, w in enumerate(listed))
    return Row(text, CWE_QUESTION, vocab[:n_common], "", length, CWE_PREFIX, None, 120,
               meta={"freq_common": freq_cw, "freq_uncommon": freq_ucw, "uncommon": lo,
                     "tokens": int(round(cost(lo))) + (length - budget)})


class _EntryCost:
    """Tokens of a numbered list ``1. w 2. w ...`` holding the common words ``freq_cw`` times and the
    first ``u`` uncommon words ``freq_ucw`` times each, as a function of ``u`` (increasing)."""

    def __init__(self, tok, word_counts: np.ndarray, n_common: int, freq_cw: int, freq_ucw: int):
        self.tok, self.freq_ucw = tok, freq_ucw
        self.fixed_entries = n_common * freq_cw
        self.common = freq_cw * float(word_counts[:n_common].sum())
        self.uncommon = np.concatenate([[0.0], np.cumsum(word_counts[n_common:])]) * freq_ucw
        self.numbers = _number_cost(tok, max(200, self.fixed_entries + freq_ucw * (len(word_counts) - n_common)))
        pieces = [f" {i + 1}. x" for i in range(200)]
        estimate = self.numbers[1:201] - self.numbers[:200] + float(count_tokens(tok, [" x"])[0])
        self.correction = join_correction(tok, pieces, estimate)

    def __call__(self, u: int) -> float:
        entries = self.fixed_entries + self.freq_ucw * u
        return self.numbers[entries] + self.common + self.uncommon[u] + self.correction * entries


def _number_cost(tok, n: int) -> np.ndarray:
    """Cumulative tokens of the list numbers `` 1.``, `` 2.``, ... `` n.``: counted exactly up to 9999,
    beyond that as the mean of 2000 evenly spread numbers of the same digit count (cached per tokenizer)."""
    per_digits = tokenizer_cache(tok).setdefault("cwe-numbers", {})
    per = np.zeros(n + 1)
    for digits in range(1, len(str(max(n, 1))) + 1):
        first, last = 10 ** (digits - 1), 10 ** digits - 1
        if digits not in per_digits:
            sample = range(first, last + 1) if digits <= 4 else np.linspace(first, last, 2000).astype(int)
            counts = count_tokens(tok, [f" {i}." for i in sample]).astype(np.float64)
            per_digits[digits] = counts if digits <= 4 else float(counts.mean())
        known, upto = per_digits[digits], min(last, n)
        per[first:upto + 1] = known[:upto - first + 1] if isinstance(known, np.ndarray) else known
    return np.cumsum(per)


@lru_cache(maxsize=1)
def _english_words() -> tuple[str, ...]:
    """Lower-case words (4-10 letters) of the built-in prose, sorted: the cwe vocabulary."""
    return tuple(sorted({w for p in builtin_paragraphs() for w in re.findall(r"\b[a-z]{4,10}\b", p)}))


def _made_up_words(rng, n: int, avoid: set) -> list[str]:
    """Pronounceable consonant-vowel words (3-4 syllables), distinct and not in ``avoid``."""
    syllables = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
    return _distinct(lambda r: "".join(r.choices(syllables, k=3 + (r.random() < 0.5))), rng, n, avoid)


def _fwe(tok, length: int, rng, alpha: float = 2.0, vocab_size: int = 2000) -> Row:
    budget = length - int(count_tokens(tok, [FWE_HEAD])[0])
    vocab = _distinct(lambda r: "".join(r.choices(string.ascii_lowercase, k=6)), rng, vocab_size)
    vocab = sorted(vocab)
    rng.shuffle(vocab)
    vocab[0] = "..."  # RULER: the top-ranked word is noise, hence "ignore the dots"
    counts = count_tokens(tok, [" " + w for w in vocab]).astype(np.float64)
    counts += join_correction(tok, [" " + w for w in vocab], counts)
    share = np.arange(1, vocab_size + 1, dtype=np.float64) ** -alpha / _zeta(alpha)

    def cost(n: int) -> float:
        return float(np.floor(n * share) @ counts)

    lo, hi = 1, max(2, 4 * budget)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if cost(mid) <= budget else (lo, mid - 1)
    repeats = np.floor(lo * share).astype(int)
    listed = [w for w, r in zip(vocab, repeats) for _ in range(r)]
    rng.shuffle(listed)
    return Row(FWE_HEAD + " ".join(listed), FWE_QUESTION, vocab[1:4], "", length, FWE_PREFIX, None, 50,
               meta={"words": lo, "top_counts": repeats[:5].tolist(),
                     "tokens": int(round(cost(lo))) + (length - budget)})


def _zeta(alpha: float, terms: int = 100_000) -> float:
    """Riemann zeta (alpha > 1): partial sum plus the integral of the tail."""
    k = np.arange(1, terms + 1, dtype=np.float64)
    return float(np.sum(k ** -alpha) + terms ** (1 - alpha) / (alpha - 1))
