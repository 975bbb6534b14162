"""Why does the reader miss a needle the gather kept? One NIAH row, encoded once per head set, answered
with REFORM's gather, ``gather_variants.whole_windows``, ``without_fragments`` and ``gap_marks``; prints each answer, the gathered runs
and which run holds the needle (a lab; issue 69).

    python scripts/labs/niah_reading_lab.py LENGTH DEPTH SEED HEADS[;HEADS...] [--haystack DIR] [--contexts DIR] [--variants V,...]

HEADS: ``shipped`` or a preset JSON. The row is ``reform eval niah --lengths LENGTH --depths DEPTH --seed
SEED [--haystack DIR]``'s. ``--variants``: ``default``, ``windows``, ``nofrag``, ``gaps``, or REFORM options
(``pool_window=129+run_peaks=0``).
"""
import argparse
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import torch

from reform import Pipeline
from reform.eval.recall import kept_runs
from reform.eval.specs import parse_lengths
from reform.eval.tasks import niah
from reform.methods.reform import Reform
from gather_variants import GAP_MARK, gap_marks, whole_windows, without_fragments

parser = argparse.ArgumentParser()
parser.add_argument("length")
parser.add_argument("depth", type=float)
parser.add_argument("seed", type=int)
parser.add_argument("heads")
parser.add_argument("--haystack")
parser.add_argument("--contexts", type=Path)
parser.add_argument("--chars", type=int, default=100)
parser.add_argument("--variants", default="default,windows,nofrag",
                    help="default, windows, nofrag, gaps, or REFORM options key=value joined by +")
args = parser.parse_args()


@contextmanager
def patched(kind: str):
    """REFORM's gather replaced by whole windows (``windows``) or without its short runs (``nofrag``) while inside."""
    original = Reform.select_scored

    def select_scored(self, ctx, part, timer):
        if ctx.state is None:
            return original(self, ctx, part, timer)
        c = self.config
        scores = self.scores(ctx, part)
        keep = whole_windows(scores, c.recompute_budget, c.gather_keep, c.pool_window) if kind == "windows" \
            else without_fragments(scores, c.recompute_budget, c.gather_keep)
        return keep, scores[keep]

    Reform.select_scored = select_scored
    try:
        yield
    finally:
        Reform.select_scored = original


for heads in args.heads.split(";"):
    pipe = Pipeline.load(method="reform", **({} if heads == "shipped" else {"heads": heads}))
    (length,) = parse_lengths(args.length)
    row = niah.generate("niah", pipe.tokenizer, length, 1, args.seed, depths=[args.depth],
                        haystack_dir=args.haystack)[0]
    saved = args.contexts / Path(heads).stem / f"{row.id}.reform" if args.contexts else None
    if saved is not None and saved.exists():
        ctx = pipe.load_context(saved)
    else:
        ctx = pipe.encode(row.content())
        if saved is not None:
            saved.parent.mkdir(parents=True, exist_ok=True)
            ctx.save(saved)
    needle = row.meta["positions"][0]
    method = ctx.method
    for name in args.variants.split(","):
        if "=" in name:
            pairs = dict(p.split("=", 1) for p in name.split("+"))
            ctx.method = type(method)(replace(method.config, **{k: int(v) if v.isdigit() else v for k, v in pairs.items()}))
        with patched(name) if name in ("windows", "nofrag") else gap_marks(GAP_MARK) if name == "gaps" \
                else torch.no_grad():
            ans = ctx.ask(row.question, answer_prefix=row.answer_prefix, max_new_tokens=row.max_new_tokens,
                          layout=row.layout, instruction=row.instruction)
        ctx.method = method
        spans = kept_runs(ans.kept)
        short = sum(e - s for s, e in spans if e - s < 16)
        print(f"\n== {heads} · {name}: {row.answers} -> {ans.text[:60]!r}; {len(spans)} runs, {short} tokens in runs < 16")
        for s, e in spans:
            mark = "N" if s <= needle < e else " "
            text = pipe.tokenizer.decode(ctx.ids[s:e]).replace("\n", " ")
            print(f" {mark}[{s}:{e}] {text[:args.chars]}")
