"""The second draw's tables: each suite's score and gold recall per set, and row by row (exact sign test,
``reform.eval.paired``) the preset against the synthetic heads and each set with gap marks against itself
without; first each draw alone, then each suite pooled with gap-marks-smollm2's seed-3 rows (the rule in
the README).

    python docs/results/heads-second-draw-smollm2/summary.py
"""
from pathlib import Path

from reform.eval.paired import compare
from reform.eval.records import folder_records

HERE = Path(__file__).parent
SEED3 = HERE.parent / "gap-marks-smollm2"
SETS = ("preset", "preset-gaps", "synthetic", "synthetic-gaps")
PAIRS = (("synthetic", "preset"), ("preset", "preset-gaps"), ("synthetic", "synthetic-gaps"),
         ("synthetic", "preset-gaps"))


def mean(values: list) -> str:
    return f"{100 * sum(values) / len(values):.1f} %" if values else "-"


def table(suites: dict, sets: tuple = SETS, pairs: tuple = PAIRS) -> None:
    """One line per suite (title -> folders, pooled; a folder as ``(folder, names)`` gives only those sets'
    rows): rows every set answered, each set's mean score (gold recall), and for each pair the rows the
    second set scored higher / lower than the first."""
    print("| suite | rows | " + " | ".join(sets) + " | " + " | ".join(f"{b} vs {a}" for a, b in pairs) + " |")
    print("|---" * (2 + len(sets) + len(pairs)) + "|")
    for title, folders in suites.items():
        folders = [(f, sets) if isinstance(f, Path) else f for f in folders]
        folders = [(f, names) for f, names in folders if (f / "predictions.jsonl").exists()]
        records = [{**r, "id": f"{f.name}/{r['id']}"} for f, names in folders
                   for r in folder_records(f)[1] if r["status"] == "ok" and r["method"] in names]
        if not records:
            continue
        ids = set.intersection(*({r["id"] for r in records if r["method"] == s} for s in sets))
        records = [r for r in records if r["id"] in ids]
        cells = []
        for s in sets:
            mine = [r for r in records if r["method"] == s]
            recall = [r["recall"] for r in mine if r.get("recall") is not None]
            cells.append(f"{mean([r['score'] for r in mine])} ({mean(recall)})")
        counts = [compare(records, a, b) for a, b in pairs]
        print(f"| {title} | {len(ids)} | " + " | ".join(cells) + " | "
              + " | ".join(f"{c['better']} / {c['worse']}" for c in counts) + " |")


if __name__ == "__main__":
    print("Each draw alone:\n")
    table({"NIAH 8k-32k x 5 depths, seed 3": [SEED3 / "niah-8k-32k-seed3"],
           "NIAH 8k-32k x 5 depths, seed 4": [HERE / "niah-8k-32k-seed4"],
           "RULER's 13 official tasks, 32k, seed 3": [SEED3 / "ruler13-seed3"],
           "RULER's 13 official tasks, 32k, seed 4": [HERE / "ruler13-seed4"],
           "RULER's 13 official tasks, 32k, seed 5": [HERE / "ruler13-seed5"],
           "built-in RULER-style, 32k, seed 2": [HERE / "ruler-builtin-seed2"]})
    print("\nPooled (the rule):\n")
    table({"NIAH 8k-32k x 5 depths, seeds 3-4": [SEED3 / "niah-8k-32k-seed3", HERE / "niah-8k-32k-seed4"],
           "RULER's 13 official tasks, 32k, seeds 3-5": [SEED3 / "ruler13-seed3", HERE / "ruler13-seed4",
                                                        HERE / "ruler13-seed5"]})
