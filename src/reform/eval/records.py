"""An evaluation's folder: ``predictions.jsonl`` (one record per finished row, appended as it finishes)
and ``config.json`` (every method and invocation that wrote into it). Records are read back tolerantly: a
torn last line from a killed run is ignored and cut before appending."""

from __future__ import annotations

import json
from pathlib import Path

from ..outputs import check_output_dir
from .rows import Row
from .specs import MethodSpec

PREDICTIONS, CONFIG, METRICS, RESULTS = "predictions.jsonl", "config.json", "metrics.json", "results.md"
EXPLAIN = "explain.md"          # the retrieval misses of a run with --explain, one screen each
STAGES = ("encode", "gather", "recompute", "generate")


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
            "context": row.context_key[:12],
            "method": spec.label, "method_name": spec.name, "config_hash": config_hash, "status": status,
            "question": row.question, "answer_prefix": row.answer_prefix, "answers": row.answers,
            "meta": row.meta, "prediction": None, "score": None, **extra}


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


def resolution_changes(before: dict, now: dict) -> list[str]:
    """The options that resolve differently now than they did for a label's rows already in a folder
    (``before``: the ``resolved`` options config.json kept for it; only the options both name): a model's
    preset (its heads, its tuned budgets) can move under an unchanged label and config hash."""
    now = json.loads(json.dumps(now, default=str))
    return [f"{k}: {before[k]} then, {now[k]} now" for k in before.keys() & now.keys() if before[k] != now[k]]


def current_records(records: list[dict], config: dict | None) -> list[dict]:
    """The latest record per (method, row); for methods in ``config``, only those of its config hash."""
    wanted = {m["label"]: m["config_hash"] for m in (config or {}).get("methods", [])}
    latest: dict[tuple[str, str], dict] = {}
    for r in records:
        if r["method"] in wanted and r.get("config_hash") != wanted[r["method"]]:
            continue
        latest[(r["method"], r["id"])] = r
    return list(latest.values())


def folder_records(out_dir: str | Path) -> tuple[dict, list[dict]]:
    """An evaluation folder's ``config.json`` and its current records (``current_records``)."""
    out = Path(out_dir)
    pred_path = out / PREDICTIONS
    if not pred_path.is_file():
        raise ValueError(f"no {PREDICTIONS} in {out}: run an evaluation into it first")
    config = json.loads((out / CONFIG).read_text()) if (out / CONFIG).is_file() else {}
    records = current_records(read_predictions(pred_path), config)
    if not records:
        raise ValueError(f"{pred_path} holds no predictions")
    return config, records
