"""Row-by-row comparison of methods: the exact sign test, the pairing over rows both answered, the report's
section and ``reform eval compare`` over several folders."""

import json
from math import comb

import pytest
from typer.testing import CliRunner

from reform.cli.main import app
from reform.eval.paired import compare, sign_test_p
from reform.eval.report import write_report

cli = CliRunner()


def rec(method, row, score, recall=None, status="ok", config_hash="h"):
    return {"id": row, "task": "niah", "length": 8192, "depth": None, "sample": 0, "method": method,
            "config_hash": config_hash, "status": status, "score": score, "recall": recall, "stats": {}}


def write(folder, records):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


@pytest.mark.parametrize("better, worse, p", [
    (0, 0, 1.0), (2, 2, 1.0),
    (1, 3, 2 * (1 + 4) / 16),                       # McNemar's exact p for 4 discordant rows split 1:3
    (0, 6, 2 / 64), (10, 0, 2 / 1024),
    (3, 12, 2 * sum(comb(15, k) for k in range(4)) / 2 ** 15),
])
def test_sign_test_matches_the_binomial_tails(better, worse, p):
    assert sign_test_p(better, worse) == pytest.approx(p)
    assert sign_test_p(worse, better) == pytest.approx(p)


def test_compare_pairs_only_rows_both_answered():
    records = [rec("a", "r1", 1.0, 1.0), rec("b", "r1", 0.0, 1.0),
               rec("a", "r2", 0.5, 0.5), rec("b", "r2", 1.0, 1.0),
               rec("a", "r3", 1.0), rec("b", "r3", 1.0),
               rec("a", "r4", 1.0), rec("b", "r4", None, status="skipped"),
               rec("b", "r5", 0.0)]
    c = compare(records, "a", "b")
    assert (c["rows"], c["better"], c["worse"], c["same"]) == (3, 1, 1, 1)
    assert c["difference"] == pytest.approx((-1.0 + 0.5 + 0.0) / 3, abs=1e-4)
    assert c["p"] == 1.0
    assert (c["recall_rows"], c["recall_better"], c["recall_worse"]) == (2, 1, 0)


def test_the_report_compares_every_method_with_the_first(tmp_path):
    records = [rec("base", f"r{i}", 1.0) for i in range(8)] + [rec("new", f"r{i}", 0.0) for i in range(7)] \
        + [rec("new", "r7", 1.0)]
    m = write_report(write(tmp_path, records), plots=False)
    (row,) = m["paired"]
    assert (row["method"], row["base"], row["rows"], row["better"], row["worse"]) == ("new", "base", 8, 0, 7)
    assert row["p"] == pytest.approx(2 / 128, abs=1e-4)
    assert "## Row by row against base" in (tmp_path / "results.md").read_text()
    assert "| new | base | 8 | 0 | 7 | 1 | -87.5 | 0.0156 | n/a |" in (tmp_path / "results.md").read_text()


def test_a_single_method_report_has_no_comparison(tmp_path):
    m = write_report(write(tmp_path, [rec("a", "r1", 1.0)]), plots=False)
    assert m["paired"] == [] and "Row by row" not in (tmp_path / "results.md").read_text()


def test_cli_compare_pools_folders_and_joins_labels(tmp_path):
    one = write(tmp_path / "one", [rec("reform", "r1", 0.0), rec("reform(heads=x=y)", "r1", 1.0)])
    two = write(tmp_path / "two", [rec("reform", "r2", 0.0), rec("old(heads=x=y)", "r2", 1.0)])
    r = cli.invoke(app, ["eval", "compare", str(one), str(two), "--same", "old(heads=x=y)=reform(heads=x=y)"])
    assert r.exit_code == 0, r.output
    assert "| reform(heads=x=y) | reform | 2 | 2 | 0 | 0 | +100.0 | 0.5 | n/a |" in r.output
    r = cli.invoke(app, ["eval", "compare", str(one), "--base", "reform(heads=x=y)"])
    assert r.exit_code == 0 and "| reform | reform(heads=x=y) | 1 | 0 | 1 | 0 | -100.0 | 1 | n/a |" in r.output


@pytest.mark.parametrize("args, msg", [
    (["{missing}"], "folder not found"),
    (["{empty}"], "cannot read"),
    (["{one}", "--same", "nope=reform"], "bad --same 'nope=reform': use OLD=NEW with OLD one of"),
    (["{one}", "--base", "h2o"], "--base 'h2o' is not a method in these folders"),
    (["{alone}"], "no two methods answered the same rows"),
])
def test_cli_compare_refuses_bad_input_in_one_line(tmp_path, args, msg):
    paths = {"missing": tmp_path / "missing", "empty": tmp_path / "empty",
             "one": write(tmp_path / "one", [rec("reform", "r1", 1.0), rec("rag", "r1", 0.0)]),
             "alone": write(tmp_path / "alone", [rec("reform", "r1", 1.0), rec("rag", "r2", 0.0)])}
    (tmp_path / "empty").mkdir()
    r = cli.invoke(app, ["eval", "compare", *(a.format(**paths) for a in args)])
    assert r.exit_code == 2 and msg in r.output and r.output.count("\n") == 1, r.output
