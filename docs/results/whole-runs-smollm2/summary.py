"""This folder's tables: each suite's score and gold recall per set, and row by row (exact sign test,
``reform.eval.paired``) the gather without pieces against the preset as shipped and against the synthetic
heads, with heads-second-draw-smollm2's table code. The rule's lines (README.md) pool RULER-13's seed 3 with
the synthetic heads' seed-3 rows of gap-marks-smollm2 (fp32 on a Zen 3), as heads-second-draw-smollm2 did.

    python docs/results/whole-runs-smollm2/summary.py
"""
import importlib.util
from pathlib import Path

HERE = Path(__file__).parent
spec = importlib.util.spec_from_file_location("second_draw", HERE.parent / "heads-second-draw-smollm2" / "summary.py")
second_draw = importlib.util.module_from_spec(spec)
spec.loader.exec_module(second_draw)
SEED3 = HERE.parent / "gap-marks-smollm2"
SETS = ("preset", "preset-whole", "synthetic")
PAIRS = (("preset", "preset-whole"), ("synthetic", "preset-whole"), ("synthetic", "preset"))
MINE = ("preset", "preset-whole")

if __name__ == "__main__":
    print("The first session's rows (preset and preset-whole only):\n")
    second_draw.table({"RULER vt, 32k, seed 2": [HERE / "vt-seed2"],
                       "NIAH 8k-32k x 5 depths, seeds 3-4": [HERE / "niah-8k-32k-seed3", HERE / "niah-8k-32k-seed4"],
                       "RULER's 13 official tasks, 32k, seed 3": [HERE / "ruler13-seed3"]}, MINE, (MINE,))
    print("\nThe rule (the synthetic heads' seed-3 and NIAH seeds 3-4 rows from the earlier fp32 draws):\n")
    second_draw.table({
        "RULER's 13 official tasks, 32k, seeds 3-5": [HERE / "ruler13-seed3", (SEED3 / "ruler13-seed3", ("synthetic",)),
                                                     HERE / "ruler13-seed4", HERE / "ruler13-seed5"],
        "NIAH 8k-32k x 5 depths, seed 5 (fresh)": [HERE / "niah-8k-32k-seed5"],
        "NIAH 8k-32k x 5 depths, seeds 3-5": [HERE / "niah-8k-32k-seed3", (SEED3 / "niah-8k-32k-seed3", ("synthetic",)),
                                              HERE / "niah-8k-32k-seed4",
                                              (HERE.parent / "heads-second-draw-smollm2" / "niah-8k-32k-seed4", ("synthetic",)),
                                              HERE / "niah-8k-32k-seed5"],
        "RULER qa_1 + qa_2, 32k, 20 rows each, seed 0 (bf16)": [HERE / "qa-32k-seed0"]}, SETS, PAIRS)
    print("\nFor the owner's choice (after the rule; the library's min_run):\n")
    second_draw.table({"NIAH 8k-128k x 5 depths, seed 0 (bf16)": [HERE / "niah-grid-seed0"]}, SETS, PAIRS)
    print("\nThe second rule (this folder's grid seeds 1 and 2 on an Intel Xeon with AMX, bf16; built-in suite fp32):\n")
    second_draw.table({"NIAH 8k-128k x 5 depths, seeds 1 and 2 (essays), bf16": [HERE / "niah-grid-seed1",
                                                                                HERE / "niah-grid-seed2-essays"],
                       "NIAH 8k-128k x 5 depths, seeds 0-2, bf16": [HERE / "niah-grid-seed0", HERE / "niah-grid-seed1",
                                                                    HERE / "niah-grid-seed2-essays"],
                       "built-in RULER-style suite, 32k, seed 2 (fp32)": [HERE / "ruler-builtin-seed2"]}, SETS, PAIRS)
