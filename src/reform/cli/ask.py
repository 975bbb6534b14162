"""``reform ask`` and ``reform demo``: answer a question about a long file (or a saved context), or hide a
needle in a haystack past the model's window and ask for it."""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path
from typing import Optional

import typer

from ..pipeline import DTYPE_FLAGS
from .common import (CliError, DeviceOpt, DtypeOpt, HeadsOpt, LoadArgs, MethodOpt, ModelOpt, SeedOpt, StopOpt,
                     TemperatureOpt, TopPOpt, app, build_pipeline, check_sampling, err, fail, load_saved_context,
                     OcrOpt, limits_for, out, pipeline_from, read_inputs, run_question, takes_images,
                     with_load_options)


@app.command()
@with_load_options
def ask(files: Optional[list[Path]] = typer.Argument(None, help="the context: a document (PDF, scans, DOCX, XLSX, "
                                                     "CSV, PPTX, EPUB, HTML, Markdown, text, code), a folder, a quoted glob or "
                                                     "several files (images among them for a vision-language "
                                                     "model); - reads standard input", show_default=False),
        question: Optional[str] = typer.Option(None, "--question", "-q", help="the question to answer"),
        context: Optional[Path] = typer.Option(None, "--context", "-c", help="a context saved by `reform encode` "
                                               "(instead of FILE): answers without encoding again"),
        answer_prefix: str = typer.Option("", "--answer-prefix", help="text the answer starts with"),
        max_new_tokens: int = typer.Option(64, "--max-new-tokens", min=1),
        temperature: float = TemperatureOpt, top_p: float = TopPOpt, seed: Optional[int] = SeedOpt,
        stop: Optional[list[str]] = StopOpt,
        as_json: bool = typer.Option(False, "--json", help="print one JSON object with the answer, its evidence "
                                     "and stats"),
        evidence: int = typer.Option(0, "--evidence", min=0, help="print the N passages the answer was "
                                     "recomputed from, best first, with their document, page or line"),
        ocr: str = OcrOpt,
        store: Optional[str] = typer.Option(None, "--store", help="ask the library in this store (`reform library "
                                            "add`) instead of FILE"),
        library: str = typer.Option("default", "--library", help="with --store: which library of the store"),
        documents: Optional[str] = typer.Option(None, "--documents", help="with --store: only these documents "
                                                "(names, comma-separated)"),
        candidates: int = typer.Option(8, "--candidates", min=1, help="with --store: documents whose passages "
                                       "score best that go on to the token gather"),
        *, load: LoadArgs):
    """Answer QUESTION about FILE (or several files, images among them, a saved --context, or a library's
    --store), however long."""
    try:
        if question is None or not question.strip():
            raise CliError("a question is required: --question \"...\"")
        sampling = check_sampling(temperature, top_p, seed, stop)
        if (not files) + (context is None) + (store is None) != 2:
            raise CliError("give FILE..., --context FILE.reform or --store LIBRARY (exactly one)")
        if documents is not None and store is None:
            raise CliError("--documents chooses documents of a library: give --store")
        if store is not None:
            from .library import ask_library
            printer = None if as_json else (lambda s: (out.print(s, end="", markup=False), sys.stdout.flush()))
            pipe, answer = ask_library(store, library, question, documents, candidates, load, answer_prefix=answer_prefix,
                                       max_new_tokens=max_new_tokens, on_text=printer, **sampling)
            if printer is not None:
                out.print()
        elif context is not None:
            fixed = load.method_flags_given()
            if fixed:
                raise CliError(f"{', '.join(fixed)} cannot be combined with --context: a saved context keeps the "
                               "method and options it was encoded with")
            pipe, ctx = load_saved_context(context, load.model, load.dtype, load.device)
            answer = run_question(pipe, None, question, answer_prefix, max_new_tokens, as_json, ctx=ctx,
                                  sampling=sampling)
        else:
            limits = limits_for(ocr)
            content = read_inputs(files, limits)
            # documents get the documents gather; text with images keeps REFORM, whose gather reads images
            pipe = pipeline_from(load.load(documents=not isinstance(content, list)))
            if isinstance(content, list) and ocr != "never" and not takes_images(pipe):
                content = read_inputs(files, limits, images_as_documents=True)    # images of pages, read by OCR
            answer = run_question(pipe, content, question, answer_prefix, max_new_tokens, as_json, sampling=sampling)
            answer.stats.update(getattr(content, "timings", {}))       # extract_s; ocr_pages, ocr_s_per_page
    except CliError as e:
        fail(e)
    # where it ran: the default dtype depends on the hardware (bf16 on bf16 CPUs and GPUs, else fp32)
    ran_on = {"device": str(pipe.engine.device), "dtype": DTYPE_FLAGS[str(pipe.engine.dtype).removeprefix("torch.")]}
    if as_json:
        print(json.dumps({**answer.to_json(), **ran_on}))
    else:
        if evidence:
            print_evidence(answer, evidence)
        err.print(f"[dim]{answer.method} ({ran_on['dtype']} on {ran_on['device']}): {answer.input_tokens} input tokens · "
                  + " · ".join(f"{k} {v}" for k, v in answer.stats.items()) + "[/]")


def print_evidence(answer, n: int) -> None:
    """The top ``n`` passages under the answer: where each is, then its text (shortened in the middle)."""
    if not answer.evidence:
        err.print(f"[dim]no evidence: {answer.evidence_note}[/]")
        return
    out.print(f"\nEvidence ({min(n, len(answer.evidence))} of {len(answer.evidence)} passages):", markup=False)
    for i, p in enumerate(answer.evidence[:n], 1):
        text = " ".join(p.text.split())
        text = text if len(text) <= 400 else text[:250] + " ... " + text[-140:]
        score = "" if p.score is None else f" (score {p.score:.3f})"
        out.print(f"[{i}] {p.where()}{score}\n    {text}", markup=False, highlight=False)


@app.command()
def demo(length: Optional[int] = typer.Option(None, "--length", help="haystack tokens (default: 8x window)"),
         depth: float = typer.Option(0.5, "--depth", min=0.0, max=1.0, help="needle depth, 0..1"),
         seed: int = typer.Option(0, "--seed"),
         as_json: bool = typer.Option(False, "--json"),
         model: Optional[str] = ModelOpt, method: str = MethodOpt, heads: Optional[str] = HeadsOpt,
         device: Optional[str] = DeviceOpt, dtype: Optional[str] = DtypeOpt):
    """Hide a fact in a haystack 8x longer than the model's window and ask for it."""
    from ..data.haystack import haystack, insert_needle, magic_number_needle
    try:
        t0 = time.perf_counter()
        pipe = build_pipeline(model, method, heads, None, None, None, device, dtype)
        load_s = time.perf_counter() - t0
        window = pipe.engine.shape.window
        length = length or 8 * window
        rng = random.Random(seed)
        needle = magic_number_needle(rng)
        paras = haystack(length, lambda t: len(pipe.templater.encode(t)), rng=rng)
        text = insert_needle(paras, needle.sentence, depth)
        if not as_json:
            err.print(f"[bold]REFORM demo[/]: model {pipe.model_name} (window {window}), "
                      f"{pipe.tokenize_context(text).shape[0]} context tokens, needle at depth {depth:.0%}")
            err.print(f"[dim]needle:[/] {needle.sentence}\n[dim]question:[/] {needle.question}")
            out.print(needle.answer_prefix, end="")
        answer = run_question(pipe, text, needle.question, needle.answer_prefix, 32, as_json)
    except CliError as e:
        fail(e)
    correct = needle.answer in answer.text
    result = {**answer.to_json(), "expected": needle.answer, "correct": correct, "load_seconds": round(load_s, 2)}
    if as_json:
        print(json.dumps(result))
    else:
        err.print(("[green]correct[/]" if correct else "[red]wrong[/]") + f" (expected {needle.answer})")
        err.print("[dim]stats: " + " · ".join(f"{k} {v}" for k, v in answer.stats.items())
                  + f" · model load {load_s:.1f}s[/]")
    if not correct:
        raise typer.Exit(1)
