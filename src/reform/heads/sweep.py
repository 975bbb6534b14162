"""A quick embedding-head sweep by MNR (mean normalised rank, REFORM §3.2 / appendix C.1-C.2).

Each sample is a window-sized haystack with one fact hidden in it and a question about the fact. The
context is encoded with REFORM's own recurrent H2O pass (256-token heavy-hitter budget, as in the
paper's head study) while the pre-RoPE Q/K/V states of every head below the depth limit are stored;
each head then scores context tokens by cosine similarity to the question tokens (max over question
tokens, mean over a 20-token window), and MNR is the mean rank of the fact's tokens divided by the
context length (lower is better).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..engine.cache import KVCache
from ..engine.extractors import HeadEmbeddings, HeadSpec
from ..engine.layout import as_tensor
from ..engine.policies import H2O
from ..data.haystack import haystack, magic_number_needle


def mean_normalised_rank(scores: torch.Tensor, gold: torch.Tensor) -> float:
    """Mean over gold positions of (rank of the token's score among all scores) / number of tokens."""
    order = scores.argsort(descending=True)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(scores.shape[0], device=scores.device)
    return float(rank[gold].float().mean() / scores.shape[0])


def smooth_mean(scores: torch.Tensor, window: int = 20) -> torch.Tensor:
    return F.avg_pool1d(scores[None, None], window + 1, stride=1, padding=window // 2,
                        count_include_pad=False)[0, 0][: scores.shape[0]]


def kv_fact_needle(rng: random.Random):
    """Pattern-matching fact: "The value corresponding to the id {key} is {value}." (random 10-char ids)."""
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    key = "".join(rng.choice(alphabet) for _ in range(10))
    value = "".join(rng.choice(alphabet) for _ in range(10))
    return (f"The value corresponding to the id {key} is {value}.",
            f"What is the value corresponding to the id {key}?")


@dataclass
class SweepResult:
    heads: list[HeadSpec]
    mnr: torch.Tensor          # [n_tasks, n_heads]: mean over each task's samples
    tasks: tuple[str, ...] = ("kv-fact", "magic-number")

    def best(self, k: int, task: int | None = None) -> list[tuple[HeadSpec, float]]:
        mnr = self.mnr.mean(0) if task is None else self.mnr[task]
        return [(self.heads[i], float(mnr[i])) for i in mnr.argsort()[:k]]

    def select(self, per_task: int = 2) -> list[HeadSpec]:
        """The ``per_task`` best heads of each task, skipping heads already chosen (appendix C.6)."""
        chosen: list[HeadSpec] = []
        for t in range(len(self.tasks)):
            ranked = [h for h, _ in self.best(len(self.heads), t) if h not in chosen]
            chosen += ranked[:per_task]
        return chosen


def sweep(pipe, *, samples: int = 8, length: int | None = None, max_depth: float = 0.7, seed: int = 0,
          budget: int = 256, chunk_size: int | None = None, progress=None) -> SweepResult:
    eng, tmpl = pipe.engine, pipe.templater
    shape = eng.shape
    n_layers = max(1, int(max_depth * shape.n_layers))
    heads = [HeadSpec(l, kind, h) for l in range(n_layers) for kind in "qkv"
             for h in range(shape.n_heads if kind == "q" else shape.n_kv_heads)]
    length = length or shape.window - 512
    chunk_size = chunk_size or shape.window // 4
    rng = random.Random(seed)
    count = lambda t: len(tmpl.encode(t))
    totals = torch.zeros(2, len(heads))
    for s in range(samples):
        fact, question = kv_fact_needle(rng) if s % 2 == 0 else (lambda n: (n.sentence, n.question))(
            magic_number_needle(rng))
        paras = haystack(length, count, rng=rng)
        at = rng.randint(1, len(paras) - 1)
        before = tmpl.context("\n\n".join(paras[:at]) + "\n\n")
        fact_ids = tmpl.encode(fact)
        ids = before + fact_ids + tmpl.encode("\n\n" + "\n\n".join(paras[at:]))
        gold = torch.arange(len(before), len(before) + len(fact_ids))
        part = tmpl.question(question)
        emb = HeadEmbeddings(heads, shape, len(ids), eng.device)
        cache = KVCache.empty(n_layers)
        eng.prefill(as_tensor(ids, eng.device), cache, chunk_size=chunk_size, hook=emb,
                    policy=H2O(budget, min(64, budget // 4), min(64, budget // 4)))
        q_emb = HeadEmbeddings(heads, shape, len(part.ids), eng.device)
        q_emb.begin(0, len(part.ids))
        eng.forward(as_tensor(part.ids, eng.device), cache, hook=q_emb)
        d = shape.head_dim
        ctx, qry = emb.data.float(), q_emb.data[part.query_span].float()
        for j in range(len(heads)):
            sim = (ctx[:, j * d:(j + 1) * d] @ qry[:, j * d:(j + 1) * d].T).amax(-1)
            totals[s % 2, j] += mean_normalised_rank(smooth_mean(sim), gold)
        if progress:
            progress(1)
    return SweepResult(heads, totals / torch.tensor([(samples + 1) // 2, samples // 2]).clamp(min=1)[:, None])
