"""Measure saved contexts end to end on the default model (issue: persisted contexts and reform serve):
encode a needle haystack once with `reform encode`, then answer from the saved file in a fresh process
with `reform ask --context`, and report encode time, bytes on disk per input token and the fresh
process's time to its first answer as a fraction of the encode time.

    python scripts/saved_context_benchmark.py --length 131072 --out docs/results/saved-contexts
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import subprocess
import sys
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--length", type=int, default=131072)
    ap.add_argument("--depth", type=float, default=0.5)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    from reform.data.haystack import haystack, insert_needle, magic_number_needle
    from reform.model import load_model
    tok = load_model().tokenizer
    rng = random.Random(0)
    needle = magic_number_needle(rng)
    text = insert_needle(haystack(args.length, lambda t: len(tok(t, add_special_tokens=False)["input_ids"]), rng=rng),
                         needle.sentence, args.depth)
    doc, saved = args.out / f"haystack-{args.length}.txt", args.out / f"haystack-{args.length}.reform"
    doc.write_text(text)
    reform = [str(Path(sys.executable).parent / "reform")]

    def run(cmd: list[str]) -> tuple[dict, float]:
        t = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        return json.loads(done.stdout.strip().splitlines()[-1]), time.perf_counter() - t

    encoded, encode_wall = run(reform + ["encode", str(doc), "-o", str(saved), "--json"])
    asked, ask_wall = run(reform + ["ask", "--context", str(saved), "-q", needle.question, "--answer-prefix",
                                    needle.answer_prefix, "--max-new-tokens", "32", "--json"])
    result = {
        "machine": {"cpu": platform.processor() or _cpu(), "python": platform.python_version()},
        "length": args.length, "tokens": encoded["tokens"], "encode_seconds": encoded["encode_seconds"],
        "encode_process_seconds": round(encode_wall, 2), "bytes": encoded["bytes"],
        "bytes_per_token": encoded["bytes_per_token"], "save_seconds": encoded["save_seconds"],
        "fresh_process_to_answer_seconds": round(ask_wall, 2),
        "ratio_to_encode": round(ask_wall / encoded["encode_seconds"], 4),
        "answer_stats": asked["stats"], "answer": asked["answer"], "expected": needle.answer,
        "correct": needle.answer in asked["answer"],
    }
    (args.out / f"result-{args.length}.json").write_text(json.dumps(result, indent=1))
    doc.unlink()
    saved.unlink()
    print(json.dumps(result, indent=1))


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


if __name__ == "__main__":
    main()
