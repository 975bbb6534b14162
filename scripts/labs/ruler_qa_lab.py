"""REFORM's gather on RULER's official qa_1 (SQuAD) and qa_2 (HotpotQA) rows, head sets against gather
corrections, beside dense retrieval at the same budget (a lab; issue 69).

    python scripts/labs/ruler_qa_lab.py MODEL LENGTH OUT.jsonl HEADS[,HEADS...] [--samples N] [--explain N]
        [--variants V,V,...] [--contexts DIR] [--subsets NAME=H+H+...;...]

HEADS: ``shipped`` (the model's preset), a preset JSON from ``reform heads select``, or heads joined by
``+``. ``--subsets``: each row is also gathered with these subsets of the encoded heads, sliced from the one
encode (``gather_variants.head_subset``), so one encode of a union measures several head sets. Each row's context
is encoded once per head set (REFORM's defaults otherwise) and gathered under each variant at REFORM's
recompute budget; nothing is generated. ``default``: REFORM as shipped; ``query_baseline=0.999``: each
question token's 99.9th-percentile cosine over the context subtracted before the max (the hub correction,
docs/results/hubs-lab-docs); ``content``: REFORM's ``query_tokens="content"`` (the question's stop words,
whitespace and punctuation dropped, RULER's instruction among them), alone and with the baseline;
``rag-dense``: 128-token passages by MiniLM, head-independent (once). ``--variants``: instead of those,
REFORM options joined by ``+`` (``query_aggregate=maxsim+query_tokens=all``; ``stop=sklearn``: scikit-learn's
stop-word list for the content tokens; ``null=W``: ``gather_variants.null_question(W)``; ``windows``: ``gather_variants.whole_windows``; ``nofrag``: ``gather_variants.without_fragments``), ``default`` and ``rag-dense``. A row per (heads, variant, row) goes to OUT.jsonl with its span recall as ``reform eval`` computes it
(``spans_kept`` over SQuAD's answer spans / HotpotQA's supporting-fact sentences); a re-run skips what is
done. ``--explain N``: the first N rows missed by each REFORM variant get ``reform.eval.explain``'s screen
in OUT.explain.md (the windows that outrank the evidence). The rows are ``reform eval ruler --generator
official --seed N``'s (``--seed``, 0 unless given).
"""
import argparse
from contextlib import nullcontext
import copy
import dataclasses
import json
import time
from pathlib import Path

import torch

from reform import Pipeline
from reform.eval.explain import explain, render
from reform.eval.recall import evidence, gold_kept, kept_runs, spans_kept
from reform.engine.layout import QuestionPart
from reform.eval.tasks import ruler_official
from reform.methods.rag import PassageIndex, pick_passages
from reform.methods.retrievers import Dense
from gather_variants import head_subset, null_question, stop_words, whole_windows, without_fragments

parser = argparse.ArgumentParser()
parser.add_argument("model")
parser.add_argument("length", type=int)
parser.add_argument("out", type=Path)
parser.add_argument("heads")
parser.add_argument("--samples", type=int, default=20)
parser.add_argument("--explain", type=int, default=0)
parser.add_argument("--tasks", default="qa_1,qa_2")
parser.add_argument("--seed", type=int, default=0, help="the rows of `reform eval ruler --seed N`")
parser.add_argument("--contexts", type=Path, help="save each encoded context here and read it back on a re-run")
parser.add_argument("--subsets", default="", help="NAME=HEAD+HEAD+...;...: also gather with these subsets "
                    "of the encoded heads, their embeddings sliced from the one encode")
parser.add_argument("--variants", default="default,query_baseline=0.999,content,content+query_baseline,rag-dense")
args = parser.parse_args()
model = None if args.model == "smollm2" else args.model
decoded: dict[str, str] = {}
done = {(r["heads"], r["variant"], r["id"]) for r in map(json.loads, args.out.read_text().splitlines())} \
    if args.out.exists() else set()
explained: dict[tuple[str, str], int] = {}
screens = args.out.with_suffix(".explain.md")


def with_options(method, **options):
    m = copy.copy(method)
    m.config = dataclasses.replace(method.config, **options)
    return m


NAMED = {"default": {}, "content": {"query_tokens": "content"},
         "content+query_baseline": {"query_tokens": "content", "query_baseline": 0.999}}


def options(variant: str) -> dict:
    """A variant's REFORM options: a named one, or ``key=value`` pairs joined by ``+``."""
    if variant in NAMED:
        return NAMED[variant]
    pairs = dict(p.split("=", 1) for p in variant.split("+") if p not in ("question-only", "windows", "nofrag") and not p.startswith(("stop=", "null=")))
    return {k: (float(v) if k == "query_baseline" else int(v) if v.isdigit() else v) for k, v in pairs.items()}


subsets = dict(item.split("=", 1) for item in args.subsets.split(";") if item)


def stop_list(variant: str) -> str:
    """A variant's stop-word list for REFORM's content tokens: ``+stop=sklearn``, else bm25s's."""
    return next((p[5:] for p in variant.split("+") if p.startswith("stop=")), "bm25s")


def null_weight(variant: str) -> float:
    """A variant's weight on the content-free question's scores (``+null=1``; 0: none)."""
    return next((float(p[5:]) for p in variant.split("+") if p.startswith("null=")), 0.0)


def gathered(method, ctx, part, variant: str) -> torch.Tensor:
    weight = null_weight(variant)
    with stop_words(stop_list(variant)), (null_question(weight) if weight else nullcontext()):
        if "windows" in variant.split("+") and ctx.state is not None:
            c = method.config
            return whole_windows(method.scores(ctx, part), c.recompute_budget, c.gather_keep, c.pool_window)
        if "nofrag" in variant.split("+") and ctx.state is not None:
            c = method.config
            return without_fragments(method.scores(ctx, part), c.recompute_budget, c.gather_keep)
        return method.select_scored(ctx, part, None)[0]


def runs(kept: torch.Tensor, short: int = 16) -> tuple[int, int]:
    """How many contiguous runs ``kept`` makes, and how many of its tokens lie in runs under ``short``."""
    lengths = [e - s for s, e in kept_runs(kept)]
    return len(lengths), sum(n for n in lengths if n < short)


def kept_flags(pipe, ctx, row, kept, decoded: dict) -> list[bool]:
    """Per piece of the row's evidence, whether the gather kept it: qa's spans by place, other tasks' gold
    strings (vt's chain of assignments, a needle's value) as ``reform eval`` checks them."""
    if "evidence_spans" in row.meta:
        return spans_kept(ctx.source.token_starts, len(ctx.source.document.text), kept, row.meta["evidence_spans"])
    text = decoded.setdefault(row.id, pipe.tokenizer.decode(ctx.ids.tolist()))
    return [f for f in gold_kept(pipe.tokenizer, ctx.ids, kept, evidence(row), text) if f is not None]


def dense_kept(pipe, ctx, question: str):
    index = ctx.extra.get("dense") or ctx.extra.setdefault("dense", PassageIndex.build(pipe, ctx.ids, 128, Dense()))
    budget = ctx.method.config.recompute_budget
    chosen = pick_passages(index.scores(question), [e - s for s, e in index.spans], budget - index.prefix)
    return torch.cat([torch.arange(index.prefix)] + [torch.arange(*index.spans[i]) for i in chosen])


for heads in args.heads.split(","):
    # HEADS: "shipped", a preset JSON, or heads joined by "+" (3:q:3+7:v:0)
    spec = heads.replace("+", ",") if ":" in heads else heads
    pipe = Pipeline.load(model, method="reform", **({} if heads == "shipped" else {"heads": spec}))
    label = "shipped" if heads == "shipped" else Path(heads).stem if heads.endswith(".json") else heads
    rows = [r for task in args.tasks.split(",")
            for r in ruler_official.generate(task, pipe.tokenizer, args.length, args.samples, args.seed)]
    variants = [v for v in args.variants.split(",") if not v.startswith("rag-dense") or heads == args.heads.split(",")[0]]
    for row in rows:
        if all((view, v, row.id) in done for v in variants for view in [label, *subsets]
               if view == label or not v.startswith("rag-dense")):
            continue
        saved = args.contexts / label / f"{row.id.replace('/', '_')}.reform" if args.contexts else None
        if saved is not None and saved.exists():
            ctx, encode_s = pipe.load_context(saved), None      # timed in the run that encoded it
        else:
            t = time.time()
            ctx = pipe.encode(row.content())
            encode_s = time.time() - t
            if saved is not None:
                saved.parent.mkdir(parents=True, exist_ok=True)
                ctx.save(saved)
        part = pipe.templater.question(row.question, row.answer_prefix, layout=row.layout, instruction=row.instruction)
        # "...question-only": the instruction moved out of the question's span (the prompt the same); rows
        # that carry their instruction apart (the official bridge since 2026-11-29) search without it always
        cut = row.question.rfind("Question:")
        asked = QuestionPart(part.separator + pipe.templater.encode(row.question[:cut]),
                             pipe.templater.encode(row.question[cut:]), part.suffix) if cut > 0 else part
        text = ctx.source.document.text
        views = [(label, ctx)] + [(name, head_subset(ctx, names)) for name, names in subsets.items()]
        for view, vctx in views:
            method = vctx.method
            methods = {v: with_options(method, **options(v)) for v in variants if not v.startswith("rag-dense")}
            gathers = {**{v: (lambda m=m, v=v: gathered(m, vctx, asked if v.endswith("question-only") else part, v))
                          for v, m in methods.items()},
                       "rag-dense": lambda: dense_kept(pipe, ctx, row.question),
                       "rag-dense+question-only": lambda: dense_kept(pipe, ctx, row.question[max(0, cut):])}
            with args.out.open("a") as out:
                for variant in variants:
                    if (view, variant, row.id) in done or (view != label and variant.startswith("rag-dense")):
                        continue
                    kept = gathers[variant]()
                    flags = kept_flags(pipe, ctx, row, kept, decoded)
                    count, in_short = runs(kept)
                    out.write(json.dumps({"heads": view, "variant": variant, "task": row.task, "id": row.id,
                                          "recall": sum(flags) / len(flags) if flags else None, "all": all(flags),
                                          "tokens": int(kept.numel()), "runs": count, "in_short_runs": in_short, "encode_s": encode_s and round(encode_s, 2)}) + "\n")
                    key = (view, variant)
                    if not variant.startswith("rag-dense") and not all(flags) and explained.get(key, 0) < args.explain:
                        explained[key] = explained.get(key, 0) + 1
                        golds = [text[a:b] for a, b in row.meta["evidence_spans"]] \
                            if "evidence_spans" in row.meta else evidence(row)
                        vctx.method = methods[variant]
                        with stop_words(stop_list(variant)):
                            report = explain(vctx, asked if variant.endswith("question-only") else part, golds, kept)
                        vctx.method = method
                        with screens.open("a") as f:
                            f.write(render(f"{view} · {variant} · {row.id}", row.question, report) + "\n\n")
        print(f"{label} {row.id}: {ctx.ids.shape[0]} tokens, " + ("read back" if encode_s is None else f"encoded in {encode_s:.1f} s"), flush=True)

results = [json.loads(line) for line in args.out.read_text().splitlines()]
print(f"{'heads':28} {'variant':22} " + " ".join(f"{t:>22}" for t in args.tasks.split(",")))
for key in dict.fromkeys((r["heads"], r["variant"]) for r in results):
    cells = []
    for task in args.tasks.split(","):
        got = [r for r in results if (r["heads"], r["variant"]) == key and r["task"].endswith(task)
               and r["recall"] is not None]
        mean = 100 * sum(r["recall"] for r in got) / max(len(got), 1)
        cells.append(f"{mean:5.1f} % ({sum(r['all'] for r in got):>2}/{len(got):<2} all)")
    print(f"{key[0]:28} {key[1]:22} " + " ".join(f"{c:>22}" for c in cells))
