"""How REFORM's gather settings decide what reaches the recompute: gold recall (and score) against the
always-kept first/last tokens, the pool window and the recompute budget, on held-out RULER-format rows.

    python scripts/gather_sweep.py --out docs/results/gather-sweep-32k --length 32k --samples 2 --seed 1000
    python scripts/gather_sweep.py --out docs/results/gather-sweep-32k --report

Each row is encoded once (REFORM's defaults); its per-token cosine scores are then pooled and gathered
under every setting (cheap), and gold recall is measured for each (``reform.eval.recall``). The answer
is generated only along two lines through the grid (every keep size at the default pool window, every
pool window at the default keep), at the default budget. The keep sizes are fractions of the budget:
the paper's 256 of an 8k-16k budget, against 256 of SmolLM2's 1024. One JSON line per row in
``sweep.jsonl``, appended as each row finishes, so a killed run resumes where it stopped; ``--report``
writes ``sweep.md`` from it.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import torch

from reform.eval.recall import evidence, gold_kept, recall
from reform.eval.specs import parse_length
from reform.eval.tasks import ruler
from reform.eval.tasks.scoring import score
from reform.methods.reform import gather_indices, max_pool

TASKS = [t for t in ruler.TASKS if t not in ("cwe", "fwe")]     # aggregation tasks have no gold span
KEEP_FRACTIONS = (0, 1 / 32, 1 / 16, 1 / 8, 1 / 4)
POOLS = (1, 33, 65, 129, 257)
BUDGETS = (512, 1024, 2048)


def sweep_row(pipe, row, answers: bool = True) -> dict:
    t0 = time.perf_counter()
    ctx = pipe.encode(row.context)
    encode_s = time.perf_counter() - t0
    part = pipe.templater.question(row.question, row.answer_prefix)
    golds, text = evidence(row), pipe.tokenizer.decode(ctx.ids.tolist())
    with torch.inference_mode():
        raw = ctx.method.similarities(ctx, part)
    default = ctx.method.config
    out = {"task": row.task, "sample": row.sample, "tokens": int(ctx.ids.shape[0]), "encode_s": round(encode_s, 1),
           "recall": [], "score": []}
    for pool in POOLS:
        pooled = max_pool(raw, pool)
        for budget in BUDGETS:
            for frac in KEEP_FRACTIONS:
                keep = int(budget * frac)
                kept = gather_indices(pooled, budget, keep, keep)
                flags = gold_kept(pipe.tokenizer, ctx.ids, kept, golds, text)
                out["recall"].append({"pool": pool, "budget": budget, "keep": keep, "recall": recall(flags)})
                on_line = answers and budget == default.recompute_budget and (pool == 129 or keep == budget // 4)
                if on_line:
                    ctx.method.config = replace(default, gather_keep=keep, pool_window=pool)
                    ans = ctx.ask(row.question, answer_prefix=row.answer_prefix, max_new_tokens=row.max_new_tokens)
                    out["score"].append({"pool": pool, "keep": keep, "score": score(row, ans.text),
                                         "recall": recall(flags), "answer": ans.text[:80]})
    ctx.method.config = default
    return out


def report(out: Path) -> str:
    rows = [json.loads(line) for line in (out / "sweep.jsonl").read_text().splitlines() if line.strip()]
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")
    lines = [f"# Gather sweep: {len(rows)} held-out RULER-format rows ({', '.join(sorted({r['task'] for r in rows}))})",
             "", "Mean gold recall (%) of the gathered tokens, by kept first/last size (columns, tokens at each "
             "end) and pool window (rows), per recompute budget.", ""]
    for budget in BUDGETS:
        cells = {}
        for r in rows:
            for c in r["recall"]:
                if c["budget"] == budget and c["recall"] is not None:
                    cells.setdefault((c["pool"], c["keep"]), []).append(c["recall"])
        keeps = sorted({k for _, k in cells})
        lines += [f"## budget {budget}", "", "| pool window | " + " | ".join(f"keep {k}" for k in keeps) + " |",
                  "|---|" + "---|" * len(keeps)]
        for pool in POOLS:
            lines.append(f"| {pool} | " + " | ".join(f"{100 * mean(cells.get((pool, k), [])):.1f}" for k in keeps) + " |")
        lines.append("")
    scored = {}
    for r in rows:
        for c in r["score"]:
            scored.setdefault((c["pool"], c["keep"]), []).append(c)
    lines += ["## Score at the default budget", "", "| pool window | keep | recall (%) | score (%) | rows |",
              "|---|---|---|---|---|"]
    for (pool, keep), cs in sorted(scored.items()):
        rec = [c["recall"] for c in cs if c["recall"] is not None]
        lines.append(f"| {pool} | {keep} | {100 * mean(rec):.1f} | {100 * mean([c['score'] for c in cs]):.1f} | {len(cs)} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--length", default="32k")
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1000, help="held out: the eval suites use seed 0")
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--report", action="store_true", help="only write sweep.md from sweep.jsonl")
    ap.add_argument("--first-sample", type=int, default=0, help="skip samples below this one")
    ap.add_argument("--recall-only", action="store_true", help="measure recall, generate no answers")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if not a.report:
        from reform.pipeline import Pipeline
        pipe = Pipeline.load(None, method="reform")
        path = out / "sweep.jsonl"
        done = {(r["task"], r["sample"]) for r in map(json.loads, path.open())} if path.exists() else set()
        for task in a.tasks.split(","):
            for row in ruler.generate(task, pipe.tokenizer, parse_length(a.length), a.samples, a.seed):
                if (row.task, row.sample) in done or row.sample < a.first_sample:
                    continue
                result = sweep_row(pipe, row, answers=not a.recall_only)
                with path.open("a") as f:
                    f.write(json.dumps(result) + "\n")
                print(row.task, row.sample, result["encode_s"], [c["score"] for c in result["score"]], flush=True)
    (out / "sweep.md").write_text(report(out))
    print((out / "sweep.md").read_text())


if __name__ == "__main__":
    main()
