"""NIAH rows read with and without REFORM's ``question_first``, fp32, by the preset and the synthetic heads
(pool 129) from one union encode: the preset's three misses of the fp32 draws (seeds 3-4; the reader copies a
quoted word of the text), the miss every set shares (seed 5, 8k at 100 %: a digit short) and three rows all
sets read. Run with the venv active: python docs/results/question-first-smollm2/probe.py"""
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "scripts" / "labs"))
from gather_variants import head_subset  # noqa: E402
from reform import Pipeline  # noqa: E402
from reform.eval.specs import parse_lengths  # noqa: E402
from reform.eval.tasks import make_rows  # noqa: E402

UNION = ROOT / "docs" / "results" / "gather-heads-smollm2" / "union.json"
SETS = {"preset": ("2:q:2+6:k:2+15:v:1+18:v:1+5:v:2", {}), "synthetic": ("5:v:2+3:k:2+12:v:1+18:v:2", {"pool_window": 129})}
ROWS = ((3, "8k", 0.25), (3, "16k", 0.75), (4, "8k", 0.75), (5, "8k", 1.0), (3, "8k", 0.5), (4, "16k", 0.25), (3, "32k", 0.0))
pipe = Pipeline.load(method="reform", heads=str(UNION), dtype="fp32")
for seed, length, depth in ROWS:
    row = make_rows("niah", pipe.tokenizer, parse_lengths(length), 1, seed, None, [depth], None)[0]
    ctx = pipe.encode(row.content())
    for name, (heads, options) in SETS.items():
        for first in (False, True):
            view = head_subset(ctx, heads)
            view.method = type(view.method)(replace(view.method.config, question_first=first, **options))
            ans = view.ask(question=row.question, answer_prefix=row.answer_prefix, max_new_tokens=row.max_new_tokens,
                           layout=row.layout, instruction=row.instruction)
            print(f"seed {seed} {row.id} {name} question_first={first}: right {row.answers[0] in ans.text}: "
                  f"{ans.text[:50]!r}", flush=True)
