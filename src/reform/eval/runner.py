"""Run rows through several methods on one loaded model, resumably, and write what they scored.

``run_eval`` loads the model once, builds one ``Pipeline`` per method on it, encodes every distinct
context once per method and asks all of that context's questions. Each finished row is appended to
``predictions.jsonl`` at once, so a killed run loses at most the row in flight and the next run skips
what is there (same method label, same config hash). ``metrics.json``, ``results.md`` and the plots are
derived from ``predictions.jsonl`` alone (``write_report``), so ``reform eval report DIR`` regenerates them.

Full attention past the model's window is not run by default: its rows are recorded as ``skipped`` with
the reason (``force_over_window=True`` runs them, as ``reform ask`` does, with degraded answers).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
import warnings
from collections import defaultdict
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

from ..outputs import check_output_dir, write_atomic
from .rows import Row

PREDICTIONS, CONFIG, METRICS, RESULTS = "predictions.jsonl", "config.json", "metrics.json", "results.md"
STAGES = ("encode", "gather", "recompute", "generate")


# ---------------------------------------------------------------- lengths ("8k", "1M")
_LENGTH = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmM]?)\s*$")


def parse_length(text: str) -> int:
    """``"8k"`` -> 8192, ``"1M"`` -> 1048576, ``"3000"`` -> 3000 (k = 1024, as RULER's lengths)."""
    m = _LENGTH.match(str(text))
    if not m:
        raise ValueError(f"bad length '{text}': use a token count such as 4096, 8k or 1M")
    n = int(float(m.group(1)) * {"": 1, "k": 1024, "m": 1024 ** 2}[m.group(2).lower()])
    if n < 1:
        raise ValueError(f"bad length '{text}': it must be at least 1 token")
    return n


def parse_lengths(text: str) -> list[int]:
    items = [t for t in text.split(",") if t.strip()]
    if not items:
        raise ValueError("no lengths given: use e.g. --lengths 8k,16k,32k")
    return sorted(set(map(parse_length, items)))


def format_length(n: int) -> str:
    for unit, size in (("M", 1024 ** 2), ("k", 1024)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


# ---------------------------------------------------------------- methods with options
def option_value(text: str):
    """A method option's value from the command line: int, float, true/false, else the string."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


@dataclass(frozen=True)
class MethodSpec:
    """A method by name plus options (fields of its config); ``label`` names it in every output."""

    name: str
    options: tuple = ()      # sorted (key, value) pairs, so specs hash and compare by value

    @classmethod
    def of(cls, item) -> "MethodSpec":
        """From ``"reform"``, ``"reform:recompute_budget=512"``, ``("reform", {...})`` or
        ``{"name": "reform", "recompute_budget": 512}``."""
        if isinstance(item, MethodSpec):
            return item
        if isinstance(item, dict):
            item = dict(item)
            return cls.of((item.pop("name", ""), item))
        if isinstance(item, tuple):
            name, options = item
            return cls(str(name).strip(), tuple(sorted((k, v) for k, v in options.items() if v is not None)))
        return cls.parse(str(item))

    @classmethod
    def parse(cls, text: str) -> "MethodSpec":
        name, *parts = text.strip().split(":")
        options = {}
        for part in parts:
            key, eq, value = part.partition("=")
            if not eq or not key.strip():
                raise ValueError(f"bad method option '{part}' in '{text}': use NAME:OPTION=VALUE[:OPTION=VALUE]")
            options[key.strip()] = option_value(value.strip())
        return cls.of((name, options))

    @property
    def label(self) -> str:
        if not self.options:
            return self.name
        return f"{self.name}({','.join(f'{k}={v}' for k, v in self.options)})"

    def check(self) -> None:
        """Refuse an unknown method or options it does not take (no model needed)."""
        from ..pipeline import check_method_options
        if not self.name:
            raise ValueError("a method name is empty")
        check_method_options(self.name, **dict(self.options))

    def config_hash(self, model_name: str, use_chat_template: bool = True) -> str:
        """What the predictions depend on besides the row: model, method, options, prompt layout."""
        key = json.dumps({"model": model_name, "method": self.name, "options": [list(o) for o in self.options],
                          "chat_template": use_chat_template}, sort_keys=True, default=str)
        return hashlib.sha1(key.encode()).hexdigest()[:12]

    def to_json(self, model_name: str, use_chat_template: bool = True) -> dict:
        return {"label": self.label, "name": self.name, "options": dict(self.options),
                "config_hash": self.config_hash(model_name, use_chat_template)}


def method_specs(methods: Iterable) -> list[MethodSpec]:
    """Normalise and check a method list (names, "name:opt=value" strings, tuples or dicts)."""
    specs = [MethodSpec.of(m) for m in methods]
    if not specs:
        raise ValueError("no methods given: use e.g. --methods reform,truncate")
    labels = [s.label for s in specs]
    if len(set(labels)) < len(labels):
        raise ValueError(f"a method is listed twice: {', '.join(sorted({x for x in labels if labels.count(x) > 1}))}")
    for spec in specs:
        spec.check()
    return specs


# ---------------------------------------------------------------- output folder and records
def prepare_out_dir(out_dir: str | Path) -> Path:
    """Make sure files can be written in ``out_dir`` (before any model is loaded), then create it."""
    out = check_output_dir(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return out


def read_predictions(path: str | Path) -> list[dict]:
    """The records of a predictions file; a torn last line (a run killed mid-write) is ignored."""
    path = Path(path)
    if not path.exists():
        return []
    records = []
    lines = path.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if i < len(lines):
                raise ValueError(f"{path} line {i} is not valid JSON") from None
    return records


def drop_torn_tail(path: Path) -> None:
    """Cut a last line left unfinished by a killed run, so appended records start on a line of their own."""
    if not path.is_file() or path.stat().st_size == 0:
        return
    data = path.read_bytes()
    if not data.endswith(b"\n"):
        path.write_bytes(data[:data.rfind(b"\n") + 1])


def finished(record: dict, force_over_window: bool) -> bool:
    """Rows a resumed run does not redo: answered ones, and skipped ones unless they are now forced.
    Errors are retried."""
    return record.get("status") == "ok" or (record.get("status") == "skipped" and not force_over_window)


def record_for(row: Row, spec: MethodSpec, config_hash: str, status: str, **extra) -> dict:
    return {"id": row.id, "task": row.task, "length": row.length, "depth": row.depth, "sample": row.sample,
            "method": spec.label, "method_name": spec.name, "config_hash": config_hash, "status": status,
            "question": row.question, "answer_prefix": row.answer_prefix, "answers": row.answers,
            "meta": row.meta, "prediction": None, "score": None, **extra}


# ---------------------------------------------------------------- answering
def group_by_context(rows: Iterable[Row]) -> list[list[Row]]:
    """Rows with identical contexts, in first-appearance order."""
    groups: dict[str, list[Row]] = {}
    for row in rows:
        groups.setdefault(row.context_key, []).append(row)
    return list(groups.values())


def encode(pipe, text: str, force_over_window: bool, progress: RowProgress):
    """``pipe.encode(text)``; full attention past the window raises ``PastWindowWarning`` unless forced."""
    from ..methods.full import PastWindowWarning
    from ..stats import reset_peak_memory
    reset_peak_memory()                         # each context's peak memory is its own
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore" if force_over_window else "error", PastWindowWarning)
            return pipe.encode(text, progress.encoding(pipe, text))
    finally:
        progress.encoded()


def answer_group(pipe, rows: list[Row], force_over_window: bool,
                 progress: RowProgress | None = None) -> Iterator[tuple[Row, str, dict]]:
    """Encode the rows' shared context once and ask every row's question: yields (row, status, record
    fields)."""
    from ..methods.full import PastWindowWarning
    try:
        ctx = encode(pipe, rows[0].context, force_over_window, progress or RowProgress(False, 0))
    except PastWindowWarning as w:
        reason = f"{w} (not run; force_over_window / --force-over-window runs it)"
        yield from ((row, "skipped", {"reason": reason}) for row in rows)
        return
    except ValueError as e:
        yield from ((row, "error", {"reason": str(e)}) for row in rows)
        return
    for row in rows:
        try:
            ans = ctx.ask(row.question, answer_prefix=row.answer_prefix, max_new_tokens=row.max_new_tokens)
        except ValueError as e:
            yield row, "error", {"reason": str(e)}
            continue
        stats = {**ans.stats, "encode_shared_by": len(rows)}
        yield row, "ok", {"prediction": ans.text, "context_tokens": int(ctx.ids.shape[0]),
                          "input_tokens": ans.input_tokens, "stats": stats}


def resolved_options(method) -> dict | None:
    config = method.config
    return {f.name: getattr(config, f.name) for f in fields(config)} if is_dataclass(config) else None


def versions() -> dict:
    import sys

    import torch
    import transformers

    from .. import __version__ as reform_version
    return {"reform": reform_version, "python": sys.version.split()[0], "torch": torch.__version__,
            "transformers": transformers.__version__}


def machine(model) -> dict:
    """The machine (CPU, cores, threads, GPU) the model runs on and the dtype it runs in (scores can move
    with it: bf16 is picked on CPUs with native bf16); CPU until a model is loaded."""
    import torch

    from ..bench.machine import machine_info
    if model is None:
        return machine_info(torch.device("cpu"))
    weight = next(model.parameters())
    return machine_info(weight.device) | {"dtype": str(weight.dtype).removeprefix("torch.")}


def default_scorer() -> Callable[[Row, str], float]:
    from .tasks.scoring import score
    return score


class RowProgress:
    """A rich bar over rows and, while a long context encodes, one over its tokens; no-ops when disabled."""

    LONG = 16384   # characters: shorter contexts encode in seconds, no token bar

    def __init__(self, enabled: bool, total: int, console=None):
        self.bar = None
        if enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
                TimeRemainingColumn
            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("{task.fields[unit]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                                console=console)
            self.rows = self.bar.add_task("starting", total=total, unit="rows")
            self.tokens = self.bar.add_task("  encoding", total=1, unit="tokens", visible=False)

    def __enter__(self):
        if self.bar is not None:
            self.bar.__enter__()
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.__exit__(*exc)

    def describe(self, text: str) -> None:
        if self.bar is not None:
            self.bar.update(self.rows, description=text)

    def row_done(self) -> None:
        if self.bar is not None:
            self.bar.advance(self.rows)

    def encoding(self, pipe, text: str) -> Callable[[int], None] | None:
        """The encode progress callback for ``text`` (None for short contexts or when disabled)."""
        if self.bar is None or len(text) < self.LONG:
            return None
        self.bar.reset(self.tokens, total=pipe.tokenize_context(text).shape[0], visible=True)
        return lambda n: self.bar.advance(self.tokens, n)

    def encoded(self) -> None:
        if self.bar is not None:
            self.bar.update(self.tokens, visible=False)


def pending(rows: list[Row], hashes: dict[str, str], done: set) -> dict[str, set[str]]:
    """The ids of the rows each method (by label) still has to answer."""
    return {label: {r.id for r in rows if (label, h, r.id) not in done} for label, h in hashes.items()}


def run_eval(rows: list[Row], *, methods: Iterable, out_dir: str | Path, model_name: str, model=None,
             tokenizer=None, loader: Callable | None = None, scorer: Callable[[Row, str], float] | None = None,
             progress: bool = False, console=None, resume: bool = True, force_over_window: bool = False,
             use_chat_template: bool = True, meta: dict | None = None, plots: bool = True) -> dict:
    """Answer ``rows`` with every method and write the results to ``out_dir``; returns the metrics.

    ``methods``: names, ``"name:option=value"`` strings, ``(name, options)`` tuples or dicts. Give a loaded
    ``model`` + ``tokenizer``, or a ``loader()`` returning an object with ``.model`` and ``.tokenizer``
    (called only if some row is left to run). ``scorer(row, prediction)`` -> score in [0, 1].
    ``meta`` (suite, lengths, samples, seed, ...) goes into ``config.json``."""
    from ..pipeline import Pipeline

    specs = method_specs(methods)
    rows = list(rows)
    ids = [r.id for r in rows]
    if len(set(ids)) < len(ids):
        raise ValueError("two rows have the same id (same task, length, depth, sample, question and context)")
    out = prepare_out_dir(out_dir)
    scorer = scorer or default_scorer()
    pred_path = out / PREDICTIONS
    if not resume and pred_path.exists():
        pred_path.unlink()
    drop_torn_tail(pred_path)
    hashes = {s.label: s.config_hash(model_name, use_chat_template) for s in specs}
    done = {(r["method"], r.get("config_hash"), r["id"]) for r in read_predictions(pred_path)
            if finished(r, force_over_window)}
    todo = pending(rows, hashes, done)
    total = sum(map(len, todo.values()))
    config = {"model": model_name, "methods": [s.to_json(model_name, use_chat_template) for s in specs],
              **(meta or {}), "rows": len(rows), "force_over_window": force_over_window,
              "chat_template": use_chat_template, "versions": versions(), "machine": machine(model),
              "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    config = merged_config(out, config) if resume else config | {"runs": [run_entry(config)]}
    write_atomic(out / CONFIG, json.dumps(config, indent=1))
    if total:
        if model is None:
            loaded = loader()
            model, tokenizer = loaded.model, loaded.tokenizer
        pipes = {s.label: Pipeline(model, tokenizer, model_name=model_name, method=s.name,
                                   use_chat_template=use_chat_template, **dict(s.options)) for s in specs}
        for entry in config["methods"]:     # the options every default resolved to, for the record
            if entry["label"] in pipes:
                entry["resolved"] = resolved_options(pipes[entry["label"]].method)
        config["machine"] = config["runs"][-1]["machine"] = machine(model)
        write_atomic(out / CONFIG, json.dumps(config, indent=1, default=str))
        with open(pred_path, "a", encoding="utf-8") as sink, RowProgress(progress, total, console) as bar:
            for group in group_by_context(rows):
                for spec in specs:
                    group_todo = [r for r in group if r.id in todo[spec.label]]
                    if not group_todo:
                        continue
                    bar.describe(f"{spec.label} · {format_length(group_todo[0].length)}")
                    for row, status, extra in answer_group(pipes[spec.label], group_todo, force_over_window, bar):
                        if status == "ok":
                            extra["score"] = float(scorer(row, extra["prediction"]))
                        record = record_for(row, spec, hashes[spec.label], status, **extra)
                        sink.write(json.dumps(record, ensure_ascii=False) + "\n")
                        sink.flush()
                        bar.row_done()
    return write_report(out, plots=plots)


def run_entry(config: dict) -> dict:
    """What one invocation ran: its settings and method labels (their options are in ``methods``)."""
    return {k: v for k, v in config.items() if k not in ("model", "methods", "runs", "versions")} | {
        "methods": [m["label"] for m in config["methods"]]}


def merged_config(out: Path, config: dict) -> dict:
    """``config`` joined to the directory's earlier ``config.json``, so the file describes every prediction
    a resumed directory holds: methods run before under other labels stay (a label run again replaces its
    entry, as its new config hash replaces its rows in the report; the same config keeps its resolved
    options), and ``runs`` lists each invocation's lengths, samples, seed, machine and start time."""
    old = json.loads((out / CONFIG).read_text()) if (out / CONFIG).is_file() else {}
    before = {m["label"]: m for m in old.get("methods", [])}
    for m in config["methods"]:
        prev = before.pop(m["label"], {})
        if prev.get("config_hash") == m["config_hash"] and "resolved" in prev:
            m["resolved"] = prev["resolved"]
    return config | {"methods": list(before.values()) + config["methods"],
                     "runs": old.get("runs", []) + [run_entry(config)]}


# ---------------------------------------------------------------- report (from predictions.jsonl alone)
def current_records(records: list[dict], config: dict | None) -> list[dict]:
    """The latest record per (method, row); for methods in ``config``, only those of its config hash."""
    wanted = {m["label"]: m["config_hash"] for m in (config or {}).get("methods", [])}
    latest: dict[tuple[str, str], dict] = {}
    for r in records:
        if r["method"] in wanted and r.get("config_hash") != wanted[r["method"]]:
            continue
        latest[(r["method"], r["id"])] = r
    return list(latest.values())


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
