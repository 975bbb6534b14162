"""Write a random-weight model of a popular architecture's shape, to time `reform bench` on it offline.

FLOP efficiency depends on the model's shape: with SmolLM2-135M (hidden 576, head dim 64) attention is half
of the encode's FLOPs, and attention's QK^T at head dim 64 is a matmul with an inner dimension of 64, which
oneDNN runs at a third of its projection rate on AMX (docs/benchmarks.md, "Encode efficiency by model shape"). Larger
models spend most of their FLOPs in projections. This writes a folder with the packaged SmolLM2 tokenizer
and a random-weight Llama/Qwen2 model of the named shape (optionally with fewer layers: per-layer work does
not depend on depth) and an 8k window (so chunks and cache are the default model's 2048 tokens), loadable
with ``--model FOLDER``. Timings are real; answers are noise.

    python scripts/random_shape_model.py llama-3.1-8b --layers 4 --out /tmp/llama8b-shape
    reform bench --model /tmp/llama8b-shape --lengths 16k --out runs/bench-8b-shape
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

# hidden, heads, KV heads, intermediate, layers, rope theta, architecture (public config.json values)
SHAPES = {
    "smollm2-135m": (576, 9, 3, 1536, 30, 100000.0, "llama"),
    "qwen2.5-0.5b": (896, 14, 2, 4864, 24, 1000000.0, "qwen2"),
    "llama-3.2-1b": (2048, 32, 8, 8192, 16, 500000.0, "llama"),
    "qwen2.5-1.5b": (1536, 12, 2, 8960, 28, 1000000.0, "qwen2"),
    "llama-3.2-3b": (3072, 24, 8, 8192, 28, 500000.0, "llama"),
    "llama-3.1-8b": (4096, 32, 8, 14336, 32, 500000.0, "llama"),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("shape", choices=sorted(SHAPES))
    ap.add_argument("--layers", type=int, default=None, help="fewer layers than the real model (default: all)")
    ap.add_argument("--window", type=int, default=8192,
                    help="context window in config.json (default 8192, SmolLM2's): REFORM derives chunk = cache = "
                         "window / 4, so 8192 gives the default model's 2048-token chunks and cache")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from reform.model import converted_gguf, default_model_path

    hidden, heads, kv_heads, inter, layers, theta, arch = SHAPES[args.shape]
    source, extra = converted_gguf(default_model_path(), None)
    tok = AutoTokenizer.from_pretrained(source, **extra)
    config_class, model_class = (LlamaConfig, LlamaForCausalLM) if arch == "llama" else (Qwen2Config, Qwen2ForCausalLM)
    config = config_class(hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=kv_heads,
                          intermediate_size=inter, num_hidden_layers=args.layers or layers, rope_theta=theta,
                          vocab_size=len(tok), max_position_embeddings=args.window, tie_word_embeddings=False,
                          bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, torch_dtype="bfloat16")
    torch.manual_seed(0)
    with torch.device("cpu"):
        model = model_class(config).to(torch.bfloat16)
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out)
    tok.save_pretrained(args.out)
    params = sum(p.numel() for p in model.parameters())
    print(f"{args.shape}: {config.num_hidden_layers} layers, {params / 1e6:.0f}M parameters, head dim "
          f"{hidden // heads} -> {args.out}")


if __name__ == "__main__":
    main()
