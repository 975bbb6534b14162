"""What the official benchmarks share: a file error, even sampling, a prompt split around its context, and
the SQuAD-style answer normalisation and token F1 that ∞-Bench's and LongBench's metrics both use."""

from __future__ import annotations

import json
import re
import string
from collections import Counter
from pathlib import Path


class BenchmarkFileError(ValueError):
    """A missing or malformed benchmark file; the message names the file and line."""


def json_lines(path: Path, what: str) -> list[tuple[int, object]]:
    """``(line number, value)`` of every non-blank line of a JSONL file; bad JSON or no line at all is refused
    naming the file and line (``what``: "examples", "tasks", "rows")."""
    values = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            values.append((number, json.loads(line)))
        except json.JSONDecodeError as e:
            raise BenchmarkFileError(f"{path} line {number}: not valid JSON ({e.msg})") from None
    if not values:
        raise BenchmarkFileError(f"{path} holds no {what}")
    return values


def token_count(tokenizer, text: str) -> int:
    """A row's length: its context's tokens under the model's tokenizer."""
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def spread(n: int, samples: int | None) -> list[int]:
    """``samples`` indices spread evenly over ``n`` (each the middle of its share), or all of them."""
    if samples is None or samples >= n:
        return list(range(n))
    return sorted({int((i + 0.5) * n / samples) for i in range(samples)})


def split_at_context(before: str, context: str, rest: str) -> tuple[str, str, str]:
    """``(context, question, answer_prefix)`` of a prompt ``before + context + rest``: what precedes the
    question is encoded; the rest's last line is the answer prefix when a question remains before it.
    The three join into the prompt again, character for character."""
    cut = rest.rfind("\n") + 1
    question, prefix = (rest[:cut], rest[cut:]) if rest[:cut].strip() else (rest, "")
    return before + context, question, prefix


def normalize_answer(s: str) -> str:
    """Lower-case, punctuation and English articles removed, whitespace collapsed (SQuAD's)."""
    s = "".join(ch for ch in s.lower() if ch not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", s).split())


ZH_PUNCTUATION = "！？｡。＂＃＄％＆＇（）＊＋，－／：；＜＝＞＠［＼］＾＿｀｛｜｝～｟｠｢｣､、〃》「」『』【】〔〕〖〗〘〙〚〛〜〝〞〟〰〾〿–—‘’‛“”„‟…‧﹏."  # noqa: E501


def normalize_zh_answer(s: str) -> str:
    """Lower-case, Chinese and ASCII punctuation and all whitespace removed."""
    drop = set(string.punctuation + ZH_PUNCTUATION)
    return "".join("".join(ch for ch in s.lower() if ch not in drop).split())


def token_f1(prediction: list, truth: list) -> float:
    same = sum((Counter(prediction) & Counter(truth)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(prediction), same / len(truth)
    return 2 * precision * recall / (precision + recall)
