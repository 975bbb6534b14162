"""Span recall of the shallow HotpotQA heads beside the sets measured on the same RULER qa rows at 128k, with
each set paired row by row against the shallow one (the exact sign test).

    python docs/results/heads-depth-gemma/table.py
"""
import json

from reform.eval.paired import sign_test_p

SOURCES = {  # name: (file, heads, variant)
    "shallow (3:q:3, 3:v:0, 5:v:0, 4:v:0; exits after 5)": ("docs/results/heads-depth-gemma/ruler-gemma-128k-shallow.jsonl", "gemma-shallow", "default"),
    "synthetic (4:q:0, 5:q:1, 3:v:0, 4:v:0; exits after 5)": ("docs/results/gather-heads-gemma/ruler-gemma-128k.jsonl", "shipped", "default"),
    "HotpotQA preset (3:q:3, 3:v:0, 7:v:0, 7:q:2; exits after 7)": ("docs/results/gather-heads-gemma/ruler-gemma-128k.jsonl", "real", "default"),
    "rag-dense (MiniLM, 128-token passages)": ("docs/results/gather-maxsim/ruler-gemma-128k.jsonl", "shipped", "rag-dense+question-only"),
}


def rows(path, heads, variant):
    with open(path) as f:
        return {r["id"]: r for r in map(json.loads, f) if r["heads"] == heads and r["variant"] == variant}


table = {name: rows(*src) for name, src in SOURCES.items()}
shallow = table[next(iter(table))]
print("| gather | qa_1 | qa_2 | both | rows with every span | shallow higher / lower (p) |")
print("|---|---|---|---|---|---|")
for name, got in table.items():
    per_task = {t: [r["recall"] for r in got.values() if r["task"] == f"ruler/{t}"] for t in ("qa_1", "qa_2")}
    means = {t: sum(v) / len(v) for t, v in per_task.items()}
    common = shallow.keys() & got.keys()
    up = sum(shallow[i]["recall"] > got[i]["recall"] for i in common)
    down = sum(shallow[i]["recall"] < got[i]["recall"] for i in common)
    paired = "" if got is shallow else f"{up} / {down} ({sign_test_p(up, down):.2g})"
    print(f"| {name} | {100 * means['qa_1']:.1f} % | {100 * means['qa_2']:.1f} % | "
          f"{50 * (means['qa_1'] + means['qa_2']):.1f} % | {sum(r['all'] for r in got.values())}/{len(got)} | {paired} |")
