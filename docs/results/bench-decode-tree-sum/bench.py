"""Decoding speed of ``batch_decode_attention``'s sums over key blocks, for one source tree (run once per
tree with PYTHONPATH=TREE/src; run.sh alternates two trees). Prints one JSON line per measurement.

- ``attention``: the function alone at Mistral-NeMo-12B's decode shape (8 KV heads x 4, head 128) over an
  8,448-key recompute, 1 and 16 sequences: ms per call (one layer's attention of one step).
- ``steps``: Mistral-NeMo-12B's 40 layers, 32 query / 8 KV heads and REFORM heads, narrowed to heads of
  16 and hidden size 256 (the operator calls do not depend on the widths) with random weights, REFORM over a 12,288-token context, one answer: PyTorch operator calls per
  decoding step outside views (each about one kernel launch on a GPU, where decoding this model waits on
  the host) and ms per step on this CPU.
- ``smollm2``: SmolLM2-135M-Instruct (the packaged GGUF), one context of ``--length`` tokens encoded once,
  then ``--users`` answers at once, ``--tokens`` each: ms per decoding step."""

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import reform.engine.attention as attention
from reform.bench.runner import needle_input
from reform.engine.core import Engine
from reform.pipeline import Pipeline

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
from gpu_measure import SHAPES, build_model, byte_tokenizer  # noqa: E402


class CountOps(TorchDispatchMode):
    """Counts the operator calls that are not views (a view launches no kernel)."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += not func.is_view
        return func(*args, **(kwargs or {}))


def decode_steps(tokens: int = 24) -> dict:
    """Operator calls and ms per ``Engine.step`` for one answer on the 12B layer structure, narrowed."""
    shape = dataclasses.replace(SHAPES["mistral-nemo-12b"], hidden=256, head_dim=16,
                                intermediate=256, vocab=512)
    pipe = Pipeline(build_model(shape, "cpu", torch.float32), byte_tokenizer(), model_name="narrow 12B",
                    use_chat_template=False, chunk_size=4096, cache_budget=4096, recompute_budget=shape.recompute,
                    heads=",".join(shape.reform_heads))
    ctx = pipe.encode_tokens(torch.randint(3, 259, (12288,), generator=torch.Generator().manual_seed(0)))
    step, counts = Engine.step, []

    def counted(self, *args, **kwargs):
        with CountOps() as mode:
            out = step(self, *args, **kwargs)
        counts.append(mode.calls)
        return out
    Engine.step = counted
    try:
        answer = ctx.ask("What does the text say?", max_new_tokens=tokens)
    finally:
        Engine.step = step
    timed = []
    for _ in range(2):                      # the time per step without the counting's own overhead
        again = ctx.ask("What does the text say?", max_new_tokens=tokens)
        timed.append(again.stats.get("generate", 0.0) / max(len(again.tokens) - 1, 1))
    return {"recomputed": answer.stats["recomputed_tokens"], "steps": len(counts),
            "ops_per_step": round(sum(counts) / max(len(counts), 1)), "ms_per_step": round(min(timed) * 1e3, 2)}


def attention_ms(users: int, keys: int, dtype: torch.dtype, calls: int = 30) -> float:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(users, 32, 128, generator=g).to(dtype)
    k, v = (torch.randn(users, 8, keys, 128, generator=g).to(dtype) for _ in range(2))
    first, end = torch.zeros(users, dtype=torch.long), torch.full((users,), keys - 100)
    for _ in range(3):
        attention.batch_decode_attention(q, k, v, first, end, 0.088)
    t = time.perf_counter()
    for _ in range(calls):
        attention.batch_decode_attention(q, k, v, first, end, 0.088)
    return (time.perf_counter() - t) / calls * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tree", required=True, help="a name for the source tree measured")
    ap.add_argument("--length", type=int, default=12288)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--users", default="1,8")
    args = ap.parse_args()
    for users in (1, 16):
        ms = attention_ms(users, 8448, torch.float32)
        print(json.dumps({"tree": args.tree, "what": "attention", "users": users, "keys": 8448, "ms": round(ms, 3)}),
              flush=True)
    print(json.dumps({"tree": args.tree, "what": "steps", **decode_steps()}), flush=True)
    pipe = Pipeline.load(None)
    ctx = pipe.encode(needle_input(None, pipe.templater, args.length).text)
    question = "Write out, word for word, every sentence of the text that mentions a number."
    for users in map(int, args.users.split(",")):
        answers = ctx.ask_many([{"question": question, "max_new_tokens": args.tokens}] * users, max_batch=users)
        steps = min(len(a.tokens) for a in answers) - 1
        generate = max(a.stats.get("generate", 0.0) for a in answers)
        print(json.dumps({"tree": args.tree, "what": "smollm2", "users": users, "context": int(ctx.ids.shape[0]),
                          "recomputed": answers[0].stats["recomputed_tokens"], "steps": steps,
                          "ms_per_step": round(generate / max(steps, 1) * 1e3, 2)}), flush=True)


if __name__ == "__main__":
    main()
