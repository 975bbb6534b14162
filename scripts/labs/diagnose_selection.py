"""Retrieval or reading? For recompute methods (reform, ilre, rag-*), check whether the tokens a method
selects for recomputation contain the NIAH needle, and whether the answer is right; for ReAttention, in
how many layers the question and the first answer token have the needle's value in their attention scope.

    python scripts/labs/diagnose_selection.py --method ilre --lengths 16k,32k --depths 0.25,0.5 [--option retrieval_layer=14] [--json]
    python scripts/labs/diagnose_selection.py --method reattention --lengths 16k,32k --depths 0.5

Rows are `reform eval niah`'s (same seed), so a miss in its table can be traced here: "selected" says
the needle's value survived selection (a miss then is a reading failure), "needle sentence" whether the
whole sentence did. ReAttention selects per layer and per block: "question scope" / "first token scope"
count the layers whose selection holds every token of the value, out of all layers.
"""

from __future__ import annotations

import argparse
import json

import torch

from reform.eval.explain import token_span
from reform.eval.specs import option_value, parse_lengths
from reform.eval.tasks import niah
from reform.methods.reattention import ReAttentionPolicy
from reform.pipeline import Pipeline
from reform.stats import Timer


def value_span(tok, ids: torch.Tensor, value: str) -> range:
    """The shortest run of context tokens whose text holds ``value``."""
    return token_span(tok, ids, value)


class ScopeRecorder:
    """Wraps ReAttentionPolicy.selection: per layer, whether each block's selection covers ``needle``."""

    def __init__(self):
        self.needle, self.layer, self.hits = None, 0, {}
        arrange, selection = ReAttentionPolicy.arrange, ReAttentionPolicy.selection

        def arrange_(policy, layer, *args):
            self.layer = layer
            return arrange(policy, layer, *args)

        def selection_(policy, q, store):
            idx = selection(policy, q, store)
            if self.needle is not None:
                covered = bool(torch.isin(torch.tensor(list(self.needle)), idx.cpu()).all())
                self.hits.setdefault(self.layer, []).append(covered)
            return idx

        ReAttentionPolicy.arrange, ReAttentionPolicy.selection = arrange_, selection_

    def counts(self) -> dict:
        per_block = lambda b: sum(h[b] for h in self.hits.values() if len(h) > b)
        return {"question scope": f"{per_block(0)}/{len(self.hits)}", "first token scope": f"{per_block(1)}/{len(self.hits)}"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--method", default="ilre")
    ap.add_argument("--lengths", default="16k")
    ap.add_argument("--depths", default="0,0.25,0.5,0.75,1")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", default=None)
    ap.add_argument("--option", action="append", default=[], help="method option KEY=VALUE (repeatable)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    options = {k: option_value(v) for k, v in (o.split("=", 1) for o in a.option)}
    pipe = Pipeline.load(a.model, method=a.method, **options)
    tok = pipe.tokenizer
    recorder = ScopeRecorder() if a.method == "reattention" else None
    depths = [float(d) for d in a.depths.split(",")]
    for length in parse_lengths(a.lengths):
        for row in niah.generate("niah", tok, length, 1, a.seed, depths=depths):
            ctx = pipe.encode(row.context)
            out = {"method": a.method, **options, "length": length, "depth": row.depth, "tokens": int(ctx.ids.shape[0])}
            if recorder:
                recorder.needle, recorder.hits = value_span(tok, ctx.ids, row.answers[0]), {}
                out["value tokens"] = f"{recorder.needle.start}-{recorder.needle.stop - 1}"
            else:
                part = pipe.templater.question(row.question, row.answer_prefix)
                with torch.inference_mode():
                    picked = pipe.method.select(ctx, part, Timer())
                kept = tok.decode(ctx.ids[picked].tolist())
                needle = f"The special magic number for {row.question.split(' for ', 1)[1].split(' mentioned')[0]}"
                out |= {"selected": row.answers[0] in kept, "needle sentence": f"{needle} is {row.answers[0]}" in kept}
            answer = ctx.ask(row.question, answer_prefix=row.answer_prefix, max_new_tokens=row.max_new_tokens)
            out |= (recorder.counts() if recorder else {}) | {"correct": row.answers[0] in answer.text,
                                                              "answer": answer.text[:60]}
            print(json.dumps(out) if a.json else "  ".join(f"{k}={v}" for k, v in out.items()), flush=True)


if __name__ == "__main__":
    main()
