"""What is searched: text before a trailing ``Question:`` label is read by the model, not searched with, at
every entry point (one rule, in ``Templater.question``); and the rarity weights that quiet a context's
recurring words."""

import pytest
import torch

from reform.engine.layout import Templater, split_instruction
from reform.methods.query_words import rarity_weights
from reform.methods.reform import ReformConfig
from reform.pipeline import Pipeline

from conftest import CharTokenizer, tiny
from live_server import DOC, OPTIONS, LiveServer, make_pipe

CLEAN = "What does the fox do?"
WRAPPED = "Answer in one word. Question: " + CLEAN


def test_the_last_question_label_with_words_after_it_splits_the_text():
    assert split_instruction(WRAPPED) == ("Answer in one word. Question: ", CLEAN)
    assert split_instruction("Read the text.\nQuestion: Who?\n") == ("Read the text.\nQuestion: ", "Who?\n")
    assert split_instruction("Question: a\n\nQuestion: b") == ("Question: a\n\nQuestion: ", "b")
    assert split_instruction("Question: b") == ("Question: ", "b")
    for text in (CLEAN, "Question:", "Is the FAQ's question: well asked?", "No label here. Question:  "):
        assert split_instruction(text) == ("", text)


def test_the_instruction_is_read_but_not_in_the_search_pass():
    t = Templater(CharTokenizer())
    clean, wrapped = t.question(CLEAN), t.question(WRAPPED)
    assert wrapped.search_ids == clean.search_ids and wrapped.search_question == clean.question
    assert CharTokenizer().decode(wrapped.ids).count("Answer in one word. Question: What does") == 1
    assert clean.search_ids == clean.ids        # nothing told: what is read is what searches


def test_a_wrapped_chat_message_gathers_what_the_clean_question_gathers(tmp_path):
    """Through `reform serve` and the official client: the same kept tokens (the evidence), the recompute
    longer by the instruction alone, which the model reads."""
    with LiveServer(make_pipe(), tmp_path / "store") as server:
        client = server.client()
        got = [client.chat.completions.create(model="reform", max_tokens=4, messages=[
            {"role": "system", "content": DOC}, {"role": "user", "content": q}]) for q in (CLEAN, WRAPPED)]
    clean, wrapped = (g.model_extra["reform"] for g in got)
    assert clean["evidence"] and wrapped["evidence"] == clean["evidence"]
    told = len(WRAPPED) - len(CLEAN)        # one character a token: the instruction, read on top of the same gather
    assert wrapped["stats"]["recomputed_tokens"] - clean["stats"]["recomputed_tokens"] == told
    assert got[1].usage.prompt_tokens - got[0].usage.prompt_tokens == told


def test_rarity_weights_quiet_a_word_on_every_piece():
    ids = torch.tensor([7, 1, 2, 3] * 8 + [9])        # 7 in every 4-token piece, 9 in the last one only
    w = rarity_weights(ids, torch.tensor([7, 9, 5]), block=4)
    assert w[0] < w[1] < w[2]                            # everywhere < once < absent
    assert torch.isclose(w[1], torch.log1p(torch.tensor((9 - 1 + 0.5) / 1.5)))


def test_idf_weights_are_a_checked_option_off_by_default():
    assert ReformConfig().query_weights == "uniform"
    for bad in (dict(query_weights="tf"), dict(query_weights="idf", query_aggregate="max")):
        with pytest.raises(ValueError, match="query_weights"):
            Pipeline(tiny("llama"), CharTokenizer(), **{**OPTIONS, **bad})


def test_idf_weights_change_the_gather_but_keep_its_shape():
    pipe = Pipeline(tiny("llama"), CharTokenizer(), **OPTIONS, query_weights="idf", query_aggregate="maxsim")
    answer = pipe.encode(DOC).ask(CLEAN, max_new_tokens=2)
    assert answer.stats["recomputed_tokens"] == make_pipe().encode(DOC).ask(CLEAN, max_new_tokens=2).stats["recomputed_tokens"]
