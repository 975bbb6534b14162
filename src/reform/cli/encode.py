"""``reform encode``: one document to a file (``--out``), or a corpus into a store of saved contexts
(``--store``), in this process or on a Ray cluster (``--ray``; see ``reform.cluster``)."""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .common import (CliError, LoadArgs, OcrOpt, app, check_load_options, checked_output, encode_text, err, fail,
                     limits_for, on_interrupt, pipeline_from, read_document, say, with_load_options)


@app.command()
@with_load_options
def encode(source: str = typer.Argument(..., help="a document (PDF, scans, DOCX, XLSX, CSV, PPTX, HTML, EPUB, Markdown, text, code) "
                                        "or, with --out, a folder or quoted glob as one context; with --store a "
                                        "folder, glob ('docs/*.pdf') or fsspec URL, one context per document"),
           output: Optional[Path] = typer.Option(None, "--out", "-o", help="save the one document's context "
                                                 "here, e.g. book.reform"),
           store: Optional[str] = typer.Option(None, "--store", help="store every document's context in this "
                                               "folder or fsspec URL, named by content (re-runs skip stored ones)"),
           ray: bool = typer.Option(False, "--ray", help="one task per document on a Ray cluster"),
           address: Optional[str] = typer.Option(None, "--address", envvar="RAY_ADDRESS",
                                                 help="the Ray cluster (default: $RAY_ADDRESS, else a local one)"),
           workers: Optional[int] = typer.Option(None, "--workers", min=1, help="Ray actors, each loading the "
                                                 "model once (default: the cluster's CPUs / --threads-per-worker)"),
           threads_per_worker: int = typer.Option(1, "--threads-per-worker", min=1, help="CPUs per Ray actor"),
           checkpoint_minutes: Optional[float] = typer.Option(
               None, "--checkpoint-minutes", min=0, help="with --out: save the encode's state to OUT.partial this "
               "often (default 5; 0: after every chunk); the same command resumes from it (REFORM)"),
           as_json: bool = typer.Option(False, "--json", help="print one JSON object with the result"),
           ocr: str = OcrOpt,
           library: Optional[str] = typer.Option(None, "--library", help="with --store: add every document to "
                                                 "this library of the store (`reform ask --store S --library NAME`)"),
           *, load: LoadArgs):
    """Encode documents once and save their contexts; ask them later with `reform ask --context FILE`
    or through `reform serve --store`."""
    args, load = load, None
    try:
        if (output is None) == (store is None):
            raise CliError("give --out FILE (one document) or --store FOLDER_OR_URL (one or many documents)")
        if ray and store is None:
            raise CliError("--ray encodes into a store: give --store FOLDER_OR_URL")
        if checkpoint_minutes is not None and output is None:
            raise CliError("--checkpoint-minutes is for one document (--out FILE)")
        if library is not None and store is None:
            raise CliError("--library fills a library of a store: give --store FOLDER_OR_URL")
        limits = limits_for(ocr)
        load = args.load(documents=True)
        if checkpoint_minutes is not None:
            refuse_checkpoint(load["method"])
    except CliError as e:
        fail(e)
    if output is not None:
        encode_one(Path(source), output, load, as_json, checkpoint_minutes, limits)
    else:
        encode_corpus(source, store, {**load, "ocr": ocr}, ray, address, workers, threads_per_worker, as_json, library)


def encode_one(file: Path, output: Path, load: dict, as_json: bool, checkpoint_minutes: float | None,
               limits=None) -> None:
    from ..store import ContextFileError
    try:
        output = checked_output(output, "--out", folder=False)
        on_interrupt(f"nothing was written ({output} is as it was); run the command again to encode from the start")
        text = read_document(file, limits, quiet=as_json)
        pipe = pipeline_from(load)
        checkpoint = checkpoint_for(pipe, output, checkpoint_minutes)
        ctx = encode_text(pipe, text, as_json, checkpoint)
        t = time.perf_counter()
        size = ctx.save(output)
        save_s = time.perf_counter() - t
        if checkpoint is not None:       # only now: a failed save leaves the checkpoint to go on from
            checkpoint.discard()
    except ContextFileError as e:
        fail(CliError(str(e)))
    except CliError as e:
        fail(e)
    n = int(ctx.ids.shape[0])
    result = {"path": str(output), "method": pipe.method.name, "tokens": n, "encode_seconds": round(ctx.encode_seconds, 3),
              "save_seconds": round(save_s, 3), "bytes": size, "bytes_per_token": round(size / n, 1),
              **getattr(text, "timings", {})}
    if as_json:
        print(json.dumps(result))
    else:
        err.print(f"saved {output}: {n} tokens encoded in {ctx.encode_seconds:.1f} s ({pipe.method.name}), "
                  f"{size / 2**20:.1f} MiB on disk ({size / n:.0f} bytes per token)")


def refuse_checkpoint(method: str, segments: int = 1) -> None:
    """Refuse ``--checkpoint-minutes`` for a method that cannot resume its encode: by name before the
    model loads, and REFORM with several segments once its options are resolved."""
    from ..pipeline import method_class
    try:
        resumable = method_class(method).resumable and segments == 1
    except ValueError:
        return                             # an unknown method: its own error comes with the load
    if not resumable:
        raise CliError(f"--checkpoint-minutes: method '{method}' cannot resume an encode (REFORM with one "
                       "segment can)")


def checkpoint_for(pipe, output: Path, minutes: float | None):
    """``OUT.partial``, where a REFORM encode keeps its state every few minutes (``methods/checkpoint.py``)
    and from which the same command goes on; None for a method that cannot resume (refused if asked for)."""
    from ..methods.checkpoint import Checkpoint
    from ..store.format import read_manifest
    segments = getattr(pipe.method.config, "segments", 1)
    if not pipe.method.resumable or segments > 1:
        if minutes is not None:
            refuse_checkpoint(pipe.method.name, segments)
        return None
    partial = output.with_name(output.name + ".partial")

    def kept(done: int, total: int) -> None:
        on_interrupt(f"{done:,} of {total:,} tokens are encoded and kept in {partial} ({output} is as it was); "
                     "run the same command again to go on from there")
    if partial.exists():
        manifest = read_manifest(partial)
        done = (manifest.get("partial") or {}).get("tokens")
        if isinstance(done, int):
            say("[yellow]note:[/]", f"going on from {partial} ({done:,} tokens were encoded before)")
            kept(done, manifest.get("tokens", 0))
    return Checkpoint(partial, every_s=60 * (5.0 if minutes is None else minutes), on_saved=kept,
                      keep_when_done=True)


def encode_corpus(source: str, store: str, load: dict, ray: bool, address: str | None, workers: int | None,
                  threads_per_worker: int, as_json: bool, library: str | None = None) -> None:
    from ..cluster import encode as cluster
    from ..documents import DocumentError, find_documents
    from ..library.catalog import Catalog
    from ..store import ContextFileError, ContextStore
    shelf = None
    try:
        documents = find_documents(source)
        if library is not None:
            Catalog(ContextStore(store), name=library)      # a bad name is refused before any model loads
            if (load.get("segments") or 1) > 1:
                raise CliError("--library and a segment-parallel encode (segments > 1) do not go together yet")
            shelf = (library, source if "://" in source else str(Path(source).expanduser().absolute()))
        ContextStore(store)                        # refuse an unusable store before any model loads
        check_load_options(load)
        on_interrupt(f"contexts already written to {store} stay there; run the command again to encode the rest")
        if ray:
            connect_ray(address)
        with corpus_progress(len(documents), as_json) as (on_event, on_result):
            if ray:
                run = lambda: cluster.encode_on_ray(documents, store, load, workers=workers,
                                                    threads_per_worker=threads_per_worker, on_event=on_event,
                                                    on_result=on_result, library=shelf)
            else:
                run = lambda: cluster.encode_in_process(documents, store, load, on_event, on_result, library=shelf)
            results, seconds = cluster.timed(run)
        entered = cluster.enter_library(store, library, results) if library is not None else None
    except (DocumentError, ContextFileError, ValueError) as e:
        fail(CliError(str(e)))
    except CliError as e:
        fail(e)
    except Exception as e:
        if type(e).__module__.startswith("ray."):          # e.g. a worker whose model would not load
            fail(CliError(f"the Ray cluster failed: {str(e).strip().splitlines()[0] if str(e).strip() else e}"))
        raise
    summary = {"store": store, "ray": ray, **cluster.summary(results, seconds),
               **({"library": library, "entered": entered} if library is not None else {})}
    if as_json:
        print(json.dumps({**summary, "results": [r.to_json() for r in results]}))
    else:
        for r in results:
            if r.status == "failed":
                err.print(f"[bold red]failed:[/] {r.document}: {r.error}", highlight=False)
        err.print(f"{summary['encoded']} encoded, {summary['stored']} already stored, {summary['failed']} failed "
                  f"of {summary['documents']} documents ({summary['tokens_encoded']} tokens) in {seconds:.1f} s "
                  f"into {store}" + (f", {entered} entered into library {library}" if library else ""), highlight=False)
    if summary["failed"]:
        raise typer.Exit(1)


def connect_ray(address: str | None) -> None:
    """Join the cluster at ``address`` (or $RAY_ADDRESS), else start a local one for this run."""
    try:
        import ray
    except ImportError:
        raise CliError("--ray needs Ray: pip install 'reform-longcontext[ray]'") from None
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False,
                 ignore_reinit_error=True)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise CliError(f"cannot connect to the Ray cluster at {address or 'a new local cluster'}: "
                       f"{str(e).strip().splitlines()[0]}") from None


@contextmanager
def corpus_progress(total: int, quiet: bool):
    """One bar for documents and one for tokens, fed by every worker's events; yields the callbacks."""
    tokens_done: dict[str, int] = {}
    if quiet or not err.is_terminal:
        yield (lambda event: None), (lambda result: None)
        return
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True) as bar:
        docs = bar.add_task("documents", total=total)
        tokens = bar.add_task("tokens", total=0)

        def on_event(event):
            kind, document, n, _ = event
            if kind == "start":             # a retried document starts over
                bar.update(tokens, total=bar.tasks[tokens].total + n - (n if document in tokens_done else 0),
                           advance=-tokens_done.get(document, 0))
                tokens_done[document] = 0
            else:
                tokens_done[document] = tokens_done.get(document, 0) + n
                bar.advance(tokens, n)

        yield on_event, (lambda result: bar.advance(docs, 1))
