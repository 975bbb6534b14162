"""The FLOP counter against a hand count, and the benchmark harness's output schema (tiny model)."""

import torch
from torch.utils.flop_counter import FlopCounterMode

from conftest import tiny
from reform.engine.cache import KVCache
from reform.engine.core import Engine


def hand_count_per_layer(t: int, start: int) -> int:
    """The tiny Llama: hidden 64, 4 query / 2 KV heads of 16, MLP 128, no biases."""
    hidden, head_dim, n_heads, n_kv, mlp = 64, 16, 4, 2, 128
    projections = hidden * n_heads * head_dim + 2 * hidden * n_kv * head_dim + n_heads * head_dim * hidden
    linear = 2 * t * (projections + 3 * hidden * mlp)
    keys_seen = sum(start + i + 1 for i in range(t))          # causal: query i sees start + i + 1 keys
    attention = 2 * 2 * n_heads * head_dim * keys_seen         # QK^T and PV
    return linear + attention


def test_flop_counter_matches_a_hand_count():
    model = tiny("llama")
    engine = Engine(model)
    cache = KVCache.empty(4)
    engine.forward(torch.arange(10), cache)
    assert engine.flops.total == 4 * hand_count_per_layer(10, 0)
    engine.flops.reset()
    engine.forward(torch.arange(7), cache)                     # 7 more tokens on a 10-token cache
    assert engine.flops.counts["linear"] + engine.flops.counts["attention"] == 4 * hand_count_per_layer(7, 10)
    engine.flops.reset()
    engine.logits(torch.zeros(3, 64))
    assert engine.flops.total == 3 * 2 * 64 * 128             # LM head: 3 rows x hidden x vocab


def test_flop_counter_agrees_with_torch_on_a_decode_step():
    """torch's own counter sees the same projection + MLP work (it has no formula for the CPU attention
    kernel, whose count the hand-count test checks)."""
    model = tiny("llama")
    engine = Engine(model)
    cache = KVCache.empty(4)
    engine.forward(torch.arange(12), cache)
    engine.flops.reset()
    with FlopCounterMode(display=False) as counter:
        engine.forward(torch.tensor([5]), cache)
    assert counter.get_total_flops() > 0
    assert engine.flops.counts["linear"] == counter.get_total_flops()
