"""Two methods on the same rows, row by row: how many rows each one scored higher on, and whether that
split could be chance. A mean over a few dozen rows moves by a whole row's worth on one reading miss, so
"lower" needs the pairing: the exact two-sided sign test on the rows where the scores differ (McNemar's
exact test when every score is 0 or 1), ties left out."""

from __future__ import annotations

from math import comb


def sign_test_p(better: int, worse: int) -> float:
    """Two-sided exact sign test: the chance of a split at least this uneven if either method were as
    likely as the other to win each differing row."""
    n = better + worse
    if n == 0:
        return 1.0
    tail = sum(comb(n, k) for k in range(min(better, worse) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def _ok_by_row(records: list[dict], method: str) -> dict:
    return {r["id"]: r for r in records if r["method"] == method and r["status"] == "ok"}


def _split(pairs: list[tuple[float, float]]) -> tuple[int, int, int]:
    better = sum(b > a for a, b in pairs)
    worse = sum(b < a for a, b in pairs)
    return better, worse, len(pairs) - better - worse


def compare(records: list[dict], base: str, other: str) -> dict:
    """``other`` against ``base`` over the rows (ids) both answered: rows scored higher / lower / the same,
    the mean score difference and the sign test's p; the same split for gold recall over the rows where
    both have one."""
    a, b = _ok_by_row(records, base), _ok_by_row(records, other)
    common = sorted(a.keys() & b.keys())
    scores = [(a[k]["score"], b[k]["score"]) for k in common]
    recalls = [(a[k]["recall"], b[k]["recall"]) for k in common
               if a[k].get("recall") is not None and b[k].get("recall") is not None]
    better, worse, same = _split(scores)
    r_better, r_worse, _ = _split(recalls)
    return {"method": other, "base": base, "rows": len(common), "better": better, "worse": worse, "same": same,
            "difference": round(sum(y - x for x, y in scores) / len(scores), 4) if scores else None,
            "p": round(sign_test_p(better, worse), 4), "recall_rows": len(recalls),
            "recall_better": r_better, "recall_worse": r_worse, "recall_p": round(sign_test_p(r_better, r_worse), 4)}


def against_first(records: list[dict], methods: list[str]) -> list[dict]:
    """Every method after the first against the first, where they share any answered row."""
    rows = [compare(records, methods[0], m) for m in methods[1:]]
    return [r for r in rows if r["rows"]]


def markdown_table(rows: list[dict]) -> list[str]:
    """The comparisons as a markdown table (score difference in points)."""
    head = ("| method | against | rows | higher | lower | same | mean difference (points) | p "
            "| gold recall higher / lower (p) |")
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for r in rows:
        diff = "—" if r["difference"] is None else f"{100 * r['difference']:+.1f}"
        recall = (f"{r['recall_better']} / {r['recall_worse']} ({r['recall_p']:.3g})" if r["recall_rows"] else "n/a")
        lines.append(f"| {r['method']} | {r['base']} | {r['rows']} | {r['better']} | {r['worse']} | {r['same']} | "
                     f"{diff} | {r['p']:.3g} | {recall} |")
    return lines
