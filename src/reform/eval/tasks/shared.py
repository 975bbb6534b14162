"""Shared-context suite: one long context, many questions asked in turn (after SCBench's multi-turn
shared-context setting, Li et al. 2024, and KVzip's multi-query evaluation, Kim et al. 2025).

The context is natural prose holding 20 key-value facts of five kinds (magic numbers, access codes,
home cities, secret words and launch dates, four of each) at RULER's depths; the 20 questions each ask
one of them, in an order drawn per sample. Every question's rows share the context, so the runner
encodes it once per method and asks all 20 (``encode_shared_by`` in each record): the suite measures
REFORM's encode-once, ask-many claim, and a compress-with-the-first-question variant
(``method:query_aware=true``) shows what question-aware compression costs the later questions.

Each gold value occurs exactly once in the context, so gold recall is defined for every row. Answers get
32 new tokens, 64 for the UUID codes (a UUID alone is about 25 tokens; RULER gives its UUID tasks 64).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..rows import Row
from .seeding import DEPTHS_40, random_key, random_number, random_uuid, sample_rng
from .haystack import build, sentence_pool

TASKS = ("kv20",)
QUESTIONS = 20
HEAD = ("Below is a long text. Some facts about people, codes and projects are hidden in it. "
        "Make sure to memorize them: you will be asked about them.\n\n")

CITIES = """Amsterdam Athens Bangkok Barcelona Berlin Bogota Boston Brisbane Brussels Budapest Cairo Chicago
Copenhagen Dublin Edinburgh Geneva Hanoi Helsinki Istanbul Jakarta Karachi Kyoto Lagos Lima Lisbon Madrid
Manila Melbourne Montreal Mumbai Munich Nairobi Oslo Ottawa Prague Quito Reykjavik Santiago Seoul Stockholm
Sydney Taipei Tehran Toronto Valencia Vienna Warsaw Zurich""".split()
FIRST_NAMES = """Alice Bruno Carmen Dmitri Elena Farid Greta Hiroshi Ingrid Jamal Katya Lorenzo Mei Nadia Oscar
Priya Quentin Rosa Sven Tamar Ulrich Valeria Wanda Xavier Yusuf Zora""".split()
MONTHS = "January February March April May June July August September October November December".split()


@dataclass(frozen=True)
class Kind:
    """One kind of fact: how its key and value are drawn, the sentence that states it, the question."""

    name: str
    key: Callable
    value: Callable
    fact: str           # {key}, {value}
    question: str       # {key}
    prefix: str         # {key}
    max_new_tokens: int = 32


KINDS = (
    Kind("number", random_key, random_number, "The special magic number for {key} is: {value}.",
         "What is the special magic number for {key}?", "The special magic number for {key} is"),
    Kind("code", random_key, random_uuid, "The access code of the {key} vault is {value}.",
         "What is the access code of the {key} vault?", "The access code of the {key} vault is", 64),
    Kind("city", lambda rng: rng.choice(FIRST_NAMES) + " " + rng.choice("BCDFGHKLMNPRSTVW") + ".",
         lambda rng: rng.choice(CITIES), "{key} has lived in the city of {value} for many years.",
         "In which city does {key} live?", "{key} lives in the city of"),
    Kind("word", random_key, lambda rng: random_key(rng).replace("-", "") + random_number(rng, 2),
         "The secret password for the {key} door is {value}.",
         "What is the secret password for the {key} door?", "The secret password for the {key} door is"),
    Kind("date", lambda rng: "Project " + random_key(rng).split("-")[1].capitalize() + "-" + random_number(rng, 3),
         lambda rng: f"{rng.choice(MONTHS)} {rng.randint(1, 28)}, {rng.randint(1990, 2039)}",
         "{key} is scheduled to launch on {value}.", "On what date is {key} scheduled to launch?",
         "{key} is scheduled to launch on"),
)


def _facts(rng) -> list[tuple[Kind, str, str]]:
    """Four facts of each kind with distinct keys and values (no value inside another or a key)."""
    facts, used = [], []
    for kind in KINDS:
        for _ in range(QUESTIONS // len(KINDS)):
            while True:
                key, value = kind.key(rng), kind.value(rng)
                if all(key not in u and value not in u and u not in value for u in used):
                    break
            used += [key, value]
            facts.append((kind, key, value))
    return facts


def generate(task: str, tok, length: int, samples: int, seed: int, haystack_dir=None, depths=None) -> list[Row]:
    """``samples`` contexts of ``length`` tokens with 20 questions each (``depths`` is ignored: facts go at
    RULER's depth grid, in a random order)."""
    pool = sentence_pool(tok, "natural", haystack_dir)
    rows = []
    for s in range(samples):
        rng = sample_rng(seed, "shared", task, length, s)
        for _ in range(20):     # redraw while a value also occurs in the filler (a city named in the prose)
            facts = _facts(rng)
            rng.shuffle(facts)
            fact_depths = sorted(rng.sample(DEPTHS_40, len(facts)))
            texts = [kind.fact.format(key=key, value=value) for kind, key, value in facts]
            built = build(tok, length, list(zip(fact_depths, texts)), pool, rng, head=HEAD)
            if all(built.text.count(value) == 1 for _, _, value in facts):
                break
        else:
            raise ValueError("the haystack text names too many of the suite's values; use another --haystack")
        order = list(range(len(facts)))
        rng.shuffle(order)
        for turn, i in enumerate(order):
            kind, key, value = facts[i]
            rows.append(Row(built.text, kind.question.format(key=key), [value], f"shared/{kind.name}", length,
                            kind.prefix.format(key=key), built.depths[i], kind.max_new_tokens, s,
                            {"metric": "contains", "turn": turn, "facts": texts, "fact": texts[i], "key": key,
                             "positions": built.positions, "tokens": built.n_tokens}))
    return rows
