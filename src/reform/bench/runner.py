"""``reform bench``: time, memory and FLOP efficiency of methods on the same needle inputs.

Every run encodes one NIAH-style input (a magic-number needle at 50 % depth of natural text), asks its
question, then asks it again on the same encoded context (REFORM's encode-once claim). Per run it
records wall time per stage (encode, gather, recompute incl. the first token, generate), time to first
token, time per output token, input tokens per second, the model FLOPs the engine executed (divided by
this machine's matmul throughput measured in the same process: FLOP efficiency), peak memory (process
RSS; CUDA peak on GPU) and the bytes the encoded context keeps per input token. Model load is not timed.
"""

from __future__ import annotations

import json
import math
import random
import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterable

import torch

from ..data.haystack import haystack, insert_needle, magic_number_needle
from ..engine.attention import cpu_attention_path
from ..eval.plots import slug
from ..eval.specs import MethodSpec, format_length
from ..methods import Context
from ..model import cache_root, release_freed_memory
from ..outputs import write_atomic
from ..pipeline import Pipeline
from ..stats import current_memory_mb, peak_cuda_mb, peak_memory_mb, reset_peak_memory
from ..machine import machine_info, matmul_throughput
from .peer import layer_equivalents, llama_cpp_rows

RESULTS = "bench.json"


@dataclass
class NeedleInput:
    text: str
    question: str
    answer_prefix: str
    answer: str


def needle_input(tokenizer, templater, length: int, seed: int = 0) -> NeedleInput:
    """A ``length``-token haystack with one magic-number needle at 50 % depth (same seed: same needle)."""
    rng = random.Random(seed)
    needle = magic_number_needle(rng)
    count = lru_cache(maxsize=None)(lambda p: len(templater.encode(p)))
    text = insert_needle(haystack(length, count, rng=rng), needle.sentence, 0.5)
    return NeedleInput(text, needle.question, needle.answer_prefix, needle.answer)


def context_bytes(ctx: Context) -> dict:
    """What the encoded context holds: token ids, per-token state (embeddings, stored keys) and the
    fixed-size compressed cache. Only the first two grow with the input."""
    def size(obj) -> int:
        if isinstance(getattr(obj, "nbytes", None), int):    # tensors, and states that know their size
            return obj.nbytes
        if isinstance(obj, torch.Tensor):
            return obj.numel() * obj.element_size()
        if isinstance(obj, (list, tuple)):
            return sum(size(o) for o in obj)
        if isinstance(obj, dict):
            return sum(size(o) for o in obj.values())
        if hasattr(obj, "__dict__"):
            return sum(size(v) for v in vars(obj).values())
        return 0
    return {"ids": size(ctx.ids), "per_token_state": size(ctx.state), "cache": size(ctx.cache)}


def one_run(pipe: Pipeline, inp: NeedleInput, *, max_new_tokens: int, matmul_flops: float) -> dict:
    """Encode, ask, ask again; every number of one benchmark run."""
    engine = pipe.engine
    ids = pipe.tokenize_context(inp.text)
    if engine.device.type == "cuda":
        torch.cuda.synchronize()
    release_freed_memory()      # else the peak starts at the heap an earlier, larger run left resident
    rss_start = current_memory_mb()
    reset_peak_memory()
    engine.flops.reset()
    t0 = time.perf_counter()
    ctx = pipe.method.encode(pipe, ids)
    ctx.encode_seconds = time.perf_counter() - t0
    encode_flops, encode_linear = engine.flops.total, engine.flops.counts.get("linear", 0)
    ans = ctx.ask(inp.question, answer_prefix=inp.answer_prefix, max_new_tokens=max_new_tokens)
    wall = time.perf_counter() - t0
    flops = dict(engine.flops.counts)
    peak_rss, peak_cuda = peak_memory_mb(), peak_cuda_mb()
    t1 = time.perf_counter()
    again = ctx.ask(inp.question, answer_prefix=inp.answer_prefix, max_new_tokens=max_new_tokens)
    second = time.perf_counter() - t1
    st, n = ans.stats, int(ids.shape[0])
    stages = {k: st.get(k, 0.0) for k in ("encode", "gather", "recompute", "generate")}
    new = st.get("new_tokens", 0)
    held = context_bytes(ctx)
    total_flops = sum(flops.values())
    return {
        "input_tokens": n, "answer": ans.text, "correct": inp.answer in ans.text,
        "second_answer_same": again.text == ans.text,
        "wall_s": round(wall, 3), "stages_s": stages,
        "ttft_s": round(stages["encode"] + stages["gather"] + stages["recompute"], 3),
        "tpot_s": round(stages["generate"] / (new - 1), 4) if new > 1 else None,
        "new_tokens": new, "tokens_per_s": round(n / wall, 1),
        "second_question_s": round(second, 3),
        "flops": flops, "encode_flops": encode_flops,
        "encode_layers": round(layer_equivalents(encode_linear, n, sum(engine.layer_flops), len(engine.layer_flops)), 2),
        "flop_per_s": total_flops / wall,
        "encode_flop_per_s": encode_flops / stages["encode"] if stages["encode"] else None,
        **efficiencies(total_flops / wall, encode_flops / stages["encode"] if stages["encode"] else None,
                       matmul_flops),
        "rss_start_mb": rss_start, "peak_rss_mb": peak_rss, "peak_cuda_mb": peak_cuda,
        "context_bytes": held, "bytes_per_input_token": round((held["ids"] + held["per_token_state"]) / n, 1),
    }


def efficiencies(flop_per_s: float, encode_flop_per_s: float | None, matmul_flops: float) -> dict:
    """The model's FLOP rate as a fraction of the machine's measured matmul rate (whole run, encode)."""
    return {"flop_efficiency": round(flop_per_s / matmul_flops, 4),
            "encode_flop_efficiency": round(encode_flop_per_s / matmul_flops, 4) if encode_flop_per_s else None}


def summarise(runs: list[dict]) -> list[dict]:
    """min and median of the timings per (method, length) over repeats."""
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        groups.setdefault((r["method"], r["length"]), []).append(r)
    out = []
    for (method, length), rs in groups.items():
        row = {"method": method, "length": length, "input_tokens": rs[0]["input_tokens"], "repeats": len(rs),
               "correct": sum(r["correct"] for r in rs) / len(rs)}
        for key in ("wall_s", "ttft_s", "tpot_s", "tokens_per_s", "second_question_s", "rss_start_mb", "peak_rss_mb",
                    "peak_cuda_mb", "flop_efficiency", "encode_flop_efficiency"):
            vals = [r[key] for r in rs if r.get(key) is not None]
            if vals:
                row[f"{key}_min"], row[f"{key}_median"] = min(vals), statistics.median(vals)
        for stage in rs[0]["stages_s"]:
            row[f"{stage}_s_median"] = statistics.median(r["stages_s"][stage] for r in rs)
        row["bytes_per_input_token"] = rs[0]["bytes_per_input_token"]
        row["encode_layers"] = rs[0].get("encode_layers")
        out.append(row)
    return out


def scaling_exponent(summary: list[dict], method: str) -> dict | None:
    """Least-squares slope of log(wall time) against log(input tokens): 1.0 is linear growth. Also the
    slope of peak RSS against tokens (bytes per extra input token)."""
    rows = sorted((r for r in summary if r["method"] == method), key=lambda r: r["input_tokens"])
    if len(rows) < 2:
        return None
    xs = [math.log(r["input_tokens"]) for r in rows]
    ys = [math.log(r["wall_s_median"]) for r in rows]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    a, b = rows[0], rows[-1]
    rss_slope = (b["peak_rss_mb_median"] - a["peak_rss_mb_median"]) * 2**20 / (b["input_tokens"] - a["input_tokens"])
    return {"method": method, "time_exponent": round(slope, 3), "points": len(rows),
            "rss_bytes_per_token": round(rss_slope, 1)}


@contextmanager
def profiled(path: Path | None):
    """Profile the block with torch's profiler and write its top operators (by self time) to ``path``."""
    if path is None:
        yield
        return
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        yield
    key = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    path.write_text(prof.key_averages().table(sort_by=key, row_limit=30))


def run_bench(specs: Iterable[MethodSpec], lengths: list[int], *, loaded, out_dir: Path, repeats: int = 1,
              max_new_tokens: int = 16, seed: int = 0, profile: bool = False, peer_gguf: Path | None = None,
              peer: str | None = None, progress: Callable[[str], None] | None = None) -> dict:
    """Run every (method, length) ``repeats`` times on one loaded model and write ``bench.json``.
    ``profile``: one extra, untimed run per (method, length) under torch's profiler, written to
    ``profile-METHOD-LENGTH.txt`` (where the time goes). ``peer="llama.cpp"``: after each length's runs,
    llama.cpp's prompt processing of the same ids (``peer_gguf``: the model's GGUF file), see ``peer.py``."""
    specs = list(specs)
    model, tokenizer = loaded.model, loaded.tokenizer
    pipes = {s.label: Pipeline(model, tokenizer, model_name=loaded.name, method=s.name, **dict(s.options))
             for s in specs}
    any_pipe = next(iter(pipes.values()))
    dtype = any_pipe.engine.dtype
    peak = matmul_throughput(dtype, any_pipe.engine.device)
    runs, peer_rows = [], []
    out_dir.mkdir(parents=True, exist_ok=True)
    for length in lengths:
        inp = needle_input(tokenizer, any_pipe.templater, length, seed)
        for label, pipe in pipes.items():
            for rep in range(repeats):
                if progress is not None:
                    progress(f"{label} @ {format_length(length)} (run {rep + 1}/{repeats})")
                run = {"method": label, "length": length, "repeat": rep,
                       **one_run(pipe, inp, max_new_tokens=max_new_tokens, matmul_flops=peak)}
                runs.append(run)
                if progress is not None:
                    progress(f"  {run['wall_s']:.1f} s, {run['tokens_per_s']:.0f} tok/s, peak "
                             f"{run['peak_rss_mb']:.0f} MB, answer {run['answer']!r}")
            if profile:
                with profiled(out_dir / f"profile-{slug(label)}-{format_length(length)}.txt"):
                    one_run(pipe, inp, max_new_tokens=max_new_tokens, matmul_flops=peak)
        if peer is not None and length <= any_pipe.engine.max_positions:    # a full pass fits the window
            if progress is not None:
                progress(f"{peer} prompt processing @ {format_length(length)}")
            ids = any_pipe.tokenize_context(inp.text).tolist()
            peer_rows += [{"length": length, **row} for row in llama_cpp_rows(
                peer_gguf, ids, torch.get_num_threads(), str(dtype).removeprefix("torch."),
                (cache_root() or out_dir) / "peer")]
    # Measured again after the runs: one probe can land on a slow moment of a shared machine (we saw
    # 208 vs 420 GFLOP/s), and the yardstick is the best rate this machine reaches.
    peak = max(peak, matmul_throughput(dtype, any_pipe.engine.device))
    for run in runs:
        run.update(efficiencies(run["flop_per_s"], run["encode_flop_per_s"], peak))
    summary = summarise(runs)
    result = {"machine": {**machine_info(any_pipe.engine.device), "matmul_flop_per_s": peak,
                          "matmul_dtype": str(dtype).removeprefix("torch."),
                          "cpu_attention": cpu_attention_path(dtype)},
              "model": loaded.name, "methods": [s.label for s in specs], "lengths": lengths,
              "repeats": repeats, "max_new_tokens": max_new_tokens, "seed": seed,
              "runs": runs, "summary": summary, "peer": peer_rows,
              "scaling": [e for s in specs if (e := scaling_exponent(summary, s.label)) is not None]}
    write_atomic(out_dir / RESULTS, json.dumps(result, indent=1))
    from .plots import plot_bench
    plot_bench(result, out_dir)
    return result
