"""The docs suite's questions with no document: how many does each model answer from what it already knows?

    python scripts/labs/closed_book.py MODEL OUT.jsonl

Each question is asked of ``Pipeline.without_context()`` (the question alone, greedy, the suite's answer
length) and scored as ``reform eval docs`` scores it: the answer contains one of the gold strings.
"""
import json
import sys
from pathlib import Path

from reform import Pipeline
from reform.eval.tasks.docs import MAX_NEW_TOKENS, questions

pipe = Pipeline.load(None if sys.argv[1] == "smollm2" else sys.argv[1])
empty = pipe.without_context()
rows = []
for q in questions():
    answer = empty.ask(q["question"], max_new_tokens=MAX_NEW_TOKENS).text
    rows.append({"document": q["document"], "id": q["id"], "prediction": answer,
                 "answered": any(a.lower() in answer.lower() for a in q["answers"])})
Path(sys.argv[2]).write_text("".join(json.dumps(r) + "\n" for r in rows))
for name in dict.fromkeys(r["document"] for r in rows):
    got = [r for r in rows if r["document"] == name]
    print(f"{name}: {sum(r['answered'] for r in got)}/{len(got)}", [r["id"] for r in got if r["answered"]])
print(f"all: {sum(r['answered'] for r in rows)}/{len(rows)}")
