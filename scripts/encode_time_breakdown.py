"""Where an encode's time goes, part by part, timed with wall clocks around the modules that run.

torch's profiler perturbs what it measures on some machines (on an AMX Xeon the profiled encode took
1.3-2.3x the unprofiled one, and large element-wise ops showed up to 10x their isolated time), so this
wraps the parts of every decoder layer the engine drives (the model's own projections, norms, activation,
RoPE; the engine's attention kernel, re-rotation and eviction) in ``time.perf_counter`` and encodes the
benchmark's needle input once, warm. Parts nest: "attention module" includes its projections, RoPE and
the attention kernel; "MLP" its projections and activation. Prints seconds and ms per layer-chunk.

    python scripts/encode_time_breakdown.py [--length 16384] [--model ID] [--dtype bf16]
"""

from __future__ import annotations

import argparse
import collections
import sys
import time

import torch

from reform.bench.runner import needle_input
from reform.engine import cache as cache_module
from reform.engine import core
from reform.pipeline import Pipeline

TOTALS: dict[str, float] = collections.defaultdict(float)
CALLS: collections.Counter = collections.Counter()


def timed(owner, name: str, part: str) -> None:
    """Replace ``owner.name`` by the same callable that adds its wall time to ``part``."""
    inner = getattr(owner, name)

    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            TOTALS[part] += time.perf_counter() - t0
            CALLS[part] += 1

    setattr(owner, name, wrapper)


def instrument(pipe: Pipeline) -> None:
    engine = pipe.engine
    for i, (layer, attn) in enumerate(zip(engine.layers, engine.attention)):
        kind = " (sliding window)" if engine._windows[i] is not None else ""     # Gemma 3's local layers
        timed(layer, "forward", "decoder layer" + kind)
        timed(attn, "forward", "attention module" + kind)
        mlp = getattr(layer, "mlp", None)
        if mlp is not None:
            timed(mlp, "forward", "MLP")
            if (act := getattr(mlp, "act_fn", None)) is not None:
                timed(act, "forward", "MLP activation")
        for owner, part in ((attn, "attention projections"), (mlp, "MLP projections")):
            for m in owner.modules() if owner is not None else ():
                if isinstance(m, torch.nn.Linear):
                    timed(m, "forward", part)
        for m in layer.children():
            if "norm" in type(m).__name__.lower():
                timed(m, "forward", "norms")
    model_module = sys.modules[type(engine.attention[0]).__module__]
    if hasattr(model_module, "apply_rotary_pos_emb"):
        timed(model_module, "apply_rotary_pos_emb", "RoPE (the model's)")
    timed(core, "attention_and_received", "attention kernel + eviction scores")
    timed(core, "causal_attention", "attention kernel, no eviction scores (sliding-window layers)")
    timed(engine.rotary, "unrotate", "engine: un-rotating keys and taps")
    timed(cache_module.LayerCache, "keep", "engine: eviction (gather + re-rotate kept keys)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--length", type=int, default=16384)
    ap.add_argument("--model", default=None)
    ap.add_argument("--dtype", default=None)
    args = ap.parse_args()
    pipe = Pipeline.load(args.model, dtype=args.dtype)
    inp = needle_input(None, pipe.templater, args.length)      # reform bench's input at this length
    pipe.encode(inp.text[:20000])                        # warm-up: kernels chosen, tables built
    instrument(pipe)
    t0 = time.perf_counter()
    ctx = pipe.encode(inp.text)
    total = time.perf_counter() - t0
    chunks = CALLS["decoder layer"] + CALLS["decoder layer (sliding window)"]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {pipe.engine.dtype}, "
          f"{int(ctx.ids.shape[0])} tokens, encode {total:.2f} s, "
          f"{chunks} layer-chunks ({total / max(chunks, 1) * 1e3:.1f} ms each)")
    for part, seconds in sorted(TOTALS.items(), key=lambda kv: -kv[1]):
        print(f"{part:62s} {seconds:7.2f} s {seconds / total:6.1%}  {seconds / max(chunks, 1) * 1e3:7.2f} ms per "
              f"layer-chunk  ({CALLS[part]} calls, {seconds / max(CALLS[part], 1) * 1e3:.2f} ms each)")


if __name__ == "__main__":
    main()
