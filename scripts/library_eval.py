"""Ask a library (`reform library add`) the docs suite's questions and record span recall, answers and each
stage's latency, one JSON line per question (resumable: questions already in OUT are skipped).

    python scripts/library_eval.py --store S --library sql --out docs/results/library-docs/smollm2-sql.jsonl
    python scripts/library_eval.py --store S --library sql --model gemma-3-270m --out ...
    python scripts/library_eval.py --store S --library manual --latency 10,100,1000 --out ...latency.jsonl

The questions are those of the docs suite about ``--document`` (default postgresql-sql: 17 questions on the
PostgreSQL 15 manual; ``--questions pages``: the 21 held-out ones, one per sampled page). Each question's evidence sentence is looked up in every document of the library;
span recall counts it kept when every token of one of its occurrences was gathered. ``--latency`` instead
makes libraries of the first N documents (named libraries in the same store, so nothing is encoded again)
and times each question against each."""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

from reform.documents import extract_bytes, read_bytes
from reform.eval.recall import spans_kept
from reform.eval.tasks.docs import evidence_pattern, questions
from reform.library import Library
from reform.pipeline import Pipeline


def texts_of(library: Library, root: Path) -> dict[str, str]:
    """Every document's text, read again from ``root`` (the folder they were added from: extraction is
    deterministic)."""
    return {d.name: extract_bytes(read_bytes(str(root / d.name)), d.name).text for d in library.documents()}


def locate(texts: dict[str, str], question: dict) -> list[tuple[str, int, int]]:
    """``(document, start, end)`` of every occurrence of the question's evidence in the library's documents."""
    pattern = re.compile(evidence_pattern(question["evidence"]))
    return [(name, *m.span()) for name, text in texts.items() for m in pattern.finditer(text)]


def ask_one(library: Library, q: dict, candidates: int, where: list) -> dict:
    started = time.perf_counter()
    collected = library.collect(q["question"], candidates=candidates)
    answer = library.answer(q["question"], collected, max_new_tokens=48)
    seconds = time.perf_counter() - started
    kept = {g.name: g for g in collected.gathered}
    spans = [name in kept and spans_kept(kept[name].ctx.source.token_starts, len(kept[name].ctx.source.document.text),
                                         kept[name].kept, [(a, b)])[0] for name, a, b in where]
    return {"id": q["id"], "question": q["question"], "answers": q["answers"], "prediction": answer.text,
            "answered": any(a.lower() in answer.text.lower() for a in q["answers"]),
            "evidence_in": sorted({n for n, _, _ in where}), "span_kept": any(spans),
            "candidate_hit": any(n in collected.stats["candidates"] for n, _, _ in where),
            "seconds": round(seconds, 3), "stats": answer.stats,
            "evidence_top": [p.where() for p in answer.evidence[:3]]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--store", required=True)
    ap.add_argument("--library", default="default")
    ap.add_argument("--model", default=None)
    ap.add_argument("--document", default="postgresql-sql")
    ap.add_argument("--questions", default="suite", help="suite, pages or a JSON file (reform eval docs --questions)")
    ap.add_argument("--candidates", type=int, default=8)
    ap.add_argument("--latency", default=None, help="library sizes to time, e.g. 10,100,1000")
    ap.add_argument("--root", default="/usr/share/doc/postgresql-doc-15/html",
                    help="the folder the documents were added from")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    pipe = Pipeline.load(args.model)
    library = Library(pipe, args.store, name=args.library, memory=64)
    asked = [q for q in questions(args.questions) if q["document"] == args.document]
    out = Path(args.out)
    done = set()
    if out.exists():
        done = {(r.get("library_size"), r["id"]) for r in map(json.loads, out.read_text().splitlines())}
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.latency:
        docs = library.documents()
        for size in [int(n) for n in args.latency.split(",")]:
            sub = Library(pipe, args.store, name=f"{args.library}-first{size}", memory=8)
            sub.catalog.write(sub.maker, {d.name: d for d in docs[:size]})     # shares the store's contexts
            for q in asked:
                if (size, q["id"]) in done:
                    continue
                started = time.perf_counter()
                answer = sub.ask(q["question"], candidates=args.candidates, max_new_tokens=16)
                row = {"library_size": size, "id": q["id"], "seconds": round(time.perf_counter() - started, 3),
                       "stats": answer.stats}
                with out.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                print(json.dumps(row), file=sys.stderr)
        return
    texts = texts_of(library, Path(args.root))
    for q in asked:
        if (None, q["id"]) in done:
            continue
        row = {"library": args.library, "documents": len(library.documents()),
               **ask_one(library, q, args.candidates, locate(texts, q))}
        with out.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps({k: row[k] for k in ("id", "answered", "span_kept", "candidate_hit", "seconds")}), file=sys.stderr)


if __name__ == "__main__":
    main()
