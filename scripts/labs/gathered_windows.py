"""The text REFORM recomputes for one NIAH row, per head set: each contiguous run of gathered tokens with its
position, so two head sets' reading of the same row can be compared side by side (a lab; issue 69).

    python scripts/labs/gathered_windows.py LENGTH DEPTH SEED HEADS[;HEADS...] [--model M] [--chars N]

HEADS: ``shipped`` (the model's preset), a preset JSON, or heads joined by ``,``. The row is ``reform eval niah
--lengths LENGTH --depths DEPTH --seed SEED``'s; nothing is generated. A run marked ``*`` is gathered by
this head set only.
"""
import argparse

import torch

from reform import Pipeline
from reform.eval.recall import kept_runs
from reform.eval.specs import parse_lengths
from reform.eval.tasks import niah

parser = argparse.ArgumentParser()
parser.add_argument("length")
parser.add_argument("depth", type=float)
parser.add_argument("seed", type=int)
parser.add_argument("heads", help="head sets separated by ';'")
parser.add_argument("--model")
parser.add_argument("--chars", type=int, default=240, help="characters of each run to print")
args = parser.parse_args()


gathered = {}
for heads in args.heads.split(";"):
    pipe = Pipeline.load(args.model, method="reform", **({} if heads == "shipped" else {"heads": heads}))
    (length,) = parse_lengths(args.length)
    row = niah.generate("niah", pipe.tokenizer, length, 1, args.seed, depths=[args.depth])[0]
    ctx = pipe.encode(row.content())
    part = pipe.templater.question(row.question, row.answer_prefix, layout=row.layout, instruction=row.instruction)
    gathered[heads] = (pipe, ctx, set(ctx.method.select_scored(ctx, part, None)[0].tolist()))
    print(f"row {row.id}: {row.question!r}, answer {row.answers}")

for heads, (pipe, ctx, kept) in gathered.items():
    others = set().union(*(k for h, (_, _, k) in gathered.items() if h != heads))
    spans = kept_runs(torch.tensor(sorted(kept)))
    print(f"\n==== {heads}: {len(kept)} tokens in {len(spans)} runs")
    for s, e in spans:
        only = "*" if others and not others & set(range(s, e)) else " "
        text = pipe.tokenizer.decode(ctx.ids[s:e]).replace("\n", " ")
        print(f"{only}[{s}:{e}] {text[:args.chars]}")
