"""Questions about a real book, with known pages: does the answer hold the answer, and is the gold page
among the top-3 passages of its evidence? For each method the book is extracted and encoded once, then
every question is asked; rows are written to OUT/results.jsonl as they finish, and a re-run skips those done
(so a long run goes in pieces). OUT/results.md is the table; OUT/extraction.json times both PDF libraries.

    python scripts/book_questions.py --book book.pdf --questions questions.json --model smollm2 \\
        --methods reform,rag-bm25,rag-dense --out docs/results/documents-debian-reference/smollm2

``questions.json``: ``[{"id": ..., "question": ..., "answers": [...], "page": N}, ...]``; a question is
answered when the answer contains one of ``answers`` (case-insensitive).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def extraction_times(book: Path) -> dict:
    """Seconds per page of each PDF library on ``book`` (text layer only, the same pages)."""
    from reform.documents.extracted import Limits
    from reform.documents.pdf import _pages_pdfium, _pages_pypdf
    data, out = book.read_bytes(), {}
    for name, pages in (("pypdfium2", _pages_pdfium), ("pypdf", _pages_pypdf)):
        t = time.perf_counter()
        texts, _, n = pages(data, book.name, Limits())
        seconds = time.perf_counter() - t
        out[name] = {"pages": n, "seconds": round(seconds, 3), "ms_per_page": round(1000 * seconds / n, 2),
                     "characters": sum(len(x) for x in texts)}
    return out


def write_rows(book, questions: list[dict], path: Path) -> None:
    """One row per question over the book's extracted text; its ``evidence`` string (words matched across
    line breaks) must occur exactly once, on the question's page, and becomes the row's gold span."""
    import re
    from reform.eval.tasks.docs import evidence_pattern
    rows = []
    for q in questions:
        spans = [(m.start(), m.end()) for m in re.finditer(evidence_pattern(q["evidence"]), book.text)]
        if len(spans) != 1 or book.locate(spans[0][0]).page != q.get("page"):     # a text file has no pages
            raise SystemExit(f"{q['id']}: its evidence occurs {len(spans)} times, not once on page {q['page']}")
        rows.append({"context": book.text, "question": q["question"], "answers": q["answers"], "task": "docs/" + q["id"],
                     "length": 0, "max_new_tokens": 48, "meta": {"evidence_spans": [list(spans[0])], "page": q.get("page"), "metric": "contains"}})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"{len(rows)} rows written to {path}")


def gold_in(evidence: list, page: int, top: int = 3) -> bool:
    return any(p.page is not None and p.page <= page <= (p.page_end or p.page) for p in evidence[:top])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--book", type=Path, required=True)
    ap.add_argument("--questions", type=Path, required=True)
    ap.add_argument("--model", default=None)
    ap.add_argument("--methods", default="reform,rag-bm25,rag-dense")
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rows", type=Path, default=None, help="instead: write the questions as `reform eval jsonl` "
                    "rows over the extracted book, each with its evidence as a character span (meta.evidence_spans)")
    ap.add_argument("--contexts", type=Path, default=None, help="keep each method's encoded book here and load it "
                    "on the next run instead of encoding again (its encode_s is the first run's)")
    args = ap.parse_args()

    from reform import Pipeline
    from reform.documents import extract
    from reform.machine import machine_info
    questions = json.loads(args.questions.read_text())
    if args.rows is not None:
        write_rows(extract(args.book), questions, args.rows)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    rows_path = args.out / "results.jsonl"
    done = {(r["method"], r["id"]) for r in map(json.loads, rows_path.read_text().splitlines())} \
        if rows_path.exists() else set()
    if not (args.out / "extraction.json").exists():
        (args.out / "extraction.json").write_text(json.dumps(extraction_times(args.book), indent=1))
    t = time.perf_counter()
    book = extract(args.book)
    extract_s = time.perf_counter() - t
    for method in args.methods.split(","):
        todo = [q for q in questions if (method, q["id"]) not in done]
        if not todo:
            continue
        pipe = Pipeline.load(args.model, method=method, dtype=args.dtype)
        saved = None if args.contexts is None else args.contexts / f"{Path(pipe.model_name).name}-{method}.reform"
        if saved is not None and saved.exists():
            ctx = pipe.load_context(saved)
            encode_s = json.loads(saved.with_suffix(".json").read_text())["encode_s"]
        else:
            t = time.perf_counter()
            ctx = pipe.encode(book)
            encode_s = time.perf_counter() - t
            if saved is not None and method == "reform":
                args.contexts.mkdir(parents=True, exist_ok=True)
                ctx.save(saved)
                saved.with_suffix(".json").write_text(json.dumps({"encode_s": encode_s}))
        for q in todo:
            t = time.perf_counter()
            answer = ctx.ask(q["question"], max_new_tokens=args.max_new_tokens)
            row = {"method": method, "id": q["id"], "question": q["question"], "page": q["page"],
                   "answer": answer.text, "answered": any(a.lower() in answer.text.lower() for a in q["answers"]),
                   "gold_page_in_top3": gold_in(answer.evidence, q["page"]),
                   "gold_page_recomputed": gold_in(answer.evidence, q["page"], top=len(answer.evidence)),
                   "top3": [[p.page, p.page_end, p.score] for p in answer.evidence[:3]],
                   "recomputed_tokens": answer.stats.get("recomputed_tokens"), "ask_s": round(time.perf_counter() - t, 2),
                   "encode_s": round(encode_s, 1), "extract_s": round(extract_s, 2), "tokens": int(ctx.ids.shape[0]),
                   "pages": book.pages, "model": pipe.model_name,
                   "dtype": str(pipe.engine.dtype).removeprefix("torch."), "machine": machine_info(pipe.engine.device)}
            with rows_path.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(json.dumps({k: row[k] for k in ("method", "id", "answered", "gold_page_in_top3", "answer")}), flush=True)
    report(args.out)


def recomputed(rows: list[dict]) -> str:
    known = [r for r in rows if "gold_page_recomputed" in r]
    return f"{sum(r['gold_page_recomputed'] for r in known)} / {len(known)}" if known else "not recorded"


def report(out: Path) -> None:
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    lines = ["| method | questions | answered | gold page in the top-3 passages | gold page recomputed | encode s | tokens | pages |",
             "|---|---|---|---|---|---|---|---|"]
    for method in dict.fromkeys(r["method"] for r in rows):
        rs = [r for r in rows if r["method"] == method]
        lines.append(f"| {method} | {len(rs)} | {sum(r['answered'] for r in rs)} / {len(rs)} | "
                     f"{sum(r['gold_page_in_top3'] for r in rs)} / {len(rs)} | "
                     f"{recomputed(rs)} | {rs[0]['encode_s']} | "
                     f"{rs[0]['tokens']:,} | {rs[0]['pages']} |")
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
