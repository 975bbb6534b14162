"""The ``docs`` suite: real documents from Debian's documentation packages, hand-written questions, gold recall
by evidence span (reform.eval.tasks.docs, ``reform eval docs``)."""

import collections
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from reform.cli.main import app
from reform.eval.jsonl import check_row
from reform.eval.tasks.docs import DOCUMENTS, evidence_pattern, make_docs_rows, questions

INSTALLED = all(Path(d.path.split("*")[0]).parent.exists() for d in DOCUMENTS.values())
needs_packages = pytest.mark.skipif(not INSTALLED, reason="Debian's debian-reference-en, postgresql-doc-15 and "
                                    "python3.11-doc are not all installed (.ci/run installs them)")


def test_questions_are_many_spread_and_checkable():
    qs = questions()
    assert len(qs) >= 40
    per_document = collections.Counter(q["document"] for q in qs)
    assert set(per_document) == set(DOCUMENTS) and min(per_document.values()) >= 12
    assert len({(q["document"], q["id"]) for q in qs}) == len(qs)
    for q in qs:
        assert q["answers"] and q["question"].endswith("?")
        # the evidence holds an answer, and the question does not give it away
        assert any(a.lower() in q["evidence"].lower() for a in q["answers"]), q["id"]
        assert not any(a.lower() in q["question"].lower() for a in q["answers"]), q["id"]


def test_the_pages_set_asks_one_page_each_and_none_the_suite_asks():
    pages, suite = questions("pages"), questions()
    assert len(pages) == 21 and {q["document"] for q in pages} == {"postgresql-sql"}
    assert not {q["id"] for q in pages} & {q["id"] for q in suite}
    for q in pages:
        assert any(a.lower() in q["evidence"].lower() for a in q["answers"]), q["id"]
        assert not any(a.lower() in q["question"].lower() for a in q["answers"]), q["id"]


def test_a_bad_question_file_is_refused_in_one_line(tmp_path):
    bad = tmp_path / "q.json"
    for text, says in (("{", "nor a readable JSON file"), ('[{"id": "x"}]', "item 0 is not a"),
                       ('[{"document": "nope", "id": "x", "question": "?", "answers": ["a"], "evidence": "a"}]',
                        "with a known document"), ("[]", "the list is empty")):
        bad.write_text(text)
        r = CliRunner().invoke(app, ["eval", "docs", "--questions", str(bad), "--out", str(tmp_path / "run")])
        assert r.exit_code == 2 and says in r.output and len(r.output.strip().splitlines()) == 1, r.output
    assert not (tmp_path / "run").exists()


def test_evidence_matches_across_line_breaks_and_typographic_quotes():
    text = 'It is set in ”/etc/mdadm/mdadm.conf”.\nSee   also   it’s  page.'
    assert re.search(evidence_pattern('set in "/etc/mdadm/mdadm.conf"'), text)
    assert re.search(evidence_pattern("See also it's page."), text)
    assert not re.search(evidence_pattern("set in /etc/mdadm"), text)


def test_unknown_or_missing_documents_are_refused_in_one_line_before_any_output(tmp_path):
    out = tmp_path / "run"
    r = CliRunner().invoke(app, ["eval", "docs", "--documents", "nope", "--out", str(out)])
    assert r.exit_code == 2 and "unknown document 'nope'; choose from debian-reference" in r.output
    r = CliRunner().invoke(app, ["eval", "docs", "--root", str(tmp_path), "--out", str(out)])
    assert r.exit_code == 2 and "comes from the Debian package debian-reference-en" in r.output
    assert len(r.output.strip().splitlines()) == 1 and not out.exists()


@needs_packages
def test_rows_locate_each_evidence_once_with_its_page_or_section(tokenizer):
    rows = make_docs_rows(tokenizer)
    assert len(rows) == len(questions())
    for row in rows:
        check_row(row)
        (start, end), = row.meta["evidence_spans"]
        evidence = row.context[start:end]
        assert any(a.lower() in evidence.lower() for a in row.answers), row.meta["question_id"]
        assert row.meta["page"] if row.task == "docs/debian-reference" else row.meta["section"]
    for name in DOCUMENTS:    # questions from the first tenth of each document to its last
        depths = [r.depth for r in rows if r.task == f"docs/{name}"]
        assert min(depths) < 0.2 and max(depths) > 0.9, name
    pages = make_docs_rows(tokenizer, question_set="pages")
    assert len(pages) == 21 and len({r.meta["file"] for r in pages}) == 21     # one page each
    assert all(r.task == "docs/postgresql-sql" for r in pages)


@pytest.mark.slow
@needs_packages
def test_the_suite_runs_end_to_end_with_span_recall(tmp_path):
    """SmolLM2 through rag-bm25 (no encode to wait for) on the first two questions of one document: the
    records carry the span recall and the document is past 4x the window."""
    out = tmp_path / "run"
    r = CliRunner().invoke(app, ["eval", "docs", "--documents", "python-howto", "--methods", "rag-bm25",
                                 "--max-rows", "2", "--out", str(out)])
    assert r.exit_code == 0, r.output
    records = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(records) == 2 and all(rec["task"] == "docs/python-howto" for rec in records)
    assert all(rec["context_tokens"] >= 4 * 8192 for rec in records)
    assert all(rec["recall"] in (0.0, 1.0) for rec in records)
    assert "Gold recall" in (out / "results.md").read_text()
