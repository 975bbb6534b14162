"""The tables of this folder's README from its JSONL files: per head set and gather, the share of vt's
chain links kept and RULER qa's evidence spans kept, each paired row by row against the preset's
default gather (the exact sign test).

    python docs/results/heads-chains-smollm2/summary.py
"""
import json
from collections import defaultdict
from pathlib import Path

from reform.eval.paired import sign_test_p

HERE = Path(__file__).parent
BASE = ("real70", "default")


def table(files: list[str]) -> dict:
    """(heads, variant) -> row id -> recall, over ``files``; the union's own rows (all 10 heads) are
    listed once under ``all10``."""
    out = defaultdict(dict)
    for name in files:
        for line in (HERE / name).read_text().splitlines():
            r = json.loads(line)
            if r["heads"] != "union" and r["recall"] is not None:
                out[(r["heads"], r["variant"])][r["id"]] = r["recall"]
    return out


def paired(rows: dict, base: dict) -> str:
    higher = sum(rows[i] > base[i] for i in rows)
    lower = sum(rows[i] < base[i] for i in rows)
    return f"{higher} / {lower}, p = {sign_test_p(higher, lower):.2g}"


def show(vt: dict, qa: dict) -> None:
    print("| heads | gather | vt links kept (whole chains) | vs preset | qa_1 | qa_2 | qa mean | vs preset |")
    print("|---|---|---|---|---|---|---|---|")
    for key in dict.fromkeys([k for k in [*vt, *qa] if vt.get(k) or qa.get(k)]):
        cells = [*key, "", "", "", "", "", ""]
        if vt.get(key):
            v = vt[key]
            cells[2:4] = [f"{100 * sum(v.values()) / len(v):.1f} % ({sum(x == 1 for x in v.values())}/{len(v)})",
                          paired(v, vt[BASE]) if key != BASE else ""]
        if qa.get(key):
            q = qa[key]
            means = [100 * sum(x for i, x in q.items() if f"/{t}-" in i) / sum(f"/{t}-" in i for i in q)
                     for t in ("qa_1", "qa_2")]
            cells[4:] = [f"{means[0]:.1f} %", f"{means[1]:.1f} %", f"{sum(means) / 2:.1f} %",
                         paired(q, qa[BASE]) if key != BASE else ""]
        print("| " + " | ".join(cells) + " |")


print("## seed 0: the rows the variants were tried on")
show(table(["vt-smollm2-32k.jsonl", "vt-capacity.jsonl", "vt-mix.jsonl", "vt-null.jsonl", "vt-pool2.jsonl"]),
     table(["qa-smollm2-32k.jsonl", "qa-pool.jsonl", "qa-mix.jsonl", "qa-null.jsonl", "qa-pool2.jsonl"]))
if (HERE / "seed1.jsonl").exists():
    print("\n## seed 1: fresh rows, the candidates only")
    rows = table(["seed1.jsonl"])
    show({k: {i: x for i, x in v.items() if "/vt-" in i} for k, v in rows.items()},
         {k: {i: x for i, x in v.items() if "/qa_" in i} for k, v in rows.items()})
