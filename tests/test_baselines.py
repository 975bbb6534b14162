"""The paper's baselines as methods of the one engine: budgets and positions hold at every chunk, covering
budgets reduce every method to full attention, RAG keeps passage order and its budget, bad options are
refused."""

import math
import os

import pytest
import torch

from reform.engine import KVCache, LayerCache, StreamingLLMPolicy
from reform.methods.tova import TOVAPolicy
from reform.engine.layout import as_tensor
from reform.methods import OptionError
from reform.methods.rag import PassageIndex, pick_passages
from reform.pipeline import Pipeline
from reform.stats import Timer

from conftest import WINDOW, CharTokenizer, tiny

CONTEXT = "The quick brown fox jumps over the lazy dog. " * 30          # ~1350 byte-tokens, > the 512 window
QUESTION = "What does the fox do?"
CACHED = ["streaming", "h2o", "tova", "infinipot", "infllm"]
CATALYST = "\nSummarize the text."
EXTRA = {"infinipot": {"catalyst": CATALYST},          # a catalyst prompt short enough for the tiny window
         "infllm": {"block_size": 16}}                 # blocks small enough for the tiny window
RECOMPUTED = ["truncate", "rag-bm25", "rag-dense"]


class TextTokenizer(CharTokenizer):
    """Byte tokenizer whose decode inverts encode (RAG retrievers read the decoded passages)."""

    def decode(self, ids, skip_special_tokens=False):
        return bytes(i - 3 for i in ids if i >= 3).decode("utf-8", errors="replace")


def hf_greedy(model, ids, n):
    with torch.no_grad():
        out = model.generate(ids[None], max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, ids.shape[0]:].tolist()


def plain_prompt(pipe, text, question=QUESTION):
    part = pipe.templater.question(question)
    return torch.cat([pipe.tokenize_context(text), as_tensor(part.ids, "cpu")])


# ------------------------------------------------------------------ recurrent methods: budget and positions
@pytest.mark.parametrize("name", CACHED)
def test_cache_within_budget_at_every_chunk_and_positions_within_window(name, tiny_model, tokenizer):
    pipe = Pipeline(tiny_model, tokenizer, method=name, chunk_size=96, cache_budget=160, **EXTRA.get(name, {}))
    lengths, ends = [], []
    make_policy, forward = pipe.method.policy, pipe.engine.forward

    def spy_policy(p):
        policy = make_policy(p)
        compress = policy.compress
        policy.compress = lambda cache, rotary: (compress(cache, rotary),
                                                 lengths.append({lc.length for lc in cache.layers}))
        return policy

    pipe.method.policy = spy_policy
    pipe.engine.forward = lambda ids, cache, **kw: ends.append(cache.length + ids.shape[0]) or forward(ids, cache, **kw)
    ctx = pipe.encode(CONTEXT)
    n = ctx.ids.shape[0]
    assert n > 2 * WINDOW
    assert len(lengths) == math.ceil(n / 96)                               # compressed after every chunk
    assert all(len(s) == 1 and s.pop() <= 160 for s in lengths)            # every layer within budget
    kept = ctx.cache.length if name == "infllm" else 160                  # InfLLM: sinks + local window
    assert len(ctx.cache.layers) == pipe.engine.shape.n_layers and kept <= 160
    catalyst = len(CATALYST) if name == "infinipot" else 0                 # InfiniPot's scoring pass
    assert max(ends) <= 160 + 96 + catalyst <= WINDOW                      # positions inside the window
    ends.clear()
    ans = ctx.ask(QUESTION, max_new_tokens=6)
    question = len(pipe.templater.question(QUESTION).ids)
    assert ans.stats["recomputed_tokens"] == (1 if name == "infllm" else question)   # InfLLM: rest in gather
    assert max(ends) <= 160 + question + 6 <= WINDOW
    assert ctx.cache.length == kept                                        # asking leaves the cache as it was


@pytest.mark.parametrize("name", CACHED)
def test_cache_methods_with_covering_budget_equal_full_attention(name, tiny_model, tokenizer):
    """Chunked encode on a cache large enough to never evict: the same tokens and logits as plain HF."""
    extra = {**EXTRA.get(name, {}), **({"local_size": 300} if name == "infllm" else {})}   # nothing leaves it
    pipe = Pipeline(tiny_model, tokenizer, method=name, chunk_size=64, cache_budget=400, **extra)
    text = CONTEXT[:300]
    ctx = pipe.encode(text)
    assert ctx.cache.length == ctx.ids.shape[0]
    plain = plain_prompt(pipe, text)
    assert ctx.ask(QUESTION, max_new_tokens=8).tokens == hf_greedy(tiny_model, plain, 8)
    prompt, cache, *_ = pipe.method.prompt(ctx, pipe.templater.question(QUESTION), Timer())
    logits = pipe.engine.logits(pipe.engine.prefill(prompt, cache, chunk_size=WINDOW)[-1:])
    with torch.no_grad():
        ref = tiny_model(plain[None]).logits[0, -1:]
    torch.testing.assert_close(logits, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name,options", [("truncate", {}), ("rag-bm25", {}), ("rag-dense", {}),
                                          ("reform+rag", {"heads": "1:v:0", "chunk_size": 64, "cache_budget": 96})])
def test_recompute_methods_with_covering_budget_equal_full_attention(name, options, tiny_model):
    pipe = Pipeline(tiny_model, TextTokenizer(), method=name, recompute_budget=400, **options)
    text = CONTEXT[:300]
    ans = pipe.encode(text).ask(QUESTION, max_new_tokens=8)
    plain = plain_prompt(pipe, text)
    assert ans.tokens == hf_greedy(tiny_model, plain, 8)
    assert ans.stats["recomputed_tokens"] == plain.shape[0]


# ------------------------------------------------------------------ the eviction policies themselves
def layer_cache(n, heads=2, d=8):
    keys = torch.arange(n, dtype=torch.float32)[None, :, None].expand(heads, n, d).contiguous()
    return LayerCache(keys.clone(), keys.clone(), keys.clone())


class NoRotation:
    def rotate(self, x, start, layer=0):
        return x


def test_streaming_keeps_sinks_and_recent_window():
    lc = layer_cache(50)
    StreamingLLMPolicy(budget=12, keep_first=4).compress(KVCache([lc]), NoRotation())
    assert lc.keys_pre[:, :, 0].tolist() == [list(range(4)) + list(range(42, 50))] * 2


def test_tova_keeps_what_the_last_query_attends_to_most_averaged_over_heads():
    lc = layer_cache(30)
    received = torch.rand(2, 30)
    policy = TOVAPolicy(budget=10, keep_first=2, keep_last=3)
    policy.observe(0, received, lc, 30)
    policy.compress(KVCache([lc]), NoRotation())
    total = received.sum(0)
    middle = total[2:27].topk(5).indices + 2
    expected = sorted([0, 1, 27, 28, 29] + middle.tolist())
    assert lc.keys_pre[:, :, 0].tolist() == [expected, expected]           # the same tokens in every head


def test_token_nll_matches_hf_loss_across_chunks(tiny_model):
    from reform.engine import Engine
    from reform.methods.infinipot import token_nll
    eng, ids = Engine(tiny_model), torch.randint(3, 128, (70,))
    cache = KVCache.empty(eng.shape.n_layers)
    h1 = eng.forward(ids[:40], cache)
    h2 = eng.forward(ids[40:], cache)
    got = torch.cat([token_nll(eng, ids[:40], h1, None, block=16), token_nll(eng, ids[40:], h2, h1[-1:], block=16)])
    with torch.no_grad():
        logits = tiny_model(ids[None]).logits[0]
    ref = torch.nn.functional.cross_entropy(logits[:-1], ids[1:], reduction="none")
    assert got[0] == 0
    torch.testing.assert_close(got[1:], ref, atol=1e-4, rtol=1e-4)


def infinipot_kept(model, nll, nuc_share):
    """Token indices (per KV head, layer 1) that InfiniPot keeps of a 60-token cache with the given NuC."""
    from reform.engine import Engine
    from reform.methods.infinipot import InfiniPotPolicy
    eng, ids = Engine(model), torch.randint(3, 128, (60,), generator=torch.Generator().manual_seed(3))
    cache = KVCache.empty(eng.shape.n_layers)
    eng.forward(ids, cache)
    before = cache.layers[1].keys_pre.clone()
    policy = InfiniPotPolicy(20, 4, 4, engine=eng, catalyst=torch.tensor([5, 6, 7, 8]), nuc_share=nuc_share)
    policy._nll = nll
    policy.compress(cache, eng.rotary)
    after = cache.layers[1].keys_pre
    return [[int((before[h] - row).abs().sum(-1).argmin()) for row in after[h]] for h in range(after.shape[0])]


def test_infinipot_splits_the_budget_between_catalyst_attention_and_novelty(tiny_model):
    nll = torch.rand(60, generator=torch.Generator().manual_seed(0))
    forced = [0, 1, 2, 3, 56, 57, 58, 59]
    novel = sorted(forced + (nll[4:56].topk(12).indices + 4).tolist())
    assert infinipot_kept(tiny_model, nll, 1.0) == [novel, novel]            # all free budget to NuC
    by_cap = infinipot_kept(tiny_model, nll, 0.0)                           # all to the catalyst's attention
    assert by_cap == infinipot_kept(tiny_model, torch.rand(60), 0.0) and by_cap[0] != novel
    assert all(set(forced) <= set(k) and len(k) == 20 for k in by_cap)


def test_infllm_keeps_evicted_tokens_in_memory_and_retrieves_within_the_active_budget(tiny_model, tokenizer):
    pipe = Pipeline(tiny_model, tokenizer, method="infllm", chunk_size=96, cache_budget=160, block_size=16)
    c = pipe.method.config
    assert (c.keep_first, c.local_size, c.blocks) == (16, 20, 6)
    active, make_policy = [], pipe.method.policy

    def spy_policy(p):
        policy = make_policy(p)
        arrange = policy.arrange
        policy.arrange = lambda layer, q, lc, rot: (arrange(layer, q, lc, rot), active.append(lc.length + q.shape[1]))
        return policy

    pipe.method.policy = spy_policy
    ctx = pipe.encode(CONTEXT)
    n = ctx.ids.shape[0]
    assert max(active) <= 16 + 6 * 16 + (20 + 15) + 96 <= WINDOW         # sinks + blocks + local + chunk
    m = ctx.state[0].length
    assert m % 16 == 0 and all(mem.length == m for mem in ctx.state)      # whole blocks, same in every layer
    assert ctx.cache.length == n - m and 20 <= n - m - 16 < 20 + 16        # sinks + local window
    layer0 = tiny_model.model.layers[0]                                    # layer-0 keys depend on the id only
    with torch.no_grad():
        k = layer0.self_attn.k_proj(layer0.input_layernorm(tiny_model.model.embed_tokens(ctx.ids[16:16 + m])))
    torch.testing.assert_close(ctx.state[0].keys, k.view(-1, 2, 16).transpose(0, 1), atol=1e-5, rtol=1e-5)
    part = pipe.templater.question(QUESTION)
    last, cache, *_ = pipe.method.prompt(ctx, part, Timer())                  # the question retrieves 6 blocks
    assert last.shape[0] == 1 and {lc.length for lc in cache.layers} == {ctx.cache.length + 6 * 16 + len(part.ids) - 1}
    assert ctx.ask(QUESTION, max_new_tokens=4).method == "infllm"           # and answers from that cache


def test_block_memory_retrieves_the_block_whose_representatives_match():
    from reform.methods.infllm import BlockMemory
    mem = BlockMemory(block_size=4, repr_tokens=1)
    keys = torch.zeros(1, 14, 2)
    keys[0, 9] = torch.tensor([0.0, 5.0])                                  # in block 2 (tokens 8..11)
    keys[0, 13] = torch.tensor([5.0, 0.0])                                 # in the partial block 3
    scores = torch.zeros(1, 14)
    scores[0, [9, 13]] = 1.0
    mem.add(keys[:, :10], keys[:, :10], scores[:, :10])
    assert mem.retrieve(torch.tensor([[0.0, 1.0]]), 1).tolist() == [8, 9]          # partial block 2 so far
    mem.add(keys[:, 10:], keys[:, 10:], scores[:, 10:])
    assert mem.retrieve(torch.tensor([[0.0, 1.0]]), 1).tolist() == [8, 9, 10, 11]
    assert mem.retrieve(torch.tensor([[1.0, 0.0]]), 2).tolist() == [8, 9, 10, 11, 12, 13]


# ------------------------------------------------------------------ RAG
PASSAGES = ["Bananas are yellow fruit that grow in warm places near the sea and monkeys like to eat them a lot. ",
            "The secret launch code for the rocket is 4711, kept by the captain in a small locked box at home. ",
            "Rivers carry water from the mountains down to the ocean, and fish swim upstream every spring. ",
            "Old castles were built from stone on hills so that guards could watch the valley for enemies. "]


def rag_context(size=100):
    """Every passage padded to exactly ``size`` tokens, so passages and retrieval units coincide."""
    assert all(len(p) <= size for p in PASSAGES)
    return "".join(p.ljust(size) for p in PASSAGES * 3)


@pytest.mark.parametrize("name", RECOMPUTED[1:])
def test_rag_keeps_passage_order_and_budget(name):
    pipe = Pipeline(tiny(), TextTokenizer(), method=name, recompute_budget=1 + 3 * 100, passage_tokens=100)
    ctx = pipe.encode(rag_context())
    part = pipe.templater.question("What is the secret launch code for the rocket?")
    keep = pipe.method.select(ctx, part, Timer()).tolist()
    assert len(keep) <= 301 and keep == sorted(set(keep)) and keep[0] == 0      # template prefix kept
    spans = ctx.state.spans
    chosen = [i for i, (s, e) in enumerate(spans) if s in keep]
    assert all(set(range(*spans[i])) <= set(keep) for i in chosen)              # whole passages only
    assert chosen == [1, 5, 9]                                                  # the three code passages
    ans = ctx.ask("What is the secret launch code for the rocket?", max_new_tokens=4)
    assert ans.stats["recomputed_tokens"] == len(keep) + len(part.ids)


def test_pick_passages_fills_budget_by_score_and_returns_original_order():
    scores = torch.tensor([0.1, 0.9, 0.5, 0.8, 0.7])
    assert pick_passages(scores, [10, 10, 10, 10, 4], 24) == [1, 3, 4]         # 0.5 would not fit after 2
    assert pick_passages(scores, [10] * 5, 5) == []
    assert pick_passages(scores, [10] * 5, 100) == [0, 1, 2, 3, 4]


def test_passage_token_scores_cover_every_context_token():
    pipe = Pipeline(tiny(), TextTokenizer(), method="rag-bm25")
    ids = pipe.tokenize_context(rag_context())
    index = PassageIndex.build(pipe, ids, 100, pipe.method.retriever(pipe))
    scores = index.token_scores("secret launch code", ids.shape[0])
    assert scores.shape[0] == ids.shape[0]
    assert scores[1 + 100:1 + 200].min() > scores[1:1 + 100].max()             # the code passage wins


def test_reform_rag_weight_zero_selects_what_reform_selects(tokenizer):
    opts = dict(heads="1:v:0,2:q:3", chunk_size=64, cache_budget=96, recompute_budget=200)
    # the hybrid's defaults: the paper's gather, every question token searching, their max
    reform = Pipeline(tiny(), TextTokenizer(), run_peaks=0, query_tokens="all", query_aggregate="max", **opts)
    hybrid = Pipeline(tiny(), TextTokenizer(), method="reform+rag", weight=0.0, **opts)
    part = reform.templater.question(QUESTION)
    picks = [p.method.select(p.encode(CONTEXT), part, Timer()) for p in (reform, hybrid)]
    assert torch.equal(*picks)
    # run_peaks is shared: it lifts what the hybrid's own ranking misses, here the same as REFORM's
    peaks = [Pipeline(tiny(), TextTokenizer(), method=m, run_peaks=1, **opts, **extra) for m, extra in
             (("reform", {"query_tokens": "all", "query_aggregate": "max"}), ("reform+rag", {"weight": 0.0}))]
    picks = [p.method.select(p.encode(CONTEXT), part, Timer()) for p in peaks]
    assert torch.equal(*picks)


def test_reform_rag_mixes_the_retrievers_it_names(tokenizer):
    """retriever=bm25 / dense+bm25: the same mix with BM25's passage scores (each standardised, the weight
    shared equally); at weight 1 the gather follows the passages alone, so the lexical match wins."""
    opts = dict(heads="1:v:0,2:q:3", chunk_size=64, cache_budget=96, recompute_budget=200, passage_tokens=100)
    context = rag_context()
    for kind in ("bm25", "dense+bm25"):
        pipe = Pipeline(tiny(), TextTokenizer(), method="reform+rag", retriever=kind, weight=1.0, **opts)
        ctx = pipe.encode(context)
        assert set(ctx.extra["passages"]) == set(kind.split("+"))
        kept = pipe.method.select(ctx, pipe.templater.question("secret launch code"), Timer())
        codes = torch.cat([torch.arange(1 + p * 100, 1 + (p + 1) * 100) for p in (1, 5, 9)])   # its three copies
        ends = 2 * pipe.method.config.gather_keep
        assert int(torch.isin(kept, codes).sum()) == kept.numel() - ends, kind   # the rest all code passage
    with pytest.raises(ValueError, match="retriever must be one of dense, bm25, dense\\+bm25"):
        Pipeline(tiny(), TextTokenizer(), method="reform+rag", retriever="tfidf", heads="1:v:0")



def test_pooled_passage_scores_reach_across_a_passage_boundary():
    """pool_passages: the mixed passage scores are max-pooled over ``pool_window`` as REFORM's are, so a value
    a few tokens past a passage boundary scores with the passage that names its key. Unpooled, that value's
    own passage shares no word with the question and is left out; pooled, the tokens around the boundary
    come with the key's passage (weight 1: the passage scores alone decide)."""
    filler = [p.ljust(100) for p in (PASSAGES[0], PASSAGES[2], PASSAGES[3])]
    key = "The secret launch code for the rocket, kept by the captain in a small locked box, is".rjust(100)
    value = " 4711 and nothing else here.".ljust(100)
    context = "".join(filler * 2 + [key, value] + filler * 2)
    opts = dict(heads="1:v:0,2:q:3", chunk_size=64, cache_budget=96, passage_tokens=100, pool_window=21,
                retriever="bm25", weight=1.0)
    kept = {}
    for pooled in (False, True):
        pipe = Pipeline(tiny(), TextTokenizer(), method="reform+rag", pool_passages=pooled, **opts,
                        recompute_budget=2 * 16 + 100 + 20)
        assert pipe.method.config.gather_keep == 16
        ctx = pipe.encode(context)
        ids = ctx.ids.tolist()
        digits = [3 + b - 32 for b in b"4711"]       # CharTokenizer's ids
        at = next(i for i in range(len(ids)) if ids[i:i + 4] == digits)
        kept[pooled] = set(pipe.method.select(ctx, pipe.templater.question("What is the secret launch code?"),
                                              Timer()).tolist())
        assert set(range(at - 90, at - 1)) <= kept[pooled]            # the key's passage either way
        assert all(i in kept[pooled] for i in range(at, at + 4)) == pooled, pooled    # its value only pooled
    with pytest.raises(ValueError, match="pool_passages"):
        Pipeline(tiny(), TextTokenizer(), method="reform+rag", pool_passages="maybe", heads="1:v:0")

# ------------------------------------------------------------------ full attention
def test_full_warns_past_the_window_and_still_equals_plain_generation(tiny_model, tokenizer):
    pipe = Pipeline(tiny_model, tokenizer, method="full")
    text = CONTEXT[:600]
    with pytest.warns(UserWarning, match="longer than the model's window"):
        ctx = pipe.encode(text)
    assert ctx.ask(QUESTION, max_new_tokens=6).tokens == hf_greedy(tiny_model, plain_prompt(pipe, text), 6)
    assert pipe.engine.max_positions == WINDOW                               # the allowance was temporary


def test_full_refuses_inputs_that_do_not_fit_memory(tokenizer, monkeypatch):
    import reform.methods.full as full
    monkeypatch.setattr(full, "available_memory", lambda device: 1000)
    with pytest.raises(ValueError, match="needs about .* GiB .* use a method that bounds memory"):
        Pipeline(tiny(), tokenizer, method="full").encode(CONTEXT[:100])


# ------------------------------------------------------------------ options
def test_window_derived_defaults_and_preset_budget(monkeypatch, tokenizer):
    pipe = Pipeline(tiny(), tokenizer, method="h2o")
    c = pipe.method.config
    assert (c.chunk_size, c.cache_budget, c.keep_first, c.keep_last, c.score_window) == (128, 128, 16, 16, 128)
    assert Pipeline(tiny(), tokenizer, method="truncate").method.config.recompute_budget == 256
    import reform.pipeline.checks as checks
    monkeypatch.setattr(checks, "find_preset", lambda name: {"defaults": {"recompute_budget": 100}})
    for name in ("truncate", "rag-bm25"):                                   # same budget as REFORM's preset
        assert Pipeline(tiny(), tokenizer, method=name).method.config.recompute_budget == 100
    assert Pipeline(tiny(), tokenizer, method="truncate", recompute_budget=50).method.config.recompute_budget == 50
    assert Pipeline(tiny(), tokenizer, method="h2o").method.config.cache_budget == 128


def test_preset_defaults_scoped_to_one_method(monkeypatch, tokenizer):
    import reform.pipeline.checks as checks
    scoped = {"recompute_budget": 100, "reattention": {"cache_budget": 256, "local_size": 128, "chunk_size": 64}}
    monkeypatch.setattr(checks, "find_preset", lambda name: {"defaults": scoped})
    c = Pipeline(tiny(), tokenizer, method="reattention").method.config
    assert (c.cache_budget, c.local_size, c.chunk_size) == (256, 128, 64)
    assert Pipeline(tiny(), tokenizer, method="h2o").method.config.cache_budget == 128      # not ReAttention's
    assert Pipeline(tiny(), tokenizer, method="truncate").method.config.recompute_budget == 100
    assert Pipeline(tiny(), tokenizer, method="reattention", cache_budget=384).method.config.cache_budget == 384


@pytest.mark.parametrize("name,opts,msg", [
    ("full", dict(cache_budget=10), "does not take cache_budget; it takes no options"),
    ("h2o", dict(recompute_budget=100), "does not take recompute_budget"),
    ("tova", dict(heads="1:v:0"), "does not take heads"),
    ("truncate", dict(chunk_size=10), "does not take chunk_size"),
    ("rag-dense", dict(cache_budget=10), "does not take cache_budget"),
    ("h2o", dict(cache_budget=400, chunk_size=200), "must fit the model's window"),
    ("tova", dict(cache_budget=20), "smaller than the always-kept"),
    ("streaming", dict(cache_budget=64, keep_first=64), "no recent window"),
    ("streaming", dict(chunk_size=0), "positive"),
    ("truncate", dict(recompute_budget=512), "must leave room"),
    ("truncate", dict(recompute_budget=100, keep_first=101), "between 0 and the budget"),
    ("rag-bm25", dict(passage_tokens=0), "positive"),
    ("reform+rag", dict(heads="1:v:0", weight=2.0), "between 0 and 1"),
    ("infinipot", dict(nuc_share=1.5), "between 0 and 1"),
    ("infllm", dict(cache_budget=300, local_size=40), "leaves no room for a 128-token memory block"),
    ("nope", {}, "unknown method"),
])
def test_bad_options_are_refused(tokenizer, name, opts, msg):
    with pytest.raises(ValueError, match=msg):
        Pipeline(tiny(), tokenizer, method=name, **opts)


def test_option_error_names_the_accepted_options(tokenizer):
    with pytest.raises(OptionError) as e:
        Pipeline(tiny(), tokenizer, method="h2o", recompute_budget=100)
    assert e.value.unknown == ["recompute_budget"] and "cache_budget" in e.value.accepted


@pytest.mark.parametrize("args,msg", [
    (["--method", "h2o", "--recompute-budget", "100"],
     "method 'h2o' takes no --recompute-budget option; it takes --chunk-size, --cache-budget"),
    (["--method", "truncate", "--heads", "1:v:0"], "method 'truncate' takes no --heads option"),
    (["--method", "full", "--chunk-size", "8"], "method 'full' takes no chunk or budget options"),
    (["--method", "nope"], "unknown method 'nope'"),
])
def test_cli_refuses_options_before_loading_the_model(tmp_path, args, msg):
    from typer.testing import CliRunner
    from reform.cli.main import app
    f = tmp_path / "ctx.txt"
    f.write_text("Some context. " * 20)
    r = CliRunner().invoke(app, ["ask", str(f), "-q", "What?", "--model", str(tmp_path / "absent.gguf"), *args])
    assert r.exit_code == 2 and msg in " ".join(r.output.split())


def test_bm25s_is_imported_without_letting_jax_reserve_the_gpu(monkeypatch):
    """bm25s runs a JAX top-k when imported; JAX would then reserve 75 % of the GPU (measured on an H200:
    34 -> 139 GiB at the first question). Allocation on demand is asked for, unless the user chose."""
    import sys
    import types
    from reform.methods.retrievers import import_bm25s
    monkeypatch.delitem(sys.modules, "jax", raising=False)
    monkeypatch.delenv("XLA_PYTHON_CLIENT_PREALLOCATE", raising=False)
    assert import_bm25s().stopwords.STOPWORDS_EN
    assert os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "true")        # the user's own choice stays
    import_bm25s()
    assert os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "true"
    monkeypatch.delenv("XLA_PYTHON_CLIENT_PREALLOCATE")
    monkeypatch.setitem(sys.modules, "jax", types.ModuleType("jax"))   # JAX set up already: not ours to change
    import_bm25s()
    assert "XLA_PYTHON_CLIENT_PREALLOCATE" not in os.environ
