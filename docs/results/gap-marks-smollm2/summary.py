"""Gap marks' tables: each suite's score and gold recall per set, and row by row (exact sign test,
``reform.eval.paired``) the preset against the synthetic heads and each set with marks against itself
without (heads-second-draw-smollm2's ``table``, which also pools these rows with its own).

    python docs/results/gap-marks-smollm2/summary.py
"""
import runpy
from pathlib import Path

HERE = Path(__file__).parent
table = runpy.run_path(str(HERE.parent / "heads-second-draw-smollm2" / "summary.py"), run_name="table")["table"]
table({"NIAH 8k-32k x 5 depths, seed 3": [HERE / "niah-8k-32k-seed3"], "RULER vt, 32k, seed 2": [HERE / "vt-seed2"],
       "RULER's 13 official tasks, 32k, seed 3": [HERE / "ruler13-seed3"]})
