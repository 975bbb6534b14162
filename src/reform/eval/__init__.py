"""Evaluation: task generators (NIAH, RULER-style, BABILong-style), scorers and the runner."""

from .rows import Row, write_rows

__all__ = ["Row", "write_rows"]
