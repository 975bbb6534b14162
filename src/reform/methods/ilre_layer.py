"""ILRe's retrieval-layer choice (arXiv 2508.17892 §3.2, appendix A.1): a passkey retrieval sweep.

Each sample hides "The <KEY_ID> magic passkey is <digits>." (key id: three common words and a two-digit
number, e.g. ``blue-cup-red-33``) at the start of one of 20 equal segments of filler prose, with passkeys
of several lengths; the query part asks "What's the <KEY_ID> magic passkey?" with the answer prefix
"The <KEY_ID> magic passkey is ". Every candidate layer l is scored as ILRe with l_R = l would score it:
the streaming chunked prefill below l (sink + sliding window), the query's softmax attention over the
layer's context keys, the pooling-bank allocation of ``budget`` tokens (1024 in the paper). Because the
layers below l run the same whatever layer is chosen, one streaming pass through all layers yields every
layer's keys and queries at once.

Recall of a layer = the fraction of passkey tokens among the selected ones, averaged over samples (the
paper's "exact match" reading, all of the passkey selected, is reported beside it); the chosen layer is
the smallest index among those with the highest recall (§3.2).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Callable

import torch

from ..data.haystack import haystack
from ..engine.cache import KVCache
from ..engine.layout import QuestionPart, Templater, as_tensor
from ..engine.policies import StreamingLLMPolicy
from .ilre import ILReConfig, LayerStates, allocate, attention_scores, key_positions, stream

WORDS = ["dog", "cat", "yellow", "red", "blue", "cup", "green", "house", "tree", "river", "apple", "stone",
         "bird", "chair", "cloud", "lamp", "horse", "window", "bread", "garden", "silver", "ocean", "paper", "road"]
DIGITS = (6, 12, 24)            # passkey lengths, cycled over samples (the paper varies them, unstated)
SEGMENTS = 20


@dataclass
class PasskeySample:
    ids: list[int]
    part: QuestionPart
    gold: torch.Tensor          # positions of the passkey's tokens in ``ids``


def passkey_sample(tmpl: Templater, length: int, rng: random.Random, segment: int, digits: int) -> PasskeySample:
    """A ~``length``-token context with the needle at the start of ``segment`` of 20 (appendix A.1)."""
    key = "-".join(rng.sample(WORDS, 3)) + f"-{rng.randint(10, 99)}"
    value = str(rng.randrange(10 ** digits)).zfill(digits)
    paras = haystack(length, lambda t: len(tmpl.encode(t)), rng=rng)
    filler = tmpl.encode("\n\n".join(paras))[:length]
    cut = round(len(filler) * segment / SEGMENTS)
    before, after = filler[:cut], filler[cut:]
    head = list(tmpl.prefix) + before + tmpl.encode(f"\n\nThe {key} magic passkey is ")
    value_ids = tmpl.encode(value)
    ids = head + value_ids + tmpl.encode(".\n") + after
    part = tmpl.question(f"What's the {key} magic passkey?", f"The {key} magic passkey is ")
    return PasskeySample(ids, part, torch.arange(len(head), len(head) + len(value_ids)))


@torch.inference_mode()
def sample_recalls(pipe, sample: PasskeySample, config: ILReConfig, budget: int) -> tuple[list[float], list[bool]]:
    """Per layer: fraction of the passkey's tokens ILRe with l_R = layer selects, and whether all are."""
    engine, s = pipe.engine, pipe.engine.shape
    ids, n = as_tensor(sample.ids, engine.device), len(sample.ids)
    keys = LayerStates(range(s.n_layers), "k", s.n_kv_heads, n, s.head_dim, config.key_dtype, engine.device)
    cache = KVCache.empty(s.n_layers)
    policy = StreamingLLMPolicy(config.cache_budget, config.keep_first)
    stream(engine, ids, cache, chunk_size=config.chunk_size, sink=config.keep_first, policy=policy, hook=keys)
    queries = LayerStates(range(s.n_layers), "q", s.n_heads, len(sample.part.ids), s.head_dim, engine.dtype,
                          engine.device)
    engine.forward(as_tensor(sample.part.ids, engine.device), cache, hook=queries)   # one more streaming chunk
    q_pos = torch.arange(n, n + len(sample.part.ids), device=engine.device)
    k_pos = key_positions(n, config.chunk_size, config.keep_first, config.dca, engine.device)
    gold, fractions, exact = sample.gold.to(engine.device), [], []
    for layer in range(s.n_layers):
        scores = attention_scores(engine, layer, queries.states[layer], q_pos, keys.states[layer], k_pos)
        hit = torch.isin(gold, allocate(scores, budget, config.keep_first, config.max_kernels, config.avg_kernels))
        fractions.append(float(hit.float().mean()))
        exact.append(bool(hit.all()))
    return fractions, exact


def select_layer(pipe, *, samples: int = 6, length: int | None = None, budget: int = 1024, seed: int = 0,
                 progress: Callable[[int], None] | None = None) -> dict:
    """Run the sweep; returns the chosen layer, per-layer recalls and the settings (JSON-ready)."""
    shape = pipe.engine.shape
    length = length or shape.window - 512
    config = ILReConfig(retrieval_layer=0).resolve(shape)          # ILRe's default streaming settings
    if budget >= length:
        raise ValueError(f"budget ({budget}) must be smaller than the sample length ({length})")
    rng, t0 = random.Random(seed), time.perf_counter()
    per_sample = []
    for i in range(samples):
        segment = (i * SEGMENTS) // samples                       # spread over the 20 depths
        sample = passkey_sample(pipe.templater, length, rng, segment, DIGITS[i % len(DIGITS)])
        per_sample.append(sample_recalls(pipe, sample, config, budget))
        if progress is not None:
            progress(1)
    recall = [sum(f[layer] for f, _ in per_sample) / samples for layer in range(shape.n_layers)]
    exact = [sum(e[layer] for _, e in per_sample) / samples for layer in range(shape.n_layers)]
    best = max(recall)
    return {"model": pipe.model_name, "retrieval_layer": next(i for i, r in enumerate(recall) if r >= best - 1e-9),
            "layer_indexing": "0-based decoder layer index", "recall": [round(r, 4) for r in recall],
            "exact": [round(e, 4) for e in exact], "samples": samples, "length": length, "budget": budget,
            "seed": seed, "digits": list(DIGITS), "seconds": round(time.perf_counter() - t0, 1),
            "rule": "smallest layer index with the highest mean passkey-token recall (ILRe §3.2)"}
