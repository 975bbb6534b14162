"""Real documents, real questions: the ``docs`` suite (``reform eval docs``).

Three long documents that Debian ships in its documentation packages, read offline through
``reform.documents`` exactly as ``reform ask FILE`` reads them, and questions written by hand from their
text (``docs_questions.json``). Each question names its *evidence*: the sentence or table row that answers
it, which occurs exactly once in the extracted text and contains one of the answers. A row carries that
evidence as a character span (``meta["evidence_spans"]``), so gold recall asks whether the place that
answers was recomputed, not whether an answer string (which a real book repeats on many pages) was.
Each document is at least 4x the window of both real models (SmolLM2 8k, Gemma 3 270M 32k).

The answers are specific to the text (a file name, a package, a limit) rather than general knowledge;
``docs/results/eval-docs/README.md`` reports how many are answered with no document at all.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ..rows import Row

QUOTES = {'"': "[\"“”„]", "'": "['‘’]"}    # PDFs and HTML print typographic quotes


@dataclass(frozen=True)
class Document:
    package: str       # the Debian package that installs it
    path: str          # a file, folder or glob, absolute
    title: str


DOCUMENTS = {
    "debian-reference": Document("debian-reference-en", "/usr/share/debian-reference/debian-reference.en.pdf",
                                 "Debian Reference, the PDF the package ships"),
    "postgresql-sql": Document("postgresql-doc-15", "/usr/share/doc/postgresql-doc-15/html/sql-*.html",
                               "PostgreSQL 15 manual, the SQL commands and SQL syntax pages (HTML)"),
    "python-howto": Document("python3.11-doc", "/usr/share/doc/python3.11/html/howto/",
                             "Python 3.11 documentation, the HOWTOs (HTML)"),
}
TASKS = tuple(DOCUMENTS)
MAX_NEW_TOKENS = 48


def questions() -> list[dict]:
    return json.loads(resources.files(__package__).joinpath("docs_questions.json").read_text(encoding="utf-8"))


def evidence_pattern(evidence: str) -> str:
    """``evidence`` as a regular expression: words matched across any whitespace (line breaks, the spaces
    a PDF's layout leaves), straight quotes matching typographic ones."""
    def word(w: str) -> str:
        return "".join(QUOTES.get(c, re.escape(c)) for c in w)
    return r"\s+".join(word(w) for w in evidence.split())


def document_path(name: str, root: str | Path | None = None) -> str:
    """Where ``name`` is: its Debian path, under ``root`` when given (a copy of those files elsewhere)."""
    path = DOCUMENTS[name].path
    return str(Path(root) / path.lstrip("/")) if root is not None else path


def read(name: str, root: str | Path | None = None, *, find_only: bool = False):
    """The document ``name`` extracted (``find_only``: only checked to be there), or a one-line
    ``ValueError`` saying which package installs it."""
    from ...documents import DocumentError, extract, find_documents
    doc = DOCUMENTS[name]
    try:
        return (find_documents if find_only else extract)(document_path(name, root))
    except DocumentError as e:
        raise ValueError(f"{name}: {e}; it comes from the Debian package {doc.package} "
                         f"(apt-get install {doc.package}), or pass --root with a copy of {doc.path}") from None


def check_documents(documents: list[str], root: str | Path | None = None) -> None:
    """Refuse an unknown name or a document not installed, in one line, before anything is loaded."""
    unknown = [d for d in documents if d not in DOCUMENTS]
    if unknown:
        raise ValueError(f"unknown document '{unknown[0]}'; choose from {', '.join(TASKS)}")
    for name in documents:
        read(name, root, find_only=True)


def rows_for_document(name: str, extracted, tokenizer) -> list[Row]:
    """One row per question about ``name``: its evidence located once in the text, its page (PDF) or
    section (HTML) recorded, its depth the evidence's place in the text."""
    text = extracted.text
    tokens = len(tokenizer(text, add_special_tokens=False)["input_ids"])
    rows = []
    for q in (q for q in questions() if q["document"] == name):
        spans = [m.span() for m in re.finditer(evidence_pattern(q["evidence"]), text)]
        if len(spans) != 1:
            raise ValueError(f"docs question {q['id']}: its evidence occurs {len(spans)} times in {name}, not "
                             "once (a different version of the document?)")
        (start, end), where = spans[0], extracted.locate(spans[0][0])
        rows.append(Row(context=text, question=q["question"], answers=list(q["answers"]), task=f"docs/{name}",
                        length=tokens, depth=round(start / len(text), 4), max_new_tokens=MAX_NEW_TOKENS,
                        sample=len(rows),
                        meta={"metric": "contains", "question_id": q["id"], "evidence_spans": [[start, end]],
                              "page": where.page, "section": where.section, "file": where.document}))
    return rows


def make_docs_rows(tokenizer, documents: list[str] | None = None, root: str | Path | None = None) -> list[Row]:
    """Every question's row for ``documents`` (default: all three), in the suite's order."""
    chosen = list(documents or TASKS)
    check_documents(chosen, root)
    return [row for name in chosen for row in rows_for_document(name, read(name, root), tokenizer)]
