"""BABILong-style reasoning (Kuratov et al., 2024, "BABILong: Testing the Limits of LLMs with Long Context
Reasoning-in-a-Haystack"; booydar/babilong): bAbI tasks qa1-qa5 (Weston et al., 2015) whose facts are
scattered through a long natural-text haystack.

We do not ship bAbI: a small seeded world simulator writes bAbI-style stories with bAbI's vocabulary
(BABILong's ``TASK_LABELS``) and sentence forms:

* qa1 single supporting fact: people move ("Mary journeyed to the bathroom."); "Where is Mary?"
* qa2 two supporting facts: people also get and drop objects ("John picked up the football there.",
  "John dropped the football."); "Where is the football?" (carried objects move with their carrier).
* qa3 three supporting facts: as qa2; "Where was the football before the kitchen?" (the object's
  location before its current one).
* qa4 two-argument relations: "The kitchen is north of the garden. The office is west of the garden.";
  "What is north of the garden?" or "What is the garden south of?" (answer kitchen in both).
* qa5 three-argument relations: people hand objects to each other ("Fred gave the apple to Bill.");
  "Who gave the apple to Bill?", "Who did Fred give the apple to?", "What did Fred give to Bill?",
  "Who received the apple?", "Who gave the apple?" -- always about the latest hand-over.

The story's sentences are inserted in order at sorted random depths of the haystack (BABILong inserts
them at random sentence boundaries of PG-19 text). The row's context is BABILong's prompt around the
haystack -- ``{instruction}\\n{examples}\\n{post_prompt}\\n<context>\\n{haystack}\\n</context>`` -- its
question ``Question: {question}`` and its answer prefix ``Answer:``; ``row.depth`` is the depth of the
first supporting fact (``meta["support_depths"]`` has them all). The score is BABILong's
``compare_answers`` (metric ``babilong``, see :mod:`.scoring`).

Instructions and post-prompts follow BABILong's ``DEFAULT_PROMPTS`` (whose qa4 and qa5 instructions are
swapped there -- qa4 asks about locations and their relations, qa5 about people and their actions -- and
are given to the task they describe here); the in-context examples are short
stories of our own in the same format, with people, places and things that never occur in the tasks (so
an example sentence can never be mistaken for a fact).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..rows import Row
from .seeding import sample_rng
from .haystack import build, sentence_pool

TASKS = ("qa1", "qa2", "qa3", "qa4", "qa5")

PEOPLE = ("Mary", "John", "Daniel", "Sandra")
GIVERS = ("Mary", "Fred", "Jeff", "Bill")
LOCATIONS = ("bathroom", "bedroom", "garden", "hallway", "kitchen", "office")
OBJECTS = ("apple", "football", "milk")
LABELS = {"qa1": LOCATIONS, "qa2": LOCATIONS, "qa3": LOCATIONS, "qa4": LOCATIONS, "qa5": GIVERS + OBJECTS}
MOVE = ("moved to", "went to", "journeyed to", "travelled to", "went back to")
GET = ("picked up", "got", "grabbed", "took")
DROP = ("dropped", "discarded", "put down", "left")
GIVE = ("gave", "passed", "handed")
OPPOSITE = {"north": "south", "south": "north", "east": "west", "west": "east"}

_INSTR_MOVES = ("I give you context with the facts about locations and actions of different persons hidden in "
                "some random text and a question. You need to answer the question based only on the "
                "information from the facts.\nIf a person got an item in the first location and travelled to "
                "the second location the item is also in the second location. If a person dropped an item in "
                "the first location and moved to the second location the item remains in the first location.")
PROMPTS = {
    "qa1": ("I will give you context with the facts about positions of different persons hidden in some random "
            "text and a question. You need to answer the question based only on the information from the "
            "facts. If a person was in different locations, use the latest location to answer the question.",
            [("Charlie went to the garage. Judith moved to the cellar. Charlie travelled to the balcony.",
              "Where is Charlie?", "The most recent location of Charlie is balcony.")],
            "Always return your answer in the following format: The most recent location of 'person' is "
            "'location'. Do not write anything else after that."),
    "qa2": (_INSTR_MOVES,
            [("Alan went to the garage. Alan got the bottle there. Alan moved to the balcony.",
              "Where is the bottle?", "The bottle is in the balcony.")],
            "Always return your answer in the following format: The 'item' is in 'location'. Do not write "
            "anything else after that."),
    "qa3": (_INSTR_MOVES,
            [("Judith went to the cellar. Judith took the screwdriver there. Alan moved to the shop. Judith "
              "journeyed to the garage.", "Where was the screwdriver before the garage?",
              "Before the garage the screwdriver was in the cellar.")],
            "Always return your answer in the following format: Before the 'location_1' the 'item' was in the "
            "'location_2'. Do not write anything else after that."),
    "qa4": ("I will give you context with the facts about locations and their relations hidden in some random "
            "text and a question. You need to answer the question based only on the information from the "
            "facts.",
            [("The shop is east of the garage. The cellar is north of the garage.",
              "What is the garage west of?", "shop")],
            "Your answer should contain only one word - location. Do not write anything else after that."),
    "qa5": ("I will give you context with the facts about different people, their location and actions, hidden "
            "in some random text and a question. You need to answer the question based only on the information "
            "from the facts.",
            [("Alan took the bottle there. Alan handed the bottle to Judith. Charlie went to the shop.",
              "Who did Alan give the bottle to?", "Judith")],
            "Your answer should contain only one word. Do not write anything else after that. Do not explain "
            "your answer."),
}
FACTS = {"qa1": (4, 10), "qa2": (8, 16), "qa3": (10, 20), "qa4": (2, 2), "qa5": (8, 16)}
"""How many story sentences each task scatters (inclusive range; bAbI stories are of this size)."""


def prompt_head(task: str) -> str:
    instruction, examples, post = PROMPTS[task]
    shown = "\n".join(f"<example>\n{story} {q}\nAnswer: {a}\n</example>" for story, q, a in examples)
    return f"{instruction}\n{shown}\n{post}\n<context>\n"


@dataclass
class Story:
    facts: list[str] = field(default_factory=list)
    question: str = ""
    answer: str = ""
    support: list[int] = field(default_factory=list)  # indices of the facts the answer needs


def generate(task: str, tok, length: int, samples: int, seed: int, haystack_dir=None, depths=None) -> list[Row]:
    """Rows of one BABILong task (``depths`` is NIAH-only and ignored here: facts go at random depths)."""
    pool = sentence_pool(tok, "natural", haystack_dir)
    head = prompt_head(task)
    rows = []
    for s in range(samples):
        rng = sample_rng(seed, "babilong", task, length, s)
        story = STORIES[task](rng, rng.randint(*FACTS[task]))
        fact_depths = sorted(rng.random() for _ in story.facts)
        built = build(tok, length, list(zip(fact_depths, story.facts)), pool, rng, head=head, tail="\n</context>")
        support = [built.depths[i] for i in story.support]
        rows.append(Row(built.text, f"Question: {story.question}", [story.answer], f"babilong/{task}", length,
                        "Answer:", min(support), 32, s,
                        {"metric": "babilong", "labels": list(LABELS[task]), "facts": story.facts,
                         "support": story.support, "support_depths": support, "positions": built.positions,
                         "evidence": [story.facts[i] for i in story.support],
                         "tokens": built.n_tokens}))
    return rows


class World:
    """bAbI's little world: where people are, who carries what, where objects have been."""

    def __init__(self, rng, people=PEOPLE):
        self.rng, self.people = rng, people
        self.story = Story()
        self.at: dict[str, str] = {}
        self.moved_at: dict[str, int] = {}           # person -> fact index of their latest move
        self.holder: dict[str, str | None] = {o: None for o in OBJECTS}
        self.trail: dict[str, list[tuple[str, int]]] = {o: [] for o in OBJECTS}  # (location, fact index)
        self.gives: list[tuple[str, str, str, int]] = []  # (giver, object, receiver, fact index)

    def say(self, sentence: str) -> int:
        self.story.facts.append(sentence)
        return len(self.story.facts) - 1

    def _place(self, obj: str, where: str, fact: int):
        if not self.trail[obj] or self.trail[obj][-1][0] != where:
            self.trail[obj].append((where, fact))

    def move(self, person: str):
        where = self.rng.choice([loc for loc in LOCATIONS if loc != self.at.get(person)])
        i = self.say(f"{person} {self.rng.choice(MOVE)} the {where}.")
        self.at[person], self.moved_at[person] = where, i
        for obj, h in self.holder.items():
            if h == person:
                self._place(obj, where, i)

    def get(self, person: str) -> bool:
        free = [o for o in OBJECTS if self.holder[o] is None and person in self.at
                and (not self.trail[o] or self.trail[o][-1][0] == self.at[person])]
        if not free:
            return False
        obj = self.rng.choice(free)
        i = self.say(f"{person} {self.rng.choice(GET)} the {obj} there.")
        self.holder[obj] = person
        self._place(obj, self.at[person], i)
        return True

    def drop(self, person: str) -> bool:
        held = [o for o, h in self.holder.items() if h == person]
        if not held:
            return False
        obj = self.rng.choice(held)
        self.say(f"{person} {self.rng.choice(DROP)} the {obj}.")
        self.holder[obj] = None
        return True

    def give(self, person: str) -> bool:
        held = [o for o, h in self.holder.items() if h == person]
        near = [p for p in self.people if p != person and p in self.at and self.at[p] == self.at.get(person)]
        if not held or not near:
            return False
        obj, other = self.rng.choice(held), self.rng.choice(near)
        i = self.say(f"{person} {self.rng.choice(GIVE)} the {obj} to {other}.")
        self.holder[obj] = other
        self.gives.append((person, obj, other, i))
        return True

    def act(self, weights: dict[str, float]):
        """One random event; falls back to a move when the drawn action is impossible."""
        person = self.rng.choice(self.people)
        action = self.rng.choices(list(weights), list(weights.values()))[0]
        if action == "move" or person not in self.at or not getattr(self, action)(person):
            self.move(person)


def _run(rng, n: int, weights: dict[str, float], people=PEOPLE, ok=lambda w: True) -> World:
    """Stories of ``n`` events until one satisfies ``ok`` (each try draws anew from ``rng``)."""
    for _ in range(1000):
        w = World(rng, people)
        for _ in range(n):
            w.act(weights)
        if ok(w):
            return w
    raise RuntimeError("no story satisfied the task's condition")  # pragma: no cover


def _qa1(rng, n: int) -> Story:
    w = _run(rng, n, {"move": 1.0})
    person = rng.choice(sorted(w.at))
    w.story.question, w.story.answer = f"Where is {person}?", w.at[person]
    w.story.support = [w.moved_at[person]]
    return w.story


_CARRY = {"move": 0.5, "get": 0.3, "drop": 0.2}


def _qa2(rng, n: int) -> Story:
    w = _run(rng, n, _CARRY, ok=lambda w: any(w.trail.values()))
    obj = rng.choice([o for o in OBJECTS if w.trail[o]])
    where, fact = w.trail[obj][-1]
    w.story.question, w.story.answer = f"Where is the {obj}?", where
    w.story.support = sorted({fact} | ({w.moved_at[w.holder[obj]]} if w.holder[obj] else set()))
    return w.story


def _qa3(rng, n: int) -> Story:
    w = _run(rng, n, _CARRY, ok=lambda w: any(len(t) >= 2 for t in w.trail.values()))
    obj = rng.choice([o for o in OBJECTS if len(w.trail[o]) >= 2])
    (before, f1), (now, f2) = w.trail[obj][-2:]
    w.story.question, w.story.answer = f"Where was the {obj} before the {now}?", before
    w.story.support = sorted({f1, f2})
    return w.story


def _qa4(rng, n: int) -> Story:
    hub, first, second = rng.sample(LOCATIONS, 3)
    d1, d2 = rng.sample(sorted(OPPOSITE), 2)
    story = Story([f"The {first} is {d1} of the {hub}.", f"The {second} is {d2} of the {hub}."])
    k = rng.randrange(2)
    answer, d = ((first, d1), (second, d2))[k]
    if rng.random() < 0.5:
        story.question = f"What is {d} of the {hub}?"
    else:
        story.question = f"What is the {hub} {OPPOSITE[d]} of?"
    story.answer, story.support = answer, [k]
    return story


def _qa5(rng, n: int) -> Story:
    w = _run(rng, n, {"move": 0.4, "get": 0.25, "give": 0.3, "drop": 0.05}, GIVERS, ok=lambda w: w.gives)
    giver, obj, receiver, fact = w.gives[-1]
    w.story.question, w.story.answer = rng.choice([
        (f"Who gave the {obj} to {receiver}?", giver),
        (f"Who did {giver} give the {obj} to?", receiver),
        (f"What did {giver} give to {receiver}?", obj),
        (f"Who received the {obj}?", receiver),
        (f"Who gave the {obj}?", giver),
    ])
    w.story.support = [fact]
    return w.story


STORIES = {"qa1": _qa1, "qa2": _qa2, "qa3": _qa3, "qa4": _qa4, "qa5": _qa5}
