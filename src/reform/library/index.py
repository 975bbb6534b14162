"""The first stage of a library question (docs/library.md): every passage of every document scored by BM25
and by dense cosine, one index over the whole library, so that both scores are comparable across documents
(one BM25 vocabulary and IDF, one embedding model). Documents are ranked by their best passage, and only the
best few go on to REFORM's token gather. Its cost grows with the number of passages, a matrix-vector
product and a sparse lookup; the token gather's and the recompute's do not grow with the library."""

from __future__ import annotations

import torch

from ..methods.reform_rag import standardize
from ..methods.retrievers import BM25, Dense
from .catalog import Passages


class LibraryIndex:
    """BM25 and dense indexes over the passages of ``names`` (``passages`` in the same order)."""

    def __init__(self, names: list[str], passages: list[Passages], device="cpu"):
        self.names = names
        self.spans = [p.spans for p in passages]
        sizes = [len(p.texts) for p in passages]
        self.owner = torch.repeat_interleave(torch.arange(len(names)), torch.tensor(sizes, dtype=torch.long))
        self.starts = [0, *torch.tensor(sizes).cumsum(0).tolist()]
        texts = [t for p in passages for t in p.texts]
        self.dense = torch.cat([p.dense.float() for p in passages]) if texts else torch.zeros(0, 1)
        self.bm25 = BM25()
        self.bm25_index = self.bm25.index(texts) if texts else None
        self.dense_model = Dense(device)

    def scores(self, question: str) -> dict[str, torch.Tensor]:
        """Every passage's score for ``question`` by each retriever: ``{"dense": [P], "bm25": [P]}``."""
        return {"dense": self.dense_model.scores(self.dense, question).float(),
                "bm25": self.bm25.scores(self.bm25_index, question).float()}

    def of(self, scores: torch.Tensor, document: int) -> torch.Tensor:
        """The scores of ``document``'s passages out of scores of every passage."""
        return scores[self.starts[document]:self.starts[document + 1]]

    def rank(self, scores: dict[str, torch.Tensor], among: list[int]) -> list[tuple[int, float]]:
        """``among``'s documents by their best passage, best first, each with that score: the mean of the
        retrievers' standardised scores (standardised over ``among``'s passages)."""
        chosen = torch.isin(self.owner, torch.tensor(among, dtype=torch.long))
        fused = torch.full_like(scores["dense"], float("-inf"))
        fused[chosen] = sum(standardize(s[chosen]) for s in scores.values()) / len(scores)
        best = torch.full((len(self.names),), float("-inf")).scatter_reduce(0, self.owner, fused, "amax")
        order = sorted(among, key=lambda d: -float(best[d]))
        return [(d, float(best[d])) for d in order]
