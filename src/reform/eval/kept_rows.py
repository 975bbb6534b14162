"""The rows an evaluation folder answers, kept beside its predictions.

``reform eval ruler|niah|babilong`` generate their rows, and RULER's own generators take minutes at 32k
and more at 128k. The first run writes them to ``rows.jsonl`` (our row format, so ``reform eval jsonl`` reads
it too) with ``rows.key``: a hash of everything that made them (the suite's options, the tokenizer, the
generator and this package's version, the haystack folder's files) and one of the rows file itself. A re-run
with the same key reads the rows back instead of generating them again; any change, to the options or to
the file, or ``--fresh``, makes them anew. A folder keeps the rows of the last command run into it (a sweep
extended length by length generates each new length's rows once)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Callable

from ..outputs import write_atomic
from .rows import Row, write_rows

ROWS, KEY = "rows.jsonl", "rows.key"


def tokenizer_fingerprint(tokenizer) -> str | None:
    """A hash of what the tokenizer does: its whole serialised form (vocabulary, merges, normalisers), else
    its vocabulary; None for a tokenizer that shows neither."""
    if (backend := getattr(tokenizer, "backend_tokenizer", None)) is not None:
        text = backend.to_str()
    elif hasattr(tokenizer, "get_vocab"):
        text = json.dumps(tokenizer.get_vocab(), sort_keys=True)
    else:
        return None
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def folder_fingerprint(folder: str | Path | None) -> list | None:
    """Name, size and modification time of each file under ``folder`` (a user's haystack)."""
    if folder is None:
        return None
    files = sorted(p for p in Path(folder).rglob("*") if p.is_file())
    return [[str(p.relative_to(folder)), p.stat().st_size, p.stat().st_mtime_ns] for p in files]


def rows_key(meta: dict, tokenizer) -> str | None:
    """The key of the rows ``meta`` (the suite's options, ``generator`` included) makes with ``tokenizer``;
    None when the tokenizer cannot be told apart from another (its rows are then made every time)."""
    from ..version import __version__
    if (tokens := tokenizer_fingerprint(tokenizer)) is None:
        return None
    made = {"meta": meta, "tokenizer": tokens, "reform": __version__,
            "haystack": folder_fingerprint(meta.get("haystack"))}
    return hashlib.sha256(json.dumps(made, sort_keys=True, default=str).encode()).hexdigest()


def kept_rows(out: Path, key: str, make: Callable[[], list[Row]], fresh: bool = False) -> tuple[list[Row], bool]:
    """``(rows, read back)``: ``out``'s kept rows when they were made under ``key`` and are unchanged since
    (and not ``fresh``), else ``make()``'s, written to ``out`` before any is answered."""
    rows_path, key_path = out / ROWS, out / KEY
    if not fresh and rows_path.is_file() and key_path.is_file():
        data = rows_path.read_bytes()
        if key_path.read_text().split() == [key, hashlib.sha256(data).hexdigest()]:
            lines = data.decode("utf-8").splitlines()
            return [Row.from_json(json.loads(line)) for line in lines if line.strip()], True
    rows = make()
    key_path.unlink(missing_ok=True)         # a key names only the rows written after it was removed
    write_atomic(rows_path, lambda tmp: write_rows(tmp, rows))
    write_atomic(key_path, f"{key} {hashlib.sha256(rows_path.read_bytes()).hexdigest()}\n")
    return rows, False
