"""RULER's 13 tasks made by RULER's own generators (the wheel nvidia-long-context-eval), bridged into rows on
a tiny word-level tokenizer built here: each row splits into context, question and answer prefix with
no mark left, fits the length RULER was asked for, carries RULER's metric, and its answers (or, for qa,
its evidence spans) are where RULER put them."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from reform.eval.tasks import make_rows, ruler_official
from reform.eval.tasks.scoring import score
from reform.engine.layout import split_instruction

pytestmark = pytest.mark.skipif(ruler_official.missing() is not None, reason=str(ruler_official.missing()))
LENGTH = 2048
# Every needle script first sorts RULER's 6.2M adjective-noun pairs (~25 s of CPU a task here), so the suite
# makes the needle tasks that together take every value of every needle setting in RULER's synthetic.yaml
# (haystack repeat / essay / needle; keys words / uuids; values numbers / uuids; 4 keys, values, queries),
# and every other task. `test_every_task_is_rulers_and_reads_its_settings` covers the 13 names.
MADE = ("niah_single_1", "niah_multikey_1", "niah_multikey_3", "niah_multivalue", "niah_multiquery",
        "vt", "cwe", "fwe", "qa_1", "qa_2")


@pytest.fixture(scope="module")
def tokenizer():
    """A word-level tokenizer (one token per word or punctuation mark) that transformers saves and loads."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    words = ["[UNK]", "the", "a", "of", "special", "magic", "number", "is", "for"]
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]")


@pytest.fixture(scope="module")
def rows_by_task(tokenizer):
    """One row of each task in MADE, made as `reform eval ruler` makes them: the generators side by side."""
    rows = make_rows("ruler-official", tokenizer, [LENGTH], 1, seed=0, tasks=list(MADE))
    assert [row.task for row in rows] == [f"ruler/{task}" for task in MADE]
    return {row.task.removeprefix("ruler/"): [row] for row in rows}


def test_every_task_is_rulers_and_reads_its_settings():
    import yaml
    from importlib import resources
    official = yaml.safe_load(resources.files("long_context_eval").joinpath("synthetic.yaml").read_text())
    assert tuple(official) == ruler_official.TASKS
    needle_settings = set()
    for task in ruler_official.TASKS:
        script, args, template = ruler_official.settings(task)
        assert script.endswith(f"{official[task]['task']}.py") and "{context}" in template["template"]
        if task in MADE and task.startswith("niah"):
            needle_settings |= set(args.items())
    assert needle_settings == {item for task in official if task.startswith("niah")   # MADE takes every value
                               for item in official[task]["args"].items()}


@pytest.mark.parametrize("task", MADE)
def test_each_official_task_becomes_rows_split_around_its_context(task, tokenizer, rows_by_task):
    rows = rows_by_task[task]
    for row in rows:
        marks = ruler_official.CONTEXT_END + ruler_official.QUESTION_END
        assert not any(m in row.context + row.instruction + row.question + row.answer_prefix for m in marks)
        assert row.task == f"ruler/{task}" and row.layout == "verbatim" and row.answers
        assert row.meta["generator"].startswith("nvidia-long-context-eval")
        # within the length as RULER counts it (its fwe may pass the length by a little: 2,073 of 2,048)
        words = len(tokenizer(row.context + row.instruction + row.question + row.answer_prefix)["input_ids"])
        assert words + row.max_new_tokens <= row.meta["ruler_length"] <= LENGTH * 1.02
        if task.startswith("qa"):
            assert row.meta["metric"] == "string_match_part" and row.answer_prefix == " Answer:"
            # the instruction is inside the question, as RULER's template writes it; the templater splits it
            assert row.instruction == "" and row.question.count("Question:") == 1
            assert row.question.strip().startswith("Answer the question based on the given documents")
            instruction, query = split_instruction(row.question)
            assert instruction.rstrip().endswith("Question:") and query.strip() and "Question:" not in query
            spans = row.meta["evidence_spans"]
            assert spans and all(0 <= a < b <= len(row.context) for a, b in spans)
            if task == "qa_1":          # SQuAD: the answer spans are the answers
                assert {row.context[a:b] for a, b in spans} <= set(row.answers)
            else:                       # HotpotQA: whole supporting sentences, in their documents
                assert all(row.context[a:b][0].isupper() and row.context[b - 1] in ".!?\"')" for a, b in spans)
        else:
            assert row.meta["metric"] == "string_match_all"
            if task.startswith("niah") or task == "vt":   # the needles' values are in the haystack
                assert all(re.search(re.escape(a), row.context) for a in row.answers)
            if task == "vt":    # the evidence is the chain: each answer's assignment, once, the first a number
                chain = row.meta["evidence"]
                assert [link.split()[1] for link in chain] == row.answers
                assert all(row.context.count(link) == 1 for link in chain) and chain[0].split()[-1].isdigit()
                assert all(link.endswith(f"VAR {prev.split()[1]}") for prev, link in zip(chain, chain[1:]))
        # RULER's metric on a perfect and an empty answer
        assert score(row, " ".join(row.answers)) == 1.0 and score(row, "") == 0.0


def test_rows_are_a_function_of_the_seed(tokenizer, rows_by_task):
    first = rows_by_task["vt"]                   # made beside the other tasks, in a thread of its own
    again = ruler_official.generate("vt", tokenizer, LENGTH, 1, seed=0)
    other = ruler_official.generate("vt", tokenizer, LENGTH, 1, seed=1)
    assert first[0].id == again[0].id != other[0].id


@pytest.mark.parametrize("task, length", [("vt", 400), ("qa_1", 600)])
def test_a_length_that_fits_no_haystack_is_refused_not_retried_forever(task, length, tokenizer):
    """RULER's scripts retry the same too-long draw forever when not one block of haystack fits: vt at 400,
    where its worked example and answer fill the length, and qa_1 at 600, shorter than ten documents."""
    pool = ThreadPoolExecutor(1)
    made = pool.submit(ruler_official.generate, task, tokenizer, length, 1, 0)
    pool.shutdown(wait=False)
    error = made.exception(timeout=120)         # a regression fails here instead of hanging the suite
    assert isinstance(error, ValueError)
    assert str(error) == (f"{length} tokens are too few for RULER's {task} in this model's tokenizer: its "
                          "generator cannot fit one block of haystack; ask a longer length")


def test_the_generator_choice_of_the_cli():
    from reform.cli.common import CliError
    from reform.cli.eval import rows_source
    assert rows_source("ruler", "builtin") == ("ruler", "built-in")
    assert rows_source("ruler", "official")[0] == "ruler-official"
    assert rows_source("ruler", "auto")[0] == "ruler-official"
    with pytest.raises(CliError, match="--generator applies to `reform eval ruler` only"):
        rows_source("niah", "official")
    with pytest.raises(CliError, match="--generator must be auto, official or builtin"):
        rows_source("ruler", "wheel")
