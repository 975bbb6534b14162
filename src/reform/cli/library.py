"""``reform library add|list|remove``: a library of documents in a store, each encoded once into its own
context (``reform.library``); ``reform ask --store S`` asks it."""

from __future__ import annotations

import json
from typing import Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .common import CliError, LoadArgs, OcrOpt, err, fail, limits_for, out, pipeline_from, with_load_options

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="A library of documents: each encoded once, asked together (`reform ask --store`).")
StoreOpt = typer.Option(..., "--store", help="the library's store: a folder or fsspec URL")
LibraryOpt = typer.Option("default", "--library", help="which library of the store (several share its "
                          "contexts: a document is encoded once)")


def open_library(store: str, name: str = "default", load: LoadArgs | None = None):
    """The library in ``store`` with the pipeline that built it: the model its catalog names unless
    ``--model`` says otherwise, the documents method unless ``--method`` names one."""
    from ..documents import DocumentError
    from ..library import Library
    from ..library.catalog import Catalog
    from ..store import ContextFileError, ContextStore
    load = load or LoadArgs()
    try:
        maker, _ = Catalog(ContextStore(store), name=name).read()
        if maker is not None and load.model is None:
            load = LoadArgs(**{**load.__dict__, "model": maker.get("model_source"), "dtype": load.dtype or maker.get("dtype")})
        return Library(pipeline_from(load.load(documents=True)), store, name=name)
    except (ContextFileError, DocumentError, ValueError) as e:
        raise CliError(str(e)) from None


@app.command()
@with_load_options
def add(sources: list[str] = typer.Argument(..., help="documents, folders (one document per file) or quoted globs"),
        store: str = StoreOpt, library: str = LibraryOpt,
        as_json: bool = typer.Option(False, "--json", help="print one JSON object"), ocr: str = OcrOpt,
        *, load: LoadArgs):
    """Add documents to the library in --store: each is encoded alone (a document already there with the same
    content is skipped); a file that fails is reported and the others are added."""
    from ..documents import DocumentError
    try:
        library = open_library(store, library, load)
        limits = limits_for(ocr)
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=err, disable=as_json or not err.is_terminal) as bar:
            task = bar.add_task("encoding", total=1)

            def progress(name: str, done: int, total: int) -> None:
                bar.update(task, description=name, completed=done, total=total)
            added = library.add(list(sources), limits=limits, progress=progress)
    except DocumentError as e:       # a path that is not there: refused before any document is added
        fail(CliError(str(e)))
    except CliError as e:
        fail(e)
    counts = {s: sum(a.status == s for a in added) for s in ("added", "replaced", "unchanged", "skipped", "failed")}
    if as_json:
        print(json.dumps({**counts, "documents": len(library.documents()), "results": [a.__dict__ for a in added]}))
    else:
        for a in added:
            if a.status == "failed":
                err.print(f"[red]failed[/] {a.name}: {a.error}", highlight=False)
        err.print(", ".join(f"{n} {s}" for s, n in counts.items() if n) + f" · {len(library.documents())} documents "
                  f"in {store}", highlight=False)
    if counts["failed"]:
        raise typer.Exit(1)


@app.command("list")
def list_documents(store: str = StoreOpt, library: str = LibraryOpt, as_json: bool = typer.Option(False, "--json")):
    """List the library's documents."""
    from ..library.catalog import Catalog
    from ..store import ContextFileError, ContextStore
    try:
        maker, docs = Catalog(ContextStore(store), name=library).read()
    except (ContextFileError, ValueError) as e:
        fail(CliError(str(e)))
    if as_json:
        print(json.dumps({"model": (maker or {}).get("model_name"), "method": (maker or {}).get("method"),
                          "documents": [d.__dict__ for d in sorted(docs.values(), key=lambda d: d.name)]}))
        return
    for d in sorted(docs.values(), key=lambda d: d.name):
        out.print(f"{d.name}\t{d.tokens} tokens\t{d.kind}" + (f"\t{d.pages} pages" if d.pages else ""),
                  markup=False, highlight=False)
    err.print(f"{len(docs)} documents" + (f" · {maker['model_name']} · {maker['method']}" if maker else ""))


@app.command()
def remove(names: list[str] = typer.Argument(..., help="document names, as `reform library list` shows them"),
           store: str = StoreOpt, library: str = LibraryOpt):
    """Remove documents from the library (their contexts go too)."""
    from ..library import Library
    from ..library.catalog import Catalog
    from ..store import ContextFileError, ContextStore
    try:
        docs = Catalog(ContextStore(store), name=library).remove(names, Library.known)
    except (ContextFileError, ValueError) as e:
        fail(CliError(str(e)))
    err.print(f"removed {len(names)} · {len(docs)} documents left")


def ask_library(store: str, name: str, question: str, documents: Optional[str], candidates: int, load: LoadArgs,
                **options):
    """``reform ask --store``: the library's answer (``Library.ask``)."""
    library = open_library(store, name, load)
    chosen = [n.strip() for n in documents.split(",") if n.strip()] if documents else None
    try:
        return library.pipe, library.ask(question, documents=chosen, candidates=candidates, **options)
    except ValueError as e:
        raise CliError(str(e)) from None
