"""Every suite row of this run against the same rows of the two head sets before it, each row counted
once, paired row by row by score and by gold evidence kept (the exact sign test; ``reform.eval.paired``).

    python docs/results/heads-chains-smollm2/pooled.py

A vt row's evidence is its whole chain since this run (``ruler_official.vt_chain``); vt rows recorded
before it checked only the last link, so their recall is left out of the pairing.
"""
from collections import defaultdict

from reform.eval.paired import compare
from reform.eval.records import folder_records

SYN = "reform(heads=docs/results/gather-heads-smollm2/smollm2-synthetic.json)"
REAL = "reform(heads=docs/results/heads-real-smollm2/smollm2-real.json)"
NOW, OLD, R = "docs/results/heads-chains-smollm2/", "docs/results/heads-smollm2-suites/", "docs/results/"
# (folder, label there) -> head set; a folder's plain ``reform`` is whichever set was the preset then
SETS = {"synthetic": [(OLD + "niah-grid-seed0-synthetic", SYN), (OLD + "niah-grid-seed1", SYN),
                      (OLD + "niah-grid-seed2-essays", SYN), (R + "gather-maxsim/ruler13-smollm2", "reform"),
                      (OLD + "ruler13-seed1", SYN), (OLD + "ruler-builtin-32k", SYN), (NOW + "vt-seed2-before", SYN)],
        "HotpotQA": [(R + "gather-heads-smollm2/niah-grid", "reform"), (OLD + "niah-grid-seed1", REAL),
                     (OLD + "niah-grid-seed2-essays", REAL), (R + "gather-heads-smollm2/ruler13-smollm2", REAL),
                     (OLD + "ruler13-seed1", REAL), (OLD + "ruler-builtin-32k", REAL), (NOW + "vt-seed2-before", REAL)],
        "preset": [(NOW + name, "reform") for name in ("niah-grid-seed0", "niah-grid-seed1", "niah-grid-seed2-essays",
                                                      "ruler13-seed0", "ruler13-seed1", "ruler-builtin-32k", "vt-seed2")]}
SUITES = {"niah-grid": "NIAH grid, 3 draws", "ruler13": "RULER's 13 official tasks, 2 draws",
          "ruler-builtin": "built-in RULER-style", "vt-seed2": "RULER vt, 10 rows (seed 2)"}

rows = defaultdict(dict)          # suite -> (set, id) -> record
for name, places in SETS.items():
    for folder, label in places:
        suite = next(s for s in SUITES if s in folder)
        for r in folder_records(folder)[1]:
            if r["method"] == label:
                if r["task"] == "ruler/vt" and "evidence" not in (r.get("meta") or {}):
                    r = {**r, "recall": None}        # the last link only: not comparable
                rows[suite][(name, r["id"])] = {**r, "method": name}

print("| suite | rows | synthetic | HotpotQA | preset | preset vs synthetic | preset vs HotpotQA |")
print("|---|---|---|---|---|---|---|")
every = []
for suite, title in SUITES.items():
    records = list(rows[suite].values())
    every += records
    mean = {s: [r["score"] for r in records if r["method"] == s and r["status"] == "ok"] for s in SETS}
    cells = [f"{100 * sum(v) / len(v):.1f} %" if v else "" for v in mean.values()]
    pairs = [compare(records, base, "preset") for base in ("synthetic", "HotpotQA")]
    text = [f"{c['better']} / {c['worse']} (p = {c['p']:.2g}); evidence {c['recall_better']} / {c['recall_worse']}"
            for c in pairs]
    print(f"| {title} | {pairs[0]['rows']} | " + " | ".join(cells) + " | " + " | ".join(text) + " |")
for base in ("synthetic", "HotpotQA"):
    c = compare(every, base, "preset")
    print(f"every row once, preset against {base}: score {c['rows']} rows, higher {c['better']} / lower "
          f"{c['worse']} (p = {c['p']:.2g}); gold evidence {c['recall_rows']} rows, higher {c['recall_better']} / "
          f"lower {c['recall_worse']} (p = {c['recall_p']:.2g})")
