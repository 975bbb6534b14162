"""OCR against a text layer: pages of a real PDF rendered to images and wrapped back as a PDF without a text
layer (as a scanner writes one; tests/data/documents/make.py ``make_scan``), read by reform's OCR, and each
page's reading compared with the text layer of the same page, two ways:

- in order: 1 - the edit distance between the two texts (whitespace runs as one space) over the text
  layer's length. A table read row by row where the text layer runs cell by cell counts as errors.
- in order, leaders aside: the same with runs of dot leaders (". . . ." in a table of contents) taken out
  of both texts: the text layer spaces them, OCR reads them as "....." or drops them.
- in any order (in the spirit of Clausner et al., 2020, "Flexible character accuracy measure for
  reading-order-independent evaluation"): each line of the text layer against the stretch of the reading
  that matches it best (rapidfuzz's partial-ratio alignment), the edit distances added up over the text
  layer's characters. Text OCR adds where the text layer has none is not counted this way.

Writes results.json and results.md.

    python scripts/ocr_accuracy.py /usr/share/debian-reference/debian-reference.en.pdf \\
        --pages 20 --out docs/results/documents-ocr
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import editdistance

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "data" / "documents"))
from make import make_scan  # noqa: E402

from reform.documents import Limits, extract  # noqa: E402
from reform.machine import cpu_name  # noqa: E402


def page_texts(doc) -> dict[int, str]:
    """Each page's text of an extracted PDF, by page number."""
    out = {}
    for i, mark in enumerate(doc.marks):
        end = doc.marks[i + 1].start if i + 1 < len(doc.marks) else len(doc.text)
        out[mark.page] = out.get(mark.page, "") + doc.text[mark.start:end]
    return out


LEADERS = re.compile(r"(?:\s*\.){2,}")


def without_leaders(text: str) -> str:
    return " ".join(LEADERS.sub(" ", text).split())


def any_order_errors(truth: str, read: str) -> int:
    """Character errors of each line of ``truth`` against its best-matching stretch of ``read``."""
    from rapidfuzz import fuzz
    from rapidfuzz.distance import Levenshtein
    read = " ".join(read.split())
    errors = 0
    for line in truth.split("\n"):
        line = " ".join(line.split())
        if not line:
            continue
        at = fuzz.partial_ratio_alignment(line, read)
        errors += Levenshtein.distance(line, read[at.dest_start:at.dest_end]) if at is not None else len(line)
    return errors


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pdf", type=Path)
    ap.add_argument("--pages", type=int, default=20, help="pages spread evenly over the book")
    ap.add_argument("--dpi", type=int, default=150, help="the scan's resolution")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    layer = extract(args.pdf, limits=Limits(ocr="never"))
    truth = page_texts(layer)
    step = layer.pages / args.pages
    pages = [int(step * i + step / 2) + 1 for i in range(args.pages)]
    scan = make_scan(args.pdf, pages, args.out / "scan.pdf", dpi=args.dpi)
    started = time.perf_counter()
    doc = extract(scan)
    seconds = time.perf_counter() - started
    read = page_texts(doc)
    rows, errors, loose, chars, bare_errors, bare_chars = [], 0, 0, 0, 0, 0
    for i, page in enumerate(pages, start=1):
        a, b = " ".join(truth.get(page, "").split()), " ".join(read.get(i, "").split())
        e, f = editdistance.eval(a, b), any_order_errors(truth.get(page, ""), b)
        bare = without_leaders(a)
        g = editdistance.eval(bare, without_leaders(b))
        errors, loose, chars = errors + e, loose + f, chars + len(a)
        bare_errors, bare_chars = bare_errors + g, bare_chars + len(bare)
        rows.append({"page": page, "chars": len(a), "edits": e, "accuracy": round(1 - e / max(len(a), 1), 4),
                     "leaders_aside_accuracy": round(1 - g / max(len(bare), 1), 4),
                     "any_order_errors": f, "any_order_accuracy": round(1 - f / max(len(a), 1), 4)})
    result = {"pdf": str(args.pdf), "dpi": args.dpi, "pages": pages, "cpu": cpu_name(),
              "accuracy": round(1 - errors / chars, 4), "any_order_accuracy": round(1 - loose / chars, 4),
              "leaders_aside_accuracy": round(1 - bare_errors / bare_chars, 4),
              "seconds": round(seconds, 1),
              "pages_per_second": round(len(pages) / seconds, 3), "timings": doc.timings, "rows": rows}
    name = f"results-{args.dpi}dpi"
    (args.out / f"{name}.json").write_text(json.dumps(result, indent=1))
    lines = [f"{args.pdf.name}: {len(pages)} pages scanned at {args.dpi} dpi, read by OCR in {seconds:.1f} s "
             f"({len(pages) / seconds:.2f} pages/s) on {cpu_name()}; character accuracy against the text layer, "
             f"all pages together: **{result['accuracy']:.1%}** in order, **{result['leaders_aside_accuracy']:.1%}** "
             f"in order with dot leaders aside, **{result['any_order_accuracy']:.1%}** in any order.", "",
             "| page | characters | in order: edits | accuracy | leaders aside | any order: errors | accuracy |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['page']} | {r['chars']} | {r['edits']} | {r['accuracy']:.1%} | {r['leaders_aside_accuracy']:.1%} | "
              f"{r['any_order_errors']} | {r['any_order_accuracy']:.1%} |" for r in rows]
    (args.out / f"{name}.md").write_text("\n".join(lines) + "\n")
    (args.out / "scan.pdf").unlink()
    print("\n".join(lines))


if __name__ == "__main__":
    main()
