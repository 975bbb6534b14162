"""Gather recall of REFORM's selection variants on saved contexts: encode each RULER-style row once, then
measure which gold strings every gather variant brings to the recompute (no answers generated, so a
variant costs seconds, not an encode).

    python scripts/recall_lab.py encode --contexts /tmp/lab --lengths 64k,128k --tasks niah_multikey_3,vt --samples 5
    python scripts/recall_lab.py encode --contexts /tmp/grid --suite niah --tasks niah --lengths 128k --samples 1 \
        --depths 0,0.25,0.5,0.75,1   # the NIAH grid (REFORM §4.1)
    python scripts/recall_lab.py measure --contexts /tmp/lab --out docs/results/recall-lab [--variants paper,rounds2] \
        [--answer-runs 16,runpeaks1]   # also answer with the paper's gather, match_run=16 and runpeaks1, scored
        [--changed-only]               # ... only the rows where some variant gathers other tokens than the paper

``encode`` saves one ``.reform`` file per row (resumable: a row already saved is skipped, a row cut off goes on
from its ``.partial`` checkpoint, saved every 5 min) beside a JSON
line describing the row (task, length, sample, question, gold strings); ``measure`` loads each, gathers
with every variant (``scripts/labs/gather_variants.py``), and writes recall per variant and per task to
``OUT/recall.jsonl`` and ``OUT/recall.md``, with an explanation of each miss of the paper's gather
(``reform.eval.explain``) in ``OUT/explain.md``. Rows are ``reform eval ruler``'s (or, with ``--suite niah``,
``reform eval niah``'s): same seed, same rows.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import torch

from reform.eval.explain import explain, render
from reform.eval.intervals import interval
from reform.eval.recall import evidence, gold_kept, recall
from reform.eval.specs import format_length, parse_lengths
from reform.eval.tasks import make_rows
from reform.machine import cpu_name
from reform.methods.checkpoint import Checkpoint
from reform.pipeline import Pipeline
from reform.stats import Timer

sys.path.insert(0, str(Path(__file__).resolve().parent / "labs"))   # the gather variants (a lab)


def encode(args) -> None:
    pipe = Pipeline.load(args.model)
    folder = Path(args.contexts)
    folder.mkdir(parents=True, exist_ok=True)
    depths = [float(d) for d in args.depths.split(",")] if args.depths else None
    rows = make_rows(args.suite, pipe.tokenizer, parse_lengths(args.lengths), args.samples, seed=args.seed,
                     tasks=args.tasks.split(","), depths=depths)
    # sample-major, so that an interrupted run leaves every task with about as many rows
    for row in sorted(rows, key=lambda r: (r.length, r.sample, r.depth or 0.0)):
        name = row.id.replace("/", "_")
        if (folder / f"{name}.reform").exists():
            continue
        # an interrupted row goes on from its checkpoint (every 5 min) instead of starting over
        checkpoint = Checkpoint(folder / f"{name}.partial", every_s=300)
        ctx = pipe.encode(row.context, checkpoint=checkpoint)
        seconds = ctx.encode_seconds      # the runs before an interruption included
        ctx.save(folder / f"{name}.reform")
        meta = {"id": row.id, "file": f"{name}.reform", "suite": args.suite, "seed": args.seed, "depth": row.depth, "task": row.task,
                "length": row.length, "sample": row.sample,
                "question": row.question, "answer_prefix": row.answer_prefix, "golds": evidence(row),
                "encode_s": round(seconds, 1), "resumed": checkpoint.spent_before > 0, "tokens": int(ctx.ids.shape[0]),
                "cpu": cpu_name()}
        with open(folder / "rows.jsonl", "a") as f:
            f.write(json.dumps(meta) + "\n")
        print(json.dumps({k: meta[k] for k in ("id", "encode_s", "tokens")}), flush=True)


def measure(args) -> None:
    from gather_variants import VARIANTS
    pipe = Pipeline.load(args.model)
    folder, out = Path(args.contexts), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    variants = args.variants.split(",") if args.variants else list(VARIANTS)
    metas = [json.loads(line) for line in open(folder / "rows.jsonl")]
    records, answers = read_jsonl(out / "recall.jsonl"), read_jsonl(out / "answers.jsonl")
    done = measured(records, answers, variants, args.answer_runs, args.changed_only)
    screens = (out / "explain.md").read_text().split(SCREEN)[1:] if (out / "explain.md").exists() else []
    screens = [s for s in screens if s.split("\n", 1)[0].removeprefix("### ") in done]  # a screen opens with its id
    metas = [m for m in metas if m["id"] not in done]
    records = [r for r in records if r["id"] in done]
    answers = [a for a in answers if a["id"] in done]
    rows = answer_rows(pipe, metas) if args.answer_runs else {}
    for meta in metas:
        ctx = pipe.load_context(folder / meta["file"])
        part = pipe.templater.question(meta["question"], meta["answer_prefix"])
        text = pipe.tokenizer.decode(ctx.ids.tolist())
        with torch.inference_mode():
            paper_kept = VARIANTS["paper"](ctx, part)
        for name in variants:
            t = time.perf_counter()
            with torch.inference_mode():
                kept = VARIANTS[name](ctx, part)
            seconds = time.perf_counter() - t
            flags = gold_kept(pipe.tokenizer, ctx.ids, kept, meta["golds"], text)
            records.append({"id": meta["id"], "task": meta["task"], "length": meta["length"], "variant": name,
                            "recall": recall(flags), "gold_kept": flags, "gather_s": round(seconds, 3),
                            "same_as_paper": torch.equal(kept, paper_kept)})
            if name == "paper" and recall(flags) is not None and recall(flags) < 1:
                with torch.inference_mode():
                    screens.append(render(meta["id"], meta["question"], explain(ctx, part, meta["golds"], kept)))
        mine = [r for r in records if r["id"] == meta["id"]]
        if meta["id"] in rows and not (args.changed_only and all(r["same_as_paper"] for r in mine)):
            answers += answer(ctx, rows[meta["id"]], args.answer_runs.split(","), text)
        print(json.dumps(mine), flush=True)
        write(out, records, answers, screens, variants, args)  # after every row: an interrupted run resumes
    write(out, records, answers, screens, variants, args)
    print((out / "recall.md").read_text())


SCREEN = "\n<!-- row -->\n"


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in open(path)] if path.exists() else []


def measured(records: list[dict], answers: list[dict], variants: list[str], answer_runs: str | None,
             changed_only: bool = False) -> set[str]:
    """Ids of rows already measured with every requested variant (and answered with every run, or, with
    ``changed_only``, left unanswered because every variant gathered what the paper does)."""
    ids = {r["id"] for r in records}
    done = {i for i in ids if set(variants) <= {r["variant"] for r in records if r["id"] == i}}
    if answer_runs:
        runs = ["paper"] + [f"match_run={v}" if v.isdigit() else v for v in answer_runs.split(",") if v != "paper"]
        unchanged = {i for i in done if changed_only and all(r["same_as_paper"] for r in records if r["id"] == i)}
        done = {i for i in done if i in unchanged or set(runs) <= {a["match_run"] for a in answers if a["id"] == i}}
    return done


def write(out: Path, records, answers, screens, variants, args) -> None:
    """Write every output file whole, each through a temporary file (never half written)."""
    files = {"recall.jsonl": "".join(json.dumps(r) + "\n" for r in records),
             "answers.jsonl": "".join(json.dumps(r) + "\n" for r in answers),
             "explain.md": "# Misses of the paper's gather, explained\n" + "".join(SCREEN + s for s in screens),
             "recall.md": table(records, variants, args) + answer_table(answers)}
    for name, text in files.items():
        tmp = out / f".{name}.tmp"
        tmp.write_text(text)
        tmp.replace(out / name)


def answer_rows(pipe, metas: list[dict]) -> dict:
    """The rows behind the saved contexts (regenerated: same seed, same rows), by id."""
    wanted = {m["id"] for m in metas}
    found = {}
    def drawn(m: dict) -> tuple:      # what a row was generated from (rows before seeds were kept: seed 0)
        return m.get("suite", "ruler"), m.get("seed", 0), m["task"].split("/")[-1], m["length"]
    for suite, seed, task, length in sorted({drawn(m) for m in metas}):
        mine = [m for m in metas if drawn(m) == (suite, seed, task, length)]
        depths = sorted({m["depth"] for m in mine}) if suite == "niah" else None
        for row in make_rows(suite, pipe.tokenizer, [length], 1 + max(m["sample"] for m in mine), seed=seed, tasks=[task],
                             depths=depths):
            if row.id in wanted:
                found[row.id] = row
    return found


def answer(ctx, row, variants: list[str], text: str) -> list[dict]:
    """Answer ``row`` with the paper's gather and each of ``variants`` (a number: REFORM's ``match_run``;
    a name: that gather variant of ``scripts/labs/gather_variants.py``): score and recall."""
    from reform.eval.tasks.scoring import score
    from gather_variants import VARIANTS, reform_with
    base, out, paper_kept = ctx.method, [], None
    part = ctx.pipeline.templater.question(row.question, row.answer_prefix)
    for variant in ["paper"] + [v for v in variants if v != "paper"]:
        method = copy.copy(base)      # the paper's gather (whatever the context was saved with), then the variant
        method.config = reform_with(ctx, match_run=int(variant) if variant.isdigit() else 0).config
        if not variant.isdigit() and variant != "paper":
            # the answer path gathers through select_scored (its scores feed the evidence): replace that
            method.select_scored = lambda c, part, timer, pick=VARIANTS[variant]: (pick(c, part), None)
        ctx.method = method
        label = f"match_run={variant}" if variant.isdigit() else variant
        with torch.inference_mode():
            kept = method.select_scored(ctx, part, Timer())[0]
        if paper_kept is not None and torch.equal(kept, paper_kept):
            # the same gathered tokens give the same greedy answer: the paper's, not asked again
            out.append({**out[0], "match_run": label, "same_as_paper": True})
            continue
        ans = ctx.ask(row.question, answer_prefix=row.answer_prefix, max_new_tokens=row.max_new_tokens)
        paper_kept = ans.kept if variant == "paper" else paper_kept
        flags = gold_kept(ctx.pipeline.tokenizer, ctx.ids, ans.kept, evidence(row), text)
        out.append({"id": row.id, "task": row.task, "length": row.length, "match_run": label,
                    "recall": recall(flags), "score": score(row, ans.text), "prediction": ans.text, "stats": ans.stats})
    ctx.method = base
    return out


def answer_table(answers: list[dict]) -> str:
    if not answers:
        return ""
    runs = list(dict.fromkeys(a["match_run"] for a in answers))
    lines = ["", "Answers (score %, mean over rows; recall of the answered gather in brackets):", "",
             "| task | length | rows | " + " | ".join(runs) + " |",
             "|---|---|---|" + "---|" * len(runs)]
    for task, length in sorted({(a["task"], a["length"]) for a in answers}) + [("**all**", None)]:
        cells = []
        for r in runs:
            mine = [a for a in answers if a["match_run"] == r and (length is None or (a["task"], a["length"]) == (task, length))]
            rec = [a["recall"] for a in mine if a["recall"] is not None]
            cells.append(f"{100 * sum(a['score'] for a in mine) / len(mine):.1f} "
                         f"({100 * sum(rec) / max(1, len(rec)):.0f})")
        n = len({a["id"] for a in answers if length is None or (a["task"], a["length"]) == (task, length)})
        lines.append(f"| {task} | {format_length(length) if length else 'all'} | {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def table(records: list[dict], variants: list[str], args) -> str:
    """Gold recall per task and length for every variant: mean over the gold strings, with a 95 % interval
    (Wilson over strings), and the mean gather time."""
    lines = [f"`python scripts/recall_lab.py measure --contexts {args.contexts} --out {args.out}` on {cpu_name()}", "",
             "| task | length | rows | " + " | ".join(variants) + " |", "|---|---|---|" + "---|" * len(variants)]
    keys = sorted({(r["task"], r["length"]) for r in records})
    for task, length in keys + [("**all**", None)]:
        cells = []
        for v in variants:
            mine = [r for r in records if r["variant"] == v and (length is None or (r["task"], r["length"]) == (task, length))]
            flags = [f for r in mine for f in r["gold_kept"] if f is not None]
            lo, hi = interval([[float(f) for f in flags]]) or (0.0, 1.0)
            cells.append(f"{100 * sum(flags) / max(1, len(flags)):.1f} [{100 * lo:.0f}–{100 * hi:.0f}] "
                         f"({sum(flags)}/{len(flags)})")
        n = len({r["id"] for r in records if length is None or (r["task"], r["length"]) == (task, length)})
        lines.append(f"| {task} | {format_length(length) if length else 'all'} | {n} | " + " | ".join(cells) + " |")
    times = {v: [r["gather_s"] for r in records if r["variant"] == v] for v in variants}
    lines += ["", "Gather time per question (s, mean): " + ", ".join(f"{v} {sum(t) / len(t):.2f}" for v, t in times.items() if t)]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("step", choices=["encode", "measure"])
    ap.add_argument("--contexts", required=True, help="folder of saved contexts (and rows.jsonl)")
    ap.add_argument("--model", default=None)
    ap.add_argument("--lengths", default="64k")
    ap.add_argument("--suite", default="ruler", choices=["ruler", "niah", "babilong"], help="rows of `reform eval SUITE`")
    ap.add_argument("--tasks", default="niah_multikey_3,vt")
    ap.add_argument("--depths", default=None, help="needle depths 0..1 for --suite niah (default: the suite's)")
    ap.add_argument("--samples", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    ap.add_argument("--variants", default=None, help="comma-separated (default: all)")
    ap.add_argument("--answer-runs", default=None, help="also answer each row with the paper's gather and each of "
                    "these (comma-separated: a number is REFORM's match_run, a name a gather variant), scored")
    ap.add_argument("--changed-only", action="store_true", help="answer only the rows where some variant's "
                    "gather differs from the paper's (elsewhere the answers are the paper's: same tokens, same "
                    "greedy answer)")
    args = ap.parse_args()
    if args.step == "measure" and not args.out:
        ap.error("measure needs --out")
    (encode if args.step == "encode" else measure)(args)


if __name__ == "__main__":
    main()
