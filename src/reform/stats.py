"""Timings and peak memory reported with every answer."""

from __future__ import annotations

import resource
import sys
import time
from contextlib import contextmanager

import torch


def peak_memory_mb() -> float:
    """Peak resident memory of this process so far (MB); on CUDA, the peak allocated GPU memory is added."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    mb = rss / 1024 if sys.platform != "darwin" else rss / 2**20   # Linux reports KiB, macOS bytes
    return round(mb, 1)


def peak_cuda_mb() -> float | None:
    return round(torch.cuda.max_memory_allocated() / 2**20, 1) if torch.cuda.is_available() else None


class Timer:
    """Accumulates wall seconds per named stage."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    @contextmanager
    def stage(self, name: str):
        t = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - t)

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds
