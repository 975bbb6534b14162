"""`reform eval ruler|niah|babilong` keep their generated rows in the output folder: a re-run with the same
options and tokenizer reads them back instead of generating them again, answers exactly those rows, and any
change of options, tokenizer or haystack (or --fresh) makes them anew."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from reform.cli.main import app
from reform.eval import tasks
from reform.eval.kept_rows import KEY, ROWS, kept_rows, rows_key
from reform.eval.records import read_predictions
from reform.eval.rows import Row
from reform.model import LoadedModel

from conftest import CharTokenizer, real_tokenizer, tiny

cli = CliRunner()


@pytest.fixture
def generated(monkeypatch):
    """The tiny model with a real tokenizer in every load, and a count of the generator's calls."""
    tok = real_tokenizer()
    model = tiny(window=2048, vocab_size=len(tok))
    monkeypatch.setattr("reform.model.load_model", lambda *a, **k: LoadedModel(model, tok, "tiny"))
    monkeypatch.setattr("reform.eval.plots.draw_all", lambda *a, **k: [])         # not what is tested here
    calls = []
    make = tasks.make_rows
    monkeypatch.setattr(tasks, "make_rows", lambda *a, **k: calls.append(a[0]) or make(*a, **k))
    return calls


def eval_niah(out, *extra):
    r = cli.invoke(app, ["eval", "niah", "--lengths", "600", "--depths", "0,1", "--samples", "1",
                         "--methods", "truncate:recompute_budget=200", "--out", str(out), *extra])
    assert r.exit_code == 0, r.output
    return r


def test_a_rerun_reads_the_rows_back_and_answers_exactly_them(generated, tmp_path):
    out = tmp_path / "run"
    first = eval_niah(out, "--max-rows", "1")
    assert generated == ["niah"] and "read back" not in first.stderr
    assert (out / KEY).is_file() and len((out / ROWS).read_text().splitlines()) == 2   # all rows, not only --max-rows
    again = eval_niah(out)
    assert generated == ["niah"]                                    # not generated again
    assert f"rows: 2 read back from {out / ROWS}" in again.stderr.replace("\n", " ")
    kept = [Row.from_json(json.loads(line)) for line in (out / ROWS).read_text().splitlines()]
    assert sorted(r["id"] for r in read_predictions(out / "predictions.jsonl")) == sorted(r.id for r in kept)
    eval_niah(out, "--seed", "1", "--max-rows", "1")                # another seed: other rows, kept instead
    assert generated == ["niah", "niah"] and kept != [Row.from_json(json.loads(line)) for line in
                                                      (out / ROWS).read_text().splitlines()]


def test_fresh_another_key_or_a_changed_file_make_the_rows_anew(tmp_path):
    made = []

    def make():
        made.append(1)
        return tasks.make_rows("niah", CharTokenizer(), [300], 1, seed=len(made), depths=[0.0, 1.0])
    rows, read_back = kept_rows(tmp_path, "k1", make)
    assert not read_back and len(made) == 1
    again, read_back = kept_rows(tmp_path, "k1", make)
    assert read_back and len(made) == 1 and [r.id for r in again] == [r.id for r in rows] and again == rows
    assert not kept_rows(tmp_path, "k1", make, fresh=True)[1] and len(made) == 2
    assert not kept_rows(tmp_path, "k2", make)[1] and len(made) == 3
    (tmp_path / ROWS).write_text((tmp_path / ROWS).read_text().splitlines()[0] + "\n")     # a row lost by hand
    rows, read_back = kept_rows(tmp_path, "k2", make)
    assert not read_back and len(made) == 4 and len(rows) == 2 == len((tmp_path / ROWS).read_text().splitlines())


def test_the_key_follows_the_options_the_tokenizer_and_the_haystack_files(tmp_path):
    tok = real_tokenizer()
    meta = {"suite": "ruler", "lengths": [4096], "seed": 0, "generator": "nvidia-long-context-eval 0.1"}
    key = rows_key(meta, tok)
    assert key == rows_key(dict(meta), real_tokenizer())               # the same tokenizer trained again
    assert key != rows_key({**meta, "seed": 1}, tok)
    assert key != rows_key({**meta, "generator": "nvidia-long-context-eval 0.2"}, tok)
    tok.add_tokens(["<new>"])
    assert key != rows_key(meta, tok)
    assert rows_key(meta, CharTokenizer()) is None                  # nothing to tell it from another: not kept
    hay = tmp_path / "hay"
    hay.mkdir()
    (hay / "a.txt").write_text("some prose")
    with_hay = rows_key({**meta, "haystack": str(hay)}, tok)
    (hay / "a.txt").write_text("other prose, longer")
    assert rows_key({**meta, "haystack": str(hay)}, tok) != with_hay
