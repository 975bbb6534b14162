"""Read rows from a JSONL file for ``reform eval jsonl``: our row format (``rows.Row``) or RULER's.

A RULER row (``input``, ``outputs``, optionally ``length``, ``answer_prefix``, ``index``) holds context
and question in one string: RULER's templates put the question after the context, last. We split it at
the last occurrence of ``question_split`` (the question starts at the marker, e.g. ``"Question:"``), or,
by default, at the last line break (the question is the input's last non-empty line). If ``input`` ends
with the row's ``answer_prefix``, the prefix is cut off first (RULER's ``prepare.py`` already cuts it).
Prepare RULER data with ``--model_template_type base`` so ``input`` holds no chat markup: our pipeline
applies the model's own chat template. The task is ``task`` if given, else the row's ``task`` field (newer
RULER), else named after the file (``data/<task>/validation.jsonl`` -> ``ruler/<task>``).
"""

from __future__ import annotations

import json
from pathlib import Path

from .rows import Row


class RowFileError(ValueError):
    """A bad row file; the message names the file and line."""


def default_task(path: Path) -> str:
    name = path.parent.name if path.stem in ("validation", "test", "train", "data") and path.parent.name else path.stem
    return f"ruler/{name}"


def split_question(text: str, marker: str | None) -> tuple[str, str]:
    """(context, question) of a RULER ``input``."""
    text = text.rstrip()
    if marker:
        at = text.rfind(marker)
        if at < 0:
            raise ValueError(f"the question marker '{marker}' does not occur in 'input'")
    else:
        at = text.rfind("\n") + 1
        if at == 0:
            raise ValueError("'input' has no line break to split context and question at; pass --question-split")
    context, question = text[:at].strip(), text[at:].strip()
    if not context or not question:
        raise ValueError("splitting 'input' left the context or the question empty; pass another --question-split")
    return context, question


def from_ruler(data: dict, task: str, marker: str | None, max_new_tokens: int) -> Row:
    outputs = data["outputs"]
    if isinstance(outputs, str):
        outputs = [outputs]
    if not isinstance(data["input"], str) or not isinstance(outputs, list) \
            or not all(isinstance(o, str) for o in outputs):
        raise ValueError("RULER rows need a string 'input' and a list of strings 'outputs'")
    prefix = data.get("answer_prefix") or ""
    text = data["input"].rstrip()
    if prefix and text.endswith(prefix.strip()):
        text = text[:-len(prefix.strip())]
    context, question = split_question(text, marker)
    index = data.get("index", 0)
    return Row(context=context, question=question, answers=outputs, task=task, length=int(data.get("length", 0)),
               answer_prefix=prefix.strip(), max_new_tokens=max_new_tokens,
               sample=index if isinstance(index, int) else 0)


def check_row(row: Row) -> Row:
    """Types and ranges the runner relies on (``Row.from_json`` checks names and ``answers``)."""
    for name in ("context", "question"):
        value = getattr(row, name)
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"'{name}' must be a non-empty string")
    if not isinstance(row.task, str) or not row.task.strip():
        raise ValueError("'task' must be a non-empty string")
    if not isinstance(row.answer_prefix, str):
        raise ValueError("'answer_prefix' must be a string")
    for name in ("length", "sample"):
        if not isinstance(getattr(row, name), int) or getattr(row, name) < 0:
            raise ValueError(f"'{name}' must be a non-negative integer")
    if not isinstance(row.max_new_tokens, int) or row.max_new_tokens < 1:
        raise ValueError("'max_new_tokens' must be a positive integer")
    if row.depth is not None and (not isinstance(row.depth, (int, float)) or not 0 <= row.depth <= 1):
        raise ValueError("'depth' must be a number from 0 to 1, or null")
    if not row.answers:
        raise ValueError("'answers' is empty")
    return row


def read_rows(path: str | Path, *, question_split: str | None = None, task: str | None = None,
              max_new_tokens: int | None = None) -> list[Row]:
    """Every row of ``path`` (blank lines skipped), each validated; ``max_new_tokens`` overrides the
    rows' own (RULER rows default to 64)."""
    path = Path(path)
    if not path.is_file():
        raise RowFileError(f"file not found: {path}" if not path.exists() else f"{path} is not a file")
    rows, seen = [], {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise RowFileError(f"{path} is not valid UTF-8 (byte {e.start})") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            if not isinstance(data, dict):
                raise ValueError("a row must be a JSON object")
            if "context" not in data and {"input", "outputs"} <= set(data):
                name = task or (f"ruler/{data['task']}" if isinstance(data.get("task"), str) else default_task(path))
                row = from_ruler(data, name, question_split, max_new_tokens or 64)
            else:
                row = Row.from_json(data)
                if max_new_tokens:
                    row.max_new_tokens = max_new_tokens
            rows.append(check_row(row))
            if row.id in seen:
                raise ValueError(f"the row repeats line {seen[row.id]} (same task, length, depth, sample, question "
                                 "and context); give repeats another 'sample'")
            seen[row.id] = number
        except json.JSONDecodeError as e:
            raise RowFileError(f"{path} line {number}: not valid JSON ({e.msg}, column {e.colno})") from None
        except (ValueError, TypeError) as e:
            raise RowFileError(f"{path} line {number}: {e}") from None
    if not rows:
        raise RowFileError(f"{path} holds no rows")
    return rows
