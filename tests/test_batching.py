"""Many answers at once (``Context.ask_many``, ``Engine.step``, ``DecodeBatch``): in fp32 every answer decoded
in a batch equals the same answer alone, token for token, whatever the method, the prompt lengths, the stop
rules or the sampling seed; an answer that leaves frees its slot for the next."""

import json

import pytest
import torch

from reform.conformance import VARIANTS, build
from reform.engine.attention import DECODE_BLOCK, batch_decode_attention
from reform.engine.batch import DecodeBatch
from reform.engine.cache import KVCache
from reform.methods.answering import Together
from reform.pipeline import Pipeline

from conftest import CharTokenizer, tiny

TEXT = " ".join(f"Key {i} opens door {i * 7 % 13}." for i in range(40))
QUESTIONS = ["What does key 7 open?", "Which door does key 12 open?", "What is key 3?", "Key 30?",
             "Tell me which door key 21 opens, please.", "Does key 5 open door 9?"]


def pipeline(model, method="reform", **options):
    defaults = {"reform": dict(heads="1:v:0,2:q:3,1:k:1", chunk_size=64, cache_budget=96, recompute_budget=120),
                "h2o": dict(chunk_size=64, cache_budget=120), "reattention": dict(chunk_size=64)}
    return Pipeline(model, CharTokenizer(), method=method, **{**defaults.get(method, {}), **options})


@pytest.mark.parametrize("method", ["reform", "h2o", "full", "truncate"])
def test_answers_decoded_together_equal_each_alone(method):
    pipe = pipeline(tiny("llama"), method)
    ctx = pipe.encode(TEXT[:300] if method == "full" else TEXT)
    alone = [ctx.ask(q, max_new_tokens=n) for q, n in zip(QUESTIONS, (9, 4, 12, 1, 7, 10))]
    together = ctx.ask_many([{"question": q, "max_new_tokens": n} for q, n in zip(QUESTIONS, (9, 4, 12, 1, 7, 10))],
                            max_batch=4)
    assert [a.tokens for a in together] == [a.tokens for a in alone]
    assert [a.text for a in together] == [a.text for a in alone]
    assert [a.finish_reason for a in together] == [a.finish_reason for a in alone]
    assert [a.stats["recomputed_tokens"] for a in together] == [a.stats["recomputed_tokens"] for a in alone]
    if method == "reform":
        assert all(torch.equal(a.kept, b.kept) for a, b in zip(together, alone))


@pytest.mark.parametrize("name", ["gemma3 (5 local : 1 global)", "mistral (sliding window)"])
def test_sliding_window_layers_decode_together_as_alone(name):
    """Sliding-window layers: alone, their cache is trimmed to the window; in a batch, the window is a mask
    over the slot. Both read the same keys."""
    model_type, overrides = VARIANTS[name]
    pipe = Pipeline(build(model_type, overrides), CharTokenizer(), method="full")
    ctx = pipe.encode(TEXT[:150])                       # past the variants' window of 32
    asked = [{"question": q, "max_new_tokens": 40} for q in QUESTIONS[:3]]
    assert [a.tokens for a in ctx.ask_many(asked)] == [ctx.ask(**one).tokens for one in asked]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batch_decode_attention_gives_each_sequence_its_lone_numbers_over_many_blocks(dtype):
    """Sequences of 1 to 20 blocks, some with a window that starts past key 0, in one batch padded to the
    longest and cut from the earliest block anyone reads: each gets bit for bit what it gets alone (its own
    blocks only), and the definition's attention. Keys past a sequence's end hold other numbers."""
    g = torch.Generator().manual_seed(0)
    first, end = torch.tensor([0, 1500, 0, 3000, 4700]), torch.tensor([300, 2600, 1100, 5000, 4800])
    b, h_kv, rep, d = len(end), 2, 3, 16
    n = -(-int(end.max()) // DECODE_BLOCK) * DECODE_BLOCK
    q = torch.randn(b, h_kv * rep, d, generator=g).to(dtype)
    k, v = (torch.randn(b, h_kv, n, d, generator=g).to(dtype) for _ in range(2))
    skip = int(first.min()) // DECODE_BLOCK * DECODE_BLOCK
    together = batch_decode_attention(q, k[:, :, skip:], v[:, :, skip:], first - skip, end - skip, 0.25,
                                      first_block=skip // DECODE_BLOCK)
    for i in range(b):
        lo = int(first[i]) // DECODE_BLOCK * DECODE_BLOCK
        hi = -(-int(end[i]) // DECODE_BLOCK) * DECODE_BLOCK
        alone = batch_decode_attention(q[i:i + 1], k[i:i + 1, :, lo:hi], v[i:i + 1, :, lo:hi], first[i:i + 1] - lo,
                                       end[i:i + 1] - lo, 0.25, first_block=lo // DECODE_BLOCK)
        assert torch.equal(together[i], alone[0]), i
        keys = k[i, :, first[i]:end[i]].float().repeat_interleave(rep, 0)           # [H, keys, D]
        probs = torch.softmax(0.25 * keys @ q[i].float()[:, :, None], 1)
        want = (probs * v[i, :, first[i]:end[i]].float().repeat_interleave(rep, 0)).sum(1)
        torch.testing.assert_close(together[i].float(), want, **({} if dtype == torch.float32 else
                                                                 dict(atol=2e-2, rtol=2e-2)))


def test_sampled_answers_keep_their_own_seed_in_a_batch():
    ctx = pipeline(tiny("qwen2")).encode(TEXT)
    asked = [{"question": q, "temperature": 1.0, "seed": s, "max_new_tokens": 10} for q, s in zip(QUESTIONS, (1, 2, 3))]
    assert [a.tokens for a in ctx.ask_many(asked)] == [ctx.ask(**one).tokens for one in asked]


def test_stop_strings_and_streamed_text_match_alone():
    ctx = pipeline(tiny("llama")).encode(TEXT)
    first = ctx.ask(QUESTIONS[0], max_new_tokens=12).text
    stop = first[3:5] if len(first) > 5 else "zz"
    streamed_alone, streamed_batch = [[], []], [[], []]
    alone = [ctx.ask(q, max_new_tokens=12, stop=stop, on_text=streamed_alone[i].append)
             for i, q in enumerate(QUESTIONS[:2])]
    batch = ctx.ask_many([{"question": q, "on_text": streamed_batch[i].append} for i, q in enumerate(QUESTIONS[:2])],
                         max_new_tokens=12, stop=stop)
    assert [a.text for a in batch] == [a.text for a in alone]
    assert ["".join(s) for s in streamed_batch] == ["".join(s) for s in streamed_alone] == [a.text for a in alone]


def test_a_method_whose_generation_reselects_answers_alone_with_the_same_tokens():
    ctx = pipeline(tiny("llama"), "reattention").encode(TEXT)
    answering = ctx.start(QUESTIONS[0], max_new_tokens=5)
    assert answering.alone
    with pytest.raises(ValueError, match="decodes alone"):
        Together(ctx.pipeline.engine, 2).add(answering)
    assert [a.tokens for a in ctx.ask_many(QUESTIONS[:2], max_new_tokens=5)] == \
           [ctx.ask(q, max_new_tokens=5).tokens for q in QUESTIONS[:2]]


def test_an_answer_that_leaves_frees_its_slot_and_the_others_go_on_unchanged():
    ctx = pipeline(tiny("llama")).encode(TEXT)
    alone = [ctx.ask(q, max_new_tokens=10).tokens for q in QUESTIONS[:3]]
    together = Together(ctx.pipeline.engine, 3)
    members = [ctx.start(q, max_new_tokens=10) for q in QUESTIONS[:3]]
    for a in members:
        assert not together.add(a)
    together.step()
    together.drop(members[0])                           # its client left: the slot is free at once
    assert len(together) == 2 and together.room() == 1
    late = ctx.start(QUESTIONS[3], max_new_tokens=10)   # joins at the next step
    together.add(late)
    while together:
        together.step()
    assert [a.tokens for a in members[1:]] == alone[1:]
    assert late.tokens == ctx.ask(QUESTIONS[3], max_new_tokens=10).tokens
    assert together.batch.size == 0 and together.batch.nbytes() == 0     # memory given back


def test_decode_batch_keeps_occupied_slots_first():
    model = tiny("llama")
    pipe = Pipeline(model, CharTokenizer(), method="full")
    caches = []
    for n in (5, 9, 7):
        cache = KVCache.empty(pipe.engine.shape.n_layers)
        pipe.engine.prefill(torch.arange(3, 3 + n), cache, chunk_size=64)
        caches.append(cache)
    batch = DecodeBatch(pipe.engine.shape.n_layers, 3)
    assert [batch.join(c) for c in caches] == [0, 1, 2]
    with pytest.raises(ValueError, match="full"):
        batch.join(caches[0])
    assert batch.leave(0) == 2                          # the last slot moved into the freed one
    assert batch.lengths[:2, 0].tolist() == [7, 9]
    assert torch.equal(batch.keys[0][0, :, :7], caches[2].layers[0].keys)
    assert batch.leave(1) is None and batch.size == 1


def test_ask_many_refuses_bad_input_in_one_line():
    ctx = pipeline(tiny("llama")).encode(TEXT)
    with pytest.raises(TypeError, match="list of questions"):
        ctx.ask_many("one question")
    with pytest.raises(ValueError, match="max_batch"):
        ctx.ask_many(QUESTIONS[:2], max_batch=0)
    with pytest.raises(ValueError, match="'question'"):
        ctx.ask_many([{"max_new_tokens": 3}])
    with pytest.raises(ValueError, match="empty"):
        ctx.ask_many(["fine", " "])


def test_the_eval_answers_a_contexts_questions_together_with_the_same_predictions(tmp_path):
    """``run_eval(batch=N)`` (``reform eval ... --batch N``): the questions of one context decode together and
    every record's prediction equals the one-at-a-time run's; a row refused alone is refused in a batch."""
    from reform.eval.runner import run_eval
    from reform.eval.tasks import make_rows
    from reform.model import LoadedModel
    rows = make_rows("shared", CharTokenizer(), [2500], 1, seed=2)[:6]
    for i, r in enumerate(rows):
        r.max_new_tokens = 3 + i
    rows[4].max_new_tokens = 10_000                      # past the window: refused, the others go on
    loaded = LoadedModel(tiny(), CharTokenizer(), "tiny")
    predictions = []
    for batch, out in ((1, tmp_path / "one"), (4, tmp_path / "four")):
        run_eval(rows, methods=["truncate:recompute_budget=200"], out_dir=out, model_name="tiny",
                 loader=lambda: loaded, plots=False, batch=batch)
        records = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
        predictions.append([(r["status"], r.get("prediction"), r.get("reason")) for r in records])
    assert predictions[0] == predictions[1]
    assert [p[0] for p in predictions[0]] == ["ok"] * 4 + ["error", "ok"]
