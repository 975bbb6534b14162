"""REFORM's ``question_first``: the question read before the gathered tokens as well (after the template's
prefix), through a tiny model with a chat template, and in a library's recompute."""

import pytest
import torch

from conftest import real_tokenizer, tiny
from reform.heads import find_preset
from reform.methods.options import build_config
from reform.methods.reform import ReformConfig
from reform.methods.reform_rag import ReformRagConfig
from reform.pipeline import Pipeline
from reform.stats import Timer

OPTIONS = dict(heads="1:v:0,2:q:3", chunk_size=64, cache_budget=96, recompute_budget=100, gather_keep=8,
               pool_window=9)
TEXT = "".join(f"The magic number {i} is {4711 + i}. The quick brown fox jumps over the lazy dog. " for i in range(30))
QUESTION = "What is the magic number 7?"


def pipelines():
    tok = real_tokenizer()
    model = tiny("llama", vocab_size=len(tok))
    return [Pipeline(model, tok, question_first=first, **OPTIONS) for first in (False, True)]


def test_the_question_is_read_first_right_after_the_template_prefix():
    paper, first = pipelines()
    assert not paper.templater.plain and len(paper.templater.prefix) > 1      # a chat template's own tokens
    ctx = paper.encode(TEXT)
    part = paper.templater.question(QUESTION)
    plain = paper.method.prompt(ctx, part, Timer())
    ahead = first.method.prompt(ctx, part, Timer())
    n = len(paper.templater.prefix)
    preview = paper.templater.encode(f"Question: {QUESTION}\n\n")
    assert plain.ids[:n].tolist() == paper.templater.prefix
    assert ahead.ids.tolist() == plain.ids[:n].tolist() + preview + plain.ids[n:].tolist()
    assert torch.equal(ahead.kept, plain.kept)                    # the same gather, read in another order
    answers = [pipe.encode(TEXT).ask(QUESTION, max_new_tokens=2) for pipe in (paper, first)]
    assert answers[1].stats["recomputed_tokens"] == answers[0].stats["recomputed_tokens"] + len(preview)
    assert torch.equal(answers[0].kept, answers[1].kept)


def test_question_first_is_a_checked_option_off_by_default():
    paper, _ = pipelines()
    assert paper.method.config.question_first is False
    with pytest.raises(ValueError, match="option question_first of reform must be true or false, got 'maybe'"):
        Pipeline(tiny("llama"), real_tokenizer(), question_first="maybe", **OPTIONS)


def test_a_library_reads_the_question_first_too(tmp_path):
    import copy
    import dataclasses
    from reform.library import Library
    paper, _ = pipelines()
    (tmp_path / "a.md").write_text(TEXT)
    library = Library(paper, tmp_path / "store")
    library.add(tmp_path / "a.md")
    ids = {}
    for first in (False, True):
        library.method = copy.copy(library.method)
        library.method.config = dataclasses.replace(library.method.config, question_first=first)
        ids[first] = library.collect(QUESTION).ids
    n, preview = len(paper.templater.prefix), paper.templater.encode(f"Question: {QUESTION}\n\n")
    assert ids[True] == ids[False][:n] + preview + ids[False][n:]


def test_smollm2s_preset_reads_the_question_first_for_reform_alone():
    """The second rule in docs/results/question-first-smollm2 put ``question_first`` in SmolLM2's preset,
    scoped to ``reform``: REFORM+RAG keeps its reader, and an explicit option still wins."""
    defaults = find_preset("HuggingFaceTB/SmolLM2-135M-Instruct")["defaults"]
    assert build_config("reform", ReformConfig, {}, defaults).question_first is True
    assert build_config("reform", ReformConfig, {"question_first": False}, defaults).question_first is False
    assert build_config("reform+rag", ReformRagConfig, {}, defaults).question_first is False
    assert build_config("reform", ReformConfig, {}, find_preset("gemma-3-270m")["defaults"]).question_first is False
