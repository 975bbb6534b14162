"""The one row format every evaluation task is written in (and ``reform eval jsonl`` reads).

A row is one question about one context. Rows whose ``context`` is identical are answered from one
encoded context (REFORM's encode-once path), so suites that ask several questions about the same
haystack (RULER multi-query, BABILong) pay for one encode.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

IMAGE_MARK = "<image>"     # where each of a row's images sits in its context (MM-NIAH's own convention)


@dataclass
class Row:
    context: str                 # the long input (haystack with the facts in it)
    question: str                # what is asked after the context
    answers: list[str]           # gold strings; the scorer decides how they are matched
    task: str                    # e.g. "niah", "ruler/multikey_2", "babilong/qa1"
    length: int                  # requested context length in the model's tokens
    answer_prefix: str = ""      # text the answer starts with (put after the question)
    depth: float | None = None   # where the gold fact sits, 0..1 of the context, when it applies
    max_new_tokens: int = 32
    sample: int = 0              # sample index within (task, length[, depth])
    meta: dict = field(default_factory=dict)
    # images for a vision-language model, one per IMAGE_MARK in ``context`` in order: PNG/JPEG data URLs
    # or paths to image files
    images: list[str] = field(default_factory=list)
    # how the question follows the context (``engine.layout.LAYOUTS``): "question" (labelled, the default),
    # "verbatim" (exactly as written: a benchmark's official prompt split around its context) or
    # "continuation" (also no chat turn closed: code completion)
    layout: str = "question"
    # text the model reads right before the question, outside what the gather searches with (RULER's
    # "Answer the question based on the given documents ..."); the prompt is instruction + question
    instruction: str = ""

    def _hashed(self) -> str:
        return self.context + "".join("\x00" + image for image in self.images)

    @property
    def id(self) -> str:
        """Stable id: task, length, depth, sample and a hash of the question + context (+ images)."""
        h = hashlib.sha1((self.instruction + self.question + "\x00" + self._hashed()).encode()).hexdigest()[:10]
        depth = "" if self.depth is None else f"-d{round(self.depth * 100)}"
        return f"{self.task}-{self.length}{depth}-s{self.sample}-{h}"

    @property
    def context_key(self) -> str:
        return hashlib.sha1(self._hashed().encode()).hexdigest()

    def content(self):
        """What ``Pipeline.encode`` takes: the context text, or with images its text and image parts in
        order (data URLs as the image's bytes, paths as ``Path``)."""
        if not self.images:
            return self.context
        pieces = self.context.split(IMAGE_MARK)
        if len(pieces) != len(self.images) + 1:
            raise ValueError(f"row {self.id}: {len(pieces) - 1} {IMAGE_MARK} marks for {len(self.images)} images")
        parts = [pieces[0]]
        for image, text in zip(self.images, pieces[1:]):
            if image.startswith("data:"):
                parts.append(base64.b64decode(image.partition(",")[2]))
            else:
                parts.append(Path(image))
            parts.append(text)
        return [p for p in parts if not isinstance(p, str) or p]

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "Row":
        names = {f.name for f in fields(cls)}
        missing = [n for n in ("context", "question", "answers", "task") if n not in data]
        if missing:
            raise ValueError(f"row is missing {', '.join(missing)}")
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"row has unknown field(s) {', '.join(unknown)}")
        row = cls(**{**{"length": 0}, **data})
        if isinstance(row.answers, str):
            row.answers = [row.answers]
        if not isinstance(row.answers, list) or not all(isinstance(a, str) for a in row.answers):
            raise ValueError("row 'answers' must be a list of strings")
        return row


def write_rows(path, rows: list[Row]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row.to_json(), ensure_ascii=False) + "\n")
