"""Run rows through several methods on one loaded model, resumably, and write what they scored.

``run_eval`` loads the model once, builds one ``Pipeline`` per method on it, encodes every distinct
context once per method and asks all of that context's questions. Each finished row is appended to
``predictions.jsonl`` at once, so a killed run loses at most the row in flight and the next run skips
what is there (same method label, same config hash). A REFORM encode in flight keeps its state in
``partial/`` every 5 minutes (``methods/checkpoint.py``), so even a 1M-token row goes on from there. ``metrics.json``, ``results.md`` and the plots are
derived from ``predictions.jsonl`` alone (``write_report``), so ``reform eval report DIR`` regenerates them.

Full attention past the model's window is not run by default: its rows are recorded as ``skipped`` with
the reason (``force_over_window=True`` runs them, as ``reform ask`` does, with degraded answers).
"""

from __future__ import annotations

import json
import time
import warnings
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

from ..outputs import write_atomic
from .recall import evidence, gold_kept, recall, spans_kept
from .records import (CONFIG, PREDICTIONS, drop_torn_tail, finished, merged_config, prepare_out_dir,
                      read_predictions, record_for, resolution_changes, run_entry)
from .report import write_report
from .rows import Row
from .specs import format_length, method_specs


# ---------------------------------------------------------------- answering
def group_by_context(rows: Iterable[Row]) -> list[list[Row]]:
    """Rows with identical contexts, in first-appearance order."""
    groups: dict[str, list[Row]] = {}
    for row in rows:
        groups.setdefault(row.context_key, []).append(row)
    return list(groups.values())


def encode(pipe, text, force_over_window: bool, progress: "RowProgress", checkpoint: Path | None = None):
    """``pipe.encode(text)`` (text, or text and image parts); full attention past the window raises
    ``PastWindowWarning`` unless forced. ``checkpoint``: where a method that can resume its encode keeps
    its state every 5 minutes, so a run killed in the middle of a long context goes on from there."""
    from ..notes import PastWindowWarning
    from ..stats import reset_peak_memory
    reset_peak_memory()                         # each context's peak memory is its own
    resumable = pipe.method.resumable and getattr(pipe.method.config, "segments", 1) == 1
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore" if force_over_window else "error", PastWindowWarning)
            return pipe.encode(text, progress.encoding(pipe, text),
                               checkpoint=checkpoint if checkpoint is not None and resumable else None)
    finally:
        progress.encoded()


def answer_group(pipe, rows: list[Row], force_over_window: bool, progress: "RowProgress | None" = None,
                 first_question: str | None = None, explain: bool = False,
                 checkpoint: Path | None = None, batch: int = 1) -> Iterator[tuple[Row, str, dict]]:
    """Encode the rows' shared context once and ask every row's question: yields (row, status, record
    fields). ``first_question``: encode the context with it appended (query-aware compression);
    ``checkpoint``: as ``encode``'s.
    ``explain``: a row whose gold strings were not all gathered gets the gather's view of them
    (``reform.eval.explain``) under ``explain``, for methods that gather by score. ``batch`` > 1: the
    questions decode together, up to ``batch`` at a time (``Context.ask_many``: the same answers; each
    question's generate time then includes the steps it shared)."""
    from ..notes import PastWindowWarning
    text = rows[0].content()
    if first_question:
        text = text + f"\n\n{first_question}" if isinstance(text, str) else [*text, f"\n\n{first_question}"]
    try:
        ctx = encode(pipe, text, force_over_window, progress or RowProgress(False, 0), checkpoint)
    except PastWindowWarning as w:
        reason = f"{w} (not run; force_over_window / --force-over-window runs it)"
        yield from ((row, "skipped", {"reason": reason}) for row in rows)
        return
    except ValueError as e:
        yield from ((row, "error", {"reason": str(e)}) for row in rows)
        return
    yield from answer_context(pipe, ctx, rows, explain, batch)


def answer_context(pipe, ctx, rows: list[Row], explain: bool = False, batch: int = 1) -> Iterator[tuple[Row, str, dict]]:
    """Ask every row's question of the encoded ``ctx``: yields (row, status, record fields), as
    ``answer_group`` (whose second half this is; a lab asks a context seen through a subset of its heads)."""
    context_text = None        # decoded once per context, for the gold recall of all its questions
    asked = [{"question": row.question, "answer_prefix": row.answer_prefix, "max_new_tokens": row.max_new_tokens,
              "layout": row.layout, "instruction": row.instruction} for row in rows]
    answers = ctx.ask_many(asked, max_batch=batch, refusals=True) if batch > 1 else map(lambda a: ask(ctx, a), asked)
    for row, ans in zip(rows, answers):
        if isinstance(ans, ValueError):
            yield row, "error", {"reason": str(ans)}
            continue
        text_ids = ctx.ids if ctx.image_rows is None else image_ids_as_marks(pipe, ctx.ids)
        if ans.kept is not None and context_text is None:
            context_text = pipe.tokenizer.decode(text_ids.tolist())
        if row.meta.get("evidence_spans") and ctx.source is not None:    # real text: the places, not strings
            flags = spans_kept(ctx.source.token_starts, len(ctx.source.document.text), ans.kept,
                               row.meta["evidence_spans"])
        else:
            flags = gold_kept(pipe.tokenizer, text_ids, ans.kept, evidence(row), context_text)
        stats = {**ans.stats, "encode_shared_by": len(rows)}
        record = {"prediction": ans.text, "context_tokens": int(ctx.ids.shape[0]), "input_tokens": ans.input_tokens,
                  "stats": stats, "recall": recall(flags), "gold_kept": flags,
                  "kept_tokens": None if ans.kept is None else int(ans.kept.numel())}
        if "needle_image" in row.meta:       # an image needle: the share of its positions gathered
            share = image_kept(pipe, ctx.ids, ans.kept, row, row.meta["needle_image"])
            record.update(recall=None if share is None else float(share == 1.0), gold_kept=[share == 1.0],
                          needle_image_kept=share)
        if explain and record["recall"] is not None and record["recall"] < 1 and hasattr(ctx.method, "scores"):
            from .explain import explain as explain_miss
            part = pipe.templater.question(row.question, row.answer_prefix, layout=row.layout,
                                           instruction=row.instruction)
            record["explain"] = explain_miss(ctx, part, evidence(row), ans.kept)
        yield row, "ok", record


def ask(ctx, asked: dict):
    """``ctx.ask(**asked)``, a refusal (``ValueError``) returned instead of raised."""
    try:
        return ctx.ask(**asked)
    except ValueError as e:
        return e


def image_ids_as_marks(pipe, ids):
    """``ids`` with every image position as the model's image token (decodes to a mark, not garbage)."""
    from ..engine.vision import image_token_id
    return ids.masked_fill(ids >= pipe.engine.vocab, image_token_id(pipe.engine.model))


def image_kept(pipe, ids, kept, row: Row, index: int) -> float | None:
    """The share of image ``index``'s positions among ``kept`` (None: the method keeps no token set).
    Images take their ids past the vocabulary in order, as many as the processor gives each."""
    import torch
    if kept is None:
        return None
    images = [p for p in row.content() if not isinstance(p, str)]
    sizes = [image_positions(pipe, image) for image in images[:index + 1]]
    first = pipe.engine.vocab + sum(sizes[:index])
    where = ((ids >= first) & (ids < first + sizes[index])).nonzero().flatten()
    return float(torch.isin(where, kept.to(where.device)).float().mean())


def image_positions(pipe, image) -> int:
    """How many image-token positions the model's processor gives ``image`` (bytes or a path)."""
    from ..engine.vision import image_token_id
    from ..pipeline.inputs import prepare_image
    return int((prepare_image(pipe, image)[0] == image_token_id(pipe.engine.model)).sum())


def resolved_options(method) -> dict | None:
    config = method.config
    return {f.name: getattr(config, f.name) for f in fields(config)} if is_dataclass(config) else None


def versions() -> dict:
    import sys

    import torch
    import transformers

    from ..version import __version__ as reform_version
    return {"reform": reform_version, "python": sys.version.split()[0], "torch": torch.__version__,
            "transformers": transformers.__version__}


def machine(model) -> dict:
    """The machine (CPU, cores, threads, GPU) the model runs on and the dtype it runs in (scores can move
    with it: bf16 is picked on CPUs with native bf16); CPU until a model is loaded."""
    import torch

    from ..machine import machine_info
    if model is None:
        return machine_info(torch.device("cpu"))
    weight = next(model.parameters())
    return machine_info(weight.device) | {"dtype": str(weight.dtype).removeprefix("torch.")}


def default_scorer() -> Callable[[Row, str], float]:
    from .tasks.scoring import score
    return score


def details(row: Row, prediction: str) -> dict:
    from .tasks.scoring import details as metric_details
    return metric_details(row, prediction)


class RowProgress:
    """A rich bar over rows and, while a long context encodes, one over its tokens; no-ops when disabled."""

    LONG = 16384   # characters: shorter contexts encode in seconds, no token bar

    def __init__(self, enabled: bool, total: int, console=None):
        self.bar = None
        if enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
                TimeRemainingColumn
            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("{task.fields[unit]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                                console=console)
            self.rows = self.bar.add_task("starting", total=total, unit="rows")
            self.tokens = self.bar.add_task("  encoding", total=1, unit="tokens", visible=False)

    def __enter__(self):
        if self.bar is not None:
            self.bar.__enter__()
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.__exit__(*exc)

    def describe(self, text: str) -> None:
        if self.bar is not None:
            self.bar.update(self.rows, description=text)

    def row_done(self) -> None:
        if self.bar is not None:
            self.bar.advance(self.rows)

    def encoding(self, pipe, text) -> Callable[[int], None] | None:
        """The encode progress callback for ``text`` (None for short contexts, contexts with images or
        when disabled)."""
        if self.bar is None or not isinstance(text, str) or len(text) < self.LONG:
            return None
        self.bar.reset(self.tokens, total=pipe.tokenize_context(text).shape[0], visible=True)
        return lambda n: self.bar.advance(self.tokens, n)

    def encoded(self) -> None:
        if self.bar is not None:
            self.bar.update(self.tokens, visible=False)


def pending(rows: list[Row], hashes: dict[str, str], done: set) -> dict[str, set[str]]:
    """The ids of the rows each method (by label) still has to answer."""
    return {label: {r.id for r in rows if (label, h, r.id) not in done} for label, h in hashes.items()}


def run_eval(rows: list[Row], *, methods: Iterable, out_dir: str | Path, model_name: str, model=None,
             tokenizer=None, processor=None, loader: Callable | None = None, scorer: Callable[[Row, str], float] | None = None,
             progress: bool = False, console=None, resume: bool = True, force_over_window: bool = False,
             use_chat_template: bool = True, meta: dict | None = None, plots: bool = True,
             explain: bool = False, batch: int = 1) -> dict:
    """Answer ``rows`` with every method and write the results to ``out_dir``; returns the metrics.

    ``methods``: names, ``"name:option=value"`` strings, ``(name, options)`` tuples or dicts. Give a loaded
    ``model`` + ``tokenizer``, or a ``loader()`` returning an object with ``.model`` and ``.tokenizer``
    (called only if some row is left to run). ``scorer(row, prediction)`` -> score in [0, 1].
    ``meta`` (suite, lengths, samples, seed, ...) goes into ``config.json``. ``explain``: each retrieval
    miss gets an explanation (``answer_group``), collected in ``explain.md``. ``batch``: questions on one
    context decoded together (``answer_group``)."""
    from ..pipeline import Pipeline

    specs = method_specs(methods)
    rows = list(rows)
    ids = [r.id for r in rows]
    if len(set(ids)) < len(ids):
        raise ValueError("two rows have the same id (same task, length, depth, sample, question and context)")
    out = prepare_out_dir(out_dir)
    scorer = scorer or default_scorer()
    pred_path = out / PREDICTIONS
    if not resume and pred_path.exists():
        pred_path.unlink()
    drop_torn_tail(pred_path)
    hashes = {s.label: s.config_hash(model_name, use_chat_template) for s in specs}
    done = {(r["method"], r.get("config_hash"), r["id"]) for r in read_predictions(pred_path)
            if finished(r, force_over_window)}
    todo = pending(rows, hashes, done)
    total = sum(map(len, todo.values()))
    config = {"model": model_name, "methods": [s.to_json(model_name, use_chat_template) for s in specs],
              **(meta or {}), "rows": len(rows), "force_over_window": force_over_window,
              "chat_template": use_chat_template, "versions": versions(), "machine": machine(model),
              "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    config = merged_config(out, config) if resume else config | {"runs": [run_entry(config)]}
    if not total:
        write_atomic(out / CONFIG, json.dumps(config, indent=1))
    else:
        if model is None:
            loaded = loader()
            model, tokenizer, processor = loaded.model, loaded.tokenizer, getattr(loaded, "processor", None)
        pipes = {s.label: Pipeline(model, tokenizer, model_name=model_name, method=s.name, processor=processor,
                                   use_chat_template=use_chat_template, **s.method_options) for s in specs}
        for entry in config["methods"]:     # the options every default resolved to, for the record
            if entry["label"] in pipes:
                now = resolved_options(pipes[entry["label"]].method)
                changed = resolution_changes(entry.get("resolved") or {}, now or {})
                if changed and any(d[:2] == (entry["label"], entry["config_hash"]) for d in done):
                    raise ValueError(f"{out} holds {entry['label']} rows answered with other options than it "
                                     f"resolves to now ({'; '.join(sorted(changed))}): add --fresh to answer "
                                     "them again, or use another --out")
                entry["resolved"] = now
        config["machine"] = config["runs"][-1]["machine"] = machine(model)
        write_atomic(out / CONFIG, json.dumps(config, indent=1, default=str))
        with open(pred_path, "a", encoding="utf-8") as sink, RowProgress(progress, total, console) as bar:
            for group in group_by_context(rows):
                for spec in specs:
                    group_todo = [r for r in group if r.id in todo[spec.label]]
                    if not group_todo:
                        continue
                    bar.describe(f"{spec.label} · {format_length(group_todo[0].length)}")
                    partial = out / "partial" / f"{hashes[spec.label]}-{group[0].context_key}.partial"
                    answers = answer_group(pipes[spec.label], group_todo, force_over_window, bar,
                                           group[0].question if spec.query_aware else None, explain, partial,
                                           batch)
                    for row, status, extra in answers:
                        if status == "ok":
                            extra["score"] = float(scorer(row, extra["prediction"]))
                            extra.update(details(row, extra["prediction"]))
                        record = record_for(row, spec, hashes[spec.label], status, **extra)
                        sink.write(json.dumps(record, ensure_ascii=False) + "\n")
                        sink.flush()
                        bar.row_done()
    return write_report(out, plots=plots)
