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


# the question sets shipped: the suite's 48 over three documents, and 21 on the PostgreSQL SQL pages, one
# each on every ninth page by name (a page another question already asks about gives way to the next), for
# comparisons that need more than the suite's 17 PostgreSQL questions (docs/results/library-docs)
QUESTION_SETS = {"suite": "docs_questions.json", "pages": "docs_questions_pages.json"}
KEYS = ("document", "id", "question", "answers", "evidence")


def questions(which: str | Path = "suite") -> list[dict]:
    """A question set: a shipped one by name (``QUESTION_SETS``) or a JSON file of the same shape (a list
    of ``{document, id, question, answers, evidence}``); a one-line ``ValueError`` for a bad one."""
    if str(which) in QUESTION_SETS:
        return json.loads(resources.files(__package__).joinpath(QUESTION_SETS[str(which)]).read_text(encoding="utf-8"))
    try:
        qs = json.loads(Path(which).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"questions {which}: not {' or '.join(QUESTION_SETS)} nor a readable JSON file ({e})") from None
    for i, q in enumerate(qs if isinstance(qs, list) else [None]):
        if not isinstance(q, dict) or any(k not in q for k in KEYS) or q["document"] not in DOCUMENTS \
                or not isinstance(q["answers"], list) or not q["answers"]:
            raise ValueError(f"questions {which}: item {i} is not a {{{', '.join(KEYS)}}} object with a known "
                             f"document ({', '.join(TASKS)}) and a non-empty list of answers")
    if not qs:
        raise ValueError(f"questions {which}: the list is empty")
    return qs


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


def rows_for_document(name: str, extracted, tokenizer, asked: list[dict] | None = None) -> list[Row]:
    """One row per question about ``name``: its evidence located once in the text, its page (PDF) or
    section (HTML) recorded, its depth the evidence's place in the text. ``asked``: the question set
    (default: the suite's)."""
    text = extracted.text
    tokens = len(tokenizer(text, add_special_tokens=False)["input_ids"])
    rows = []
    for q in (q for q in (asked or questions()) if q["document"] == name):
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


def make_docs_rows(tokenizer, documents: list[str] | None = None, root: str | Path | None = None,
                   question_set: str | Path = "suite") -> list[Row]:
    """Every question's row for ``documents`` (default: every document the question set asks about), in the
    set's order."""
    asked = questions(question_set)
    chosen = list(documents or [name for name in TASKS if any(q["document"] == name for q in asked)])
    check_documents(chosen, root)
    return [row for name in chosen for row in rows_for_document(name, read(name, root), tokenizer, asked)]
