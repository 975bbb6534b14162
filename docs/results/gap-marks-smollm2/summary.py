"""Gap marks' tables: each suite's score and gold recall per set, and row by row (exact sign test,
``reform.eval.paired``) each set with marks against itself without, and the preset with marks against the
synthetic heads without (issue 69's comparison).

    python docs/results/gap-marks-smollm2/summary.py
"""
from pathlib import Path

from reform.eval.paired import compare
from reform.eval.records import folder_records

HERE = Path(__file__).parent
SUITES = {"niah-8k-32k-seed3": "NIAH 8k-32k x 5 depths, seed 3", "vt-seed2": "RULER vt, 32k, seed 2",
          "ruler13-seed3": "RULER's 13 official tasks, 32k, seed 3"}
SETS = ("preset", "preset-gaps", "synthetic", "synthetic-gaps")
PAIRS = (("preset", "preset-gaps"), ("synthetic", "synthetic-gaps"), ("synthetic", "preset-gaps"),
         ("synthetic", "preset"))


def mean(values: list) -> str:
    return f"{100 * sum(values) / len(values):.1f} %" if values else "-"


print("| suite | rows | " + " | ".join(SETS) + " | " + " | ".join(f"{b} vs {a}" for a, b in PAIRS) + " |")
print("|---" * (2 + len(SETS) + len(PAIRS)) + "|")
for folder, title in SUITES.items():
    if not (HERE / folder / "predictions.jsonl").exists():
        continue
    records = [r for r in folder_records(HERE / folder)[1] if r["status"] == "ok"]
    ids = set.intersection(*({r["id"] for r in records if r["method"] == s} for s in SETS))
    records = [r for r in records if r["id"] in ids]
    cells = []
    for s in SETS:
        mine = [r for r in records if r["method"] == s]
        cells.append(f"{mean([r['score'] for r in mine])} ({mean([r['recall'] for r in mine if r.get('recall') is not None])})")
    pairs = [compare(records, a, b) for a, b in PAIRS]
    print(f"| {title} | {len(ids)} | " + " | ".join(cells) + " | "
          + " | ".join(f"{c['better']} / {c['worse']}" for c in pairs) + " |")
