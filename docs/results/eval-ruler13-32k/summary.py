"""RULER's 13 official tasks at 32k on SmolLM2: per task and overall, each method's score and gold recall
pooled over seeds 3-5, then REFORM against each other method row by row (``reform.eval.paired``).

REFORM's rows are this folder's (``reform eval --methods reform``) where ``run.sh`` reached them, otherwise
the ``preset`` rows that heads-second-draw-smollm2's lab answered on the same rows (the same ids); the
synthetic heads (the preset when issue 69 was filed) come from those labs too. Seed 3 checks that the lab's
preset answers as ``reform eval`` does.

    python docs/results/eval-ruler13-32k/summary.py
"""
from pathlib import Path

from reform.eval.paired import compare
from reform.eval.records import folder_records

HERE = Path(__file__).parent
LABS = {3: HERE.parent / "gap-marks-smollm2" / "ruler13-seed3",
        4: HERE.parent / "heads-second-draw-smollm2" / "ruler13-seed4",
        5: HERE.parent / "heads-second-draw-smollm2" / "ruler13-seed5"}
METHODS = ("reform", "rag-dense", "truncate", "synthetic heads")


def ok(folder: Path) -> list[dict]:
    return [r for r in folder_records(folder)[1] if r["status"] == "ok"] if (folder / "predictions.jsonl").exists() else []


def seed_records(seed: int) -> tuple[list[dict], str]:
    """One seed's records under METHODS' names (ids prefixed by the seed), and where REFORM's came from."""
    mine, lab = ok(HERE / f"seed{seed}"), ok(LABS[seed])
    source = "reform eval" if any(r["method"] == "reform" for r in mine) else "lab"
    rename = {"preset": "reform"} if source == "lab" else {}
    rename["synthetic"] = "synthetic heads"
    out = [r for r in mine if r["method"] in METHODS]
    out += [{**r, "method": rename[r["method"]]} for r in lab if r["method"] in rename]
    return [{**r, "id": f"{seed}/{r['id']}"} for r in out], source


def lab_check(seed: int) -> str:
    """This folder's REFORM predictions against the lab's preset on the same rows."""
    mine = {r["id"]: r for r in ok(HERE / f"seed{seed}") if r["method"] == "reform"}
    lab = {r["id"]: r for r in ok(LABS[seed]) if r["method"] == "preset"}
    same = [k for k in mine.keys() & lab.keys() if mine[k]["prediction"] == lab[k]["prediction"]]
    return f"seed {seed}: {len(same)} of {len(mine.keys() & lab.keys())} rows predict the same text"


def mean(values: list) -> str:
    return f"{100 * sum(values) / len(values):.1f}" if values else "-"


def cell(records: list[dict], method: str) -> str:
    mine = [r for r in records if r["method"] == method]
    recall = [r["recall"] for r in mine if r.get("recall") is not None]
    return f"{mean([r['score'] for r in mine])} ({mean(recall)})" if mine else "-"


def main() -> None:
    records, sources = [], {}
    for seed in LABS:
        rows, sources[seed] = seed_records(seed)
        records += rows
    ids = set.intersection(*({r["id"] for r in records if r["method"] == m} for m in METHODS))
    records = [r for r in records if r["id"] in ids]
    print("REFORM's rows from: " + ", ".join(f"seed {s}: {src}" for s, src in sources.items()))
    print("Lab check: " + lab_check(3) + "\n")
    print(f"Score % (gold recall %), {len(ids)} rows answered by every method:\n")
    print("| task | rows | " + " | ".join(METHODS) + " |")
    print("|---" * (2 + len(METHODS)) + "|")
    for task in sorted({r["task"] for r in records}):
        mine = [r for r in records if r["task"] == task]
        rows = len({r["id"] for r in mine})
        print(f"| {task.removeprefix('ruler/')} | {rows} | " + " | ".join(cell(mine, m) for m in METHODS) + " |")
    print(f"| **all 13** | {len(ids)} | " + " | ".join(f"**{cell(records, m)}**" for m in METHODS) + " |")
    print("\nREFORM against each, row by row (rows REFORM scored higher / lower, exact sign test):\n")
    print("| against | rows | REFORM higher | lower | p | gold recall higher / lower |")
    print("|---|---|---|---|---|---|")
    for other in METHODS[1:]:
        c = compare(records, other, "reform")
        print(f"| {other} | {c['rows']} | {c['better']} | {c['worse']} | {c['p']:.3g} | "
              f"{c['recall_better']} / {c['recall_worse']} |")


if __name__ == "__main__":
    main()
