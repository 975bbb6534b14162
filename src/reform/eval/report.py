"""The report of an evaluation, derived from its ``predictions.jsonl`` alone: ``metrics.json`` (score and
gold recall with n and 95 % intervals per task x length x method, per depth, per method), ``results.md``
and the plots; ``reform eval report DIR`` regenerates them."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Iterable

from ..outputs import write_atomic
from .intervals import interval
from .paired import against_first, markdown_table
from .recall import miss_kind
from .records import EXPLAIN, METRICS, RESULTS, STAGES, folder_records
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


def _ok(group: list[dict]) -> list[dict]:
    return [r for r in group if r["status"] == "ok"]


def _interval(groups: list[list[float]]) -> list[float] | None:
    ci = interval(groups)
    return None if ci is None else [round(ci[0], 4), round(ci[1], 4)]


def summary(cells: list[list[dict]]) -> dict:
    """Score and gold recall of one or more cells' rows (several: a mean over tasks, each task weighing the
    same), each with its row count and 95 % interval, and how many misses were reading / retrieval misses."""
    oks = [_ok(c) for c in cells]
    scores = [[r["score"] for r in ok] for ok in oks if ok]
    recalls = [g for g in ([r["recall"] for r in ok if r.get("recall") is not None] for ok in oks) if g]
    exact = [g for g in ([r["em"] for r in ok if r.get("em") is not None] for ok in oks) if g]   # RepoEval's EM
    misses = Counter(miss_kind(r["score"], r.get("recall")) for ok in oks for r in ok)
    mean = lambda groups: _mean([sum(g) / len(g) for g in groups]) if groups else None
    return {"score": mean(scores), "n": sum(map(len, scores)), "ci": _interval(scores),
            "recall": mean(recalls), "recall_n": sum(map(len, recalls)), "recall_ci": _interval(recalls),
            **({"em": mean(exact), "em_ci": _interval(exact)} if exact else {}),
            "reading_misses": misses["reading"], "retrieval_misses": misses["retrieval"],
            "skipped": sum(r["status"] == "skipped" for c in cells for r in c),
            "errors": sum(r["status"] == "error" for c in cells for r in c)}


def question_seconds(record: dict) -> float:
    """Wall seconds of one question once its context is encoded: gather, recompute, generate."""
    return sum(record.get("stats", {}).get(k, 0.0) for k in STAGES[1:])


def shared_contexts(records: list[dict], methods: list[str]) -> list[dict]:
    """Per method x length, over the contexts that were asked several questions: score (all questions,
    the first, the later ones), the encode paid once, seconds per question, total seconds per context."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in _ok(records):
        if r.get("context") and r.get("stats", {}).get("encode_shared_by", 1) > 1:
            groups[(r["method"], r["length"], r["context"])].append(r)
    by_cell: dict[tuple, list[list[dict]]] = defaultdict(list)
    for (method, length, _), group in groups.items():
        by_cell[(method, length)].append(group)
    out = []
    for (method, length), contexts in sorted(by_cell.items(), key=lambda kv: (kv[0][1], methods.index(kv[0][0]))):
        rows = [r for c in contexts for r in c]
        turn = lambda first: [[r for r in rows if (r.get("meta", {}).get("turn", 0) == 0) == first]]
        encodes = [max(r["stats"].get("encode", 0.0) for r in c) for c in contexts]
        out.append({"method": method, "length": length, "contexts": len(contexts),
                    "questions_per_context": round(len(rows) / len(contexts), 2), **summary([rows]),
                    "first_question": summary(turn(True))["score"], "later_questions": summary(turn(False))["score"],
                    "encode_seconds": _mean(encodes), "seconds_per_question": _mean(list(map(question_seconds, rows))),
                    "total_seconds_per_context": _mean([e + sum(map(question_seconds, c))
                                                        for e, c in zip(encodes, contexts)])})
    return out


def aggregate(records: list[dict], method_order: Iterable[str] = ()) -> dict:
    """Score and recall (with n and 95 % intervals) per task x length x method, per depth where rows have
    one, per length averaged over tasks, and per method (with seconds per row and peak memory)."""
    methods = _ordered((r["method"] for r in records), method_order)
    tasks = _ordered(sorted(r["task"] for r in records))
    lengths = sorted({r["length"] for r in records})
    cells: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        cells[(r["task"], r["length"], r["method"])].append(r)
        if r.get("depth") is not None:
            cells[(r["task"], r["length"], r["method"], r["depth"])].append(r)
        cells[(r["method"],)].append(r)

    by_task = [{"task": k[0], "length": k[1], "method": k[2], **summary([v])} for k, v in cells.items() if len(k) == 3]
    by_depth = [{"task": k[0], "length": k[1], "method": k[2], "depth": k[3], **summary([v])}
                for k, v in cells.items() if len(k) == 4]
    by_length = []
    for length in lengths:
        for method in methods:
            group = [cells[(t, length, method)] for t in tasks if _ok(cells.get((t, length, method), []))]
            if group:
                by_length.append({"length": length, "method": method, **summary(group), "tasks": len(group)})
    by_method = []
    for method in methods:
        group = cells[(method,)]
        by_method.append({"method": method, **summary([group]),
                          "seconds_per_row": _mean([row_seconds(r) for r in _ok(group)]),
                          "peak_memory_mb": max((r["stats"].get("peak_memory_mb", 0) for r in _ok(group)),
                                                default=None)})
    key = lambda c: (tasks.index(c["task"]), c["length"], methods.index(c["method"]), c.get("depth") or 0)
    return {"methods": methods, "tasks": tasks, "lengths": lengths, "by_task": sorted(by_task, key=key),
            "by_depth": sorted(by_depth, key=key), "by_length": by_length, "by_method": by_method,
            "shared_contexts": shared_contexts(records, methods), "paired": against_first(records, methods)}


def _percent(cell: dict | None, key: str = "score", ci: bool = True) -> str:
    """A cell as ``score [low–high]`` in %, or why it has no score."""
    if cell is None:
        return "—"
    if cell.get(key) is None:
        if key != "score":
            return "n/a" if cell["n"] else "—"
        return "skipped" if cell["skipped"] else "error"
    text = f"{100 * cell[key]:.1f}"
    bounds = cell.get("ci" if key == "score" else f"{key}_ci")
    return f"{text} [{100 * bounds[0]:.0f}–{100 * bounds[1]:.0f}]" if ci and bounds else text


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(r) + " |" for r in rows)]


def _count(cells: list[dict | None]) -> str:
    """The rows behind a table line: one number when every method has the same count."""
    counts = list(dict.fromkeys(c["n"] for c in cells if c is not None and c["n"]))
    return "—" if not counts else str(counts[0]) if len(counts) == 1 else "/".join(map(str, counts))


def _grid(metrics: dict, show) -> list[str]:
    """A task x length (rows) by method (columns) table of ``show(cell)``, with the mean over tasks."""
    methods = metrics["methods"]
    cell = {(c["task"], c["length"], c["method"]): c for c in metrics["by_task"]}
    body = []
    for task in metrics["tasks"]:
        for length in metrics["lengths"]:
            line = [cell.get((task, length, m)) for m in methods]
            if any(c is not None for c in line):
                body.append([task, format_length(length), _count(line), *map(show, line)])
    if len(metrics["tasks"]) > 1:
        avg = {(c["length"], c["method"]): c for c in metrics["by_length"]}
        shared = [length for length in metrics["lengths"]
                  if max((c["tasks"] for c in metrics["by_length"] if c["length"] == length), default=0) > 1]
        for length in shared:
            line = [avg.get((length, m)) for m in methods]
            most = max((c["tasks"] for c in line if c is not None), default=0)
            partial = lambda c: "" if c is None or c["tasks"] == most else f" ({c['tasks']} of {most} tasks)"
            body.append(["**mean over tasks**", format_length(length), _count(line),
                         *(show(c) + partial(c) for c in line)])
        if not shared:      # every task at lengths of its own (real documents): one line over all the rows
            overall = {c["method"]: c for c in metrics["by_method"]}
            line = [overall.get(m) for m in methods]
            body.append(["**all rows**", "all", _count(line), *map(show, line)])
    return _table(["task", "length", "n", *methods], body)


def _misses(cell: dict | None) -> str:
    if cell is None or cell["recall"] is None:
        return "—" if cell is None or not cell["n"] else "n/a"
    return f"{cell['reading_misses']} / {cell['retrieval_misses']}"


def markdown(metrics: dict, model: str = "") -> str:
    """``results.md``: score and gold recall (%) with 95 % intervals per task x length (rows) and method
    (columns), reading / retrieval miss counts, per-depth tables for the tasks that have depths, and time
    and memory per method."""
    methods = metrics["methods"]
    lines = [f"# Evaluation results{f': {model}' if model else ''}", "",
             "Scores are the mean per-row score in % (NIAH/BABILong: answer contains the gold string; "
             "RULER-style: fraction of gold strings present), with a 95 % interval in brackets (Wilson for "
             "0/1 scores, bootstrap for partial credit; the mean over tasks weighs each task the same). "
             "`n`: rows per cell.", ""]
    lines += _grid(metrics, _percent)
    if any(c["recall"] is not None for c in metrics["by_task"]):
        lines += ["", "## Gold recall (%)", "",
                  "Share of the gold strings (a task's evidence, else its answers) that lie inside the context "
                  "tokens the method recomputed, with a 95 % interval. n/a: the method answers from a "
                  "compressed cache, or the gold strings are not each exactly once in the context.", ""]
        lines += _grid(metrics, lambda c: _percent(c, "recall"))
        lines += ["", "## Misses: reading / retrieval", "",
                  "Rows scored below 100 % with every gold string recomputed (reading misses: the model had the "
                  "facts) / with some gold string left out (retrieval misses).", ""]
        lines += _grid(metrics, _misses)
    if any(c.get("em") is not None for c in metrics["by_task"]):
        lines += ["", "## Exact match (%)", "",
                  "RepoEval's EM: the prediction's first lines, stripped, equal the target's (the score above is "
                  "its edit similarity).", ""]
        lines += _grid(metrics, lambda c: _percent(c, "em"))
    if metrics.get("paired"):
        lines += ["", f"## Row by row against {methods[0]}", "",
                  "Over the rows both methods answered: how many each method scored higher / lower than the "
                  "first, the mean difference, and the exact two-sided sign test's p over the rows that differ "
                  "(McNemar's exact test for 0/1 scores; a small p: the split is unlikely to be chance).", ""]
        lines += markdown_table(metrics["paired"])
    if metrics.get("shared_contexts"):
        lines += ["", "## Shared contexts: encode once, ask many", "",
                  "Contexts asked several questions in turn: score over all their questions (95 % interval), "
                  "on the first question and on the later ones; the encode is paid once per context.", ""]
        pct = lambda v: "—" if v is None else f"{100 * v:.1f}"
        secs = lambda v: "—" if v is None else f"{v:.1f}"
        lines += _table(["method", "length", "contexts", "questions each", "score", "first question",
                         "later questions", "gold recall", "encode s", "s per question", "total s per context"],
                        [[c["method"], format_length(c["length"]), str(c["contexts"]),
                          f"{c['questions_per_context']:g}", _percent(c), pct(c["first_question"]),
                          pct(c["later_questions"]), _percent(c, "recall"), secs(c["encode_seconds"]),
                          f"{c['seconds_per_question']:.2f}", secs(c["total_seconds_per_context"])]
                         for c in metrics["shared_contexts"]])
    for task in _ordered(c["task"] for c in metrics["by_depth"]):
        depth = {(c["method"], c["depth"], c["length"]): c for c in metrics["by_depth"] if c["task"] == task}
        lengths = sorted({k[2] for k in depth})
        pairs = sorted({k[:2] for k in depth}, key=lambda k: (methods.index(k[0]), k[1]))
        lines += ["", f"## {task}: score (%) by depth", ""]
        lines += _table(["method", "depth", *map(format_length, lengths)],
                        [[m, f"{d:.0%}", *(_percent(depth.get((m, d, n)), ci=False) for n in lengths)]
                         for m, d in pairs])
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
    config, records = folder_records(out)
    metrics = aggregate(records, [m["label"] for m in config.get("methods", [])])
    metrics["model"] = config.get("model", "")
    write_atomic(out / METRICS, json.dumps(metrics, indent=1))
    write_atomic(out / RESULTS, markdown(metrics, metrics["model"]))
    explained = [r for r in records if r.get("explain")]
    if explained:
        from .explain import render
        write_atomic(out / EXPLAIN, "# Retrieval misses, explained\n\n" + "\n\n".join(
            f"{render(r['id'], r['question'], r['explain'])}\n(method {r['method']}; answer {r['prediction']!r}, "
            f"score {r['score']})" for r in explained) + "\n")
    metrics["plots"] = []
    if plots:
        from .plots import draw_all
        metrics["plots"] = [str(p) for p in draw_all(metrics, out)]
    return metrics
