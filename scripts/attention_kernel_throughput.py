"""How fast does this machine run the two kernels REFORM's encode spends its time in?

Encoding a 2048-token chunk against a 2048-token compressed cache costs about as many FLOPs in attention
as in the projections and MLPs (see docs/benchmarks.md, "Where the time goes"). This prints the GFLOP/s of PyTorch's
CPU flash-attention kernel on exactly those shapes (SmolLM2: 9 query heads, 3 KV heads, head dim 64),
the engine's whole chunk attention (cache + causal chunk) on each CPU path (`flash`: two flash calls
merged by log-sum-exp; `blocked`: half-precision matmuls a block of rows at a time, see
`reform.engine.attention`), next to a projection-shaped matmul, so the FLOP-efficiency column of
`reform bench` can be read against what the kernels themselves reach.

    python scripts/attention_kernel_throughput.py [--dtype bf16|fp32] [--chunk 2048] [--cache 2048]
"""

from __future__ import annotations

import argparse
import time

import torch

from reform.engine.attention import _CPU_FLASH, BLOCK_ROWS, _split_attention, blocked_attention


def best_ms(fn, repeats: int = 10) -> float:
    fn()  # warm-up: kernel selection, allocations
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    ap.add_argument("--chunk", type=int, default=2048)
    ap.add_argument("--cache", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=9)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=576, help="projection matmul: chunk x hidden x ffn")
    ap.add_argument("--ffn", type=int, default=1536)
    args = ap.parse_args()
    if _CPU_FLASH is None:
        raise SystemExit("this PyTorch build has no CPU flash-attention kernel")
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    h, hkv, d, t, n = args.heads, args.kv_heads, args.head_dim, args.chunk, args.cache
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, h, t, d, generator=gen).to(dtype)
    k = torch.randn(1, hkv, n, d, generator=gen).to(dtype)
    v = torch.randn(1, hkv, n, d, generator=gen).to(dtype)
    kc = torch.randn(1, hkv, t, d, generator=gen).to(dtype)
    scale = d ** -0.5

    rows = []
    ms = best_ms(lambda: _CPU_FLASH(q, k, v, scale=scale))
    rows.append(("flash attention, chunk x cache (no mask)", 4 * h * t * n * d, ms))
    ms = best_ms(lambda: _CPU_FLASH(q, kc, kc, is_causal=True, scale=scale))
    rows.append(("flash attention, chunk x chunk (causal)", 4 * h * t * t * d // 2, ms))
    kf, vf = torch.cat([k, kc], 2)[0], torch.cat([v, kc], 2)[0]
    whole = 4 * h * t * d * (n + t // 2)
    ms = best_ms(lambda: _split_attention(q[0], kf, vf, n, scale))
    rows.append(("chunk attention, path flash", whole, ms))
    ms = best_ms(lambda: blocked_attention(q[0], kf, vf, n, scale))
    rows.append(("chunk attention, path blocked", whole, ms))
    # the same attention's two matmuls alone (no softmax, no mask), a block of query rows at a time as the
    # blocked path runs them: what attention would cost if exponentials were free. Q.K^T's inner dimension
    # is the head dim (64 for SmolLM2), far below what the matrix units need to run at their rate.
    rep, block = h // hkv, BLOCK_ROWS
    grouped = q[0].view(hkv, rep * t, d)
    probs = torch.randn(block, n + t, generator=gen).to(dtype)
    scores = torch.empty(block, n + t, dtype=dtype)
    out = torch.empty(block, d, dtype=dtype)

    def matmuls(first: bool) -> None:
        for g in range(hkv):
            for r in range(0, rep * t, block):
                if first:
                    torch.mm(grouped[g, r:r + block], kf[g].T, out=scores[:min(block, rep * t - r)])
                else:
                    torch.mm(probs[:min(block, rep * t - r)], vf[g], out=out[:min(block, rep * t - r)])

    bare = 2 * h * t * (n + t) * d
    ms_qk, ms_pv = best_ms(lambda: matmuls(True)), best_ms(lambda: matmuls(False))
    rows.append((f"Q.K^T alone, all keys (inner dim {d})", bare, ms_qk))
    rows.append(("P.V alone, all keys", bare, ms_pv))
    a = torch.randn(t, args.hidden, generator=gen).to(dtype)
    b = torch.randn(args.hidden, args.ffn, generator=gen).to(dtype)
    ms = best_ms(lambda: a @ b, repeats=30)
    rows.append((f"matmul {t} x {args.hidden} x {args.ffn} (MLP projection)", 2 * t * args.hidden * args.ffn, ms))

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.dtype}")
    for name, flops, ms in rows:
        print(f"{name:48s} {ms:8.2f} ms  {flops / ms / 1e6:8.0f} GFLOP/s")
    # the chunk attention's useful FLOPs (causal) at the two bare matmuls' rates: a floor for any kernel
    # that multiplies with these matmul kernels, however cheap its softmax
    floor = whole / 2 / (bare / ms_qk) + whole / 2 / (bare / ms_pv)
    print(f"{'chunk attention with a free softmax (floor)':48s} {floor:8.2f} ms  {whole / floor / 1e6:8.0f} GFLOP/s")


if __name__ == "__main__":
    main()
