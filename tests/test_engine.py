"""Equivalences that hold by construction: the engine computes what the HF model computes."""

import torch

from reform.engine import H2O, Engine, KVCache
from reform.engine.attention import attention_received
from reform.engine.rope import Rotary

from conftest import tiny


def hf_forward(model, ids):
    with torch.no_grad():
        out = model(ids[None], use_cache=True)
    return out.logits[0], out.past_key_values


def test_one_shot_prefill_matches_hf(tiny_model):
    eng, ids = Engine(tiny_model), torch.randint(3, 128, (200,))
    cache = KVCache.empty(eng.shape.n_layers)
    logits = eng.logits(eng.prefill(ids, cache, chunk_size=1000))
    ref, _ = hf_forward(tiny_model, ids)
    torch.testing.assert_close(logits, ref, atol=1e-4, rtol=1e-4)


def test_chunked_prefill_with_unbounded_cache_equals_one_shot(tiny_model):
    eng, ids = Engine(tiny_model), torch.randint(3, 128, (300,))
    cache = KVCache.empty(eng.shape.n_layers)
    last = eng.prefill(ids, cache, chunk_size=37)
    ref_logits, ref_cache = hf_forward(tiny_model, ids)
    torch.testing.assert_close(eng.logits(last), ref_logits[-(300 % 37):], atol=1e-4, rtol=1e-4)
    for mine, theirs in zip(cache.layers, ref_cache.layers):   # HF caches post-RoPE keys
        torch.testing.assert_close(mine.keys, theirs.keys[0], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(mine.values, theirs.values[0], atol=1e-4, rtol=1e-4)


def test_mistral_is_supported():
    model = tiny("mistral")
    eng, ids = Engine(model), torch.randint(3, 128, (64,))
    logits = eng.logits(eng.prefill(ids, KVCache.empty(4), chunk_size=10))
    torch.testing.assert_close(logits, hf_forward(model, ids)[0][-4:], atol=1e-4, rtol=1e-4)


def test_kept_keys_equal_keys_computed_at_new_positions(tiny_model):
    """After eviction, every cached key is exactly RoPE(k_proj(h), new position), new positions 0..n-1."""
    eng = Engine(tiny_model)
    ids = torch.randint(3, 128, (160,))
    cache = KVCache.empty(2)
    captured = {}

    class Capture:  # record pre-RoPE keys of every token as the engine computes them
        def begin(self, offset, length):
            self.span = slice(offset, offset + length)

        def on_qkv(self, layer, q, k, v):
            captured.setdefault(layer, torch.zeros(k.shape[0], 160, k.shape[2]))[:, self.span] = k

    policy = H2O(budget=40, keep_first=8, keep_last=8, score_window=16)
    eng.prefill(ids, cache, chunk_size=50, hook=Capture(), policy=policy)
    assert cache.length == 40
    for layer, lc in enumerate(cache.layers):
        k_pre = captured[layer]
        # find which token each kept pre-RoPE key came from, per head
        for h in range(k_pre.shape[0]):
            src = [int((k_pre[h] - row).abs().sum(-1).argmin()) for row in lc.keys_pre[h]]
            if layer > 0:   # layer-0 keys depend on the token id only, so repeated ids are ambiguous
                assert src == sorted(src) and len(set(src)) == 40      # original order kept
                assert src[:8] == list(range(8)) and src[-8:] == list(range(152, 160))
            expected = eng.rotary.rotate(k_pre[h, src], 0)              # keys at positions 0..39
            torch.testing.assert_close(lc.keys[h], expected, atol=1e-5, rtol=1e-5)


def test_positions_never_exceed_window():
    model = tiny(window=128)
    eng = Engine(model)
    cache = KVCache.empty(2)
    policy = H2O(budget=48, keep_first=8, keep_last=8, score_window=16)
    eng.prefill(torch.randint(3, 128, (2000,)), cache, chunk_size=64, policy=policy)  # 2000 >> 128
    assert cache.length == 48
    import pytest
    with pytest.raises(ValueError, match="exceed the model's window"):
        eng.prefill(torch.randint(3, 128, (200,)), KVCache.empty(2), chunk_size=200)


def test_attention_received_matches_dense_reference_with_gqa():
    torch.manual_seed(0)
    h, h_kv, w, n, d = 8, 2, 5, 30, 16
    q, k = torch.randn(h, w, d), torch.randn(h_kv, n, d)
    got = attention_received(q, k, 0.25)
    rep = h // h_kv
    ref = torch.zeros(h_kv, n)
    for head in range(h):
        kv = head // rep                                   # GQA: query head h reads KV head h // n_rep
        logits = q[head] @ k[kv].T * 0.25
        pos = torch.arange(n - w, n)[:, None]
        logits[torch.arange(n)[None, :] > pos] = float("-inf")
        ref[kv] += logits.softmax(-1).sum(0)
    torch.testing.assert_close(got, ref)


def test_gqa_head_mapping_in_attention():
    """The engine's attention with 4 query / 2 KV heads equals attention with KV heads repeated h // n_rep."""
    from reform.engine.attention import causal_attention
    torch.manual_seed(0)
    q, k, v = torch.randn(4, 6, 8), torch.randn(2, 10, 8), torch.randn(2, 10, 8)
    got = causal_attention(q, k, v, 4, 0.3)
    kr, vr = k[[0, 0, 1, 1]], v[[0, 0, 1, 1]]
    mask = torch.arange(10)[None] <= (4 + torch.arange(6))[:, None]
    ref = ((q @ kr.transpose(1, 2) * 0.3).masked_fill(~mask, float("-inf")).softmax(-1)) @ vr
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


def test_rotate_matches_hf_rotary(tiny_model):
    rot = Rotary(tiny_model.model.rotary_emb, [l.self_attn for l in tiny_model.model.layers], tiny_model.config)
    x = torch.randn(2, 7, 16)
    cos, sin = tiny_model.model.rotary_emb(x, torch.arange(5, 12)[None])
    from transformers.models.llama.modeling_llama import rotate_half
    torch.testing.assert_close(rot.rotate(x, 5), x * cos[0] + rotate_half(x) * sin[0])
    torch.testing.assert_close(rot.unrotate(rot.rotate(x, 5), 5), x, atol=1e-6, rtol=1e-6)


def test_cache_appends_in_place_like_concatenation_and_clones_stay_independent():
    from reform.engine.cache import LayerCache
    torch.manual_seed(0)
    parts = [torch.randn(2, t, 4) for t in (100, 1, 1, 3, 300, 1)]      # prefill, decode steps, a bulk append
    lc = LayerCache()
    for i, p in enumerate(parts):
        lc.append(p, p + 1, p + 2)
        if i == 1:
            fork = KVCache([lc]).clone().layers[0]                       # e.g. a second question's cache
            fork.append(-parts[2], -parts[2], -parts[2])
    ref = torch.cat(parts, dim=1)
    assert torch.equal(lc.keys_pre, ref) and torch.equal(lc.keys, ref + 1) and torch.equal(lc.values, ref + 2)
    # the owner's later in-place appends did not reach the clone, nor the clone's the owner
    assert torch.equal(fork.keys, torch.cat([ref[:, :101] + 1, -parts[2]], dim=1))
    assert lc._buffers is not None and lc._buffers[0].data_ptr() != fork._buffers[0].data_ptr()
    lc.keys_pre = lc.keys = lc.values = ref[:, :5].clone()               # a policy swaps in other tensors
    lc.append(parts[1], parts[1], parts[1])
    assert torch.equal(lc.values, torch.cat([ref[:, :5], parts[1]], dim=1))
