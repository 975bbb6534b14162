"""This folder's tables: each suite's score and gold recall per set, and row by row (exact sign test,
``reform.eval.paired``) the gather without pieces against the preset as shipped, with heads-second-draw-smollm2's
table code.

    python docs/results/whole-runs-smollm2/summary.py
"""
import importlib.util
from pathlib import Path

HERE = Path(__file__).parent
spec = importlib.util.spec_from_file_location("second_draw", HERE.parent / "heads-second-draw-smollm2" / "summary.py")
second_draw = importlib.util.module_from_spec(spec)
spec.loader.exec_module(second_draw)

if __name__ == "__main__":
    second_draw.table({"RULER vt, 32k, seed 2": [HERE / "vt-seed2"],
                       "NIAH 8k-32k x 5 depths, seeds 3-4": [HERE / "niah-8k-32k-seed3", HERE / "niah-8k-32k-seed4"],
                       "RULER's 13 official tasks, 32k, seeds 3-4": [HERE / "ruler13-seed3", HERE / "ruler13-seed4"]},
                      ("preset", "preset-whole"), (("preset", "preset-whole"),))
