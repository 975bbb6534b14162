"""Gather variants on the docs suite: which recomputed set holds each question's evidence span? (a lab)

    python scripts/labs/docs_gather_lab.py MODEL CONTEXTS_DIR OUT.jsonl [VARIANT,...] [HEADS.json]

For each document of ``reform eval docs`` the context is encoded with REFORM's defaults once (saved under
CONTEXTS_DIR, with the dense passage index beside it) and every question is gathered under each variant at
REFORM's recompute budget; nothing is generated. A row per (variant, question) goes to OUT.jsonl (a re-run
skips those done); the summary table is printed. Span recall is ``reform.eval.recall.spans_kept``, the
check ``reform eval docs`` makes. HEADS.json: encode with these heads instead of the preset; a variant
``heads:H+H+...[|key=value+...]`` gathers with a subset of them (``gather_variants.head_subset``),
``documents:H+H+...[|key=value+...]`` runs the documents default (REFORM+RAG, dense + BM25, pooled) over such a subset.
"""
import copy
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from reform import Pipeline
from reform.eval.recall import spans_kept
from reform.eval.tasks.docs import TASKS, make_docs_rows, read
from reform.methods.rag import PassageIndex, pick_passages
from reform.methods.reform import (content_tokens, gather_indices, max_pool, raise_run_windows, ordered_run_scores,
                                   token_scores, window_maxsim, PEAK_RUN)
from reform.methods.reform_rag import mixed_ranking, standardize
from reform.methods.retrievers import BM25, Dense
from gather_variants import head_subset, stop_words, with_rag

model, contexts, out_path = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
only = sys.argv[4].split(",") if len(sys.argv) > 4 else None
heads = {"heads": sys.argv[5]} if len(sys.argv) > 5 else {}    # encode with these heads (a preset JSON)
pipe = Pipeline.load(None if model == "smollm2" else model, method="reform", **heads)   # REFORM for documents too
contexts.mkdir(parents=True, exist_ok=True)
done = {(r["variant"], r["id"]) for r in map(json.loads, out_path.read_text().splitlines())} if out_path.exists() else set()


def variant_method(method, **options):
    m = copy.copy(method)
    m.config = dataclasses.replace(method.config, **options)
    return m


def options(text: str) -> dict:
    """``key=value`` pairs joined by ``+``, numbers as numbers."""
    pairs = dict(p.split("=", 1) for p in text.split("+"))
    return {k: float(v) if "." in v else int(v) if v.isdigit() else v for k, v in pairs.items()}


def opt_gather(method, ctx, part, opts: dict) -> torch.Tensor:
    with stop_words(opts.pop("stop", "bm25s")):
        return variant_method(method, **{"query_tokens": "content", **opts}).select_scored(ctx, part, None)[0]


def subset_gather(ctx, part, names: str, opts: str) -> torch.Tensor:
    """REFORM's gather over a subset of the encoded heads (``head_subset``), with ``opts`` (``k=v+k=v``)."""
    view = head_subset(ctx, names)
    return variant_method(view.method, **(options(opts) if opts else {})).select_scored(view, part, None)[0]


def content(ids: torch.Tensor) -> torch.Tensor:
    """Which question tokens carry content (REFORM's ``content_tokens``)."""
    return content_tokens(pipe.tokenizer, ids.tolist())


def pick(scores, c):
    return gather_indices(scores, c.recompute_budget, c.gather_keep, c.gather_keep)


def peaks(scores, query, c):
    raise_run_windows(scores, ordered_run_scores(emb, query, PEAK_RUN), c, c.run_peaks, only_missed=True)
    return scores


def passages_kept(index: PassageIndex, scores: torch.Tensor, budget: int) -> torch.Tensor:
    chosen = pick_passages(scores, [e - s for s, e in index.spans], budget - index.prefix)
    return torch.cat([torch.arange(index.prefix)] + [torch.arange(*index.spans[i]) for i in chosen])


for name in TASKS:
    path = contexts / f"{name}.reform"
    rows = make_docs_rows(pipe.tokenizer, [name])
    if all((v, r.meta["question_id"]) in done for r in rows for v in (only or ["default", "rag-bm25"])):
        continue
    if path.exists():
        ctx = pipe.load_context(path)
    else:
        t = time.time()
        ctx = pipe.encode(read(name))
        print(f"{name}: encoded {ctx.ids.shape[0]} tokens in {time.time() - t:.0f} s", flush=True)
        ctx.save(path)
    dense_path = contexts / f"{name}.dense.safetensors"
    if dense_path.exists():
        dense = PassageIndex.build(pipe, ctx.ids, 128, Dense(), load_file(dense_path)["index"])
    else:
        t = time.time()
        dense = PassageIndex.build(pipe, ctx.ids, 128, Dense())
        print(f"{name}: dense index in {time.time() - t:.0f} s", flush=True)
        save_file({"index": dense.index.contiguous()}, dense_path)
    bm25 = PassageIndex.build(pipe, ctx.ids, 128, BM25())
    method, c = ctx.method, ctx.method.config
    emb = ctx.state.data
    counts = torch.bincount(ctx.ids.cpu(), minlength=int(ctx.ids.max()) + 1).float()
    with out_path.open("a") as out:
        for row in rows:
            part = pipe.templater.question(row.question)
            question = row.question
            query = variant_method(method, query_tokens="all").query_embeddings(ctx, part)   # every question token
            ranking = method.ranking(ctx, part, query)                       # REFORM's pooled scores, no run_peaks
            dense_tokens = dense.token_scores(question, ranking.shape[0]).to(ranking)
            bm25_tokens = bm25.token_scores(question, ranking.shape[0]).to(ranking)
            qids = torch.as_tensor(part.ids)[part.query_span].cpu()
            idf = torch.log(ctx.ids.shape[0] / (1.0 + counts[qids.clamp_max(counts.numel() - 1)]))
            cq, cidf = query[content(qids)], idf[content(qids)]     # the content tokens (query holds all)
            s = {"reform": standardize(ranking), "dense": standardize(dense_tokens), "bm25": standardize(bm25_tokens)}
            kept = {       # each variant computed only when asked for
                "default": lambda: method.select_scored(ctx, part, None)[0],
                "paper": lambda: pick(ranking, c),
                "query_baseline=0.999": lambda: variant_method(method, query_baseline=0.999).select_scored(ctx, part, None)[0],
                # REFORM's query_tokens option (run_peaks kept), alone and with the baseline
                "query_tokens=content": lambda: variant_method(method, query_tokens="content")
                .select_scored(ctx, part, None)[0],
                "query_tokens=content+query_baseline=0.999": lambda: variant_method(
                    method, query_tokens="content", query_baseline=0.999).select_scored(ctx, part, None)[0],
                "idf-weighted": lambda: pick(max_pool((emb.float() @ query.float().T * (idf / idf.max())).amax(1),
                                                      c.pool_window), c),
                # hubs (issue 69): QRHead's mean over the question's tokens instead of the max, and the max
                # over its content tokens only (stop words and punctuation dropped)
                "mean over question tokens": lambda: pick(max_pool((emb.float() @ query.float().T).mean(1),
                                                                   c.pool_window), c),
                "content question tokens": lambda: pick(max_pool((emb.float() @ query[content(qids)].float().T)
                                                                 .amax(1), c.pool_window), c),
                "reform+rag (dense, w=0.5)": lambda: pick((s["reform"] + s["dense"]) / 2, c),
                "reform+rag (dense, w=0.3)": lambda: pick(0.7 * s["reform"] + 0.3 * s["dense"], c),
                "reform+bm25 (w=0.5)": lambda: pick((s["reform"] + s["bm25"]) / 2, c),
                "reform+dense+bm25 (1/3 each)": lambda: pick((s["reform"] + s["dense"] + s["bm25"]) / 3, c),
                # reform+rag:retriever=dense+bm25 at its default weight 0.5: REFORM 1/2, each retriever 1/4
                "reform+rag retriever=dense+bm25 (w=0.5)": lambda: pick(s["reform"] / 2 + (s["dense"] + s["bm25"]) / 4, c),
                # ColBERT's MaxSim over REFORM's window: the mean over question tokens of each one's best
                # cosine in the window, plain and IDF-weighted (the context's own token counts)
                "maxsim": lambda: pick(window_maxsim(emb, cq, c.pool_window), c),
                "maxsim-idf": lambda: pick(window_maxsim(emb, cq, c.pool_window, cidf.clamp_min(0.1)), c),
                "maxsim top3": lambda: pick(window_maxsim(emb, cq, c.pool_window, top=3), c),
                "maxsim top4": lambda: pick(window_maxsim(emb, cq, c.pool_window, top=4), c),
                "maxsim top5": lambda: pick(window_maxsim(emb, cq, c.pool_window, top=5), c),
                "max+maxsim": lambda: pick(standardize(max_pool((emb.float() @ cq.float().T).amax(1), c.pool_window))
                                           + standardize(window_maxsim(emb, cq, c.pool_window)), c),
                "maxsim top2": lambda: pick(window_maxsim(emb, cq, c.pool_window, top=2), c),
                "maxsim-idf top3": lambda: pick(window_maxsim(emb, cq, c.pool_window, cidf.clamp_min(0.1), top=3), c),
                "maxsim+peaks": lambda: pick(peaks(window_maxsim(emb, cq, c.pool_window), cq, c), c),
                "maxsim-idf+peaks": lambda: pick(peaks(window_maxsim(emb, cq, c.pool_window, cidf.clamp_min(0.1)), cq, c), c),
                # the documents default (reform+rag:retriever=dense+bm25:pool_passages=true), and the same mix
                # over REFORM's maxsim ranking of the content tokens
                "documents default": lambda: pick(mixed_ranking(ranking, [dense_tokens, bm25_tokens], 0.5,
                                                                c.pool_window), c),
                "documents default (maxsim)": lambda: pick(mixed_ranking(window_maxsim(emb, cq, c.pool_window),
                                                                        [dense_tokens, bm25_tokens], 0.5, c.pool_window), c),
                "rag-dense": lambda: passages_kept(dense, dense.scores(question), c.recompute_budget),
                "rag-bm25": lambda: passages_kept(bm25, bm25.scores(question), c.recompute_budget),
                "default, 2x budget": lambda: variant_method(method, recompute_budget=2 * c.recompute_budget)
                .select_scored(ctx, part, None)[0],
            }
            for variant in only or []:      # REFORM options: "opt:key=value+key=value", content tokens unless said
                if variant.startswith("opt:"):     # "stop=sklearn": another stop-word list for the content tokens
                    kept[variant] = lambda v=variant: opt_gather(method, ctx, part, options(v[4:]))
                if variant.startswith("documents:"):   # "documents:H+H[|key=value+...]": the documents default on a subset of the heads
                    ctx.extra.setdefault("all_passages", {}).update(dense=dense, bm25=bm25)   # the indexes built above
                    names, _, opts = variant[10:].partition("|")
                    kept[variant] = lambda names=names, opts=opts: with_rag(
                        head_subset(ctx, names), part, 0, retriever="dense+bm25", pool_passages=True,
                        **(options(opts) if opts else {}))
                if variant.startswith("heads:"):   # "heads:H+H[|key=value+...]": REFORM on a subset of the heads
                    names, _, opts = variant[6:].partition("|")
                    kept[variant] = lambda names=names, opts=opts: subset_gather(ctx, part, names, opts)
            for variant, gather in kept.items():
                if (only and variant not in only) or (variant, row.meta["question_id"]) in done:
                    continue
                k = gather()
                flag, = spans_kept(ctx.source.token_starts, len(ctx.source.document.text), k, row.meta["evidence_spans"])
                out.write(json.dumps({"variant": variant, "document": name, "id": row.meta["question_id"],
                                      "kept": bool(flag), "tokens": int(k.numel())}) + "\n")
            out.flush()

results = [json.loads(line) for line in out_path.read_text().splitlines()]
print(f"{'variant':32} " + " ".join(f"{n:>18}" for n in TASKS) + "   all")
for variant in dict.fromkeys(r["variant"] for r in results):
    cells, total, n = [], 0, 0
    for name in TASKS:
        got = [r["kept"] for r in results if r["variant"] == variant and r["document"] == name]
        cells.append(f"{sum(got):>12}/{len(got):<5}")
        total, n = total + sum(got), n + len(got)
    print(f"{variant:32} " + " ".join(cells) + f"  {total}/{n} = {100 * total / max(n, 1):.1f} %")
