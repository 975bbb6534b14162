"""Gather variants on a real book: does the recomputed set hold the gold page / the answer string? (a lab)

    python scripts/labs/book_gather_lab.py MODEL CONTEXT.reform BOOK.pdf questions.json

encodes the book with REFORM once (saved to CONTEXT.reform), then gathers each question with every variant:
the default (run_peaks), the paper's scores, centred embeddings (hubs), each question token less its own
high percentile over the context (common words), both, and the sum of the best three question tokens."""
import json, sys, time
from pathlib import Path
import torch
torch.manual_seed(0)        # the question-token baselines sample 20,000 context tokens
from reform import Pipeline
from reform.documents import extract
from reform.methods.reform import token_scores, max_pool, gather_indices
from reform.documents.evidence import passages

model, ctx_path, book_path, qpath = sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4]
variants = sys.argv[5].split(",") if len(sys.argv) > 5 else None
pipe = Pipeline.load(None if model == "smollm2" else model, method="reform")   # REFORM for documents too
if ctx_path.exists():
    ctx = pipe.load_context(ctx_path)
else:
    t = time.time(); ctx = pipe.encode(extract(book_path)); print("encode", time.time() - t, flush=True); ctx.save(ctx_path)
method, c = ctx.method, ctx.method.config
emb = ctx.state.data            # [N, E] fp16
H = len(c.heads); D = emb.shape[1] // H
questions = json.loads(Path(qpath).read_text())
text = ctx.source.document.text

def per_head_norm(x):
    x = x.float().view(x.shape[0], H, D)
    return (x / x.norm(dim=-1, keepdim=True).clamp_min(1e-6)).view(x.shape[0], H * D)

mean = emb.float().view(-1, H, D).mean(0)           # per head mean
centered = per_head_norm((emb.float().view(-1, H, D) - mean).view(-1, H * D))

def sims(context, query, block=1 << 15):
    """[N, Q] would be too big at 1M; the book is 160k x ~20: fine here (lab only)."""
    return context.float() @ query.float().T

def evaluate(name, kept, scores, q):
    gathered = pipe.tokenizer.decode(ctx.ids[kept].tolist())
    ev = passages(ctx.source, kept, scores)
    page = q["page"]
    inside = lambda ps: any(p.page is not None and p.page <= page <= (p.page_end or p.page) for p in ps)
    return {"variant": name, "id": q["id"], "answer_in_gathered": any(a.lower() in gathered.lower() for a in q["answers"]),
            "gold_page_recomputed": inside(ev), "gold_page_top3": inside(ev[:3])}

rows = []
for q in questions:
    part = pipe.templater.question(q["question"])
    query = method.query_embeddings(ctx, part)          # [Q, E]
    S = sims(emb, query)                                  # [N, Q]
    keep = lambda s: gather_indices(max_pool(s, c.pool_window), c.recompute_budget, c.gather_keep, c.gather_keep)
    def pick(s):
        pooled = max_pool(s, c.pool_window); k = gather_indices(pooled, c.recompute_budget, c.gather_keep, c.gather_keep); return k, pooled[k]
    out = {}
    out["default"] = (method.select_scored(ctx, part, None))
    s = S.amax(1); out["paper"] = pick(s)
    qc = per_head_norm((query.float().view(-1, H, D) - mean).view(-1, H * D))
    Sc = sims(centered, qc)
    s = Sc.amax(1); out["centred"] = pick(s)
    # each question token's own baseline: its 99.9th percentile over the context (common words match everywhere)
    for pct in (0.99, 0.999):
        base = torch.quantile(S[torch.randint(0, S.shape[0], (20000,))], pct, dim=0)
        s = (S - base).amax(1); out[f"qbase{pct}"] = pick(s)
        basec = torch.quantile(Sc[torch.randint(0, Sc.shape[0], (20000,))], pct, dim=0)
        s = (Sc - basec).amax(1); out[f"centred+qbase{pct}"] = pick(s)
    # sum over the top-3 question tokens instead of the max
    s = S.topk(min(3, S.shape[1]), dim=1).values.sum(1); out["top3sum"] = pick(s)
    for name, (kept, scores) in out.items():
        if variants and name not in variants: continue
        rows.append(evaluate(name, kept, scores, q))
summary = {}
for r in rows:
    s = summary.setdefault(r["variant"], [0, 0, 0, 0])
    s[0] += r["answer_in_gathered"]; s[1] += r["gold_page_recomputed"]; s[2] += r["gold_page_top3"]; s[3] += 1
print(f"{'variant':24} answer-in-gathered  gold-page-recomputed  gold-page-top3")
for k, (a, b, c3, n) in summary.items():
    print(f"{k:24} {a:2}/{n}               {b:2}/{n}                 {c3:2}/{n}")
for r in rows:
    print(json.dumps(r))
