"""Equivalences that hold by construction: the engine computes what the HF model computes."""

import pytest
import torch

from reform.engine import H2OPolicy, Engine, KVCache
from reform.engine.attention import attention_received, blocked_attention, causal_attention, cpu_attention_path
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


@pytest.mark.parametrize("path", ["flash", "blocked"])
def test_chunked_prefill_matches_hf_on_every_cpu_attention_path(tiny_model, path, monkeypatch):
    monkeypatch.setenv("REFORM_CPU_ATTENTION", path)
    assert cpu_attention_path(torch.float32) == path
    eng, ids = Engine(tiny_model), torch.randint(3, 128, (300,))
    cache = KVCache.empty(eng.shape.n_layers)
    logits = torch.cat([eng.logits(eng.forward(ids[s:s + 70], cache)) for s in range(0, 300, 70)])
    ref, _ = hf_forward(tiny_model, ids)
    torch.testing.assert_close(logits, ref, atol=1e-4, rtol=1e-4)


def dense_attention(q, k, v, start, scaling, window=None, softcap=None, sinks=None):
    """The textbook definition in float64, KV heads repeated per query head: what every path must equal."""
    q, k, v = q.double(), k.double(), v.double()
    rep = q.shape[0] // k.shape[0]
    k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
    q_pos, k_pos = (start + torch.arange(q.shape[1]))[:, None], torch.arange(k.shape[1])[None]
    allowed = k_pos <= q_pos if window is None else (k_pos <= q_pos) & (k_pos > q_pos - window)
    logits = q @ k.transpose(1, 2) * scaling
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    logits = logits.masked_fill(~allowed, float("-inf"))
    if sinks is not None:
        sink = sinks.double().view(-1, 1, 1).expand(-1, q.shape[1], 1)
        return (torch.cat([logits, sink], -1).softmax(-1)[..., :-1] @ v)
    return logits.softmax(-1) @ v


@pytest.mark.parametrize("start,t,rows,window,softcap,sinks", [
    (0, 50, 384, None, None, False),      # first chunk: causal over itself
    (37, 50, 12, None, None, False),      # blocks of 4 positions x 3 heads, ragged last block
    (37, 50, 1, None, None, False),       # one row per block (rows < heads per group)
    (100, 9, 30, 16, None, False),        # sliding window narrower than the block's reach
    (60, 40, 24, None, 3.0, True),        # soft cap and sinks
])
def test_blocked_attention_equals_the_definition(start, t, rows, window, softcap, sinks):
    gen = torch.Generator().manual_seed(start + t)
    q, k, v = (torch.randn(6, t, 16, generator=gen) * 2, torch.randn(2, start + t, 16, generator=gen),
               torch.randn(2, start + t, 16, generator=gen))
    sink_logits = torch.randn(6, generator=gen) if sinks else None
    ref = dense_attention(q, k, v, start, 0.3, window, softcap, sink_logits)
    got, _ = blocked_attention(q, k, v, start, 0.3, window, softcap, sink_logits, rows=rows)
    torch.testing.assert_close(got.double(), ref, atol=1e-5, rtol=1e-5)
    # half precision (the default CPU path for bf16): within bf16 rounding of the definition
    half, _ = blocked_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), start, 0.3, window, softcap,
                             sink_logits, rows=rows)
    assert half.dtype == torch.bfloat16
    torch.testing.assert_close(half.double(), ref, atol=0.05, rtol=0.05)


def test_cpu_attention_path_is_chosen_by_dtype_and_cpu_and_can_be_forced(monkeypatch):
    import reform.engine.attention as attention
    monkeypatch.delenv("REFORM_CPU_ATTENTION", raising=False)
    monkeypatch.setattr(attention, "cpu_has_amx", lambda: False)
    assert cpu_attention_path(torch.float32) == "flash" and cpu_attention_path(torch.bfloat16) == "blocked"
    monkeypatch.setattr(attention, "cpu_has_amx", lambda: True)     # AMX: the flash kernel is the faster one
    assert cpu_attention_path(torch.float32) == "flash" and cpu_attention_path(torch.bfloat16) == "flash"
    monkeypatch.setattr(attention, "cpu_has_amx", lambda: False)
    monkeypatch.setenv("REFORM_CPU_ATTENTION", "flash")
    assert cpu_attention_path(torch.bfloat16) == "flash"
    monkeypatch.setenv("REFORM_CPU_ATTENTION", "fastest")
    with pytest.raises(ValueError, match="REFORM_CPU_ATTENTION must be one of auto, flash, blocked"):
        causal_attention(torch.randn(2, 3, 4), torch.randn(2, 3, 4), torch.randn(2, 3, 4), 0, 0.5)


def test_amx_detection_honours_a_onednn_isa_cap_and_the_kernels_permission(monkeypatch):
    import reform.engine.attention as attention
    usable = attention._amx_usable.__wrapped__                      # the uncached check, run on stand-ins below
    monkeypatch.setattr(attention, "_amx_usable", lambda: True)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    assert attention.cpu_has_amx()
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")   # capped below AMX: oneDNN won't use it
    assert not attention.cpu_has_amx()
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_AMX")
    assert attention.cpu_has_amx()
    for tiles, granted in ((True, True), (True, False), (False, True)):
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda t=tiles: t, raising=False)
        monkeypatch.setattr(torch.cpu, "_init_amx", lambda g=granted: g, raising=False)
        assert usable() == (tiles and granted)


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

    policy = H2OPolicy(budget=40, keep_first=8, keep_last=8, score_window=16)
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
    policy = H2OPolicy(budget=48, keep_first=8, keep_last=8, score_window=16)
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


def test_attention_without_the_cpu_flash_kernel_masks_bottom_right(monkeypatch):
    """The GPU's path (a bottom-right causal bias instead of a [t, n] mask), taken here by hiding the CPU
    kernel: a chunk at positions start.. over the cache and itself, GQA heads, equal to the split path."""
    from reform.engine import attention
    torch.manual_seed(0)
    q, k, v = torch.randn(4, 6, 8), torch.randn(2, 10, 8), torch.randn(2, 10, 8)
    split = attention.causal_attention(q, k, v, 4, 0.3)
    monkeypatch.setattr(attention, "_CPU_FLASH", None)
    torch.testing.assert_close(attention.causal_attention(q, k, v, 4, 0.3), split, atol=1e-5, rtol=1e-5)


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


@pytest.mark.parametrize("start,t,w,softcap,sinks", [(40, 30, 8, None, False), (40, 30, 30, None, False),
                                                   (0, 50, 20, 3.0, True), (10, 5, 16, None, False)])
def test_fused_eviction_scores_equal_attention_received(start, t, w, softcap, sinks, monkeypatch):
    """Both CPU paths sum probabilities they already computed; they equal the separate computation."""
    from reform.engine.attention import attention_and_received
    monkeypatch.setenv("REFORM_CPU_ATTENTION", "blocked")
    gen = torch.Generator().manual_seed(t)
    q, k, v = (torch.randn(6, t, 16, generator=gen) * 2, torch.randn(2, start + t, 16, generator=gen),
               torch.randn(2, start + t, 16, generator=gen))
    sink_logits = torch.randn(6, generator=gen) if sinks else None
    out, received = attention_and_received(q, k, v, start, 0.3, w, softcap, sink_logits)
    torch.testing.assert_close(out, causal_attention(q, k, v, start, 0.3, softcap=softcap, sinks=sink_logits))
    ref = attention_received(q[:, -min(w, t):], k, 0.3, softcap, sink_logits)
    torch.testing.assert_close(received, ref, atol=1e-5, rtol=1e-5)
    _, across_blocks = blocked_attention(q, k, v, start, 0.3, None, softcap, sink_logits,
                                         received_by_last=min(w, t), rows=9)    # 3 positions per block
    torch.testing.assert_close(across_blocks, ref, atol=1e-5, rtol=1e-5)
    monkeypatch.setenv("REFORM_CPU_ATTENTION", "flash")  # the kernel for the first queries, blocked for the last w
    out, received = attention_and_received(q, k, v, start, 0.3, w, softcap, sink_logits)
    dense = dense_attention(q, k, v, start, 0.3, None, softcap, sink_logits)
    torch.testing.assert_close(out.double(), dense, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(received, ref, atol=1e-5, rtol=1e-5)
    out, received = attention_and_received(q.bfloat16(), k.bfloat16(), v.bfloat16(), start, 0.3, w, softcap,
                                           sink_logits)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), dense, atol=0.05, rtol=0.05)
    torch.testing.assert_close(received, ref, atol=0.02, rtol=0.02)


class _RotaryKeptElsewhere(torch.nn.Module):
    """A rotary module that, like transformers 5.17's Cohere one, never moves its frequencies to the input's
    device: positions on another device fail. Its buffer lives on ``meta`` as the stand-in for a GPU."""

    def __init__(self, head_dim):
        super().__init__()
        self.register_buffer("inv_freq", torch.ones(head_dim // 2, device="meta"))

    def forward(self, x, position_ids):
        freqs = position_ids[..., None].float() * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def test_rotary_probe_runs_on_the_rotary_modules_device():
    """The RoPE probe at construction calls the module on its own device (on CUDA, Cohere was refused
    because the probe's positions were on the CPU)."""
    cfg = tiny().config
    emb = _RotaryKeptElsewhere(cfg.head_dim)
    with pytest.raises(RuntimeError):                 # the module itself refuses positions on the CPU
        emb(torch.zeros(1), torch.arange(2)[None])
    Rotary(emb, [torch.nn.Module() for _ in range(cfg.num_hidden_layers)], cfg)
