"""The sampling fields clients send besides OpenAI's temperature and top_p (issue 101): top_k, min_p and
repetition_penalty (vLLM's and llama.cpp's), frequency_penalty and presence_penalty (OpenAI's). A repetition
penalty equals transformers' own generate; batched answers equal lone ones."""

import httpx
import pytest
import torch

from reform.engine.layout import as_tensor
from reform.engine.sampling import Sampling, TokenChooser
from reform.pipeline import Pipeline

from conftest import tiny
from live_server import DOC_CHAT

CONTEXT = "The quick brown fox jumps over the lazy dog. " * 6
QUESTION = "What does the fox do?"


def test_a_repetition_penalty_answers_as_transformers_generate_does(tokenizer):
    model = tiny("llama", seed=1)          # a seed whose answer runs 12 tokens without a line break
    pipe = Pipeline(model, tokenizer, method="full")
    ctx = pipe.encode(CONTEXT)
    plain = torch.cat([pipe.tokenize_context(CONTEXT), as_tensor(pipe.templater.question(QUESTION).ids, "cpu")])
    with torch.no_grad():
        want = model.generate(plain[None], max_new_tokens=12, do_sample=False, repetition_penalty=1.8,
                              eos_token_id=None, pad_token_id=0)[0, plain.shape[0]:].tolist()
    got = ctx.ask(QUESTION, max_new_tokens=12, repetition_penalty=1.8).tokens
    assert got == want and len(got) == 12
    assert got != ctx.ask(QUESTION, max_new_tokens=12).tokens        # the penalty changed the answer


def test_penalties_and_filters_by_hand():
    logits = torch.tensor([3.0, 2.9, 1.0, 0.5])
    choose = lambda **kw: TokenChooser(Sampling(**kw))
    assert choose(frequency_penalty=0.2)(logits, answer=[0]) == 1            # 3.0 - 0.2 < 2.9
    assert choose(frequency_penalty=0.06)(logits, answer=[0]) == 0           # 2.94 > 2.9
    assert choose(frequency_penalty=0.06)(logits, answer=[0, 0]) == 1        # twice: 2.88
    assert choose(presence_penalty=0.06)(logits, answer=[0, 0]) == 0         # presence counts once
    for seed in range(20):      # sampled, top_k=1 and min_p=1 leave the top token alone
        assert choose(temperature=1.0, top_k=1, seed=seed)(logits) == 0
        assert choose(temperature=1.0, min_p=1.0, seed=seed)(logits) == 0
        assert choose(temperature=1.0, top_k=2, seed=seed)(logits) in (0, 1)
    for bad in (dict(top_k=-1), dict(top_k=True), dict(min_p=1.5), dict(repetition_penalty=0),
                dict(frequency_penalty=3), dict(presence_penalty="0.5")):
        with pytest.raises(ValueError, match=next(iter(bad))):
            Sampling(**bad)


def test_penalised_answers_in_a_batch_equal_their_lone_selves(tokenizer):
    ctx = Pipeline(tiny("qwen2"), tokenizer, method="full").encode(CONTEXT)
    asked = [{"question": q, "max_new_tokens": 10, **kw} for q, kw in (
        ("What does the fox do?", {"repetition_penalty": 1.5}), ("Who is lazy?", {"frequency_penalty": 1.0}),
        ("What jumps?", {"temperature": 0.8, "top_k": 5, "min_p": 0.05, "seed": 3, "presence_penalty": 0.5}))]
    assert [a.tokens for a in ctx.ask_many(asked)] == [ctx.ask(**one).tokens for one in asked]


def test_the_server_takes_the_fields_and_refuses_bad_values_naming_them(live):
    ok = httpx.post(f"{live.url}/v1/chat/completions", timeout=60, json={
        "model": "reform", "messages": DOC_CHAT, "max_tokens": 4, "top_k": 20, "min_p": 0.05,
        "repetition_penalty": 1.1, "frequency_penalty": 0.5, "presence_penalty": 0.5, "temperature": 0.7, "seed": 1})
    assert ok.status_code == 200, ok.text
    assert httpx.post(f"{live.url}/v1/chat/completions", timeout=60, json={
        "model": "reform", "messages": DOC_CHAT, "max_tokens": 4, "top_k": -1}).status_code == 200   # vLLM's "all"
    for field, value in (("top_k", -5), ("min_p", 2), ("repetition_penalty", 0), ("presence_penalty", 9)):
        r = httpx.post(f"{live.url}/v1/chat/completions", timeout=60,
                       json={"model": "reform", "messages": DOC_CHAT, field: value})
        assert r.status_code == 400 and field in r.json()["error"]["message"], (field, r.text)
