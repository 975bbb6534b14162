"""Time REFORM's gather scores for a long question over a long context, on random unit-norm states:
``token_scores`` (the paper's max over question tokens) and ``ordered_run_scores`` (``run_peaks``' runs).

    python scripts/bench_gather_scores.py [--tokens 135000] [--question 1615] [--width 1024]

The defaults are a RepoEval-style row on Gemma 3 270M: a 135k-token repository and a 1,615-token code prompt.
Best of two calls each, seconds."""
import argparse
import time

import torch
import torch.nn.functional as F

from reform.machine import cpu_name
from reform.methods.reform import PEAK_RUN, ordered_run_scores, token_scores


def best_of_two(fn, *args) -> float:
    times = []
    for _ in range(2):
        start = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=135_000)
    ap.add_argument("--question", type=int, default=1615)
    ap.add_argument("--width", type=int, default=1024, help="embedding width (heads x head size)")
    args = ap.parse_args()
    g = torch.Generator().manual_seed(0)
    context = F.normalize(torch.randn(args.tokens, args.width, generator=g), dim=-1).to(torch.bfloat16)
    query = F.normalize(torch.randn(args.question, args.width, generator=g), dim=-1).to(torch.bfloat16)
    print(f"{cpu_name()}, {torch.get_num_threads()} threads, {args.tokens} x {args.question} tokens, width {args.width}")
    print(f"token_scores {best_of_two(token_scores, context, query):.2f} s, "
          f"ordered_run_scores (run {PEAK_RUN}) {best_of_two(ordered_run_scores, context, query, PEAK_RUN):.2f} s")


if __name__ == "__main__":
    main()
