"""Which of a question's tokens search a context, and how loudly each one votes."""

from __future__ import annotations

import torch

from .retrievers import import_bm25s

QUERY_WEIGHTS = ("uniform", "idf")


def content_tokens(tokenizer, ids: list[int], stop_words: frozenset[str] | None = None) -> torch.Tensor:
    """Which of ``ids`` (a question's tokens) carry content: decoded alone, neither an English stop word
    (``stop_words``; by default bm25s's list, as BM25 drops them) nor whitespace or punctuation alone; all of
    them where none would."""
    if stop_words is None:
        stop_words = import_bm25s().stopwords.STOPWORDS_EN
    words = [tokenizer.decode([i]).strip().lower() for i in ids]
    keep = torch.tensor([bool(w) and w not in stop_words and any(ch.isalnum() for ch in w) for w in words],
                        dtype=torch.bool)
    return keep if keep.any() else torch.ones_like(keep)


def block_frequencies(context_ids: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The distinct token ids of ``context_ids`` [N], how many of its ``block``-token pieces hold each, and
    the number of pieces: a context's document frequencies, its pieces standing for documents."""
    ids = context_ids.long().cpu()
    pieces = -(-ids.shape[0] // block)
    pairs = torch.unique(torch.arange(ids.shape[0]) // block * (int(ids.max()) + 1) + ids)   # (piece, token) once
    tokens, counts = torch.unique(pairs % (int(ids.max()) + 1), return_counts=True)
    return tokens, counts, pieces


def rarity_weights(context_ids: torch.Tensor, query_ids: torch.Tensor, block: int) -> torch.Tensor:
    """BM25's IDF of each of ``query_ids`` [Q] over the ``block``-token pieces of ``context_ids``:
    ln(1 + (P - df + 0.5) / (df + 0.5)), P pieces, df of them holding the token (0 for a token the context
    lacks). A name on every page weighs little, the one word only the answer's page holds weighs most."""
    tokens, counts, pieces = block_frequencies(context_ids, block)
    q = query_ids.long().cpu()
    at = torch.searchsorted(tokens, q).clamp(max=max(0, tokens.shape[0] - 1))
    df = torch.where(tokens[at] == q, counts[at], 0).float() if tokens.numel() else torch.zeros(q.shape[0])
    return torch.log1p((pieces - df + 0.5) / (df + 0.5)).clamp_min(1e-3)
