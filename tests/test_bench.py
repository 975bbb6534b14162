"""The FLOP counter against a hand count, and the benchmark harness's output schema (tiny model)."""

import json
import sys

import pytest
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


def test_sliding_window_attention_counts_only_the_keys_in_the_window():
    """A sliding-window layer's query reads at most ``window`` keys: counted so, by brute force."""
    from reform.engine.flops import causal_attention_flops
    for start, t, window in [(0, 10, 4), (3, 5, 100), (511, 8192, 512), (2, 9, 6), (0, 1, 1)]:
        keys = sum(min(start + i + 1, window) for i in range(t))
        assert causal_attention_flops(2, 8, start, t, window) == 4 * 2 * 8 * keys
        assert causal_attention_flops(2, 8, start, t) == 4 * 2 * 8 * sum(start + i + 1 for i in range(t))


def test_flop_counter_agrees_with_torch_on_a_decode_step():
    """torch's own counter sees the same projection + MLP work and, as decoding attention on CPU is two
    matmuls (``decode_attention``), the same attention work."""
    model = tiny("llama")
    engine = Engine(model)
    cache = KVCache.empty(4)
    engine.forward(torch.arange(12), cache)
    engine.flops.reset()
    with FlopCounterMode(display=False) as counter:
        engine.forward(torch.tensor([5]), cache)
    assert counter.get_total_flops() > 0
    assert engine.flops.counts["linear"] + engine.flops.counts["attention"] == counter.get_total_flops()


def test_bench_writes_its_schema_and_plots(tmp_path, tokenizer):
    from types import SimpleNamespace

    from reform.bench.runner import run_bench
    from reform.eval.specs import method_specs

    loaded = SimpleNamespace(model=tiny("llama"), tokenizer=tokenizer, name="tiny-llama")
    specs = method_specs([{"name": "reform", "heads": "1:v:0,2:q:3", "chunk_size": 64, "cache_budget": 96,
                           "recompute_budget": 200}, "h2o:chunk_size=64:cache_budget=96"])
    result = run_bench(specs, [300, 600], loaded=loaded, out_dir=tmp_path, repeats=2, max_new_tokens=4,
                       profile=True, peer="llama.cpp", peer_gguf=None)
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert saved["lengths"] == [300, 600] and len(saved["runs"]) == 2 * 2 * 2
    assert saved["machine"]["matmul_flop_per_s"] > 0 and saved["machine"]["cpu_attention"] == "flash"   # fp32
    for run in saved["runs"]:
        assert set(run["stages_s"]) == {"encode", "gather", "recompute", "generate"}
        assert run["input_tokens"] > 0 and run["wall_s"] > 0 and run["peak_rss_mb"] > 0
        assert run["flops"]["linear"] > 0 and 0 < run["flop_efficiency"]
        # efficiencies are against the one yardstick reported (the best of the probes before and after)
        assert run["flop_efficiency"] == round(run["flop_per_s"] / saved["machine"]["matmul_flop_per_s"], 4)
        assert 0 < run["rss_start_mb"] <= run["peak_rss_mb"]
    reform_runs = [r for r in saved["runs"] if r["method"].startswith("reform")]
    # REFORM keeps token ids + 2 heads x 16 dims of fp16 embeddings per input token; H2O only the ids
    assert all(r["context_bytes"]["per_token_state"] == r["input_tokens"] * 2 * 16 * 2 for r in reform_runs)
    assert {r["method"] for r in saved["summary"]} == {s.label for s in specs}
    assert all(r["repeats"] == 2 and r["wall_s_min"] <= r["wall_s_median"] for r in saved["summary"])
    assert {e["method"] for e in saved["scaling"]} == {s.label for s in specs}
    for name in ("time_vs_length.png", "memory_vs_length.png", "stages.png"):
        assert (tmp_path / name).stat().st_size > 1000
    assert result["summary"] == saved["summary"]
    # layers of work per token: REFORM's deepest head is in layer 2 (of 4), where only Q/K/V run
    assert all(2 < r["encode_layers"] < 2.5 for r in reform_runs)
    assert all(r["encode_layers"] == 4 for r in saved["runs"] if r["method"].startswith("h2o"))
    # a peer that cannot run is a row with its reason, never a failed benchmark
    assert [p["length"] for p in saved["peer"]] == [300] and all(p["error"] for p in saved["peer"])   # 600 > window
    from reform.cli.bench import peer_table
    assert "llama.cpp" in peer_table(saved) and "reform" in peer_table(saved)
    profiles = sorted(tmp_path.glob("profile-*.txt"))
    assert len(profiles) == 2 * 2 and all("aten::" in p.read_text() for p in profiles)


def test_scaling_lengths_double_up_to_the_limit():
    from reform.cli.bench import scaling_lengths
    assert scaling_lengths("8k..64k") == [8192, 16384, 32768, 65536]
    assert scaling_lengths("8k..1M")[-1] == 1024 ** 2
    with pytest.raises(ValueError):
        scaling_lengths("64k..8k")


def test_llama_cpp_peer_processes_the_same_tokens(tmp_path):
    """Runs where llama-cpp-python is installed (an optional extra, not in CI): both weight kinds time."""
    pytest.importorskip("llama_cpp")
    from reform.bench.peer import llama_cpp_rows
    from reform.model import default_model_path
    rows = llama_cpp_rows(default_model_path(), list(range(100, 400)), 2, "bfloat16", tmp_path)
    assert [r["weights"] for r in rows] == ["as shipped", "bfloat16"], rows
    # the shipped Q4_1 may crash llama.cpp's AMX kernels (a row with the reason); bf16 never uses them
    timed = [r for r in rows if "error" not in r]
    assert rows[1] in timed and all("crashed (SIGSEGV)" in r["error"] for r in rows if r not in timed)
    assert all(r["tokens"] == 300 and r["layers"] == 30 and r["tokens_per_s"] > 0 for r in timed)
    assert (tmp_path / "SmolLM2-135M-Instruct.Q4_1.bfloat16.gguf").is_file()
    assert not list(tmp_path.glob(".*tmp"))                     # the conversion is renamed into place


def test_a_peer_that_crashes_is_a_row_with_the_reason(tmp_path, monkeypatch):
    """A signal inside the peer's own code (llama.cpp's AMX kernels segfault on some Xeons) ends only the
    child process that times it; the benchmark gets a row that says so."""
    from reform.bench import peer
    crash = "import os, signal, sys; sys.stdin.read(); os.kill(os.getpid(), signal.SIGSEGV)"
    monkeypatch.setattr(peer, "CHILD", [sys.executable, "-c", crash])
    gguf = tmp_path / "m.gguf"
    row = peer._prompt_row(gguf, "as shipped", [1, 2, 3], 2, "AVX2 = 1 | AMX_INT8 = 1 |")
    assert row["error"].startswith("llama.cpp crashed (SIGSEGV) processing the prompt with m.gguf; llama.cpp's AMX")
    refuse = "import sys; sys.stdin.read(); raise SystemExit('llama.cpp could not load m.gguf: bad magic')"
    monkeypatch.setattr(peer, "CHILD", [sys.executable, "-c", refuse])
    assert peer._prompt_row(gguf, "as shipped", [1], 2)["error"] == "llama.cpp could not load m.gguf: bad magic"
    monkeypatch.setattr(peer, "CHILD", [sys.executable, "-c", "import sys; sys.stdin.read(); print('noise')"])
    assert peer._prompt_row(gguf, "as shipped", [1], 2)["error"] == "llama.cpp printed no result processing the prompt with m.gguf"
    answer = "import json, sys; ids = json.loads(sys.stdin.read()); print(json.dumps({'tokens': len(ids)}))"
    monkeypatch.setattr(peer, "CHILD", [sys.executable, "-c", answer])
    assert peer._prompt_row(gguf, "bfloat16", [5, 6, 7], 2) == {"peer": "llama.cpp", "weights": "bfloat16",
                                                                "gguf": "m.gguf", "threads": 2, "tokens": 3}
