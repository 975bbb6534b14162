"""How REFORM's gather settings decide what reaches the recompute: gold recall (and score) against the
always-kept first/last tokens, the pool window and the recompute budget, on held-out RULER-format rows.

    python scripts/gather_sweep.py --out docs/results/gather-sweep-32k --length 32k --samples 2 --seed 1000
    python scripts/gather_sweep.py --out docs/results/gather-sweep-32k --report
    python scripts/gather_sweep.py --model gemma-3-270m --out DIR --length 64k --budgets 2048,4096,8192,16384 \
        --budget-answers          # the recompute budget: an answer at every budget (default pool and keep)

Each row is encoded once (REFORM's defaults); its per-token cosine scores are then pooled and gathered
under every setting (cheap), and gold recall is measured for each (``reform.eval.recall``). The answer
is generated only along two lines through the grid (every keep size at the default pool window, every
pool window at the default keep), at the default budget. The keep sizes are fractions of the budget:
the paper's 256 of an 8k-16k budget, against 256 of SmolLM2's 1024. ``--budget-answers`` instead
answers once per budget, at the default pool window and keep (the cache's keep, at most budget / 8):
the measurement a model's recompute budget is chosen by. One JSON line per row in
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


def sweep_row(pipe, row, answers: bool = True, budgets=BUDGETS, budget_answers: bool = False) -> dict:
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
        for budget in budgets:
            default_keep = min(default.keep_first, default.keep_last, budget // 8)
            for keep in sorted({int(budget * frac) for frac in KEEP_FRACTIONS} | {default_keep}):
                kept = gather_indices(pooled, budget, keep, keep)
                flags = gold_kept(pipe.tokenizer, ctx.ids, kept, golds, text)
                out["recall"].append({"pool": pool, "budget": budget, "keep": keep, "recall": recall(flags)})
                if budget_answers:
                    on_line = answers and pool == default.pool_window and keep == default_keep
                else:
                    on_line = answers and budget == default.recompute_budget and (pool == 129 or keep == budget // 4)
                if on_line:
                    ctx.method.config = replace(default, gather_keep=keep, pool_window=pool, recompute_budget=budget)
                    t = time.perf_counter()
                    ans = ctx.ask(row.question, answer_prefix=row.answer_prefix, max_new_tokens=row.max_new_tokens)
                    out["score"].append({"pool": pool, "keep": keep, "budget": budget, "score": score(row, ans.text),
                                         "recall": recall(flags), "answer": ans.text[:80],
                                         "ask_s": round(time.perf_counter() - t, 2)})
    ctx.method.config = default
    return out


def report(out: Path) -> str:
    rows = [json.loads(line) for line in (out / "sweep.jsonl").read_text().splitlines() if line.strip()]
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")
    budgets = sorted({c["budget"] for r in rows for c in r["recall"]})
    lines = [f"# Gather sweep: {len(rows)} held-out RULER-format rows ({', '.join(sorted({r['task'] for r in rows}))})",
             "", "Mean gold recall (%) of the gathered tokens, by kept first/last size (columns, tokens at each "
             "end) and pool window (rows), per recompute budget.", ""]
    for budget in budgets:
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
            scored.setdefault((c.get("budget"), c["pool"], c["keep"]), []).append(c)
    lines += ["## Scores", "", "| budget | pool window | keep | recall (%) | score (%) | seconds per answer | rows |",
              "|---|---|---|---|---|---|---|"]
    for (budget, pool, keep), cs in sorted(scored.items(), key=lambda kv: tuple(x or 0 for x in kv[0])):
        rec = [c["recall"] for c in cs if c["recall"] is not None]
        ask = [c["ask_s"] for c in cs if "ask_s" in c]
        lines.append(f"| {budget or 'default'} | {pool} | {keep} | {100 * mean(rec):.1f} | "
                     f"{100 * mean([c['score'] for c in cs]):.1f} | {mean(ask):.1f} | {len(cs)} |")
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
    ap.add_argument("--model", default=None, help="model (default: the packaged SmolLM2)")
    ap.add_argument("--heads", default=None, help="embedding heads or a preset JSON (default: the model's preset)")
    ap.add_argument("--budgets", default=",".join(map(str, BUDGETS)), help="recompute budgets to gather with")
    ap.add_argument("--budget-answers", action="store_true", help="answer at every budget (default pool and keep)")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if not a.report:
        from reform.pipeline import Pipeline
        pipe = Pipeline.load(a.model, method="reform", heads=a.heads)
        path = out / "sweep.jsonl"
        done = {(r["task"], r["sample"]) for r in map(json.loads, path.open())} if path.exists() else set()
        for task in a.tasks.split(","):
            for row in ruler.generate(task, pipe.tokenizer, parse_length(a.length), a.samples, a.seed):
                if (row.task, row.sample) in done or row.sample < a.first_sample:
                    continue
                result = sweep_row(pipe, row, answers=not a.recall_only, budgets=[int(b) for b in a.budgets.split(",")],
                                   budget_answers=a.budget_answers)
                with path.open("a") as f:
                    f.write(json.dumps(result) + "\n")
                print(row.task, row.sample, result["encode_s"], [c["score"] for c in result["score"]], flush=True)
    (out / "sweep.md").write_text(report(out))
    print((out / "sweep.md").read_text())


if __name__ == "__main__":
    main()
