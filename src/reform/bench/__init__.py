"""Benchmark harness: wall time per stage, peak memory and FLOP efficiency per method and length."""
