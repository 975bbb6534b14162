"""ILRe and ReAttention as methods of the engine: ILRe's allocator (Algorithm 1) and scoring, its early exit
and layer sweep; ReAttention's tiled top-k selection against a brute-force reference and its per-step
selection; both reduce to full attention when their budgets cover the input; bad options are refused."""

import random
from collections import Counter

import pytest
import torch

from reform.engine import KVCache
from reform.methods.ilre_layer import passkey_sample, sample_recalls, select_layer
from reform.methods.ilre import allocate, attention_scores, key_positions
from reform.methods.reattention import KVStore, ReAttentionPolicy, spans, votes
from reform.pipeline import Pipeline
from reform.stats import Timer

from conftest import WINDOW, CharTokenizer, tiny
from test_baselines import CONTEXT, QUESTION, hf_greedy, plain_prompt


# ------------------------------------------------------------------ ILRe: allocation (Algorithm 1)
def algorithm_1(scores, budget, sink, max_kernels, avg_kernels):
    """Algorithm 1 read literally, one token at a time (the remainder of budget - sink spread over the first
    combinations; SnapKV-style average pooling; a partial last max-pool window counts)."""
    rest, n = scores[sink:].tolist(), scores.shape[0]
    taken = set(range(sink))
    combos = [(m, a) for m in max_kernels for a in avg_kernels]
    free = budget - sink
    for c, (m, a) in enumerate(combos):
        quota = free // len(combos) + (c < free % len(combos))
        blocks = [max(rest[b * m:(b + 1) * m]) for b in range(-(-len(rest) // m))]
        smooth = [sum(blocks[j] for j in range(i - a // 2, i - a // 2 + a) if 0 <= j < len(blocks)) / a
                  for i in range(len(blocks))]
        got = 0
        for b in sorted(range(len(blocks)), key=lambda b: -smooth[b]):
            for token in range(sink + b * m, min(sink + (b + 1) * m, n)):
                if got < quota and token not in taken:
                    taken.add(token)
                    got += 1
    return sorted(taken)


@pytest.mark.parametrize("n,budget,sink,max_kernels,avg_kernels", [
    (400, 100, 4, (2, 4, 8), tuple(range(1, 17))),          # 96 free tokens over 48 combinations
    (1000, 301, 4, (2, 4, 8), tuple(range(1, 17))),         # a remainder to spread
    (257, 60, 0, (3,), (1, 2, 5)),                          # no sink, partial last block
    (90, 89, 4, (2, 4, 8), tuple(range(1, 17))),            # almost everything
])
def test_allocation_follows_algorithm_1(n, budget, sink, max_kernels, avg_kernels):
    scores = torch.rand(n, generator=torch.Generator().manual_seed(n))
    got = allocate(scores, budget, sink, max_kernels, avg_kernels).tolist()
    assert got == algorithm_1(scores, budget, sink, max_kernels, avg_kernels)
    assert len(got) == budget and got == sorted(set(got)) and got[:sink] == list(range(sink))


def test_allocation_skips_tokens_earlier_combinations_took():
    scores = torch.zeros(500)
    scores[300] = 1.0                                 # every combination ranks the same block first
    got = allocate(scores, 100, 4).tolist()
    assert len(got) == len(set(got)) == 100 and 300 in got and got[:4] == [0, 1, 2, 3]
    assert allocate(scores, 600, 4).tolist() == list(range(500))        # a covering budget keeps everything


# ------------------------------------------------------------------ ILRe: scoring (Eq. 4-5) and positions
def test_attention_scores_match_a_dense_softmax(tiny_model):
    from reform.engine import Engine
    eng, g = Engine(tiny_model), torch.Generator().manual_seed(1)
    q, keys = torch.randn(4, 6, 16, generator=g), torch.randn(2, 300, 16, generator=g)
    got = attention_scores(eng, 0, q, torch.arange(300, 306), keys, torch.arange(300), tile=64)
    qr, kr = eng.rotary.rotate(q, 300), eng.rotary.rotate(keys, 0).repeat_interleave(2, 0)   # head h -> KV h // 2
    probs = (qr @ kr.transpose(1, 2) * eng.scaling).softmax(-1)             # [4, 6, 300] at once
    torch.testing.assert_close(got, probs.amax(dim=(0, 1)), atol=1e-6, rtol=1e-4)


def test_dca_folds_all_but_the_last_two_chunks_onto_chunk_n_minus_1():
    pos = key_positions(4 + 10 * 8, chunk_size=8, sink=4, dca=True)          # chunks of 12, 8, 8, ... (10 in all)
    assert pos[-16:].tolist() == list(range(4 + 10 * 8 - 16, 4 + 10 * 8))    # the last two keep their places
    assert pos[:12].tolist() == [p + 8 * 8 for p in range(12)]               # chunk 0 moves by N_C - 2 chunks
    assert int(pos.min()) == 8 * 8 and (4 + 10 * 8) - int(pos.min()) <= 2 * 8 + 4 + 8
    assert key_positions(50, 8, 4, dca=False).tolist() == list(range(50))


# ------------------------------------------------------------------ ILRe: early exit
def calls(model, part: str) -> dict:
    """Counts forward calls of ``part`` (e.g. "self_attn.k_proj") per decoder layer."""
    counts = Counter()
    for i, layer in enumerate(model.model.layers):
        layer.get_submodule(part).register_forward_hook(lambda *_, i=i: counts.update([i]))
    return counts


def test_ilre_encodes_no_layer_above_the_retrieval_layer_and_only_its_keys(tokenizer):
    model = tiny()
    pipe = Pipeline(model, tokenizer, method="ilre", retrieval_layer=2, recompute_budget=200)
    mlp, q_proj, k_proj = (calls(model, p) for p in ("mlp", "self_attn.q_proj", "self_attn.k_proj"))
    ctx = pipe.encode(CONTEXT)
    chunks = 1 + -(-(ctx.ids.shape[0] - 4 - 128) // 128)                    # first chunk 4 + 128 tokens
    assert dict(mlp) == {0: chunks, 1: chunks}                             # layer 2: projections only; 3 never
    assert dict(q_proj) == dict(k_proj) == {0: chunks, 1: chunks, 2: chunks}
    assert ctx.state.shape == (2, ctx.ids.shape[0], 16) and len(ctx.cache.layers) == 2
    assert ctx.cache.length == 68                                           # 4 sinks + 64-token window
    for counter in (mlp, q_proj, k_proj):
        counter.clear()
    part = pipe.templater.question(QUESTION)
    keep = pipe.method.select(ctx, part, Timer())
    assert dict(q_proj) == {0: 1, 1: 1, 2: 1} and 2 not in mlp and 3 not in k_proj   # query at layer 2 only
    assert keep.shape[0] == 200
    ans = ctx.ask(QUESTION, max_new_tokens=4)
    assert ans.stats["recomputed_tokens"] == 200 + len(part.ids)


# ------------------------------------------------------------------ ILRe: the layer sweep
def test_layer_sweep_scores_each_layer_as_ilre_with_that_layer_does(tokenizer):
    model = tiny()
    templater = Pipeline(model, tokenizer, method="ilre").templater
    sample = passkey_sample(templater, 400, random.Random(0), segment=7, digits=12)
    assert len(sample.gold) == 12 and tokenizer.decode([sample.ids[i] for i in sample.gold]).isdigit()
    sweep = Pipeline(model, tokenizer, method="ilre", retrieval_layer=0)
    fractions, exact = sample_recalls(sweep, sample, sweep.method.config, budget=100)
    for layer in range(4):
        pipe = Pipeline(model, tokenizer, method="ilre", retrieval_layer=layer, recompute_budget=100)
        ctx = pipe.method.encode(pipe, torch.tensor(sample.ids))
        keep = pipe.method.select(ctx, sample.part, Timer())
        hit = torch.isin(sample.gold, keep)
        assert fractions[layer] == pytest.approx(float(hit.float().mean())) and exact[layer] == bool(hit.all())


def test_select_layer_picks_the_smallest_layer_with_the_highest_recall(tokenizer, monkeypatch):
    import reform.methods.ilre_layer as ls
    pipe = Pipeline(tiny(), tokenizer, method="ilre", retrieval_layer=0)
    recalls = iter([([0.2, 0.9, 0.9, 0.5], [False] * 4), ([0.4, 0.7, 0.7, 1.0], [False, False, False, True])])
    monkeypatch.setattr(ls, "sample_recalls", lambda *a: next(recalls))
    out = select_layer(pipe, samples=2, length=300, budget=50)
    assert out["retrieval_layer"] == 1 and out["recall"] == [0.3, 0.8, 0.8, 0.75] and out["exact"][3] == 0.5


# ------------------------------------------------------------------ ReAttention: selection
def brute_force_selection(q, keys, top_k, winners, span):
    """Every (query head, query) pair's top-k over the full score matrix, votes counted, the most voted
    (earlier first on ties) expanded to centred spans clamped to the middle."""
    rep = q.shape[0] // keys.shape[0]
    scores = q @ keys.repeat_interleave(rep, 0).transpose(1, 2)              # [H, T, M] at once
    count = Counter(scores.topk(top_k, dim=-1).indices.flatten().tolist())
    won = sorted(count, key=lambda i: (-count[i], i))[:winners]
    m = keys.shape[1]
    return sorted({min(max(i + o, 0), m - 1) for i in won for o in range(-(span // 2), (span + 1) // 2)})


@pytest.mark.parametrize("tile", [7, 64, 1000])
def test_reattention_selection_matches_brute_force(tile):
    g = torch.Generator().manual_seed(tile)
    q, keys = torch.randn(6, 5, 8, generator=g), torch.randn(2, 300, 8, generator=g)
    got = spans(votes(q, keys, 4, tile), winners=6, span=8).tolist()
    assert got == brute_force_selection(q, keys, 4, 6, 8)


def test_reattention_attends_to_global_selected_and_local_with_the_block_inside_the_local_window():
    store = KVStore()
    store.append(torch.randn(2, 200, 8), torch.randn(2, 200, 8))
    policy = ReAttentionPolicy(global_size=10, local_size=50, winners=3, span_size=4)
    q = torch.randn(4, 20, 8)
    idx = policy.selection(q, store).tolist()
    middle = brute_force_selection(q, store.keys[:, 10:170], 4, 3, 4)
    assert idx == list(range(10)) + [10 + i for i in middle] + list(range(170, 200))   # 30 + 20 = local 50


def test_reattention_keeps_every_token_selects_within_scope_and_reselects_every_step(tiny_model, tokenizer):
    pipe = Pipeline(tiny_model, tokenizer, method="reattention", chunk_size=64, cache_budget=256, local_size=128,
                    keep_first=16, span_size=16)
    c = pipe.method.config
    assert c.spans == 7
    scope, blocks = [], []
    arrange = ReAttentionPolicy.arrange

    def spy(self, layer, q, cache, rotary):
        arrange(self, layer, q, cache, rotary)
        scope.append(cache.length + q.shape[1])
        blocks.append((layer, q.shape[1]))

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ReAttentionPolicy, "arrange", spy)
        ctx = pipe.encode(CONTEXT)
        n = ctx.ids.shape[0]
        assert n > 2 * WINDOW and max(scope) <= 256                          # never past the scope
        assert all(s.n == n for s in ctx.state.stores)                       # the full cache, every layer
        blocks.clear()
        ans = ctx.ask(QUESTION, max_new_tokens=4)
    layer0 = tiny_model.model.layers[0]                                     # pre-RoPE keys of layer 0
    with torch.no_grad():
        k = layer0.self_attn.k_proj(layer0.input_layernorm(tiny_model.model.embed_tokens(ctx.ids)))
    torch.testing.assert_close(ctx.state.stores[0].keys[:, :n], k.view(n, 2, 16).transpose(0, 1))
    steps = [b for b in blocks if b[1] == 1]
    assert len(steps) >= 4 * (len(ans.tokens) - 1) and {layer for layer, _ in steps} == {0, 1, 2, 3}
    assert all(s.n == n for s in ctx.state.stores)                          # asking left the context as it was


# ------------------------------------------------------------------ both: covering budgets = full attention
def first_token_logits(engine, prompt, cache, policy=None):
    return engine.logits(engine.prefill(prompt, cache, chunk_size=WINDOW, policy=policy)[-1:])


@pytest.mark.parametrize("name,options", [
    ("ilre", dict(retrieval_layer=1, recompute_budget=400)),
    ("reattention", dict(chunk_size=64, keep_first=32, local_size=448, span_size=32)),   # input < global + local
])
def test_covering_budgets_equal_full_attention(name, options, tiny_model, tokenizer):
    pipe = Pipeline(tiny_model, tokenizer, method=name, **options)
    text = CONTEXT[:300]
    ctx = pipe.encode(text)
    plain = plain_prompt(pipe, text)
    assert ctx.ask(QUESTION, max_new_tokens=8).tokens == hf_greedy(tiny_model, plain, 8)
    prompt, cache, *_ = pipe.method.prompt(ctx, pipe.templater.question(QUESTION), Timer())
    if name == "ilre":
        logits = first_token_logits(pipe.engine, prompt, KVCache.empty(4))
    else:
        logits = first_token_logits(pipe.engine, prompt, cache, pipe.method.generation_policy(ctx))
    with torch.no_grad():
        ref = tiny_model(plain[None]).logits[0, -1:]
    torch.testing.assert_close(logits, ref, atol=1e-4, rtol=1e-4)


# ------------------------------------------------------------------ options
@pytest.mark.parametrize("name,opts,msg", [
    ("ilre", dict(retrieval_layer=4), "retrieval layer 4 is not a layer of this model"),
    ("ilre", dict(cache_budget=4), "must hold the 4 sink tokens"),
    ("ilre", dict(cache_budget=400, chunk_size=200), "must fit the model's window"),
    ("ilre", dict(recompute_budget=512), "must leave room"),
    ("ilre", dict(recompute_budget=2, keep_first=3, cache_budget=10), "smaller than the 3 always-kept sink"),
    ("ilre", dict(avg_kernels=(0, 2)), "kernel sizes must be positive"),
    ("ilre", dict(heads="1:v:0"), "does not take heads"),
    ("reattention", dict(chunk_size=300), "smaller than the local window"),
    ("reattention", dict(cache_budget=600), "must fit the model's window"),
    ("reattention", dict(local_size=480), "leaves no room for a 32-token span"),
    ("reattention", dict(top_k=0), "positive"),
    ("reattention", dict(recompute_budget=100), "does not take recompute_budget"),
])
def test_bad_options_are_refused(tokenizer, name, opts, msg):
    with pytest.raises(ValueError, match=msg):
        Pipeline(tiny(), tokenizer, method=name, **opts)


@pytest.mark.parametrize("args,msg", [
    (["--method", "reattention", "--recompute-budget", "100"],
     "method 'reattention' takes no --recompute-budget option; it takes --chunk-size, --cache-budget"),
    (["--method", "ilre", "--heads", "1:v:0"], "method 'ilre' takes no --heads option"),
])
def test_cli_refuses_their_options_before_loading_the_model(tmp_path, args, msg):
    from test_baselines import test_cli_refuses_options_before_loading_the_model as refused
    refused(tmp_path, args, msg)
