"""The fresh draw's tables: each suite's score and gold recall per head set, the preset against each earlier
set row by row (exact sign test, ``reform.eval.paired``), then every row of this draw pooled, and this draw
pooled with the earlier draws of heads-chains-smollm2 (its ``pooled.py`` rows; its vt seed-2 rows, where the
old sets ran at pool 113, replaced by this folder's).

    python docs/results/heads-fresh-draw-smollm2/summary.py
"""
import contextlib
import io
import runpy
from pathlib import Path

from reform.eval.paired import compare
from reform.eval.records import folder_records

HERE = Path(__file__).parent
SUITES = {"ruler13-seed3": "RULER's 13 official tasks, seed 3", "ruler-builtin-seed1": "built-in RULER-style, seed 1",
          "niah-8k-32k-seed3": "NIAH 8k-32k x 5 depths, seed 3",
          "vt-seed2": "RULER vt, seed 2 (heads-chains' rows, the old sets at their own pool 129)"}
SETS = ("preset", "synthetic", "HotpotQA")
POOLS = ("preset", "preset129", "preset145")     # the preset's heads at pools 113, 129 and 145 (run-pools.sh)


def mean(values: list) -> str:
    return f"{100 * sum(values) / len(values):.1f} %" if values else ""


def score_and_recall(records: list, method: str) -> tuple[str, str]:
    """The method's mean score and mean gold recall (over the rows that have one) in these records."""
    mine = [r for r in records if r["method"] == method]
    return mean([r["score"] for r in mine]), mean([r["recall"] for r in mine if r.get("recall") is not None])


def line(c: dict) -> str:
    return (f"{c['better']} / {c['worse']} (p = {c['p']:.2g}); evidence {c['recall_better']} / "
            f"{c['recall_worse']}")


print("| suite | rows | " + " | ".join(SETS) + " | gold recall " + " / ".join(SETS)
      + " | preset vs synthetic | preset vs HotpotQA |")
print("|---" * 8 + "|")
every, replaced = [], set()
for folder, title in SUITES.items():
    if not (HERE / folder / "predictions.jsonl").exists():
        continue
    records = [r for r in folder_records(HERE / folder)[1] if r["status"] == "ok"]
    if folder == "vt-seed2":        # the same rows as heads-chains' vt-seed2, which they replace in the pooling
        replaced |= {r["id"] for r in records}
    records = [{**r, "id": f"{folder}/{r['id']}"} for r in records]
    every += records
    scores, recalls = zip(*(score_and_recall(records, s) for s in SETS))
    pairs = [compare(records, base, "preset") for base in ("synthetic", "HotpotQA")]
    print(f"| {title} | {pairs[0]['rows']} | " + " | ".join(scores) + " | " + " / ".join(recalls) + " | "
          + " | ".join(line(c) for c in pairs) + " |")

print()
print("The preset's heads at three pools (run-pools.sh), rows answered by every set: score (evidence)")
print("| suite | rows | " + " | ".join(SETS[1:] + POOLS) + " | " + " | ".join(f"{p} vs synthetic" for p in POOLS) + " |")
print("|---" * (2 + len(SETS[1:] + POOLS) + len(POOLS)) + "|")
for folder, title in SUITES.items():
    records = [r for r in every if r["id"].startswith(folder + "/")]
    ids = set.intersection(*({r["id"] for r in records if r["method"] == s} for s in SETS + POOLS[1:]))
    records = [r for r in records if r["id"] in ids]
    if not ids:
        continue
    cells = ["{} ({})".format(*score_and_recall(records, s)) for s in SETS[1:] + POOLS]
    pairs = [compare(records, "synthetic", p) for p in POOLS]
    print(f"| {title} | {len(ids)} | " + " | ".join(cells) + " | " + " | ".join(line(c) for c in pairs) + " |")
print()
for base in ("synthetic", "HotpotQA"):
    c = compare(every, base, "preset")
    print(f"this draw, every row once, preset against {base}: score {c['rows']} rows, higher {c['better']} / "
          f"lower {c['worse']} (p = {c['p']:.2g}); gold evidence higher {c['recall_better']} / lower "
          f"{c['recall_worse']} (p = {c['recall_p']:.2g})")

# the earlier draws (bf16, another machine): heads-chains-smollm2/pooled.py's rows, its set names the same
with contextlib.redirect_stdout(io.StringIO()):      # its own tables are in its README
    earlier = runpy.run_path(str(HERE.parent / "heads-chains-smollm2" / "pooled.py"), run_name="earlier")["every"]
both = [r for r in earlier if r["id"] not in replaced] + every
for base in ("synthetic", "HotpotQA"):
    c = compare(both, base, "preset")
    print(f"with the earlier draws, preset against {base}: score {c['rows']} rows, higher {c['better']} / "
          f"lower {c['worse']} (p = {c['p']:.2g}); gold evidence higher {c['recall_better']} / lower "
          f"{c['recall_worse']} (p = {c['recall_p']:.2g})")
