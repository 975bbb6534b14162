"""The paper's real-task benchmarks read from their official files, with their official prompts and
scorers (REFORM §4.2): ∞-Bench (:mod:`.infinitebench`). Part of ``reform.eval`` (docs/architecture.md)."""
