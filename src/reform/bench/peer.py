"""A peer in the same run: llama.cpp's prompt processing of the same model on the same tokens.

llama.cpp is what CPU users pick for small models, so ``reform bench --peer llama.cpp`` times its prompt
processing (``Llama.eval`` through ``llama-cpp-python``, the same thread count as torch) on the ids of the
benchmark's own input, cut to the model's window, with its fastest settings measured on a Zen 5 (flash
attention on, 2048-token micro-batches: 680 tokens/s at 4k against 472 with its defaults). It runs the GGUF twice: as shipped (e.g. Q4_1) and
converted by llama.cpp itself to bf16 or f32 -- the weights our engine computes with (transformers
dequantizes GGUF weights). Both sides are reported in tokens per second per layer: a full pass runs every
layer, REFORM's encode stops at its deepest embedding head (see ``layer_equivalents``).

A peer that cannot run (package missing, model not a GGUF, conversion failed, llama.cpp crashed) is a row
with the reason, never a failed benchmark: each timing runs in a child process, so even a crash inside
llama.cpp's own kernels (a signal, which no exception catches) only ends that child.
"""

from __future__ import annotations

import ctypes
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

PEERS = ("llama.cpp",)
CHILD = [sys.executable, "-m", "reform.bench.peer"]   # + the step's arguments; its input as JSON on stdin
CHILD_TIMEOUT_S = 900
# seen on a 2-core Sapphire Rapids VM with llama-cpp-python 0.3.36 built with -DGGML_NATIVE=ON: a SIGSEGV
# in the AMX matmul for the shipped Q4_1 weights (bf16 weights do not use those kernels and run)
AMX_HINT = ("; llama.cpp's AMX kernels for quantized weights are known to crash on some Xeons (llama.cpp "
            "issue 20824): a build without them runs them, CMAKE_ARGS=\"-DGGML_NATIVE=OFF -DGGML_AVX=ON "
            "-DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=ON -DGGML_AVX512_BF16=ON "
            "-DGGML_AVX512_VNNI=ON -DGGML_AVX512_VBMI=ON\" pip install --force-reinstall --no-deps "
            "--no-cache-dir llama-cpp-python")
# llama.cpp's ftype codes (llama.h, enum llama_ftype) for the weights our engine runs in
FTYPES = {"bfloat16": 32, "float32": 0}


def llama_cpp_rows(gguf: Path | None, ids: list[int], threads: int, dtype: str, cache_dir: Path) -> list[dict]:
    """Prompt-processing rows for the GGUF as shipped and converted to ``dtype``; a reason where it can't run."""
    try:
        import llama_cpp
    except ImportError:
        return [{"peer": "llama.cpp", "error": "llama-cpp-python is not installed: pip install llama-cpp-python"}]
    if gguf is None or gguf.suffix != ".gguf" or not gguf.is_file():
        return [{"peer": "llama.cpp", "error": "the model is not a local .gguf file, which llama.cpp needs"}]
    info = llama_cpp.llama_print_system_info().decode(errors="replace")
    rows = [_prompt_row(gguf, "as shipped", ids, threads, info)]
    if dtype in FTYPES:
        converted = cache_dir / f"{gguf.stem}.{dtype}.gguf"
        done = {} if converted.is_file() else _in_child(["convert", str(gguf), str(converted), str(FTYPES[dtype]),
                                                          str(threads)], None, f"converting {gguf.name}", info)
        rows.append({"peer": "llama.cpp", "weights": dtype, **done} if "error" in done
                    else _prompt_row(converted, dtype, ids, threads, info))
    return rows


def _prompt_row(gguf: Path, weights: str, ids: list[int], threads: int, system_info: str = "") -> dict:
    """Time the prompt in a child process (``_time_prompt``); its crash or error becomes the row's reason."""
    row = {"peer": "llama.cpp", "weights": weights, "gguf": gguf.name, "threads": threads}
    return {**row, **_in_child(["time", str(gguf), str(threads)], ids, f"processing the prompt with {gguf.name}",
                               system_info)}


def _in_child(args: list[str], payload, doing: str, system_info: str = "") -> dict:
    """Run one llama.cpp step (``args``, ``payload`` as JSON on stdin) in a child process: its JSON answer,
    or ``{"error": reason}`` when it exits with an error, crashes or hangs."""
    try:
        proc = subprocess.run([*CHILD, *args], input=json.dumps(payload), capture_output=True, text=True,
                              timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"error": f"llama.cpp did not finish {doing} within {CHILD_TIMEOUT_S} s"}
    if proc.returncode == 0:
        try:
            return json.loads(proc.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            return {"error": f"llama.cpp printed no result {doing}"}
    if proc.returncode < 0:
        hint = AMX_HINT if "AMX_INT8 = 1" in system_info else ""
        return {"error": f"llama.cpp crashed ({signal.Signals(-proc.returncode).name}) {doing}{hint}"}
    lines = proc.stderr.strip().splitlines()
    return {"error": lines[-1] if lines else f"llama.cpp exited with status {proc.returncode} {doing}"}


def _convert(src: Path, dst: Path, ftype: int, threads: int) -> dict:
    """The child's side of a conversion: llama.cpp's own quantize tool, run to dequantize; written under a
    temporary name, then renamed."""
    import llama_cpp
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.tmp")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.allow_requantize, params.nthread = ftype, True, threads
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), ctypes.byref(params))
    if rc != 0 or not tmp.is_file():
        tmp.unlink(missing_ok=True)
        raise SystemExit(f"llama.cpp could not convert {src.name} (llama_model_quantize returned {rc})")
    tmp.replace(dst)
    return {}


def _time_prompt(gguf: Path, threads: int, ids: list[int]) -> dict:
    """The child's side: load the GGUF, warm up, time one ``eval`` of the ids (cut to the context)."""
    import llama_cpp
    try:
        llm = llama_cpp.Llama(model_path=str(gguf), n_ctx=0, n_batch=2048, n_ubatch=2048, flash_attn=True,
                              n_threads=threads, n_threads_batch=threads, verbose=False)
    except (ValueError, RuntimeError, OSError) as e:
        raise SystemExit(f"llama.cpp could not load {gguf.name}: {e}") from None
    try:
        tokens = ids[:llm.n_ctx()]
        layers = int(llama_cpp.llama_model_n_layer(llm.model))
        llm.eval(tokens[:64])                    # warm-up: weights paged in, kernels chosen
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(tokens)
        seconds = time.perf_counter() - t0
    finally:
        llm.close()
    per_s = len(tokens) / seconds
    return {"tokens": len(tokens), "seconds": round(seconds, 3), "tokens_per_s": round(per_s, 1),
            "layers": layers, "tokens_per_s_per_layer": round(per_s * layers, 1)}


def layer_equivalents(linear_flops: float, tokens: int, full_pass_flops_per_token: float, n_layers: int) -> float:
    """How many of the model's layers one token's encode ran, from the projection/MLP FLOPs it executed
    (REFORM: every layer below its deepest embedding head, plus that layer's Q/K/V)."""
    return linear_flops / tokens / (full_pass_flops_per_token / n_layers)


if __name__ == "__main__":      # the child process of ``_in_child``: time GGUF THREADS | convert SRC DST FTYPE THREADS
    command, *rest = sys.argv[1:]
    payload = json.loads(sys.stdin.read())
    if command == "time":
        print(json.dumps(_time_prompt(Path(rest[0]), int(rest[1]), payload)))
    else:
        print(json.dumps(_convert(Path(rest[0]), Path(rest[1]), int(rest[2]), int(rest[3]))))
