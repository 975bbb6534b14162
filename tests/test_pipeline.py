"""Encode once, ask many; REFORM equals plain generation where it should; budgets are validated."""

import pytest
import torch

from reform.engine.layout import as_tensor
from reform.pipeline import Pipeline

from conftest import tiny

CONTEXT = "The quick brown fox jumps over the lazy dog. " * 12           # ~540 byte-tokens
QUESTION = "What does the fox do?"


def hf_greedy(model, ids, n):
    with torch.no_grad():
        out = model.generate(ids[None], max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, ids.shape[0]:].tolist()


def make(model, tokenizer, **kw):
    opts = dict(heads="1:v:0,2:q:3,1:k:1", chunk_size=64, cache_budget=96, recompute_budget=200)
    opts.update(kw)
    return Pipeline(model, tokenizer, **opts)


def test_short_context_takes_exact_full_attention_path(tiny_model, tokenizer):
    pipe = make(tiny_model, tokenizer, recompute_budget=400)
    text = CONTEXT[:300]
    ans = pipe.encode(text).ask(QUESTION, max_new_tokens=8)
    part = pipe.templater.question(QUESTION)
    plain = torch.cat([pipe.tokenize_context(text), as_tensor(part.ids, "cpu")])
    assert ans.tokens == hf_greedy(tiny_model, plain, 8)[:len(ans.tokens)]
    assert ans.stats["recomputed_tokens"] == plain.shape[0]


def test_full_method_equals_plain_generation(tiny_model, tokenizer):
    pipe = Pipeline(tiny_model, tokenizer, method="full")
    ans = pipe.encode(CONTEXT[:300]).ask(QUESTION, max_new_tokens=8)
    part = pipe.templater.question(QUESTION)
    plain = torch.cat([pipe.tokenize_context(CONTEXT[:300]), as_tensor(part.ids, "cpu")])
    assert ans.tokens == hf_greedy(tiny_model, plain, 8)[:len(ans.tokens)]


def test_long_context_recomputes_gathered_tokens_at_fresh_positions(tiny_model, tokenizer):
    """The answer equals plain HF generation over exactly the gathered tokens + question."""
    pipe = make(tiny_model, tokenizer)
    ctx = pipe.encode(CONTEXT)
    n = ctx.ids.shape[0]
    assert n > 400 and ctx.cache.length == 96 and len(ctx.cache.layers) == 2      # layers 0, 1 (+ Q/K/V of 2)
    assert ctx.state.data.shape == (n, 3 * 16)
    part = pipe.templater.question(QUESTION)
    from reform.stats import Timer
    keep = pipe.method.select(ctx, part, Timer())
    assert keep.shape[0] == 200 and keep.tolist() == sorted(set(keep.tolist()))
    ans = ctx.ask(QUESTION, max_new_tokens=6)
    prompt = torch.cat([ctx.ids[keep], as_tensor(part.ids, "cpu")])
    assert ans.tokens == hf_greedy(tiny_model, prompt, 6)[:len(ans.tokens)]
    assert ans.stats["recomputed_tokens"] == prompt.shape[0]


def test_fit_window_lowers_max_new_tokens_to_the_room_the_prompt_leaves(tiny_model, tokenizer):
    """``fit_window``: an answer length the window cannot hold is lowered to what it can, not refused; the
    answer is the same greedy continuation, only as long as fits."""
    pipe = make(tiny_model, tokenizer)
    ctx = pipe.encode(CONTEXT)
    with pytest.raises(ValueError, match="exceeds the model's window"):
        ctx.ask(QUESTION, max_new_tokens=10_000)
    ans = ctx.ask(QUESTION, max_new_tokens=10_000, fit_window=True)
    room = pipe.engine.max_positions - ans.stats["recomputed_tokens"]
    assert 0 < len(ans.tokens) <= room and (ans.finish_reason == "length") == (len(ans.tokens) == room)
    short = ctx.ask(QUESTION, max_new_tokens=6)
    assert ans.tokens[:len(short.tokens)] == short.tokens


def test_second_question_does_not_re_encode(tiny_model, tokenizer):
    pipe = make(tiny_model, tokenizer)
    ctx = pipe.encode(CONTEXT)
    calls = []
    original = pipe.engine.prefill
    pipe.engine.prefill = lambda *a, **k: calls.append(a[0].shape[0]) or original(*a, **k)
    cache_before = [lc.keys.clone() for lc in ctx.cache.layers]
    a1, a2 = ctx.ask(QUESTION, max_new_tokens=4), ctx.ask("Who is lazy?", max_new_tokens=4)
    # only the recompute prefills run (gathered tokens + question) and the decoding steps (one token
    # each), never the whole context again
    prompts = [c for c in calls if c > 1]
    assert len(prompts) == 2 and all(c < ctx.ids.shape[0] for c in prompts)
    # one step per generated token at most (none after the last, unless it ended at an end-of-sequence id)
    assert len(calls) - len(prompts) <= len(a1.tokens) + len(a2.tokens)
    assert all(torch.equal(b, lc.keys) for b, lc in zip(cache_before, ctx.cache.layers))  # cache untouched
    assert a1.stats["encode"] == a2.stats["encode"]


def test_reform_with_budgets_covering_input_equals_plain_generation(tiny_model, tokenizer):
    """Chunked, compressed encode, but the recompute budget covers the context: same tokens as plain."""
    pipe = make(tiny_model, tokenizer, recompute_budget=480, cache_budget=96, chunk_size=64)
    text = CONTEXT[:455]          # + the question part fits the 512-token window
    ctx = pipe.encode(text)
    ans = ctx.ask(QUESTION, max_new_tokens=8)
    part = pipe.templater.question(QUESTION)
    plain = torch.cat([ctx.ids, as_tensor(part.ids, "cpu")])
    assert ans.tokens == hf_greedy(tiny_model, plain, 8)[:len(ans.tokens)]
    # and the first-token logits match HF's exactly
    eng = pipe.engine
    from reform.engine import KVCache
    logits = eng.logits(eng.prefill(plain, KVCache.empty(4), chunk_size=50)[-1:])
    with torch.no_grad():
        ref = tiny_model(plain[None]).logits[0, -1:]
    torch.testing.assert_close(logits, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("opts,msg", [
    (dict(cache_budget=400, chunk_size=200), "must fit the model's window"),
    (dict(recompute_budget=512), "must leave room"),
    (dict(cache_budget=20), "smaller than the always-kept"),
    (dict(heads="9:v:0"), "layer must be in 0..3"),
    (dict(heads="1:k:5"), "index must be in 0..1"),
    (dict(heads="1:x:0"), "bad head"),
    (dict(chunk_size=0), "positive"),
    (dict(profile="turbo"), "profile of reform must be one of default, fast"),
])
def test_bad_budgets_and_heads_are_refused(tokenizer, opts, msg):
    with pytest.raises(ValueError, match=msg):
        make(tiny(), tokenizer, **opts)


def test_fast_profile_is_the_same_context_as_its_numbers(tokenizer):
    """profile="fast" sets chunk and cache to W/8 (W = 512 here) where not given, and a context encoded
    with it is the one encoded with those numbers: same store key, same answer, same saved options."""
    from reform.methods.options import options_json
    model = tiny()
    fast = make(model, tokenizer, chunk_size=None, cache_budget=None, profile="fast")
    numbers = make(model, tokenizer, chunk_size=64, cache_budget=64)
    default = make(model, tokenizer, chunk_size=None, cache_budget=None)
    assert (fast.method.config.chunk_size, fast.method.config.cache_budget) == (64, 64)
    assert (default.method.config.chunk_size, default.method.config.cache_budget) == (128, 128)
    assert make(model, tokenizer, chunk_size=32, cache_budget=None, profile="fast").method.config.chunk_size == 32
    ids = fast.tokenize_context(CONTEXT)
    assert fast.context_key(ids) == numbers.context_key(ids) != default.context_key(ids)
    assert options_json(fast.method.config) == options_json(numbers.method.config)
    assert fast.encode(CONTEXT).ask(QUESTION, max_new_tokens=6).tokens == \
        numbers.encode(CONTEXT).ask(QUESTION, max_new_tokens=6).tokens
    with pytest.raises(ValueError, match="does not take profile"):
        Pipeline(model, tokenizer, method="h2o", profile="fast")


def test_unknown_method_and_empty_inputs(tokenizer):
    with pytest.raises(ValueError, match="unknown method"):
        Pipeline(tiny(), tokenizer, method="nope")
    pipe = make(tiny(), tokenizer)
    with pytest.raises(ValueError, match="context is empty"):
        pipe.encode("   ")
    with pytest.raises(ValueError, match="question is empty"):
        pipe.encode(CONTEXT).ask(" ")


def test_documents_get_the_documents_method_unless_a_method_is_named(tokenizer, tmp_path):
    """``Pipeline(method=None)``, the default, runs REFORM for text and ``DOCUMENTS_METHOD`` for documents, as
    `reform ask FILE` and `reform serve` do; a method named runs for everything, and content keys follow."""
    from reform.methods import DOCUMENTS_METHOD
    from reform.pipeline import check_load
    model = tiny()
    pipe, named = make(model, tokenizer), make(model, tokenizer, method="reform")
    doc = tmp_path / "notes.md"
    doc.write_text("# Boats\n\n" + CONTEXT)
    assert pipe.policy == {"text": "reform", "documents": DOCUMENTS_METHOD[0]}
    assert named.policy == {"text": "reform", "documents": "reform"}
    assert pipe.encode(doc).method.name == DOCUMENTS_METHOD[0] and pipe.encode(CONTEXT).method.name == "reform"
    assert named.encode(doc).method.name == "reform"
    ids, _, source = pipe.tokenize(doc)
    assert pipe.context_key(ids, document=source.document) != named.context_key(ids, document=source.document)
    assert pipe.context_key(ids) == named.context_key(ids)      # the same ids as plain text: REFORM's key
    with pytest.raises(ValueError, match="retriever"):           # the policy's two methods check every option
        check_load(method=None, retriever="nope")


def test_model_without_rotary_positions_is_refused(tokenizer):
    from transformers import GPT2Config, GPT2LMHeadModel
    from reform.engine import UnsupportedModelError
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=128, n_positions=256))
    with pytest.raises(UnsupportedModelError, match="no rotary position embedding"):
        Pipeline(gpt2, tokenizer)


def test_early_exit_runs_only_the_projections_of_the_deepest_head_layer(tiny_model, tokenizer):
    """Layers 0-1 run in full; layer 2 (deepest head) only projects Q/K/V; layer 3 never runs. The stored
    embeddings equal those of a run that computes layer 2 in full."""
    pipe = make(tiny_model, tokenizer)
    calls = {"mlp2": 0, "attn3": 0}
    layers = tiny_model.model.layers
    h1 = layers[2].mlp.register_forward_hook(lambda *a: calls.__setitem__("mlp2", calls["mlp2"] + 1))
    h2 = layers[3].self_attn.q_proj.register_forward_hook(lambda *a: calls.__setitem__("attn3", calls["attn3"] + 1))
    try:
        ctx = pipe.encode(CONTEXT)
    finally:
        h1.remove(), h2.remove()
    assert calls == {"mlp2": 0, "attn3": 0}
    from reform.engine.cache import KVCache
    from reform.engine.extractors import HeadEmbeddings
    from reform.engine.policies import H2OPolicy
    c = pipe.method.config
    emb = HeadEmbeddings(list(c.heads), pipe.engine.shape, ctx.ids.shape[0], "cpu", c.embed_dtype)
    pipe.engine.prefill(ctx.ids, KVCache.empty(emb.exit_layer + 1), chunk_size=c.chunk_size, hook=emb,
                        policy=H2OPolicy(c.cache_budget, c.keep_first, c.keep_last, c.score_window))
    torch.testing.assert_close(emb.data, ctx.state.data)


def test_a_model_without_chat_template_is_asked_in_plain_text_and_answers_one_line(tiny_model, tokenizer):
    """A base model gets "context / Question: ... / Answer: PREFIX", says so once, and its answer ends
    at the end of its first line (a base model would go on with a question of its own)."""
    import warnings

    from reform.engine.sampling import StopScanner
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pipe = make(tiny_model, tokenizer)
    assert [str(w.message) for w in caught if "no chat template" in str(w.message)] != []
    part = pipe.templater.question("Who is lazy?", "It is")
    assert tokenizer.decode(part.ids) == "\n\nQuestion: Who is lazy?\nAnswer: It is"
    assert tokenizer.decode(part.ids[part.query_span]) == " Who is lazy?"
    scanner = StopScanner((), one_line=True)
    assert scanner.final("\n 42") == "\n 42" and not scanner.stopped       # a leading break is no end
    assert scanner.final("\n 42.\nQuestion: next") == "\n 42." and scanner.stopped
    ans = pipe.encode(CONTEXT).ask(QUESTION, max_new_tokens=12)
    assert "\n" not in ans.text
