"""Timings and peak memory reported with every answer."""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch


_STATUS = Path("/proc/self/status")


def peak_memory_mb() -> float:
    """Peak resident memory (MB) of this process since start or since the last ``reset_peak_memory``."""
    if _STATUS.exists():   # Linux: VmHWM, the high-water mark that reset_peak_memory can clear
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    try:
        import resource               # POSIX only: Windows has neither it nor /proc
    except ImportError:
        return 0.0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    mb = rss / 1024 if sys.platform != "darwin" else rss / 2**20   # Linux reports KiB, macOS bytes
    return round(mb, 1)


def current_memory_mb() -> float | None:
    """Resident memory (MB) of this process now (Linux ``VmRSS``; None elsewhere)."""
    if _STATUS.exists():
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    return None


def reset_peak_memory() -> bool:
    """Start a new peak-memory measurement (the benchmark runs many inputs in one process): clears the
    RSS high-water mark on Linux (``/proc/self/clear_refs``) and CUDA's peak. False if RSS cannot be reset."""
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


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
