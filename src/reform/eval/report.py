"""The report of an evaluation, derived from its ``predictions.jsonl`` alone: ``metrics.json`` (scores per
task x length x method, per depth, per method), ``results.md`` and the plots; ``reform eval report DIR``
regenerates them."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Iterable

from ..outputs import write_atomic
from .records import CONFIG, METRICS, PREDICTIONS, RESULTS, STAGES, current_records, read_predictions
from .specs import format_length


def _mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 4) if values else None


def _ordered(values: Iterable, first: Iterable = ()) -> list:
    """``first`` (in its order) then the other values in first-appearance order, without repeats."""
    return list(dict.fromkeys([*first, *values]))


def row_seconds(record: dict) -> float:
    """Wall seconds spent on one row, the shared encode split over the rows that shared it."""
    s = record.get("stats", {})
    return s.get("encode", 0.0) / s.get("encode_shared_by", 1) + sum(s.get(k, 0.0) for k in STAGES[1:])


def aggregate(records: list[dict], method_order: Iterable[str] = ()) -> dict:
    """Mean score and counts per task x length x method, per depth where rows have one, per length
    averaged over tasks, and per method (with seconds per row and peak memory)."""
    methods = _ordered((r["method"] for r in records), method_order)
    tasks = _ordered(sorted(r["task"] for r in records))
    lengths = sorted({r["length"] for r in records})
    cells: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        cells[(r["task"], r["length"], r["method"])].append(r)
        if r.get("depth") is not None:
            cells[(r["task"], r["length"], r["method"], r["depth"])].append(r)
        cells[(r["method"],)].append(r)

    def summary(group: list[dict]) -> dict:
        scores = [r["score"] for r in group if r["status"] == "ok"]
        return {"score": _mean(scores), "n": len(scores),
                "skipped": sum(r["status"] == "skipped" for r in group),
                "errors": sum(r["status"] == "error" for r in group)}

    by_task = [{"task": k[0], "length": k[1], "method": k[2], **summary(v)} for k, v in cells.items() if len(k) == 3]
    by_depth = [{"task": k[0], "length": k[1], "method": k[2], "depth": k[3], **summary(v)}
                for k, v in cells.items() if len(k) == 4]
    by_length = []
    for length in lengths:
        for method in methods:
            means = [c["score"] for c in by_task if c["length"] == length and c["method"] == method
                     and c["score"] is not None]
            if means:
                by_length.append({"length": length, "method": method, "score": _mean(means), "tasks": len(means)})
    by_method = []
    for method in methods:
        group = cells[(method,)]
        ok = [r for r in group if r["status"] == "ok"]
        by_method.append({"method": method, **summary(group),
                          "seconds_per_row": _mean([row_seconds(r) for r in ok]),
                          "peak_memory_mb": max((r["stats"].get("peak_memory_mb", 0) for r in ok), default=None)})
    key = lambda c: (tasks.index(c["task"]), c["length"], methods.index(c["method"]), c.get("depth") or 0)
    return {"methods": methods, "tasks": tasks, "lengths": lengths, "by_task": sorted(by_task, key=key),
            "by_depth": sorted(by_depth, key=key), "by_length": by_length, "by_method": by_method}


def _percent(cell: dict | None) -> str:
    if cell is None:
        return "—"
    if cell["score"] is None:
        return "skipped" if cell["skipped"] else "error"
    return f"{100 * cell['score']:.1f}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(r) + " |" for r in rows)]


def markdown(metrics: dict, model: str = "") -> str:
    """``results.md``: score (%) per task x length (rows) and method (columns), per-depth tables for the
    tasks that have depths, and time and memory per method."""
    methods, by_task = metrics["methods"], metrics["by_task"]
    cell = {(c["task"], c["length"], c["method"]): c for c in by_task}
    counts = {c["n"] for c in by_task if c["n"]}
    lines = [f"# Evaluation results{f': {model}' if model else ''}", "",
             "Scores are the mean per-row score in % (NIAH/BABILong: answer contains the gold string; "
             "RULER-style: fraction of gold strings present)."
             + (f" Rows per cell: {counts.pop()}." if len(counts) == 1 else " Rows per cell are in metrics.json."), ""]
    body = [[task, format_length(length), *(_percent(cell.get((task, length, m))) for m in methods)]
            for task in metrics["tasks"] for length in metrics["lengths"]
            if any((task, length, m) in cell for m in methods)]
    if len(metrics["tasks"]) > 1:
        avg = {(c["length"], c["method"]): c for c in metrics["by_length"]}
        body += [["**mean over tasks**", format_length(length),
                  *(f"{100 * avg[(length, m)]['score']:.1f}" if (length, m) in avg else "—" for m in methods)]
                 for length in metrics["lengths"]]
    lines += _table(["task", "length", *methods], body)
    for task in _ordered(c["task"] for c in metrics["by_depth"]):
        depth = {(c["method"], c["depth"], c["length"]): c for c in metrics["by_depth"] if c["task"] == task}
        lengths = sorted({k[2] for k in depth})
        pairs = sorted({k[:2] for k in depth}, key=lambda k: (methods.index(k[0]), k[1]))
        lines += ["", f"## {task}: score (%) by depth", ""]
        lines += _table(["method", "depth", *map(format_length, lengths)],
                        [[m, f"{d:.0%}", *(_percent(depth.get((m, d, n))) for n in lengths)] for m, d in pairs])
    lines += ["", "## Time and memory per method", ""]
    lines += _table(["method", "rows answered", "skipped", "errors", "seconds per row", "peak memory (MB)"],
                    [[m["method"], str(m["n"]), str(m["skipped"]), str(m["errors"]),
                      "—" if m["seconds_per_row"] is None else f"{m['seconds_per_row']:.2f}",
                      "—" if m["peak_memory_mb"] is None else f"{m['peak_memory_mb']:.0f}"]
                     for m in metrics["by_method"]])
    return "\n".join(lines) + "\n"


def write_report(out_dir: str | Path, plots: bool = True) -> dict:
    """(Re)write ``metrics.json``, ``results.md`` and the PNGs of ``out_dir`` from its predictions."""
    out = Path(out_dir)
    pred_path = out / PREDICTIONS
    if not pred_path.is_file():
        raise ValueError(f"no {PREDICTIONS} in {out}: run an evaluation into it first")
    config = json.loads((out / CONFIG).read_text()) if (out / CONFIG).is_file() else {}
    records = current_records(read_predictions(pred_path), config)
    if not records:
        raise ValueError(f"{pred_path} holds no predictions")
    metrics = aggregate(records, [m["label"] for m in config.get("methods", [])])
    metrics["model"] = config.get("model", "")
    write_atomic(out / METRICS, json.dumps(metrics, indent=1))
    write_atomic(out / RESULTS, markdown(metrics, metrics["model"]))
    metrics["plots"] = []
    if plots:
        from .plots import draw_all
        metrics["plots"] = [str(p) for p in draw_all(metrics, out)]
    return metrics
