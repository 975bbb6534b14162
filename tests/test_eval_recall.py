"""Gold recall (which gold strings the recomputed tokens hold), reading vs retrieval misses, and the
tables' 95 % intervals, on hand-made selections and known counts; then end to end through ``run_eval``."""

import json

import pytest
import torch

from reform.eval.intervals import bootstrap, interval, wilson
from reform.eval.recall import evidence, gold_kept, kept_runs, miss_kind, recall
from reform.eval.report import write_report
from reform.eval.rows import Row
from reform.eval.runner import run_eval
from reform.model import LoadedModel

from conftest import CharTokenizer, real_tokenizer, tiny

GOLD = "PELICAN-4821"
TEXT = f"The quick brown fox jumps over the lazy dog. The code is {GOLD}. What is the magic number? It is 42."


@pytest.fixture(scope="module")
def encoded():
    tok = real_tokenizer()
    ids = torch.tensor(tok(TEXT, add_special_tokens=False)["input_ids"])
    # the gold's token span: the shortest run of tokens whose text holds it
    spans = [(a, b) for a in range(len(ids)) for b in range(a + 1, len(ids) + 1) if GOLD in tok.decode(ids[a:b])]
    start, stop = min(spans, key=lambda s: s[1] - s[0])
    assert stop - start >= 3                            # several tokens, so it can be cut
    return tok, ids, start, stop


def test_kept_runs():
    assert kept_runs(torch.tensor([0, 1, 2, 5, 7, 8])) == [(0, 3), (5, 6), (7, 9)]
    assert kept_runs(torch.tensor([], dtype=torch.long)) == []


def test_gold_fully_in_partly_in_out_and_across_a_boundary(encoded):
    tok, ids, a, b = encoded
    n = len(ids)
    check = lambda kept: gold_kept(tok, ids, torch.tensor(sorted(set(kept))), [GOLD])[0]
    assert check(range(a, b)) is True                                   # exactly its span
    assert check(list(range(0, 3)) + list(range(a - 2, b + 2))) is True  # inside a longer run
    assert check(range(a, b - 1)) is False                              # its last token left out
    assert check(range(a + 1, b)) is False                              # its first token left out
    assert check(list(range(0, a)) + list(range(b, n))) is False        # everything but the gold
    # every gold token kept, but in two runs cut by one dropped token in the middle: not recalled
    middle = (a + b) // 2
    assert check([i for i in range(a - 1, b + 1) if i != middle]) is False
    # two selections that meet (first/last keep and a pooled window, say) form one run: recalled
    assert check(list(range(a - 3, middle)) + list(range(middle, b + 1))) is True


def test_unknown_recall(encoded):
    tok, ids, a, b = encoded
    everything = torch.arange(len(ids))
    assert gold_kept(tok, ids, None, [GOLD, "fox"]) == [None, None]          # answered from a cache
    assert gold_kept(tok, ids, everything, ["The", "absent", GOLD]) == [None, None, True]   # 2x, 0x, 1x
    assert recall([None, True, False, True]) == pytest.approx(2 / 3) and recall([None]) is None


def test_evidence_and_miss_kinds():
    row = Row("ctx", "q?", ["ABCDE"], "ruler/vt", 10, meta={"evidence": ["VAR ABCDE = 1"]})
    assert evidence(row) == ["VAR ABCDE = 1"]
    assert evidence(Row("ctx", "q?", ["x", "y"], "niah", 10)) == ["x", "y"]
    assert miss_kind(0.0, 1.0) == "reading" and miss_kind(0.5, 1.0) == "reading"
    assert miss_kind(0.0, 0.75) == "retrieval" and miss_kind(0.0, 0.0) == "retrieval"
    assert miss_kind(1.0, 0.0) is None and miss_kind(0.0, None) is None and miss_kind(None, 1.0) is None


def test_wilson_on_known_counts():
    # reference values: Wilson (1927) score interval, z = 1.96
    assert wilson(0, 5) == pytest.approx((0.0, 0.4345), abs=1e-4)
    assert wilson(5, 5) == pytest.approx((0.5655, 1.0), abs=1e-4)
    assert wilson(3, 10) == pytest.approx((0.1078, 0.6032), abs=1e-4)
    assert wilson(50, 100) == pytest.approx((0.4038, 0.5962), abs=1e-4)
    assert interval([[1, 0, 1, 1, 0, 0, 1, 0, 0, 0]]) == pytest.approx(wilson(4, 10))   # 0/1 values: Wilson


def test_bootstrap_on_partial_credit():
    values = [0.0, 0.25, 0.5, 0.75, 1.0] * 4
    lo, hi = interval([values])
    assert lo < 0.5 < hi and bootstrap([values]) == (lo, hi)            # seeded: the same interval again
    # standard error of the mean is 0.354 / sqrt(20) = 0.079: the 95 % interval is about +-0.155
    assert hi - lo == pytest.approx(2 * 1.96 * 0.3536 / 20 ** 0.5, rel=0.15)
    assert interval([[0.5, 0.5]]) == pytest.approx(wilson(1, 2)) and interval([]) is None   # no spread
    # stratified over tasks: one task always 1, the other spread; the interval is the second's, halved
    lo2, hi2 = interval([[1.0] * 20, values])
    assert lo2 == pytest.approx((1 + lo) / 2, abs=0.02) and hi2 == pytest.approx((1 + hi) / 2, abs=0.02)


def record(method, score, recall_, task="ruler/a", sample=0):
    return {"id": f"{task}-{sample}", "task": task, "length": 8192, "depth": None, "sample": sample,
            "method": method, "config_hash": "h", "status": "ok", "score": score, "recall": recall_,
            "stats": {"encode": 1.0}}


def test_report_recall_and_miss_counts(tmp_path):
    recs = [record("reform", 1.0, 1.0, sample=0), record("reform", 0.0, 1.0, sample=1),
            record("reform", 0.5, 0.5, sample=2), record("reform", 0.0, 0.0, sample=3),
            record("h2o", 0.0, None, sample=0), record("h2o", 1.0, None, sample=1)]
    (tmp_path / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    m = write_report(tmp_path)
    assert {p.rsplit("/", 1)[1] for p in m["plots"]} == {"accuracy_vs_length.png", "recall_vs_length.png"}
    cell = {c["method"]: c for c in m["by_task"]}
    reform, h2o = cell["reform"], cell["h2o"]
    assert reform["recall"] == 0.625 and reform["recall_n"] == 4 and reform["n"] == 4
    assert reform["reading_misses"] == 1 and reform["retrieval_misses"] == 2
    lo, hi = reform["recall_ci"]
    assert lo < 0.625 < hi
    assert h2o["recall"] is None and h2o["recall_ci"] is None and h2o["ci"] == pytest.approx(list(wilson(1, 2)), abs=1e-4)
    table = (tmp_path / "results.md").read_text()
    assert "## Gold recall (%)" in table and "| ruler/a | 8k | 4/2 | 62.5 [" in table and "| n/a |" in table
    assert "| ruler/a | 8k | 4/2 | 1 / 2 | n/a |" in table


def test_run_eval_records_recall(tmp_path):
    """Truncation keeps the start and the end: a gold near the start is recomputed, one in the middle is not;
    with a budget covering the context both are. The recall in each record says so."""
    filler = "a small boat drifts along the quiet river bank. " * 3
    context = "KEY-ALPHA is here. " + filler + "KEY-OMEGA sits in the middle. " + filler
    rows = [Row(context, "Which keys?", ["KEY-ALPHA"], "t", 1, sample=0, max_new_tokens=2),
            Row(context, "Which keys??", ["KEY-OMEGA"], "t", 1, sample=1, max_new_tokens=2),
            Row(context, "Both?", ["KEY-ALPHA", "KEY-OMEGA"], "t", 1, sample=2, max_new_tokens=2)]
    loaded = LoadedModel(tiny(), CharTokenizer(), "tiny")
    run_eval(rows, methods=["truncate:recompute_budget=120:keep_first=60", "truncate:recompute_budget=480"],
             out_dir=tmp_path, model_name="tiny", loader=lambda: loaded, scorer=lambda row, p: 0.0, plots=False)
    recs = {(r["method"], r["sample"]): r for r in map(json.loads, (tmp_path / "predictions.jsonl").open())}
    narrow, wide = "truncate(keep_first=60,recompute_budget=120)", "truncate(recompute_budget=480)"
    assert [recs[(narrow, s)]["gold_kept"] for s in range(3)] == [[True], [False], [True, False]]
    assert [recs[(narrow, s)]["recall"] for s in range(3)] == [1.0, 0.0, 0.5]
    assert recs[(narrow, 0)]["kept_tokens"] == 120
    assert [recs[(wide, s)]["recall"] for s in range(3)] == [1.0, 1.0, 1.0]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    by = {c["method"]: c for c in metrics["by_task"]}
    assert by[narrow]["reading_misses"] == 1 and by[narrow]["retrieval_misses"] == 2
    assert by[wide]["reading_misses"] == 3 and by[wide]["recall"] == 1.0


@pytest.mark.parametrize("aggregate", ["max", "maxsim"])
def test_explain_accounts_for_every_miss(tmp_path, aggregate):
    """``--explain``: each retrieval miss gets the gather's view of its gold strings, and the view agrees
    with what was gathered: a missed string scores no higher than the last gathered token, would need a
    larger budget, and what outranks it scores above it. Five 12-character golds cannot all fit a budget
    with 48 free tokens, so some row misses."""
    from reform.eval.explain import render
    filler = "a small boat drifts along the quiet river bank. " * 2
    golds = [f"CODE-{k}{k}{k}-{i}X" for i, k in enumerate("ABCDE")]
    context = filler + filler.join(f" {g} here. " for g in golds) + filler
    rows = [Row(context, "Which codes?", golds, "t", 1, sample=0, max_new_tokens=2)]
    loaded = LoadedModel(tiny(), CharTokenizer(), "tiny")
    method = ("reform", dict(heads="1:v:0,2:q:3,1:k:1", chunk_size=64, cache_budget=96, recompute_budget=64,
                             gather_keep=8, pool_window=9, query_aggregate=aggregate))
    run_eval(rows, methods=[method], out_dir=tmp_path, model_name="tiny", loader=lambda: loaded,
             scorer=lambda row, p: 0.0, plots=False, explain=True)
    rec = json.loads((tmp_path / "predictions.jsonl").read_text().splitlines()[0])
    report = rec["explain"]
    assert rec["recall"] < 1 and report["budget"] == 64 and report["gather_keep"] == 8
    assert [g["kept"] for g in report["golds"]] == rec["gold_kept"]
    for g in report["golds"]:
        assert g["found"] and len(g["heads"]) == 3 and g["query_tokens"]
        if not g["kept"]:
            assert g["score"] <= report["threshold"] + 1e-6 and g["budget_needed"] > 64 - 16
    lowest = min(g["score"] for g in report["golds"] if not g["kept"])
    assert report["peaks"] and all(p["score"] > lowest for p in report["peaks"])
    text = (tmp_path / "explain.md").read_text()
    assert "MISSED" in text and "outranked by" in text and render(rec["id"], rec["question"], report) in text


def test_span_recall_checks_every_token_a_span_overlaps():
    from reform.eval.recall import spans_kept
    # 3 template tokens, then one token per 4 characters of a 40-character text
    starts = torch.tensor([-1, -1, -1] + list(range(0, 40, 4)), dtype=torch.int32)
    kept = torch.tensor([0, 1, 2, 5, 6, 7])            # text characters 8..19 (tokens at 8, 12, 16)
    assert spans_kept(starts, 40, kept, [[8, 20], [9, 11], [8, 21], [6, 12], [39, 40]]) == [True, True, False, False, False]
    assert spans_kept(starts, 40, None, [[8, 20]]) == [None]


def test_rows_may_name_their_evidence_by_place_and_the_runner_checks_it(tmp_path):
    """Real text repeats its answers; a row's ``meta.evidence_spans`` says where the fact is instead: a
    string recall would be n/a here (ORCHID-7 occurs twice), the span recall says which was recomputed."""
    from reform.eval.jsonl import RowFileError, read_rows
    filler = "a small boat drifts along the quiet river bank. " * 3
    fact = "The code is ORCHID-7."
    context = fact + " " + filler + "ORCHID-7 also names the boat in the middle. " + filler
    middle = context.index("ORCHID-7 also")
    rows = [{"context": context, "question": q, "answers": ["ORCHID-7"], "task": "doc/t", "length": 1, "sample": i,
             "max_new_tokens": 2, "meta": {"evidence_spans": [span]}}
            for i, (q, span) in enumerate([("Code?", [0, len(fact)]), ("Boat?", [middle, middle + 28])])]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    parsed = read_rows(path)
    assert parsed[1].meta["evidence_spans"] == [[middle, middle + 28]]
    path.write_text(json.dumps({**rows[0], "meta": {"evidence_spans": [[5, len(context) + 5]]}}) + "\n")
    with pytest.raises(RowFileError, match="evidence_spans"):
        read_rows(path)
    loaded = LoadedModel(tiny(), CharTokenizer(), "tiny")
    run_eval(parsed, methods=["truncate:recompute_budget=120:keep_first=60", "truncate:recompute_budget=480"],
             out_dir=tmp_path / "out", model_name="tiny", loader=lambda: loaded, scorer=lambda row, p: 0.0, plots=False)
    recs = {(r["method"], r["sample"]): r for r in map(json.loads, (tmp_path / "out" / "predictions.jsonl").open())}
    narrow, wide = "truncate(keep_first=60,recompute_budget=120)", "truncate(recompute_budget=480)"
    assert [recs[(narrow, s)]["gold_kept"] for s in range(2)] == [[True], [False]]
    assert [recs[(wide, s)]["gold_kept"] for s in range(2)] == [[True], [True]]
