"""∞-Bench from its official files (reform.eval.benchmarks.infinitebench): the official prompts split and joined
again, the official scorers on worked examples (quirks included), the loader on files in the official schema,
the synthetic tasks checked independently of their generator, and the command end to end on a tiny model."""

import json
import re
import statistics

import pytest
from typer.testing import CliRunner

from reform.cli.main import app
from reform.eval.benchmarks import infinitebench as ib
from reform.eval.benchmarks import infinitebench_synthetic as synthetic
from reform.eval.rows import Row
from reform.eval.tasks.scoring import score as row_score

from conftest import CharTokenizer

OPTIONS = ["Paris", "Rome", "Oslo", "Bern"]
EXAMPLES = {      # one example per task in the official schema, answers in the types the released files use
    "passkey": {"context": "noise\nThe pass key is 71432. Remember it. 71432 is the pass key.\nnoise",
                "input": "What is the pass key?", "answer": ["71432"]},
    "number_string": {"context": "The sequence of digits is 1123456789.", "input": "What is the sequence of digits?",
                      "answer": ["1123456789"]},
    "kv_retrieval": {"context": 'JSON data:\n{"k1": "v1", "k2": "v2"}',
                     "input": '\nKey: "k2"\nThe value associated with the specified key is: ', "answer": ["v2"]},
    "longbook_sum_eng": {"context": "A long book.", "input": "", "answer": ["A short summary."]},
    "longbook_choice_eng": {"context": "A book about France.", "input": "Where is the tower?", "answer": ["Paris"],
                            "options": OPTIONS},
    "longbook_qa_eng": {"context": "A book.", "input": "Who rowed?", "answer": ["The old man"]},
    "longbook_qa_chn": {"context": "一本书。", "input": "谁划船？", "answer": ["老人"]},
    "longdialogue_qa_eng": {"context": "JOHN: hi\n$$MASK$$: hello", "input": "", "answer": ["MARY"]},
    "math_find": {"context": "[3, 9, 1]", "answer": [9],
                  "input": "You should answer with only one number, no other words. The largest number of the list is: "},
    "math_calc": {"context": "1 + 3 - 2", "input": "The value of the numerical expression is: ", "answer": [[4, 2]]},
    "code_run": {"context": "def func_1(x):\n    return x + 2\n", "answer": [5],
                 "input": "Please give me the exact number of the return value of func_1(3). Your response should "
                          "end with the sentence 'The return value is:'."},
    "code_debug": {"context": "def a(): pass", "input": "", "answer": ["b_func"], "options": ["a", "b_func", "c", "d"]},
}


@pytest.mark.parametrize("task", ib.TASKS)
def test_split_prompts_join_to_the_official_prompt(task):
    example = EXAMPLES[task]
    context, question, prefix = ib.split_prompt(example, task)
    assert context + question + prefix == ib.official_prompt(example, task)
    assert context.endswith(example["context"]) and question.strip()      # the context is encoded on its own
    assert example["context"] not in question + prefix


def test_split_prompts_put_the_question_before_the_answer_cue():
    assert ib.split_prompt(EXAMPLES["passkey"], "passkey")[1:] == ("\n\nWhat is the pass key?\n\n", "The pass key is")
    context, question, prefix = ib.split_prompt(EXAMPLES["longbook_choice_eng"], "longbook_choice_eng")
    assert question.startswith("\n\nQuestion: Where is the tower?\nA. Paris\n") and prefix == \
        "The letter of the correct answer is"
    # math_find: the official prefix, made from the question, before the list; code_run: the call filled in
    assert ib.split_prompt(EXAMPLES["math_find"], "math_find")[0] == \
        "What is the largest number in the following list?\n\n[3, 9, 1]"
    assert "The value of func_1(3) is" in ib.split_prompt(EXAMPLES["code_run"], "code_run")[1]


def test_scorers_follow_the_official_code():
    assert ib.score("passkey", "The pass key is 71432. Remember", "71432") == 1.0
    assert ib.score("passkey", "7143 2", "71432") == 0.0                      # the first run of digits only
    assert ib.score("number_string", " 1123456789", ["1123456789"]) == 1.0
    assert ib.score("kv_retrieval", '"v2".', "v2") == 1.0 and ib.score("kv_retrieval", "v22", "v2") == 0.0
    assert ib.score("longbook_choice_eng", "C. Oslo", ["Oslo", "C"]) == 1.0
    assert ib.score("longbook_choice_eng", "(C)", ["Oslo", "C"]) == 0.0       # the official quirk: "(" first
    assert ib.score("longbook_choice_eng", "I think the answer is: B", ["Rome", "B"]) == 1.0
    assert ib.score("longbook_choice_eng", "maybe D or so", ["Bern", "D"]) == 1.0
    assert ib.score("longbook_qa_eng", "The old man.", ["old man"]) == 1.0
    assert ib.score("longbook_qa_eng", "tower in Paris", ["Eiffel Tower"]) == pytest.approx(0.4)
    assert ib.score("longbook_qa_chn", "老人。", ["老人"]) == 1.0
    assert ib.score("longbook_qa_chn", "老", ["老人"]) == pytest.approx(2 / 3)
    assert ib.score("longbook_sum_eng", "the cat lay on a mat", ["the cat sat on the mat"]) == pytest.approx(2 / 3)
    assert ib.score("longdialogue_qa_eng", "Mary, I think.", ["MARY"]) == 1.0
    assert ib.score("math_find", "It is 42", 42) == 1.0 and ib.score("math_find", "4.5", 4) == 0.0
    assert ib.score("math_find", "49.5", 49.5) == 1.0
    assert ib.score("math_calc", "[1, 4, 9, 10]", [1, 4, 8, 10]) == 0.5      # right values up to the first wrong
    assert ib.score("code_run", "The return value is: -3.", -3) == 1.0
    assert ib.score("code_run", "-3 is it", -3) == 0.0                       # the last word counts
    assert ib.score("code_debug", "B. b_func", ["b_func", "B"]) == 1.0
    assert ib.score("code_debug", "The correct option is: b_func", ["b_func", "B"]) == 1.0
    assert ib.score("code_debug", "b_func", ["b_func", "B"]) == 0.0           # no answer phrase, no letter


UUID_KEY, UUID_VALUE = "2a8d601d-1d69-4e64-9f90-8ad825a74195", "15f2cd71-92af-4f03-907b-ef95f9810e12"
KV_CONTEXT = f'JSON data:\n{{"0b0a3b7e-68ee-4a8c-bd5b-2ed6ca0bd9a5": "9d2d1c0b-30b3-4b6b-8f3b-6c1d6f4f7b71", "{UUID_KEY}": "{UUID_VALUE}"}}'


def test_official_label_shapes_score_and_evidence_as_the_official_code():
    """The released files' answers: a list for every task, [fn_name, letter] for Code.Debug after get_answer,
    nested lists for Math.Calc; a right prediction scores 1, a wrong one 0, as get_score_one does."""
    right = {"passkey": ("71432", ["71432"]), "number_string": ("1123456789", ["1123456789"]),
             "kv_retrieval": (f"{UUID_VALUE} is the value. The key", [UUID_VALUE]),
             "math_find": ("9", [9]), "math_calc": ("4, 2", [[4, 2]]), "code_run": ("The return value is: 5", [5]),
             "code_debug": ("B. b_func", ["b_func", "B"]), "longbook_choice_eng": ("A. Paris", ["Paris", "A"]),
             "longbook_qa_eng": ("the old man", ["The old man"]), "longbook_qa_chn": ("老人", ["老人"]),
             "longdialogue_qa_eng": ("Mary", ["MARY"]), "longbook_sum_eng": ("A short summary.", ["A short summary."])}
    assert set(right) == set(ib.TASKS)
    for task, (prediction, label) in right.items():
        assert ib.score(task, prediction, label) == 1.0, task
        assert ib.score(task, "0", label) == 0.0, task
    assert ib.score("kv_retrieval", UUID_VALUE[:-1], [UUID_VALUE]) == 0.0
    assert ib.score("math_find", "9", ["9"]) == 1.0 and ib.score("code_run", "is: -3", ["-3"]) == 1.0   # Hub strings
    with pytest.raises(TypeError, match="must be a number"):
        ib.score("math_find", "9", ["nine"])
    example = {"context": KV_CONTEXT, "input": f'\nKey: "{UUID_KEY}"\nThe value associated with the specified key is: ',
               "answer": [UUID_VALUE], "options": []}
    label = ib.official_label(example, "kv_retrieval")
    assert ib.evidence(example, "kv_retrieval", label) == [f'"{UUID_KEY}": "{UUID_VALUE}"']
    assert ib.evidence(example, "kv_retrieval", label)[0] in example["context"]    # the pair as the context has it


def test_kv_retrieval_row_from_an_official_file_scores_a_right_uuid(tmp_path):
    example = {"id": 0, "context": KV_CONTEXT, "answer": [UUID_VALUE], "options": [],
               "input": f'\nKey: "{UUID_KEY}"\nThe value associated with the specified key is: '}
    (tmp_path / "kv_retrieval.jsonl").write_text(json.dumps(example) + "\n")
    row, = ib.load_rows(tmp_path, CharTokenizer(), ["kv_retrieval"])
    assert row.answers == [UUID_VALUE] and row.meta["evidence"][0] in row.context
    assert row_score(row, f"{UUID_VALUE}\n\nKey: more text the model went on with") == 1.0
    assert row_score(row, "9d2d1c0b-30b3-4b6b-8f3b-6c1d6f4f7b71") == 0.0


def write_files(folder, examples):
    folder.mkdir(exist_ok=True)
    for task, example in examples.items():
        (folder / f"{task}.jsonl").write_text(json.dumps({"id": 0, "options": [], **example}) + "\n")


def test_loader_reads_the_official_files_with_their_labels(tmp_path):
    write_files(tmp_path / "data", EXAMPLES)
    rows = ib.load_rows(tmp_path / "data", CharTokenizer(), list(ib.TASKS))
    by_task = {r.task.split("/")[1]: r for r in rows}
    assert set(by_task) == set(ib.TASKS) and all(r.layout == "verbatim" for r in rows)
    assert by_task["longbook_choice_eng"].meta["label"] == ["Paris", "A"]      # get_answer: text and letter
    assert by_task["code_debug"].meta["label"] == ["b_func", "B"]
    assert by_task["passkey"].meta["evidence"] == ["The pass key is 71432. Remember it. 71432 is the pass key."]
    assert by_task["kv_retrieval"].meta["evidence"] == ['"k2": "v2"']
    assert by_task["math_calc"].answers == ["4, 2"] and by_task["math_find"].max_new_tokens == 3
    for task, row in by_task.items():     # the row scores through the eval's scorer with the official one
        assert row_score(row, "") == 0.0, task
    assert row_score(by_task["code_run"], "The value of func_1(3) is 5") == 1.0
    default = ib.load_rows(tmp_path / "data", CharTokenizer())
    assert {r.task.split("/")[1] for r in default} == set(ib.PAPER_TASKS)      # Table 3's ten


def test_loader_refuses_what_it_cannot_read(tmp_path):
    with pytest.raises(ValueError, match="lacks passkey.jsonl"):
        ib.load_rows(tmp_path, CharTokenizer(), ["passkey"])
    (tmp_path / "passkey.jsonl").write_text('{"context": "x"}\n')
    with pytest.raises(ValueError, match="passkey.jsonl line 1: missing input, answer"):
        ib.load_rows(tmp_path, CharTokenizer(), ["passkey"])
    (tmp_path / "longbook_choice_eng.jsonl").write_text(json.dumps({**EXAMPLES["longbook_choice_eng"],
                                                                    "answer": "Lima"}) + "\n")
    with pytest.raises(ValueError, match="not one of the four options"):
        ib.load_rows(tmp_path, CharTokenizer(), ["longbook_choice_eng"])
    with pytest.raises(ValueError, match="unknown ∞-Bench task"):
        ib.load_rows(tmp_path, CharTokenizer(), ["passkeys"])


def test_samples_spread_through_the_file(tmp_path):
    (tmp_path / "passkey.jsonl").write_text("".join(json.dumps({**EXAMPLES["passkey"], "id": i}) + "\n"
                                                    for i in range(10)))
    rows = ib.load_rows(tmp_path, CharTokenizer(), ["passkey"], samples=3)
    assert [r.meta["id"] for r in rows] == [1, 5, 8]


def follow_expression(text: str) -> list[int]:
    terms = text.split()
    value, out = int(terms[0]), []
    for op, number in zip(terms[1::2], terms[2::2]):
        value = value + int(number) if op == "+" else value - int(number)
        out.append(value)
    return out


def test_generated_tasks_are_right_by_independent_checks(tmp_path):
    paths = synthetic.generate(tmp_path, 4096, 5, seed=1)
    assert sorted(p.stem for p in paths) == sorted(synthetic.SYNTHETIC)
    files = {p.stem: [json.loads(line) for line in p.read_text().splitlines()] for p in paths}
    assert all(isinstance(e["answer"], list) and len(e["answer"]) == 1 for examples in files.values() for e in examples)
    answers = {task: [e["answer"][0] for e in examples] for task, examples in files.items()}   # the released shape
    for e, key in zip(files["passkey"], answers["passkey"]):
        assert re.fullmatch(r"\d{5}", key) and e["context"].count(key) == 2
    assert files["passkey"][0]["context"].index(answers["passkey"][0]) / len(files["passkey"][0]["context"]) < 0.01
    for e, key in zip(files["number_string"], answers["number_string"]):
        assert re.fullmatch(r"\d{10}", key) and f"The sequence of digits is {key}." in e["context"]
    for e, value in zip(files["kv_retrieval"], answers["kv_retrieval"]):
        pairs = json.loads(e["context"].removeprefix("JSON data:\n"))
        key = re.search(r'Key: "([^"]+)"', e["input"]).group(1)
        assert pairs[key] == value and len(set(pairs.values())) == len(pairs)
    for e, answer in zip(files["math_find"], answers["math_find"]):
        values = json.loads(e["context"])
        target = re.search(r"The (.+) of the list", e["input"]).group(1)
        distinct = sorted(set(values))
        want = {"largest number": distinct[-1], "second largest number": distinct[-2],
                "third largest number": distinct[-3], "smallest number": distinct[0],
                "second smallest number": distinct[1], "third smallest number": distinct[2],
                "median number": statistics.median(values)}[target]
        assert answer == want, target
    for e, steps in zip(files["math_calc"], answers["math_calc"]):          # nested: [[4, 2]]
        assert steps == follow_expression(e["context"]) and min(steps) >= 0
    for e, value in zip(files["code_run"], answers["code_run"]):
        namespace = {}
        exec(e["context"].split(":\n\n", 1)[1], namespace)       # the functions, run by Python itself
        call = re.search(r"(func_\d+)\((-?\d+)\)", e["input"])
        assert namespace[call.group(1)](int(call.group(2))) == value
    assert synthetic.generate(tmp_path / "again", 4096, 5, seed=1)[0].read_text() == paths[0].read_text()   # by seed


def test_generated_rows_score_their_own_answer_and_not_another(tmp_path):
    synthetic.generate(tmp_path, 2048, 2, tasks=["passkey", "kv_retrieval", "math_find", "code_run", "number_string"])
    rows = ib.load_rows(tmp_path, CharTokenizer(), ["passkey", "kv_retrieval", "math_find", "code_run",
                                                   "number_string"])
    for row in rows:
        assert isinstance(row.meta["label"], list)
        assert row_score(row, f" {row.answers[0]}") == 1.0, row.task
        assert row_score(row, " 0") == 0.0, row.task


def test_generate_refuses_tasks_it_cannot_write(tmp_path):
    with pytest.raises(ValueError, match="only the synthetic tasks"):
        synthetic.generate(tmp_path, 4096, 1, tasks=["longbook_qa_eng"])


def test_verbatim_rows_lay_out_the_official_prompt(tiny_model_dir):
    """A verbatim row's prompt is the official prompt's tokens: context, question and answer cue, no labels."""
    from reform import Pipeline
    from reform.model import load_model
    loaded = load_model(str(tiny_model_dir))
    pipe = Pipeline(loaded.model, loaded.tokenizer, method="truncate", use_chat_template=False)
    context, question, prefix = ib.split_prompt(EXAMPLES["passkey"], "passkey")
    part = pipe.templater.question(question, prefix, layout="verbatim")
    ids = pipe.templater.context(context) + part.ids
    assert loaded.tokenizer.decode(ids, skip_special_tokens=True) == ib.official_prompt(EXAMPLES["passkey"], "passkey")
    assert Row(context=context, question=question, answers=["1"], task="t", length=1).layout == "question"


def test_cli_generates_then_evaluates(tiny_model_dir, tmp_path):
    cli = CliRunner()
    data = tmp_path / "ib"
    r = cli.invoke(app, ["eval", "infinitebench", str(data), "--generate", "--length", "1k", "--samples", "2",
                         "--tasks", "passkey,kv_retrieval"])
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in data.iterdir()) == ["kv_retrieval.jsonl", "passkey.jsonl"]
    out = tmp_path / "run"
    r = cli.invoke(app, ["eval", "infinitebench", str(data), "--tasks", "passkey,kv_retrieval", "--samples", "1",
                         "--methods", "truncate:recompute_budget=256", "--model", str(tiny_model_dir),
                         "--out", str(out)])
    assert r.exit_code == 0, r.output
    records = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert sorted(rec["task"] for rec in records) == ["infinitebench/kv_retrieval", "infinitebench/passkey"]
    assert all(rec["status"] == "ok" and rec["score"] in (0.0, 1.0) for rec in records)
    for args, message in ((["--generate"], "--generate needs --length"),
                          (["--length", "1k"], "--length applies only with --generate"),
                          (["--tasks", "passkeys"], "unknown ∞-Bench task")):
        r = cli.invoke(app, ["eval", "infinitebench", str(data), *args])
        assert r.exit_code == 2 and message in r.output, r.output
    r = cli.invoke(app, ["eval", "infinitebench", str(tmp_path / "nowhere")])
    assert r.exit_code == 2 and "folder not found" in r.output


def test_layouts_close_the_turn_only_where_they_should(tiny_model_dir):
    """A chat model: ``verbatim`` closes the user turn before the answer cue, ``continuation`` leaves it open
    (code completion continues the text); neither adds a separator, and neither ends answers at a line."""
    from reform.engine.layout import Templater
    from reform.model import load_model
    tok = load_model(str(tiny_model_dir)).tokenizer
    chat, plain = Templater(tok), Templater(tok, use_chat_template=False)
    tail = chat.template_ids(chat.tail)
    verbatim = chat.question("\nx = 1\n", "y =", layout="verbatim")
    assert verbatim.separator == [] and verbatim.suffix[:len(tail)] == tail and not verbatim.one_line
    continuation = chat.question("\nx = 1\n", layout="continuation")
    assert continuation.ids == chat.encode("\nx = 1\n") and not continuation.one_line
    assert plain.question("What?").one_line and not chat.question("What?").one_line
    with pytest.raises(ValueError, match="layout must be one of question, verbatim, continuation"):
        chat.question("What?", layout="prose")


# ------------------------------------------------------------------ RepoEval
from reform.eval.benchmarks import repoeval as rev       # noqa: E402


def test_repoeval_metrics_are_compute_score_py():
    """RepoCoder's compute_score.py: lines stripped, empty ones dropped, the prediction cut to the target's
    line count; EM compares those lines, ES is 1 - editdistance / max(len)."""
    assert rev.exact_match("x = foo(1)\n", "x = foo(1)\ny = 2") == 1.0        # the extra line is cut off
    assert rev.edit_similarity("x = foo(1)\n", "x = foo(1)\ny = 2") == 1.0
    assert rev.exact_match("  foo(a,\n      b)\n", "foo(a,\n\n b)") == 1.0     # stripped, empty lines dropped
    assert rev.exact_match("a = 1", "a = 2") == 0.0
    assert rev.edit_similarity("a = 1", "a = 2") == pytest.approx(0.8)       # one edit in five characters
    assert rev.edit_similarity("abc", "") == 0.0
    assert rev.edit_similarity("abc", "abcdef") == pytest.approx(0.5)        # one line: "abcdef" is kept whole


def make_repo(root):
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "lib.py").write_text("def helper(x):\n    return x + 1\n\n\nclass Box:\n    pass\n")
    body = [f"# line {i}" for i in range(12)] + ["value = 3", "result = helper(value)", "box = Box()",
                                                  "print(result)", "SECRET_AFTER = 1"]
    (root / "pkg" / "main.py").write_text("\n".join(body) + "\n")
    (root / "other.py").write_text("def unrelated():\n    return 0\n")
    return root


def test_from_repo_api_level_finds_calls_into_other_files(tmp_path):
    root = make_repo(tmp_path / "demo")
    tasks = rev.from_repo(root, "api", 10, seed=0)
    truths = sorted(t["metadata"]["ground_truth"] for t in tasks)
    assert truths == ["box = Box()", "result = helper(value)"]                # calls defined in lib.py only
    task = next(t for t in tasks if t["metadata"]["ground_truth"] == "result = helper(value)")
    assert task["metadata"]["fpath_tuple"] == ["demo", "pkg", "main.py"] and task["metadata"]["line_no"] == 13
    assert task["prompt"].endswith("value = 3\n")
    row = rev.task_row(task, rev.repository_files(root), "api", 0, CharTokenizer())
    assert row.layout == "continuation" and row.question == task["prompt"]
    assert "def helper(x)" in row.context and "# file: pkg/lib.py" in row.context
    assert "SECRET_AFTER" not in row.context + row.question                     # RepoCoder's leakage rule
    assert row.context.index("# file: other.py") < row.context.index("# file: pkg/main.py")   # the target last
    assert rev.from_repo(root, "api", 10, seed=0) == tasks                     # deterministic by seed
    assert all(t["metadata"]["ground_truth"].startswith(("value", "result", "box", "print", "SECRET"))
               for t in rev.from_repo(root, "line", 10))


def test_official_records_read_over_their_repositories(tmp_path):
    make_repo(tmp_path / "repos" / "demo")
    task = {"prompt": "value = 3\n", "metadata": {"task_id": "demo/7", "ground_truth": "result = helper(value)",
                                                  "fpath_tuple": ["demo", "pkg", "main.py"], "line_no": 13,
                                                  "context_start_lineno": 12}}
    path = tmp_path / "random-api-completion.test.jsonl"
    path.write_text(json.dumps(task) + "\n")
    row, = rev.load_rows(path, tmp_path / "repos", CharTokenizer())
    assert row.task == "repoeval/api" and row.meta["task_id"] == "demo/7"
    assert row.context.endswith("# file: pkg/main.py\n" + "\n".join(f"# line {i}" for i in range(12)) + "\n")
    assert row_score(row, "result = helper(value)\nmore") == 1.0
    assert row_score(row, "result = helper(valu)") == pytest.approx(1 - 1 / 22)
    # the cap counts the target's lines in the context (110 characters here), not its whole file (198)
    capped, = rev.load_rows(path, tmp_path / "repos", CharTokenizer(), max_length=180)
    assert "# file: pkg/lib.py" in capped.context and "other.py" not in capped.context   # nearest files first
    roomier, = rev.load_rows(path, tmp_path / "repos", CharTokenizer(), max_length=200)
    assert "# file: other.py" in roomier.context
    path.write_text(json.dumps({**task, "metadata": {**task["metadata"], "line_no": 99}}) + "\n")
    with pytest.raises(ValueError, match="line 1: line_no 99 and context_start_lineno 12 do not fit"):
        rev.load_rows(path, tmp_path / "repos", CharTokenizer())
    path.write_text('{"prompt": "x"}\n')
    with pytest.raises(ValueError, match="needs 'prompt' and 'metadata'"):
        rev.load_rows(path, tmp_path / "repos", CharTokenizer())


def test_cli_repoeval_from_a_repository(tiny_model_dir, tmp_path):
    cli = CliRunner()
    root = make_repo(tmp_path / "demo")
    out = tmp_path / "run"
    r = cli.invoke(app, ["eval", "repoeval", "--from-repo", str(root), "--level", "api", "--samples", "2",
                         "--methods", "truncate:recompute_budget=256", "--model", str(tiny_model_dir),
                         "--out", str(out)])
    assert r.exit_code == 0, r.output
    records = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(records) == 2 and all(rec["status"] == "ok" for rec in records)
    assert all(rec["score"] == rec["es"] and rec["em"] in (0.0, 1.0) for rec in records)
    assert "## Exact match (%)" in (out / "results.md").read_text()
    for args, message in (([], "give an official RepoEval FILE"),
                          (["--from-repo", str(root), "--level", "file"], "--level must be one of line, api"),
                          ([str(tmp_path / "x.jsonl")], "needs --repos"),
                          (["--from-repo", str(tmp_path / "nowhere")], "--from-repo folder not found")):
        r = cli.invoke(app, ["eval", "repoeval", *args])
        assert r.exit_code == 2 and message in r.output, r.output


# ------------------------------------------------------------------ LongBench
from reform.eval.benchmarks import longbench as lb       # noqa: E402


def test_longbench_metrics_follow_metrics_py():
    """LongBench/metrics.py and eval.py, worked by hand from the official code."""
    assert lb.score("hotpotqa", "The Eiffel Tower.", ["Eiffel Tower", "x"]) == 1.0          # best over answers
    assert lb.score("multifieldqa_zh", "北京是中国的首都", ["北京"]) == pytest.approx(1 / 3)  # jieba: 5 words, 1 right
    assert lb.score("passage_count", "There are 3, not 4", ["3"]) == 0.5                 # right numbers / numbers
    assert lb.score("passage_retrieval_en", "Paragraph 12", ["Paragraph 12"]) == 1.0
    assert lb.score("passage_retrieval_zh", "段落3 或 段落4", ["段落3"]) == 0.5
    assert lb.score("lcc", "```python\n# a comment\nx = foo(1)\n", ["x = foo(2)"]) == 0.9     # first code line; InDel 90 %
    assert lb.score("lcc", "", ["x"]) == 0.0                                              # fuzzywuzzy: empty is 0
    assert lb.score("trec", "Location\nPerson", ["Location"], ["Location", "Person"]) == 1.0   # first line only
    assert lb.score("trec", "Location or Location city", ["Location"],
                    ["Location", "Location city", "Person"]) == 0.5
    # metrics.py removes from the list it iterates: "ab" is skipped, so two classes stay matched
    assert lb.classification_score("abc", "abc", all_classes=["a", "ab", "abc"]) == 0.5
    assert lb.score("gov_report", "", ["A summary."]) == 0.0                               # rouge raises: 0
    from rouge import Rouge
    want = Rouge().get_scores(["the cat lay on a mat"], ["the cat sat on the mat"], avg=True)["rouge-l"]["f"]
    assert lb.score("samsum", "the cat lay on a mat\nmore", ["the cat sat on the mat"]) == want
    assert lb.extract_answer("**The correct answer is (B)**") == "B" and lb.extract_answer("It is B") is None
    assert lb.score("v2", "The correct answer is C", ["C"]) == 1.0


def test_longbench_v1_and_v2_files(tmp_path):
    (tmp_path / "v1").mkdir()
    rows_in = [{"input": "Who rowed?", "context": "The old man rowed.", "answers": ["the old man"], "length": 4,
                "all_classes": None, "_id": f"id{i}"} for i in range(4)]
    (tmp_path / "v1" / "hotpotqa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows_in))
    (tmp_path / "v1" / "trec.jsonl").write_text(json.dumps({"input": "What is X?", "context": "Q: a\nType: Location",
                                                            "answers": ["Location"], "all_classes": ["Location"]}) + "\n")
    rows = lb.load_rows(tmp_path / "v1", CharTokenizer(), ["hotpotqa", "trec"], samples=2)
    hot = [r for r in rows if r.task == "longbench/hotpotqa"]
    assert [r.meta["id"] for r in hot] == ["id1", "id3"] and hot[0].layout == "verbatim"
    assert hot[0].context + hot[0].question + hot[0].answer_prefix == \
        lb.PROMPTS["hotpotqa"].format(context="The old man rowed.", input="Who rowed?")
    assert hot[0].answer_prefix == "Answer:" and hot[0].max_new_tokens == 32
    trec, = [r for r in rows if r.task == "longbench/trec"]
    assert trec.layout == "continuation" and row_score(trec, "Location\nmore") == 1.0
    with pytest.raises(ValueError, match="lacks musique.jsonl"):
        lb.load_rows(tmp_path / "v1", CharTokenizer(), ["musique"])
    with pytest.raises(ValueError, match="unknown LongBench dataset"):
        lb.load_rows(tmp_path / "v1", CharTokenizer(), ["hotpot"])
    item = {"_id": "a", "domain": "Single-Document QA", "difficulty": "easy", "length": "short",
            "question": "Who?", "choice_A": "Ann", "choice_B": "Bob", "choice_C": "Cy", "choice_D": "Di",
            "answer": "B", "context": "  Bob did it.  "}
    (tmp_path / "data.json").write_text(json.dumps([item]))
    v2, = lb.load_rows(tmp_path / "data.json", CharTokenizer())
    assert v2.context + v2.question + v2.answer_prefix == lb.v2_prompt(item) and v2.context.endswith("Bob did it.")
    assert row_score(v2, "The correct answer is (B)") == 1.0 and row_score(v2, "The correct answer is (A)") == 0.0
    (tmp_path / "data.json").write_text(json.dumps([{**item, "answer": "E"}]))
    with pytest.raises(ValueError, match="an answer A-D"):
        lb.load_rows(tmp_path / "data.json", CharTokenizer())


def test_cli_longbench_refuses_before_loading(tmp_path):
    cli = CliRunner()
    r = cli.invoke(app, ["eval", "longbench", str(tmp_path), "--datasets", "hotpot"])
    assert r.exit_code == 2 and "unknown LongBench dataset" in r.output
    r = cli.invoke(app, ["eval", "longbench", str(tmp_path / "nothing")])
    assert r.exit_code == 2 and "not found" in r.output
