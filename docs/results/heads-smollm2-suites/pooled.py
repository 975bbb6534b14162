"""Every row of this run and of the earlier runs it extends, each row counted once, paired row by row:
the preset (HotpotQA heads) against the synthetic-task heads, by score and by gold evidence kept.

    python docs/results/heads-smollm2-suites/pooled.py

Two older folders label a set plain ``reform`` (whichever was the default then); RENAMED says which.
"""
from reform.eval.paired import compare
from reform.eval.records import folder_records

SYN = "reform(heads=docs/results/gather-heads-smollm2/smollm2-synthetic.json)"
REAL = "reform(heads=docs/results/heads-real-smollm2/smollm2-real.json)"
D = "docs/results/heads-smollm2-suites/"
FOLDERS = [D + "niah-grid-seed0-synthetic", "docs/results/gather-heads-smollm2/niah-grid", D + "niah-grid-seed1",
           D + "niah-grid-seed2-essays", "docs/results/gather-maxsim/ruler13-smollm2",
           "docs/results/gather-heads-smollm2/ruler13-smollm2", D + "ruler13-seed1", D + "ruler-builtin-32k",
           "docs/results/gather-heads-smollm2/vt-smollm2-32k", D + "vt-seed2"]
RENAMED = {"docs/results/gather-heads-smollm2/niah-grid": REAL, "docs/results/gather-maxsim/ruler13-smollm2": SYN}

rows = {}
for folder in FOLDERS:
    for r in folder_records(folder)[1]:
        r["method"] = RENAMED.get(folder, r["method"]) if r["method"] == "reform" else r["method"]
        rows[(r["method"], r["id"])] = r
c = compare(list(rows.values()), SYN, REAL)
print(f"score: {c['rows']} rows, preset higher on {c['better']}, lower on {c['worse']}, p = {c['p']:.3g}")
print(f"gold evidence kept: {c['recall_rows']} rows, preset higher on {c['recall_better']}, lower on "
      f"{c['recall_worse']}, p = {c['recall_p']:.3g}")
for (method, row_id), r in rows.items():
    other = rows.get((REAL, row_id))
    if method == SYN and other and None not in (r.get("recall"), other.get("recall")) and r["recall"] != other["recall"]:
        print(f"  {row_id}: kept {r['recall']:.2f} with the synthetic heads, {other['recall']:.2f} with the preset")
