"""The preset's three NIAH misses (fp32 draws, seeds 3-4) answered as shipped and with maxsim's window scores
max-pooled over 17 tokens, 33 tokens and the whole window (``gather_variants.pooled_windows``), and with runs
shorter than 32 tokens dropped and their budget given to the runs kept (``whole_runs``, since 2026-12-01
REFORM's ``min_run``), counting the gathered runs. Run with the venv active: python docs/results/pooled-windows-smollm2/probe.py"""
import sys
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "scripts" / "labs"))
from gather_variants import head_subset, pooled_windows  # noqa: E402
from reform import Pipeline  # noqa: E402
from reform.eval.specs import parse_lengths  # noqa: E402
from reform.eval.tasks import make_rows  # noqa: E402



@contextmanager
def whole_runs(shortest: int):
    """The view's REFORM with ``min_run`` = ``shortest`` while inside."""
    config = view.method.config
    view.method.config = replace(config, min_run=shortest)
    try:
        yield
    finally:
        view.method.config = config


UNION = ROOT / "docs" / "results" / "gather-heads-smollm2" / "union.json"
PRESET = "2:q:2+6:k:2+15:v:1+18:v:1+5:v:2"
VARIANTS = {"shipped": nullcontext, "pooled17": lambda: pooled_windows(17), "pooled33": lambda: pooled_windows(33),
            "pooled": pooled_windows, "whole32": lambda: whole_runs(32)}
pipe = Pipeline.load(method="reform", heads=str(UNION), dtype="fp32")
for seed, length, depth in ((3, "8k", 0.25), (3, "16k", 0.75), (4, "8k", 0.75)):
    row = make_rows("niah", pipe.tokenizer, parse_lengths(length), 1, seed, None, [depth], None)[0]
    view = head_subset(pipe.encode(row.content()), PRESET)
    for name, variant in VARIANTS.items():
        with variant():
            ans = view.ask(question=row.question, answer_prefix=row.answer_prefix, max_new_tokens=row.max_new_tokens,
                           layout=row.layout, instruction=row.instruction)
        runs = int((ans.kept[1:] != ans.kept[:-1] + 1).sum()) + 1
        print(f"{row.id} {name}: runs {runs}, right {row.answers[0] in ans.text}: {ans.text[:60]!r}", flush=True)
