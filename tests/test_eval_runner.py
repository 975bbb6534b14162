"""The evaluation runner: predictions schema, resume, encode-once per context, skipped rows past the
window, metrics/table/plots from predictions alone, JSONL import (ours and RULER's), CLI refusals."""

import json

import pytest
from typer.testing import CliRunner

from reform.cli.main import app
from reform.eval import runner as runner_mod
from reform.eval.jsonl import RowFileError, read_rows, split_question
from reform.eval.rows import Row, write_rows
from reform.eval.records import current_records, read_predictions
from reform.eval.report import aggregate, write_report
from reform.eval.runner import run_eval
from reform.eval.specs import MethodSpec, method_specs, parse_length, parse_lengths
from reform.methods.base import Context
from reform.model import LoadedModel
from reform.pipeline import Pipeline

from conftest import CharTokenizer, tiny

REFORM = ("reform", dict(heads="1:v:0,2:q:3,1:k:1", chunk_size=64, cache_budget=96, recompute_budget=200))
TRUNCATE = ("truncate", dict(recompute_budget=200))
HAY_A = "The quick brown fox jumps over the lazy dog. " * 9            # ~400 byte-tokens (window 512)
HAY_B = "A small boat drifts along the quiet river bank. " * 8


def make_rows():
    rows = []
    for i, (hay, length) in enumerate([(HAY_A, 400), (HAY_B, 800)]):
        for depth in (0.0, 0.5):
            rows.append(Row(context=hay, question=f"Where is item {depth}?", answers=["fox", "dog"], task="niah",
                            length=length, depth=depth, max_new_tokens=3, sample=i))
    return rows


def fake_score(row, prediction):
    """Deterministic and row-dependent, so aggregation is checkable: depth 0 scores 1, depth 0.5 scores 0."""
    assert isinstance(prediction, str)
    return 1.0 if row.depth == 0.0 else 0.0


class Counts:
    def __init__(self, monkeypatch):
        self.encode = self.ask = self.load = 0
        encode, ask = Pipeline.encode, Context.ask

        def counted_encode(pipe, *a, **k):
            self.encode += 1
            return encode(pipe, *a, **k)

        def counted_ask(ctx, *a, **k):
            self.ask += 1
            return ask(ctx, *a, **k)
        monkeypatch.setattr(Pipeline, "encode", counted_encode)
        monkeypatch.setattr(Context, "ask", counted_ask)

    def loader(self):
        self.load += 1
        return LoadedModel(tiny(), CharTokenizer(), "tiny")


@pytest.fixture
def counts(monkeypatch):
    return Counts(monkeypatch)


def evaluate(rows, out, counts, methods=(REFORM, TRUNCATE), **kw):
    return run_eval(rows, methods=list(methods), out_dir=out, model_name="tiny", loader=counts.loader,
                    scorer=fake_score, **kw)


def test_predictions_schema_outputs_and_encode_once_per_context(tmp_path, counts):
    rows = make_rows()
    metrics = evaluate(rows, tmp_path, counts, meta={"suite": "niah", "seed": 3})
    assert counts.load == 1
    assert counts.encode == 2 * 2 and counts.ask == 4 * 2           # 2 contexts x 2 methods; 4 rows x 2 methods
    records = read_predictions(tmp_path / "predictions.jsonl")
    assert len(records) == 8
    labels = {"reform(cache_budget=96,chunk_size=64,heads=1:v:0,2:q:3,1:k:1,recompute_budget=200)",
              "truncate(recompute_budget=200)"}
    assert {r["method"] for r in records} == labels
    for r in records:
        assert r["status"] == "ok" and isinstance(r["prediction"], str)
        assert r["score"] == (1.0 if r["depth"] == 0.0 else 0.0)
        assert r["answers"] == ["fox", "dog"] and r["task"] == "niah" and r["length"] in (400, 800)
        assert set(r["stats"]) >= {"encode", "recompute", "generate", "peak_memory_mb", "new_tokens"}
        assert r["stats"]["encode_shared_by"] == 2 and r["context_tokens"] > 300
        assert r["id"] in {row.id for row in rows} and len(r["config_hash"]) == 12
    assert {r["method_name"] for r in records} == {"reform", "truncate"}

    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model"] == "tiny" and config["suite"] == "niah" and config["seed"] == 3 and config["rows"] == 4
    assert [m["name"] for m in config["methods"]] == ["reform", "truncate"]
    assert config["methods"][1]["options"] == {"recompute_budget": 200}
    resolved = config["methods"][1]["resolved"]
    assert resolved["recompute_budget"] == 200 and resolved["keep_first"] > 0       # defaults filled in
    assert {"torch", "transformers", "reform"} <= set(config["versions"]) and config["machine"]["cpu_cores"]

    saved = json.loads((tmp_path / "metrics.json").read_text())
    assert saved["by_task"] == metrics["by_task"]
    assert {(c["length"], c["score"], c["n"]) for c in metrics["by_task"]} == {(400, 0.5, 2), (800, 0.5, 2)}
    assert {(c["length"], c["depth"], c["score"]) for c in metrics["by_depth"]} == \
        {(400, 0.0, 1.0), (400, 0.5, 0.0), (800, 0.0, 1.0), (800, 0.5, 0.0)}
    table = (tmp_path / "results.md").read_text()
    assert "| task | length | n | reform(" in table and "| niah | 400 | 2 | 50.0 [9–91] | 50.0 [9–91] |" in table
    assert "| method | depth | 400 | 800 |" in table and "| truncate(recompute_budget=200) | 50% | 0.0 | 0.0 |" in table
    for png in ("heatmap_niah.png", "accuracy_vs_length.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_resume_skips_finished_rows(tmp_path, counts):
    rows = make_rows()
    evaluate(rows, tmp_path, counts)
    first = (tmp_path / "predictions.jsonl").read_text()
    counts.encode = counts.ask = 0
    evaluate(rows, tmp_path, counts)
    assert (counts.encode, counts.ask, counts.load) == (0, 0, 1)       # nothing ran, the model was not even loaded
    assert (tmp_path / "predictions.jsonl").read_text() == first

    # a run killed mid-way (and mid-line): only the missing rows run again
    lines = first.splitlines(keepends=True)
    (tmp_path / "predictions.jsonl").write_text("".join(lines[:5]) + lines[5][:20])
    evaluate(rows, tmp_path, counts)
    assert counts.ask == 3 and counts.encode == 2         # rows 6-8 span one context of each method
    records = read_predictions(tmp_path / "predictions.jsonl")
    assert len(current_records(records, json.loads((tmp_path / "config.json").read_text()))) == 8

    # other options for a method = another config: its rows run again; --fresh starts over
    counts.ask = 0
    evaluate(rows, tmp_path, counts, methods=[("truncate", dict(recompute_budget=150))])
    assert counts.ask == 4
    counts.ask = 0
    evaluate(rows, tmp_path, counts, methods=[TRUNCATE], resume=False)
    assert counts.ask == 4 and len(read_predictions(tmp_path / "predictions.jsonl")) == 4
    assert len(json.loads((tmp_path / "config.json").read_text())["runs"]) == 1


def test_a_run_killed_in_an_encode_goes_on_from_its_checkpoint(tmp_path, counts, monkeypatch):
    """REFORM's encode in flight keeps its state in OUT/partial/ (methods/checkpoint.py): killed there,
    the next run goes on from it and writes what an uninterrupted run writes."""
    from reform.methods import checkpoint as module
    rows = [r for r in make_rows() if r.length == 800]
    evaluate(rows, tmp_path / "once", counts, methods=[REFORM])
    original = module.Checkpoint.chunk_done

    def killed_after_a_save(self, done, total, partial):
        self.every_s = 0
        original(self, done, total, partial)
        if done >= 3 * 64:
            raise KeyboardInterrupt
    monkeypatch.setattr(module.Checkpoint, "chunk_done", killed_after_a_save)
    with pytest.raises(KeyboardInterrupt):
        evaluate(rows, tmp_path / "cut", counts, methods=[REFORM])
    assert len(list((tmp_path / "cut" / "partial").iterdir())) == 1
    monkeypatch.setattr(module.Checkpoint, "chunk_done", original)
    evaluate(rows, tmp_path / "cut", counts, methods=[REFORM])
    assert list((tmp_path / "cut" / "partial").iterdir()) == []
    strip = lambda r: {k: v for k, v in r.items() if k not in ("stats",)}
    once, cut = (read_predictions(tmp_path / d / "predictions.jsonl") for d in ("once", "cut"))
    assert [strip(r) for r in cut] == [strip(r) for r in once] and len(cut) == 2


def test_config_describes_every_method_run_into_a_directory(tmp_path, counts):
    rows = make_rows()
    evaluate(rows[:2], tmp_path, counts, methods=[REFORM], meta={"lengths": [400]})
    evaluate(rows, tmp_path, counts, methods=[TRUNCATE], meta={"lengths": [400, 800]})
    config = json.loads((tmp_path / "config.json").read_text())
    assert [m["name"] for m in config["methods"]] == ["reform", "truncate"]
    assert all(m["resolved"]["recompute_budget"] == 200 for m in config["methods"])
    assert [(r["lengths"], len(r["methods"])) for r in config["runs"]] == [([400], 1), ([400, 800], 1)]
    assert all(r["machine"]["cpu_cores"] and r["started"] for r in config["runs"])
    assert all(r["machine"]["dtype"] == "float32" for r in config["runs"])  # the tiny model's dtype
    metrics = write_report(tmp_path, plots=False)
    assert [m["method"].split("(")[0] for m in metrics["by_method"]] == ["reform", "truncate"]

    counts.load = 0                       # a resumed run with nothing left keeps every method's record
    evaluate(rows, tmp_path, counts, methods=[TRUNCATE])
    again = json.loads((tmp_path / "config.json").read_text())
    assert counts.load == 0 and again["methods"] == config["methods"] and len(again["runs"]) == 3


def test_full_past_the_window_is_skipped_unless_forced(tmp_path, counts):
    long = Row(context="word " * 120, question="Which word?", answers=["word"], task="niah", length=600,
               max_new_tokens=2)
    short = Row(context="word " * 40, question="Which word?", answers=["word"], task="niah", length=200,
                max_new_tokens=2)
    metrics = evaluate([long, short], tmp_path, counts, methods=["full"])
    by_id = {r["id"]: r for r in read_predictions(tmp_path / "predictions.jsonl")}
    assert by_id[long.id]["status"] == "skipped" and "longer than the model's window" in by_id[long.id]["reason"]
    assert by_id[long.id]["score"] is None and by_id[short.id]["status"] == "ok"
    assert counts.ask == 1
    cell = {c["length"]: c for c in metrics["by_task"]}
    assert cell[600] == {"task": "niah", "length": 600, "method": "full", "score": None, "n": 0, "ci": None,
                         "recall": None, "recall_n": 0, "recall_ci": None, "reading_misses": 0,
                         "retrieval_misses": 0, "skipped": 1, "errors": 0}
    assert "| niah | 600 | — | skipped |" in (tmp_path / "results.md").read_text()

    counts.ask = 0
    evaluate([long, short], tmp_path, counts, methods=["full"])        # resumed: the skip is final
    assert counts.ask == 0
    metrics = evaluate([long, short], tmp_path, counts, methods=["full"], force_over_window=True)
    assert counts.ask == 1
    assert {c["length"]: c["n"] for c in metrics["by_task"]} == {200: 1, 600: 1}


def test_long_contexts_show_encode_progress(tmp_path, counts, monkeypatch):
    import io

    from rich.console import Console
    seen = []
    encode = Pipeline.encode
    monkeypatch.setattr(Pipeline, "encode", lambda pipe, text, progress=None, **k: seen.append(progress) or
                        encode(pipe, text, progress, **k))
    monkeypatch.setattr(runner_mod.RowProgress, "LONG", 500)
    rows = [Row(context="word " * 40, question="Which?", answers=["w"], task="t", length=200, max_new_tokens=1),
            Row(context="word " * 120, question="Which?", answers=["w"], task="t", length=600, max_new_tokens=1)]
    console = Console(file=io.StringIO(), width=120)
    evaluate(rows, tmp_path, counts, methods=[("h2o", dict(chunk_size=64, cache_budget=96))], progress=True,
             console=console)
    assert seen[0] is None and callable(seen[1])                    # only the long context gets a token bar
    assert "2/2 rows" in console.file.getvalue()


def record(method, task, length, score, depth=None, status="ok", sample=0, **extra):
    return {"id": f"{task}-{length}-{depth}-{sample}", "task": task, "length": length, "depth": depth,
            "sample": sample, "method": method, "config_hash": "h", "status": status, "score": score,
            "stats": {"encode": 2.0, "encode_shared_by": 2, "gather": 0.5, "recompute": 1.0, "generate": 0.5,
                      "peak_memory_mb": 100 + length / 1000}, **extra}


def test_metrics_table_and_plots_from_handmade_predictions(tmp_path):
    recs = [record("reform", "ruler/a", 8192, 1.0, sample=0), record("reform", "ruler/a", 8192, 0.5, sample=1),
            record("reform", "ruler/b", 8192, 0.0), record("h2o", "ruler/a", 8192, 0.25),
            record("h2o", "ruler/b", 8192, None, status="skipped"),
            record("reform", "ruler/a", 16384, 1.0), record("reform", "ruler/b", 16384, 1.0)]
    (tmp_path / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    m = write_report(tmp_path)
    assert m["methods"] == ["reform", "h2o"] and m["tasks"] == ["ruler/a", "ruler/b"] and m["lengths"] == [8192, 16384]
    cells = {(c["task"], c["length"], c["method"]): (c["score"], c["n"], c["skipped"]) for c in m["by_task"]}
    assert cells[("ruler/a", 8192, "reform")] == (0.75, 2, 0)
    assert cells[("ruler/b", 8192, "h2o")] == (None, 0, 1)
    assert m["by_depth"] == []
    mean = {(c["length"], c["method"]): c["score"] for c in m["by_length"]}
    assert mean == {(8192, "reform"): 0.375, (8192, "h2o"): 0.25, (16384, "reform"): 1.0}
    reform = m["by_method"][0]
    assert reform["n"] == 5 and reform["seconds_per_row"] == 3.0 and reform["peak_memory_mb"] == pytest.approx(116.384)
    table = (tmp_path / "results.md").read_text()
    assert "| task | length | n | reform | h2o |" in table
    assert "| ruler/a | 8k | 2/1 | 75.0 [50–100] | 25.0 [1–88] |" in table
    assert "| ruler/b | 8k | 1 | 0.0 [0–79] | skipped |" in table
    assert "| ruler/a | 16k | 1 | 100.0 [21–100] | — |" in table
    assert "| **mean over tasks** | 8k | 3/1 | 37.5 [25–50] | 25.0 [1–88] (1 of 2 tasks) |" in table
    assert (tmp_path / "accuracy_vs_length.png").stat().st_size > 1000
    assert not list(tmp_path.glob("heatmap_*.png"))                 # no depths, no heat map


def test_tasks_at_lengths_of_their_own_get_one_line_over_all_rows(tmp_path):
    """Real documents (the docs suite): each task has its own length, so a mean over tasks per length
    would repeat each task's line; the table ends with one line over all the rows instead."""
    recs = [record("reform", "docs/a", 180000, 1.0, sample=0), record("reform", "docs/a", 180000, 0.0, sample=1),
            record("reform", "docs/b", 260000, 1.0), record("rag-dense", "docs/a", 180000, 0.0),
            record("rag-dense", "docs/b", 260000, 0.0)]
    (tmp_path / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    write_report(tmp_path, plots=False)
    table = (tmp_path / "results.md").read_text()
    assert "**mean over tasks**" not in table
    assert "| **all rows** | all | 3/2 | 66.7 [21–94] | 0.0 [0–66] |" in table


def test_depth_metrics_and_latest_record_wins(tmp_path):
    recs = [record("reform", "niah", 4096, 0.0, depth=0.5), record("reform", "niah", 4096, 1.0, depth=0.5),
            record("reform", "niah", 4096, 1.0, depth=0.0), record("reform", "niah", 8192, 0.0, depth=0.0)]
    m = aggregate(current_records(recs, None))
    assert [(c["length"], c["depth"], c["score"]) for c in m["by_depth"]] == \
        [(4096, 0.0, 1.0), (4096, 0.5, 1.0), (8192, 0.0, 0.0)]
    other = {**recs[0], "config_hash": "old", "score": 0.0}
    kept = current_records([recs[1], other], {"methods": [{"label": "reform", "config_hash": "h"}]})
    assert kept == [recs[1]]


def test_lengths_and_method_specs():
    assert [parse_length(t) for t in ("8k", "1M", "3000", "1.5k", " 16K ")] == [8192, 1 << 20, 3000, 1536, 16384]
    assert parse_lengths("16k,8k,8k") == [8192, 16384]
    for bad in ("8x", "0", "", "k", "-4k"):
        with pytest.raises(ValueError, match="bad length"):
            parse_length(bad)
    spec = MethodSpec.parse("truncate:recompute_budget=512")
    assert spec == MethodSpec.of(("truncate", {"recompute_budget": 512})) == \
        MethodSpec.of({"name": "truncate", "recompute_budget": 512})
    assert spec.label == "truncate(recompute_budget=512)"
    assert spec.config_hash("m") != MethodSpec("truncate").config_hash("m") != MethodSpec("truncate").config_hash("n")
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        method_specs(["reform", "nope"])
    with pytest.raises(ValueError, match="does not take cache_budget"):
        method_specs(["full:cache_budget=10"])
    with pytest.raises(ValueError, match="no methods"):
        method_specs([])
    with pytest.raises(ValueError, match="listed twice"):
        method_specs(["h2o", "h2o"])
    with pytest.raises(ValueError, match="bad method option"):
        MethodSpec.parse("reform:budget")


# ------------------------------------------------------------------ JSONL import
RULER_INPUT = ("Some special magic numbers are hidden within the following text.\nThe grass is green. "
               "One of the special magic numbers for apple is: 42.\nWhat is the special magic number for apple "
               "mentioned in the provided text?")


def test_jsonl_our_format_round_trips(tmp_path):
    rows = make_rows()
    write_rows(tmp_path / "rows.jsonl", rows)
    assert read_rows(tmp_path / "rows.jsonl") == rows
    assert [r.max_new_tokens for r in read_rows(tmp_path / "rows.jsonl", max_new_tokens=9)] == [9] * 4


def test_jsonl_ruler_rows(tmp_path):
    folder = tmp_path / "niah_single_1"
    folder.mkdir()
    row = {"index": 3, "input": RULER_INPUT + " Answer: The special magic number for apple is",
           "outputs": ["42"], "length": 4000, "answer_prefix": " Answer: The special magic number for apple is"}
    (folder / "validation.jsonl").write_text(json.dumps(row) + "\n\n")
    [r] = read_rows(folder / "validation.jsonl")
    assert r.task == "ruler/niah_single_1" and r.length == 4000 and r.sample == 3 and r.answers == ["42"]
    assert r.question == "What is the special magic number for apple mentioned in the provided text?"
    assert r.context.endswith("is: 42.") and r.answer_prefix == "Answer: The special magic number for apple is"
    assert r.max_new_tokens == 64
    (folder / "named.jsonl").write_text(json.dumps({**row, "task": "vt"}) + "\n")
    assert read_rows(folder / "named.jsonl")[0].task == "ruler/vt"
    assert read_rows(folder / "named.jsonl", task="mine")[0].task == "mine"
    context, question = split_question("docs\nQuestion: who?\nmore of it", "Question:")
    assert (context, question) == ("docs", "Question: who?\nmore of it")


@pytest.mark.parametrize("lines,msg", [
    (['{"context": "c", "question": "q", "answers": ["a"], "task": "t"}', "{not json"], "line 2: not valid JSON"),
    (['{"context": "c", "answers": ["a"], "task": "t"}'], "line 1: row is missing question"),
    (['[1, 2]'], "line 1: a row must be a JSON object"),
    (['{"context": "c", "question": "q", "answers": ["a"], "task": "t", "colour": 1}'], "unknown field(s) colour"),
    (['{"context": "c", "question": " ", "answers": ["a"], "task": "t"}'], "'question' must be a non-empty"),
    (['{"context": "c", "question": "q", "answers": ["a"], "task": "t", "depth": 3}'], "'depth' must be"),
    (['{"context": "c", "question": "q", "answers": [], "task": "t"}'], "'answers' is empty"),
    (['{"context": "c", "question": "q", "answers": [1], "task": "t"}'], "must be a list of strings"),
    (['{"input": "no line break", "outputs": ["x"]}'], "line 1: 'input' has no line break"),
    (['{"input": "a\\nb", "outputs": 5}'], "RULER rows need"),
    (["", "  "], "holds no rows"),
    (['{"context": "c", "question": "q", "answers": ["a"], "task": "t"}'] * 2, "line 2: the row repeats line 1"),
])
def test_jsonl_errors_name_the_line(tmp_path, lines, msg):
    p = tmp_path / "rows.jsonl"
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(RowFileError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        read_rows(p)


# ------------------------------------------------------------------ CLI
cli = CliRunner()


@pytest.fixture
def no_model(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("the model must not be loaded for bad input")
    monkeypatch.setattr("reform.model.load_model", refuse)


@pytest.mark.parametrize("args,msg", [
    (["niah", "--methods", "reform,nope"], "unknown method 'nope'"),
    (["niah", "--methods", " , "], "no methods given"),
    (["ruler", "--methods", "full:cache_budget=10"], "does not take cache_budget"),
    (["babilong", "--lengths", "8k,12q"], "bad length '12q'"),
    (["niah", "--lengths", ","], "no lengths given"),
    (["niah", "--depths", "0.5,2"], "outside 0..1"),
    (["niah", "--depths", "half"], "bad depth 'half'"),
    (["niah", "--haystack", "/no/such/dir"], "haystack folder not found"),
    (["ruler", "--tasks", "vt,ruler/cwe,nope"], "unknown ruler task 'nope'; choose from: niah_single_1"),
    (["babilong", "--tasks", ","], "no tasks given; choose from: qa1"),
    (["niah", "--model", "/no/such/model.gguf"], "GGUF file not found"),
    (["jsonl", "/no/such/rows.jsonl"], "file not found"),
    (["report", "/no/such/run"], "folder not found"),
])
def test_cli_bad_input_exits_before_loading(args, msg, no_model, tmp_path):
    r = cli.invoke(app, ["eval", *args] + (["--out", str(tmp_path / "o")] if args[0] != "report" else []))
    assert r.exit_code == 2 and msg in r.output and r.output.count("\n") == 1, r.output


def test_cli_unwritable_out_and_unknown_suite(no_model, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    r = cli.invoke(app, ["eval", "niah", "--out", str(blocker / "sub")])
    assert r.exit_code == 2 and "cannot write output folder" in r.output
    r = cli.invoke(app, ["eval", "niah", "--out", str(blocker)])
    assert r.exit_code == 2 and "is a file" in r.output
    r = cli.invoke(app, ["eval", "nosuite"])
    assert r.exit_code == 2 and "No such command" in r.output
    (tmp_path / "empty").mkdir()
    r = cli.invoke(app, ["eval", "report", str(tmp_path / "empty")])
    assert r.exit_code == 2 and "no predictions.jsonl" in r.output


def test_cli_jsonl_bad_line(no_model, tmp_path):
    p = tmp_path / "rows.jsonl"
    write_rows(p, make_rows()[:1])
    p.write_text(p.read_text() + '{"question": "q"}\n')
    r = cli.invoke(app, ["eval", "jsonl", str(p), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "rows.jsonl line 2: row is missing context" in r.output


def test_cli_jsonl_runs_and_report_regenerates(tmp_path, monkeypatch):
    monkeypatch.setattr("reform.model.load_model", lambda *a, **k: LoadedModel(tiny(), CharTokenizer(), "tiny"))
    monkeypatch.setattr(runner_mod, "default_scorer", lambda: fake_score)
    p = tmp_path / "rows.jsonl"
    write_rows(p, make_rows())
    out = tmp_path / "run"
    args = ["eval", "jsonl", str(p), "--methods", "truncate:recompute_budget=200", "--out", str(out)]
    r = cli.invoke(app, args + ["--max-rows", "3"])
    assert r.exit_code == 0, r.output
    assert len(read_predictions(out / "predictions.jsonl")) == 3
    r = cli.invoke(app, args)                                       # resumed: only the fourth row runs
    assert r.exit_code == 0, r.output
    assert "| niah | 400 | 2 | 50.0 [9–91] |" in r.output
    assert len(read_predictions(out / "predictions.jsonl")) == 4
    metrics = json.loads((out / "metrics.json").read_text())
    for name in ("metrics.json", "results.md", "heatmap_niah.png", "accuracy_vs_length.png"):
        (out / name).unlink()
    r = cli.invoke(app, ["eval", "report", str(out)])
    assert r.exit_code == 0, r.output
    assert json.loads((out / "metrics.json").read_text())["by_task"] == metrics["by_task"]
    assert (out / "heatmap_niah.png").exists() and (out / "accuracy_vs_length.png").exists()


def test_generated_niah_rows_with_the_default_scorer(tmp_path, counts):
    from reform.eval.tasks import make_rows as generate
    rows = generate("niah", CharTokenizer(), [300, 400], 1, depths=[0.0, 1.0])
    metrics = run_eval(rows, methods=[TRUNCATE], out_dir=tmp_path, model_name="tiny", loader=counts.loader)
    records = read_predictions(tmp_path / "predictions.jsonl")
    assert len(records) == 4 and all(r["meta"]["metric"] == "contains" and r["score"] in (0.0, 1.0) for r in records)
    assert {(c["length"], c["depth"]) for c in metrics["by_depth"]} == {(300, 0.0), (300, 1.0), (400, 0.0), (400, 1.0)}
    assert (tmp_path / "heatmap_niah.png").exists()


def test_shared_suite_encodes_once_asks_twenty_and_reports_time(tmp_path, monkeypatch):
    """``reform eval shared``'s rows: one encode per context and method, 20 questions from it, and the
    shared-context table's timing fields; ``query_aware=true`` encodes with the first question appended."""
    from reform.eval.tasks import make_rows
    rows = make_rows("shared", CharTokenizer(), [2500], 1, seed=2)
    for r in rows:
        r.max_new_tokens = 2
    seen = []
    encode = Pipeline.encode
    monkeypatch.setattr(Pipeline, "encode", lambda pipe, text, *a, **k: seen.append(text) or encode(pipe, text, *a, **k))
    loaded = LoadedModel(tiny(), CharTokenizer(), "tiny")
    aware = "truncate:recompute_budget=200:query_aware=true"
    metrics = run_eval(rows, methods=[TRUNCATE, aware], out_dir=tmp_path, model_name="tiny", loader=lambda: loaded,
                       scorer=lambda row, p: float(row.meta["turn"] < 5), plots=False)
    assert seen == [rows[0].context, rows[0].context + "\n\n" + rows[0].question]       # once per method
    labels = [m["label"] for m in json.loads((tmp_path / "config.json").read_text())["methods"]]
    assert labels == ["truncate(recompute_budget=200)", "truncate(query_aware=True,recompute_budget=200)"]
    records = read_predictions(tmp_path / "predictions.jsonl")
    assert len(records) == 40 and {r["context"] for r in records} == {rows[0].context_key[:12]}
    shared = {c["method"]: c for c in metrics["shared_contexts"]}
    plain = shared["truncate(recompute_budget=200)"]
    assert plain["contexts"] == 1 and plain["questions_per_context"] == 20 and plain["n"] == 20
    assert plain["score"] == 0.25 and plain["first_question"] == 1.0 and plain["later_questions"] == pytest.approx(4 / 19, abs=1e-4)
    mine = [r for r in records if r["method"] == "truncate(recompute_budget=200)"]
    asked = sum(r["stats"]["gather"] + r["stats"]["recompute"] + r["stats"].get("generate", 0) for r in mine)
    assert plain["encode_seconds"] == pytest.approx(mine[0]["stats"]["encode"], abs=1e-3)
    assert plain["total_seconds_per_context"] == pytest.approx(plain["encode_seconds"] + asked, abs=2e-3)
    assert plain["seconds_per_question"] == pytest.approx(asked / 20, abs=1e-3)
    assert "## Shared contexts: encode once, ask many" in (tmp_path / "results.md").read_text()
    with pytest.raises(ValueError, match="query_aware .* must be true or false"):
        method_specs(["truncate:query_aware=maybe"])
