"""Read rows from a JSONL file for ``reform eval jsonl``: our row format (``rows.Row``) or RULER's.

A RULER row (``input``, ``outputs``, optionally ``length``, ``answer_prefix``, ``index``) holds context
and question in one string: RULER's templates put the question after the context, last. We split it at
the last occurrence of ``question_split`` (the question starts at the marker, e.g. ``"Question:"``), or,
by default, at the last line break (the question is the input's last non-empty line). If ``input`` ends
with the row's ``answer_prefix``, the prefix is cut off first (RULER's ``prepare.py`` already cuts it).
Prepare RULER data with ``--model_template_type base`` so ``input`` holds no chat markup: our pipeline
applies the model's own chat template. The task is ``task`` if given, else the row's ``task`` field (newer
RULER), else named after the file (``data/<task>/validation.jsonl`` -> ``ruler/<task>``).

An MM-NIAH row (``images_list``, ``context`` with ``<image>`` marks, ``question``, ``answer``, ``meta``; the
format of OpenGVLab/MM-NIAH) becomes a row with images for a vision-language model: image paths are
resolved against ``images_root`` (default: the file's folder); a multiple-choice answer (an index into
``meta.choices``) is asked with the options lettered A, B, ... and scored by the letter (``choice``).
Rows that ask with images (``<image>`` in the question, image choices) or want a list (counting) are
refused by line: reform asks questions as text and scores one answer.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..engine.layout import LAYOUTS
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


def from_mm_niah(data: dict, task: str, images_root: Path, max_new_tokens: int) -> Row:
    from .rows import IMAGE_MARK
    meta = data.get("meta") or {}
    context, question, answer = data.get("context"), data.get("question"), data.get("answer")
    images = data.get("images_list") or []
    if not isinstance(context, str) or not isinstance(question, str) or not isinstance(images, list):
        raise ValueError("MM-NIAH rows need a string 'context' and 'question' and a list 'images_list'")
    if IMAGE_MARK in question or meta.get("choices_image_path"):
        raise ValueError("its question asks with images (an image needle picked by picture), which reform cannot "
                         "ask yet: questions are text")
    if context.count(IMAGE_MARK) != len(images):
        raise ValueError(f"'context' has {context.count(IMAGE_MARK)} {IMAGE_MARK} marks for {len(images)} images")
    scoring = {"metric": "contains"}
    if isinstance(answer, bool) or isinstance(answer, list):
        raise ValueError("list answers (MM-NIAH counting) are not scored by reform eval yet")
    if isinstance(answer, int):
        choices = meta.get("choices")
        if not isinstance(choices, list) or not 0 <= answer < len(choices) or len(choices) > 26:
            raise ValueError("a multiple-choice 'answer' must index 'meta.choices' (at most 26 text options)")
        question += "\n" + "\n".join(f"{chr(65 + i)}. {c}" for i, c in enumerate(choices)) + \
            "\nAnswer with the option's letter."
        answer, scoring = chr(65 + answer), {"metric": "choice"}
    if not isinstance(answer, str):
        raise ValueError("'answer' must be a string or an option index")
    depth = meta.get("placed_depth")
    depth = depth if isinstance(depth, (int, float)) and not isinstance(depth, bool) else None
    index = data.get("id", 0)
    return Row(context=context, question=question, answers=[answer], task=task,
               length=int(meta.get("context_length") or 0), depth=depth, max_new_tokens=max_new_tokens,
               sample=index if isinstance(index, int) else 0, meta=scoring,
               images=[str((images_root / image).resolve()) for image in images])


def check_row(row: Row) -> Row:
    """Types and ranges the runner relies on (``Row.from_json`` checks names and ``answers``)."""
    for name in ("context", "question"):
        value = getattr(row, name)
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"'{name}' must be a non-empty string")
    if not isinstance(row.task, str) or not row.task.strip():
        raise ValueError("'task' must be a non-empty string")
    for name in ("answer_prefix", "instruction"):
        if not isinstance(getattr(row, name), str):
            raise ValueError(f"'{name}' must be a string")
    if row.layout not in LAYOUTS:
        raise ValueError(f"'layout' must be one of {', '.join(LAYOUTS)}")
    for name in ("length", "sample"):
        if not isinstance(getattr(row, name), int) or getattr(row, name) < 0:
            raise ValueError(f"'{name}' must be a non-negative integer")
    if not isinstance(row.max_new_tokens, int) or row.max_new_tokens < 1:
        raise ValueError("'max_new_tokens' must be a positive integer")
    if row.depth is not None and (not isinstance(row.depth, (int, float)) or not 0 <= row.depth <= 1):
        raise ValueError("'depth' must be a number from 0 to 1, or null")
    if not row.answers:
        raise ValueError("'answers' is empty")
    if not isinstance(row.images, list) or not all(isinstance(i, str) and i for i in row.images):
        raise ValueError("'images' must be a list of image paths or data URLs")
    if row.images:
        row.content()          # as many <image> marks as images
    spans = row.meta.get("evidence_spans") if isinstance(row.meta, dict) else None
    if spans is not None and not (isinstance(spans, list) and spans and all(
            isinstance(s, list) and len(s) == 2 and all(isinstance(x, int) for x in s)
            and 0 <= s[0] < s[1] <= len(row.context) for s in spans)):
        raise ValueError("'meta.evidence_spans' must be a non-empty list of [start, end) character offsets "
                         f"inside 'context' (0 <= start < end <= {len(row.context)})")
    return row


def read_rows(path: str | Path, *, question_split: str | None = None, task: str | None = None,
              max_new_tokens: int | None = None, images_root: str | Path | None = None) -> list[Row]:
    """Every row of ``path`` (blank lines skipped), each validated; ``max_new_tokens`` overrides the
    rows' own (RULER rows default to 64, MM-NIAH rows to 32)."""
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
            if "images_list" in data:
                row = from_mm_niah(data, task or f"mm-niah/{path.stem}", Path(images_root or path.parent),
                                   max_new_tokens or 32)
            elif "context" not in data and {"input", "outputs"} <= set(data):
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
