"""Several head sets answering the same suite rows from one encode per context (a lab; issue 69).

    python scripts/labs/suite_heads_lab.py SUITE OUT_DIR UNION.json NAME=H+H+...[|key=value+...][;NAME=...]
        [--lengths 32k] [--samples 1] [--seed 0] [--depths ...] [--tasks ...] [--haystack DIR] [--dtype fp32]

Each context of ``reform eval SUITE``'s rows (``make_rows``: the same rows for the same seed) is encoded once
with the union of the head sets (UNION.json), then every set answers each row from that encode seen through
its own heads' columns (``gather_variants.head_subset``): its gather, the full model's recompute over what it
gathered, the answer and its score, as ``reform eval`` records them (``runner.answer_context``). When every
set exits the encode after the same layer (the union's deepest), this is exactly what ``reform eval
--methods reform:heads=SET`` answers, at one encode's cost instead of one per set. Rows go to
OUT_DIR/predictions.jsonl under each set's NAME (a re-run skips those there), so ``reform eval compare
OUT_DIR`` pairs the sets row by row. ``|key=value+...`` after a set's heads: REFORM options for that set
(``pool_window=129``: a set as it ran before the preset's window became 113); ``gaps=1``: the recompute with
``gather_variants.gap_marks`` between runs; ``pooled=1``: the gather with ``gather_variants.pooled_windows``
(``pooled=K``: over K tokens); ``whole=K``: REFORM's ``min_run=K`` (``methods/whole_runs.py``, the lab's
``whole_runs`` until it moved there, the same gather). SUITE: niah, ruler (the
built-in generator) or ruler-official.
"""
import argparse
import hashlib
import json
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

from reform import Pipeline
from reform.eval.records import PREDICTIONS, read_predictions, record_for
from reform.eval.runner import answer_context, default_scorer, details, group_by_context
from reform.eval.specs import parse_lengths
from reform.eval.tasks import make_rows
from gather_variants import gap_marks, head_subset, pooled_windows

parser = argparse.ArgumentParser()
parser.add_argument("suite", choices=("niah", "ruler", "ruler-official"))
parser.add_argument("out", type=Path)
parser.add_argument("union")
parser.add_argument("sets", help="NAME=HEAD+HEAD+...;NAME=...: subsets of the union's heads")
parser.add_argument("--lengths", default="32k")
parser.add_argument("--samples", type=int, default=1)
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--depths")
parser.add_argument("--tasks")
parser.add_argument("--haystack")
parser.add_argument("--dtype", help="bf16, fp16 or fp32 (default: the machine's, as reform picks it)")
args = parser.parse_args()

sets = dict(item.split("=", 1) for item in args.sets.split(";") if item)
pipe = Pipeline.load(method="reform", heads=args.union, dtype=args.dtype)
depths = [float(d) for d in args.depths.split(",")] if args.depths else None
rows = make_rows(args.suite, pipe.tokenizer, parse_lengths(args.lengths), args.samples, args.seed,
                 args.haystack, depths, args.tasks.split(",") if args.tasks else None)
args.out.mkdir(parents=True, exist_ok=True)
path = args.out / PREDICTIONS
done = {(r["method"], r["id"]) for r in read_predictions(path)} if path.exists() else set()
(args.out / "config.json").write_text(json.dumps({"model": pipe.identity.get("name"), "suite": args.suite,
                                                  "union": args.union, "sets": sets, "lengths": args.lengths,
                                                  "samples": args.samples, "seed": args.seed, "depths": depths,
                                                  "haystack": args.haystack}, indent=1))
score = default_scorer()
for group in group_by_context(rows):
    if all((name, row.id) in done for name in sets for row in group):
        continue
    ctx = pipe.encode(group[0].content())
    for name, heads in sets.items():
        names, _, given = heads.partition("|")
        view = head_subset(ctx, names)
        options = {k: int(v) if v.isdigit() else v for k, v in (p.split("=", 1) for p in given.split("+") if p)}
        marked = bool(options.pop("gaps", 0))
        pooled = int(options.pop("pooled", 0))
        if "whole" in options:
            options["min_run"] = int(options.pop("whole"))
        if options:
            view.method = type(view.method)(replace(view.method.config, **options))
        spec = SimpleNamespace(label=name, name="reform")
        config_hash = hashlib.sha256(heads.encode()).hexdigest()[:12]
        with path.open("a") as sink, gap_marks() if marked else nullcontext(), \
                pooled_windows(pooled) if pooled else nullcontext():
            for row, status, extra in answer_context(pipe, view, [r for r in group if (name, r.id) not in done]):
                if status == "ok":
                    extra["score"] = float(score(row, extra["prediction"]))
                    extra.update(details(row, extra["prediction"]))
                sink.write(json.dumps(record_for(row, spec, config_hash, status, **extra), ensure_ascii=False) + "\n")
    print(f"{group[0].id}: encoded in {ctx.encode_seconds:.1f} s", flush=True)
