"""This folder's tables, by the rule's lines (README.md): each suite's score and gold recall per set, and row by
row (exact sign test, ``reform.eval.paired``) the preset with the question first against the preset as shipped
and against the synthetic heads, with heads-second-draw-smollm2's table code. A line whose rows have not run yet
is left out.

    python docs/results/question-first-smollm2/summary.py
"""
import importlib.util
from pathlib import Path

HERE = Path(__file__).parent
spec = importlib.util.spec_from_file_location("second_draw", HERE.parent / "heads-second-draw-smollm2" / "summary.py")
second_draw = importlib.util.module_from_spec(spec)
spec.loader.exec_module(second_draw)
SETS = ("preset", "preset-qf", "synthetic")
PAIRS = (("preset", "preset-qf"), ("synthetic", "preset-qf"), ("synthetic", "preset"))
LINES = {"1. NIAH 8k-32k x 5 depths, seed 6 (fresh), fp32": ["niah-8k-32k-seed6"],
         "2. RULER's 13 official tasks, 32k, seeds 3-5, fp32": ["ruler13-seed3", "ruler13-seed4", "ruler13-seed5"],
         "3. RULER qa_1 + qa_2, 32k, 20 rows each, seed 0, bf16": ["qa-32k-seed0"],
         "4. NIAH 8k-32k x 5 depths, seeds 3-5, fp32": ["niah-8k-32k-seed3", "niah-8k-32k-seed4", "niah-8k-32k-seed5"],
         "5. built-in RULER-style suite, 32k, seed 2, fp32": ["ruler-builtin-seed2"],
         "6. NIAH 8k-128k x 5 depths, seeds 0-2, bf16": ["niah-grid-seed0", "niah-grid-seed1", "niah-grid-seed2-essays"],
         "after the rule: RULER qa_1 + qa_2, 32k, seeds 1-2, bf16": ["qa-32k-seed1", "qa-32k-seed2"],
         "after the rule: RULER qa_1 + qa_2, 32k, seeds 0-2, bf16": ["qa-32k-seed0", "qa-32k-seed1", "qa-32k-seed2"],
         "second rule, A. NIAH 8k-32k x 5 depths, fresh seeds 7-12, fp32": [f"niah-8k-32k-seed{s}" for s in range(7, 13)],
         "after the rule: NIAH 8k-32k x 5 depths, seeds 3-12, fp32": [f"niah-8k-32k-seed{s}" for s in range(3, 13)],
         "second rule, B. RULER qa_1 + qa_2, 32k, fresh seeds 3-4, bf16": ["qa-32k-seed3", "qa-32k-seed4"]}

if __name__ == "__main__":
    ran = {line: [HERE / f for f in folders if (HERE / f / "predictions.jsonl").exists()] for line, folders in LINES.items()}
    for line, folders in LINES.items():
        if len(ran[line]) < len(folders):
            print(f"{line}: {len(ran[line])} of {len(folders)} parts run")
    second_draw.table({line: got for line, got in ran.items() if got}, SETS, PAIRS)
