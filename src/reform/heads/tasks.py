"""Synthetic calibration tasks for head selection (REFORM §3.2, appendix C.1-C.2), generated offline.

* **pattern matching** — several sentences "The value corresponding to the id {key} is {value}." with
  random 10-character keys and values hidden in filler text; the question asks for one key's value; the
  gold tokens are that sentence.
* **multi-hop QA** — the paper embeds HotpotQA passages, which cannot be downloaded here, so we generate
  fact chains instead: two or three linked facts (person → colleague → city → mayor) spread through the
  filler, plus distractor chains about other people; the question needs every link; the gold tokens are
  the supporting facts.

Filler: prose paragraphs of the Python reference manual (``pydoc_data``, PSF License, frozen from
CPython 3.11 into the package), see ``reform.data.haystack``.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass

import torch

from ..data.haystack import haystack
from ..engine.layout import QuestionPart, Templater

TASKS = ("pattern", "multihop")

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


def make_sample(task: str, tmpl: Templater, length: int, rng: random.Random) -> Sample:
    """A ~``length``-token context with the task's facts scattered through filler at random places."""
    facts, gold_facts, question = pattern_facts(rng) if task == "pattern" else multihop_facts(rng)
    paras = haystack(length - sum(len(tmpl.encode(f)) + 2 for f in facts), lambda t: len(tmpl.encode(t)), rng=rng)
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
