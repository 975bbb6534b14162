"""Evaluation: task generators (NIAH, RULER-style, BABILong-style), scorers and the runner. Layer 6 of docs/architecture.md (measuring),
below ``reform.bench``."""

from .rows import Row, write_rows

__all__ = ["Row", "write_rows"]
