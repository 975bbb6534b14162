"""Benchmark harness: wall time per stage, peak memory and FLOP efficiency per method and length. Layer 6 of docs/architecture.md
(measuring), above ``reform.eval`` (whose method specs and plots it reuses)."""
