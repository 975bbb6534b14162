"""Why a gold string was not gathered: one screen per retrieval miss (``reform eval ... --explain``).

REFORM's gather (paper §3.3, appendix C.6) scores every context token by the cosine of its retrieval
embedding to each question token (the mean over the embedding heads, §3.2), takes the maximum over the
question tokens, max-pools it over 129 tokens and keeps the top ``recompute_budget`` tokens with the
first and last ``gather_keep`` always among them. A gold string is gathered when all its tokens are
kept. For a missed one this says:

- **where it stands**: the lowest pooled score over its tokens (what the whole string needs), how many
  tokens score above it, and the budget at which it would have been gathered, beside the score the
  last gathered token had (the threshold);
- **which question tokens** score it best, and **which heads**: per head, the best cosine into the string
  and how many context tokens that head scores higher (its rank);
- **what outranks it**: the best-scoring windows above it (their text, depth, the question token that
  scores them, and whether they hold another gold string); under ``query_aggregate="maxsim"`` the peaks
  are the pooled window scores and the token named is the question token that window matches best.

Works for every method with gather scores (``scores(ctx, part)``: REFORM, REFORM+RAG, ILRe); the
question-token, per-head and outranking lines need REFORM's retrieval embeddings (``query_embeddings``;
for REFORM+RAG they show its REFORM half).
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..engine.policies import forced_mask
from ..methods.reform import distinct_peaks

PEAKS = 5              # outranking windows shown
QUERY_TOKENS = 3       # question tokens shown per gold string
SNIPPET = 12           # tokens of text shown on each side of a peak


def token_span(tokenizer, ids: torch.Tensor, text: str) -> range | None:
    """The shortest run of ``ids`` whose decoded text holds ``text`` (two binary searches on its ends);
    None when the whole context does not hold it."""
    ids = ids.tolist()
    holds = lambda a, b: text in tokenizer.decode(ids[a:b])
    if not holds(0, len(ids)):
        return None
    lo, hi = 1, len(ids)
    while lo < hi:                        # smallest end b with the text inside ids[:b]
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if holds(0, mid) else (mid + 1, hi)
    end, lo, hi = lo, 0, lo - 1
    while lo < hi:                        # largest start a with the text inside ids[a:end]
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if holds(mid, end) else (lo, mid - 1)
    return range(lo, end)


def explain(ctx, part, golds: Sequence[str], kept: torch.Tensor) -> dict:
    """The gather's view of ``golds`` for the question ``part`` (a ``QuestionPart``) asked of ``ctx``
    (``kept``: the indices the method gathered). JSON-ready; ``render`` lays it out."""
    method, tok, ids = ctx.method, ctx.pipeline.tokenizer, ctx.ids
    c, n = method.config, ids.shape[0]
    ends = getattr(c, "gather_keep", getattr(c, "keep_first", 0))     # ILRe keeps the first tokens alone
    window = getattr(c, "pool_window", 1)
    pooled = method.scores(ctx, part).float().cpu()
    forced = forced_mask(n, ends, ends if hasattr(c, "gather_keep") else 0, torch.device("cpu"))
    chosen = torch.zeros(n, dtype=torch.bool)
    chosen[kept.cpu()] = True
    free = chosen & ~forced
    threshold = float(pooled[free].min()) if free.any() else None
    spans = [token_span(tok, ids, g) for g in golds]
    per_token, per_head, query_text = per_token_scores(ctx, part)
    out = {"tokens": n, "budget": int(c.recompute_budget), "gather_keep": int(ends),
           "threshold": threshold, "golds": [], "peaks": []}
    for gold, span in zip(golds, spans):
        if span is None:
            out["golds"].append({"text": gold, "found": False})
            continue
        a, b = span.start, span.stop
        need = float(pooled[a:b].min())
        above = int(((pooled > need) & ~forced).sum())
        entry = {"text": gold, "found": True, "span": [a, b], "depth": round(a / n, 4),
                 "kept": bool(chosen[a:b].all()), "score": round(need, 4), "tokens_above": above,
                 "budget_needed": min(n, above + (b - a) + int(forced.sum()))}
        if per_token is not None:
            best = per_token[a:b].amax(dim=0)                      # [Q]: each question token's best cosine
            top = best.topk(min(QUERY_TOKENS, best.numel()))
            entry["query_tokens"] = [[query_text[int(q)], round(float(v), 4)] for v, q in zip(top.values, top.indices)]
            # per head: the best cosine into the string, and how many context tokens that head scores higher
            entry["heads"] = []
            for spec, scores in zip(c.heads, per_head):
                into = float(scores[a:b].max())
                entry["heads"].append([str(spec), round(into, 4), int((scores > into).sum())])
        out["golds"].append(entry)
    lowest = min((g["score"] for g in out["golds"] if g.get("found") and not g["kept"]), default=None)
    if per_token is not None and lowest is not None:
        maxsim = getattr(c, "query_aggregate", "max") == "maxsim"     # windows scored whole: peaks of pooled
        raw = pooled if maxsim else per_token.amax(dim=1)
        for p in distinct_peaks(raw, window, PEAKS, forced, floor=lowest):
            around = per_token[max(0, p - window // 2):p + window // 2 + 1] if maxsim else per_token[p:p + 1]
            q = int(around.amax(dim=0).argmax())
            out["peaks"].append({"at": p, "depth": round(p / n, 4), "score": round(float(raw[p]), 4),
                                 "query_token": query_text[q],
                                 "gold": next((golds[i] for i, s in enumerate(spans) if s is not None and p in s), None),
                                 "text": tok.decode(ids[max(0, p - SNIPPET):p + SNIPPET].tolist())})
    return out


def per_token_scores(ctx, part) -> tuple[torch.Tensor | None, list[torch.Tensor], list[str]]:
    """``(scores [N, Q] on the gather's scale (per-head cosines summed over the heads), per head [N] (the
    cosine, max over question tokens), question token texts)`` from REFORM's retrieval embeddings;
    ``(None, [], [])`` for a method without them."""
    method = ctx.method
    if not hasattr(method, "query_embeddings") or ctx.state is None:
        return None, [], []
    query = method.query_embeddings(ctx, part).float()
    heads, data = len(method.config.heads), ctx.state.data
    d = data.shape[1] // heads
    per_token = torch.cat([data[s:s + 65536].float() @ query.T for s in range(0, data.shape[0], 65536)])
    per_head = [torch.cat([(data[s:s + 65536, h * d:(h + 1) * d].float() @ query[:, h * d:(h + 1) * d].T).amax(dim=1)
                           for s in range(0, data.shape[0], 65536)]) for h in range(heads)]
    tok = ctx.pipeline.tokenizer
    texts = [tok.decode([t]) for t, searches in zip(part.search_question, method.searching(ctx, part)) if searches]
    return per_token, per_head, texts


def render(row_id: str, question: str, report: dict) -> str:
    """One screen of text for one missed row."""
    lines = [f"### {row_id}", f"question: {question!r}",
             f"{report['tokens']} context tokens; budget {report['budget']} ({report['gather_keep']} always kept at "
             f"the ends); last gathered score {fmt(report['threshold'])}"]
    for g in report["golds"]:
        if not g.get("found"):
            lines.append(f"- {g['text']!r}: not in the context as one string")
            continue
        mark = "gathered" if g["kept"] else "MISSED"
        lines.append(f"- {mark} {g['text']!r} at {g['depth']:.0%} (tokens {g['span'][0]}-{g['span'][1]}): score "
                     f"{g['score']:.4f}, {g['tokens_above']} tokens above it, gathered from a budget of "
                     f"{g['budget_needed']}")
        if "query_tokens" in g:
            lines.append("  best question tokens: " + ", ".join(f"{t!r} {v:.3f}" for t, v in g["query_tokens"]))
            lines.append("  heads (best cosine, tokens above): " + ", ".join(f"{h} {v:.3f} ({r})" for h, v, r in g["heads"]))
    if report["peaks"]:
        lines.append("outranked by:")
        for p in report["peaks"]:
            where = f" [gold {p['gold']!r}]" if p["gold"] else ""
            lines.append(f"  {p['score']:.4f} at {p['depth']:.0%} via {p['query_token']!r}{where}: "
                         f"{' '.join(p['text'].split())!r}")
    return "\n".join(lines)


def fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4f}"
