"""What every ``reform`` command shares (docs/architecture.md, "cli"): the consoles and one-line errors, the
command group, the model-loading options declared once (``with_load_options``), building a pipeline from
them, encoding with a progress bar and answering. Command modules import this; ``main`` registers them."""

from __future__ import annotations

import functools
import inspect
import os
import sys
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import typer
import typer.core
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from ..methods import REGISTRY

err = Console(stderr=True, soft_wrap=True, emoji=False)
out = Console(highlight=False, soft_wrap=True, emoji=False)
_interrupt_note = ["nothing was written"]


def plain_line(text) -> str:
    """``text`` as one printable line: control characters (newlines, tabs, U+001E ...) shown escaped,
    so a message that quotes user input cannot break the one-line promise or fake a second line."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


def say(label: str, message) -> None:
    """One line on stderr: a styled ``label`` then ``message`` as plain text (any rich markup in it, e.g.
    quoted user input, is printed as written)."""
    from rich.markup import escape
    err.print(f"{label} {escape(plain_line(message))}", highlight=False)


def on_interrupt(note: str) -> None:
    """What the Ctrl-C line tells the user about the work done so far (e.g. how to resume)."""
    _interrupt_note[0] = note


class ReformGroup(typer.core.TyperGroup):
    """The ``reform`` command group, with every failure on one line: usage errors (a bad flag or value)
    as ``error: ...`` with exit status 2, like the commands' own refusals, and Ctrl-C as one line that
    says what was kept, with exit status 130."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except typer.Abort:                  # end of input at a prompt
            code = 130
        except Exception as e:               # click's exceptions (typer vendors its own click): by shape
            if not (hasattr(e, "format_message") and hasattr(e, "exit_code")):
                raise
            if type(e).__name__ == "NoArgsIsHelpError":
                e.show()
            else:
                ctx = getattr(e, "ctx", None)
                hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
                say("[bold red]error:[/]", f"{e.format_message()}{hint}")
            sys.exit(e.exit_code)
        if code == 130:                      # typer turns KeyboardInterrupt into exit status 130
            say("[bold red]interrupted[/] (Ctrl-C):", _interrupt_note[0])
        sys.exit(code if isinstance(code, int) else 0)


app = typer.Typer(cls=ReformGroup, add_completion=False, no_args_is_help=True,
                  help="REFORM: answer questions about inputs far longer than the model's window.")

class CliError(Exception):
    """A user-facing error: printed as one line, exit status 2."""


def limits_for(ocr: str):
    """The extraction limits of a command, with its ``--ocr`` policy (refused in one line when unknown)."""
    from ..documents import Limits
    try:
        return Limits(ocr=ocr)
    except ValueError:
        raise CliError(f"--ocr must be never, auto or always, not {ocr!r}") from None


@contextmanager
def ocr_progress(quiet: bool = False):
    """A progress bar over the pages OCR reads, where someone watches."""
    from ..documents.ocr import progress
    if quiet or not err.is_terminal:
        yield
        return
    with Progress(TextColumn("OCR"), BarColumn(), MofNCompleteColumn(), TextColumn("pages"), TimeRemainingColumn(),
                  console=err, transient=True) as bar:
        task = bar.add_task("ocr", total=None)
        with progress(lambda done, total: bar.update(task, completed=done, total=total)):
            yield


def read_stdin() -> bytes:
    """Standard input's bytes; a one-line error where there is none to read (closed, as with ``0<&-``)."""
    try:
        return sys.stdin.buffer.read()
    except (AttributeError, OSError, ValueError):      # sys.stdin is None, or its descriptor is closed
        raise CliError("standard input is closed: pipe a document into '-' or name a file") from None


def read_document(path: Path, limits=None, quiet: bool = False):
    """One document (PDF, scans, DOCX, XLSX, CSV, PPTX, HTML, EPUB, Markdown, text, code), a folder of them
    or a quoted glob ('docs/*.pdf') as one ``Extracted``; ``-`` reads standard input. Files of a folder that
    reform does not read are named in one note line."""
    from ..documents import DocumentError, Limits, extract, extract_bytes
    limits = limits or Limits()
    try:
        with ocr_progress(quiet):
            if str(path) == "-":
                doc = extract_bytes(read_stdin(), "standard input", limits)
            elif not path.exists() and not any(c in str(path) for c in "*?["):
                raise CliError(f"file not found: {path}")
            elif path.exists() and not path.is_file() and not path.is_dir():
                # a pipe (mkfifo, <(...)) or a device: read as a stream, as "-" is
                with open(path, "rb") as stream:
                    doc = extract_bytes(stream.read(), path.name, limits)
            else:
                doc = extract(path, limits=limits)
    except DocumentError as e:
        raise CliError(str(e)) from None
    if doc.skipped:
        shown = ", ".join(name for name, _ in doc.skipped[:5]) + (" ..." if len(doc.skipped) > 5 else "")
        say("[yellow]note:[/]", f"left out {len(doc.skipped)} file(s) reform does not read: {shown}")
    return doc


@contextmanager
def encode_progress(total: int, quiet: bool):
    """A progress bar over encoded tokens (only for contexts worth watching)."""
    if quiet or total < 4096 or not err.is_terminal:   # a bar only where someone watches
        yield None
        return
    with Progress(TextColumn("encoding"), BarColumn(), MofNCompleteColumn(), TextColumn("tokens"),
                  TimeRemainingColumn(), console=err, transient=True) as bar:
        task = bar.add_task("encode", total=total)
        yield lambda n: bar.advance(task, n)


# Shared options --------------------------------------------------------------------------------
ModelOpt = typer.Option(None, "--model", "-m", help="HF model id, local directory, .gguf file or a packaged "
                        "model: smollm2 (the default, SmolLM2-135M-Instruct) or gemma-3-270m")
METHODS = ", ".join(sorted(REGISTRY, key=lambda name: name != "reform"))     # every registered method, reform first
MethodOpt = typer.Option("reform", "--method", help=f"long-context method: {METHODS} (docs/methods.md)")
DocumentMethodOpt = typer.Option(None, "--method", help=f"long-context method: {METHODS} (docs/methods.md); "
                                 "default: reform, and for the documents of `ask FILE` and `encode`, reform+rag "
                                 "with --option retriever=dense+bm25 --option pool_passages=true",
                                 show_default=False)
HeadsOpt = typer.Option(None, "--heads", help="embedding heads 'LAYER:KIND:HEAD,...' or a preset JSON "
                        "(default: the model's preset)")
ChunkOpt = typer.Option(None, "--chunk-size", help="tokens per encoded chunk (default: window/4; reform and "
                        "the recurrent methods)")
CacheOpt = typer.Option(None, "--cache-budget", help="compressed KV cache size (default: window/4; reform and "
                        "the recurrent methods)")
RecomputeOpt = typer.Option(None, "--recompute-budget", help="context tokens gathered and recomputed (default: "
                            "window/2 or the model preset's; reform, truncate, rag-*, reform+rag)")
DeviceOpt = typer.Option(None, "--device", help="cpu, cuda, cuda:1 ... (default: cuda if available)")
DtypeOpt = typer.Option(None, "--dtype", help="bf16, fp16 or fp32 (default: bf16 where the hardware has it)")
OptionOpt = typer.Option(None, "--option", help="KEY=VALUE: any other option of the method (a field of its "
                         "config), e.g. ilre's dca=true; repeatable")
ChatTemplateOpt = typer.Option(True, "--chat-template/--no-chat-template", help="--no-chat-template: ask in plain "
                               "text (Question: ... Answer:), as a model without a chat template is asked")
OcrOpt = typer.Option("auto", "--ocr", help="read pages by OCR: never, auto (PDF pages without a text layer, "
                      "and image files a text-only model cannot see) or always (every page)")
ProfileOpt = typer.Option(None, "--profile", help="reform's encode profile: default, or fast (chunk and cache "
                          "of window/8: a 1.3-1.4x faster encode, measured in docs/benchmarks.md); --chunk-size and "
                          "--cache-budget still win")



@dataclass(frozen=True)
class LoadArgs:
    """The model-loading options of every command that runs a method (``ask``, ``encode``, ``serve``),
    declared once: ``with_load_options`` adds them to a command and hands them over as one value."""

    model: Optional[str] = None
    method: Optional[str] = None        # None: the command's default (reform; DOCUMENTS_METHOD for documents)
    heads: Optional[str] = None
    chunk_size: Optional[int] = None
    cache_budget: Optional[int] = None
    recompute_budget: Optional[int] = None
    device: Optional[str] = None
    dtype: Optional[str] = None
    option: Optional[list[str]] = None
    profile: Optional[str] = None
    chat_template: bool = True

    def load(self, documents: bool | None = False) -> dict:
        """``Pipeline.load`` keyword arguments (``load_options``); a bad ``--option`` is a ``CliError``.
        With no ``--method``: ``documents`` True, the context is read from files and gets ``DOCUMENTS_METHOD``
        (its options under any ``--option`` given); False, REFORM; None (a server, which takes both), the
        pipeline's own policy: REFORM for text, ``DOCUMENTS_METHOD`` for documents."""
        from ..methods import DOCUMENTS_METHOD
        method, options = self.method or "reform", parse_options(self.option, self.profile)
        if self.method is None and documents is None:
            method = None
        elif self.method is None and documents:
            method, options = DOCUMENTS_METHOD[0], {**DOCUMENTS_METHOD[1], **options}
        return load_options(self.model, method, self.heads, self.chunk_size, self.cache_budget,
                            self.recompute_budget, self.device, self.dtype, self.chat_template, options)

    def method_flags_given(self) -> list[str]:
        """The flags given that choose the method or its options (a saved context fixes those)."""
        given = {"--method": self.method is not None, "--heads": self.heads, "--chunk-size": self.chunk_size,
                 "--cache-budget": self.cache_budget, "--recompute-budget": self.recompute_budget,
                 "--option": self.option, "--profile": self.profile, "--no-chat-template": not self.chat_template}
        return [flag for flag, value in given.items() if value]


_LOAD_OPTIONS = {"model": (Optional[str], ModelOpt), "method": (Optional[str], DocumentMethodOpt), "heads": (Optional[str], HeadsOpt),
                 "chunk_size": (Optional[int], ChunkOpt), "cache_budget": (Optional[int], CacheOpt),
                 "recompute_budget": (Optional[int], RecomputeOpt), "device": (Optional[str], DeviceOpt),
                 "dtype": (Optional[str], DtypeOpt), "option": (Optional[list[str]], OptionOpt),
                 "profile": (Optional[str], ProfileOpt), "chat_template": (bool, ChatTemplateOpt)}
assert set(_LOAD_OPTIONS) == set(LoadArgs.__dataclass_fields__)


def with_load_options(command):
    """Give ``command`` (which takes ``load: LoadArgs``) the shared model-loading options as flags."""
    signature = inspect.signature(command, eval_str=True)
    own = [p for p in signature.parameters.values() if p.name != "load"]
    shared = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)
              for name, (annotation, default) in _LOAD_OPTIONS.items()]

    @functools.wraps(command)
    def run(*args, **kwargs):
        load = LoadArgs(**{name: kwargs.pop(name) for name in _LOAD_OPTIONS})
        return command(*args, load=load, **kwargs)

    run.__signature__ = signature.replace(parameters=own + shared)
    return run


_FLAGS = {"chunk_size": "--chunk-size", "cache_budget": "--cache-budget", "recompute_budget": "--recompute-budget",
          "heads": "--heads", "profile": "--profile"}


def option_error(e) -> CliError:
    """An ``OptionError`` in terms of this command's flags."""
    bad = ", ".join(_FLAGS.get(k, k) for k in e.unknown)
    takes = [_FLAGS[k] for k in _FLAGS if k in e.accepted] + \
        [f"--option {k}=..." for k in e.accepted if k not in _FLAGS]
    if not any(k in e.accepted for k in ("chunk_size", "cache_budget", "recompute_budget")):
        return CliError(f"method '{e.method}' takes no chunk or budget options ({bad} given)")
    return CliError(f"method '{e.method}' takes no {bad} option; it takes {', '.join(takes)}")


def parse_options(items: list[str] | None, profile: str | None = None) -> dict:
    """``--option KEY=VALUE`` (repeatable): any field of the method's config, e.g. ``dca=true``; and
    ``--profile`` (the config's ``profile`` field), which methods without profiles refuse."""
    from ..eval.specs import option_value
    options = {} if profile is None else {"profile": profile}
    for item in items or ():
        key, eq, value = item.partition("=")
        if not eq or not key.strip() or not value.strip():
            raise CliError(f"bad --option '{item}': use KEY=VALUE, e.g. --option retrieval_layer=14")
        options[key.strip()] = option_value(value.strip())
    return options


def build_pipeline(model, method, heads, chunk_size, cache_budget, recompute_budget, device, dtype,
                   chat_template=True, extra: dict | None = None):
    """Load the model and build ``method``; options left as None take the method's defaults, and a
    method refuses options it does not take (before the model is loaded). ``extra``: further options
    (fields of the method's config) from ``--option``."""
    return pipeline_from(load_options(model, method, heads, chunk_size, cache_budget, recompute_budget, device,
                                      dtype, chat_template, extra))


def pipeline_from(load: dict):
    """The pipeline ``load`` (``load_options``) describes, refusals as one-line ``CliError``s."""
    from ..model import ModelLoadError
    from ..pipeline import Pipeline
    from ..engine.shape import UnsupportedModelError
    from ..methods.options import OptionError
    load = dict(load)
    try:
        with notes_as_lines():      # Pipeline.load refuses bad options, device, dtype or path before loading
            return Pipeline.load(load.pop("model"), **load)
    except OptionError as e:
        raise option_error(e) from None
    except (ModelLoadError, UnsupportedModelError, ValueError) as e:
        raise CliError(str(e)) from None


def load_options(model, method, heads, chunk_size, cache_budget, recompute_budget, device, dtype,
                 chat_template=True, extra: dict | None = None) -> dict:
    """``Pipeline.load`` keyword arguments (``model`` among them) from the shared command-line options:
    plain values, so a cluster worker can load the same pipeline."""
    return {"model": model, "device": device, "dtype": dtype, "method": method, "use_chat_template": chat_template,
            "heads": heads, "chunk_size": chunk_size, "cache_budget": cache_budget,
            "recompute_budget": recompute_budget, **(extra or {})}


def check_load_options(load: dict) -> None:
    """Refuse what ``load`` would refuse, without loading the model (before work goes to a cluster)."""
    from ..methods.options import OptionError
    from ..model import ModelLoadError
    from ..pipeline import check_load
    options = {k: v for k, v in load.items() if k not in ("model", "use_chat_template", "ocr")}
    try:
        check_load(load.get("model"), **options)
    except OptionError as e:
        raise option_error(e) from None
    except (ModelLoadError, ValueError, TypeError) as e:
        raise CliError(str(e)) from None


@contextmanager
def notes_as_lines():
    """Our warnings (guessed embedding heads, a context past the window) as one ``note:`` line each on
    stderr when they happen, each text once, not as Python's two-line warnings; other libraries' warnings
    are not shown."""
    shown: set[str] = set()

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        if "/reform/" in str(filename).replace("\\", "/") and str(message) not in shown:
            shown.add(str(message))
            say("[yellow]note:[/]", message)

    with warnings.catch_warnings():
        warnings.simplefilter("always", UserWarning)
        warnings.showwarning = show          # restored on exit by catch_warnings
        yield


def encode_text(pipe, content, quiet: bool, checkpoint=None):
    """Encode ``content`` (text, or text and image parts: ``read_inputs``) with a progress bar over its
    tokens (refusals become one-line errors); ``checkpoint`` as ``Pipeline.encode``'s."""
    try:
        ids, rows, source = pipe.tokenize(content)
        with encode_progress(ids.shape[0], quiet) as progress, notes_as_lines():
            return pipe.encode_tokens(ids, rows, progress, checkpoint=checkpoint, source=source)
    except ValueError as e:
        raise CliError(str(e)) from None


def read_inputs(paths: list[Path], limits=None, images_as_documents: bool = False):
    """The context of ``reform ask FILE...``: one document, folder or glob (``read_document``); several
    documents as one context, each under a header naming it; with image files among them (by suffix: .png,
    .jpg, ...), the parts in order, images as images for a vision-language model and documents as text
    (``images_as_documents``: images of pages read by OCR, for a model that cannot see them)."""
    from ..documents import IMAGE_SUFFIXES, DocumentError, Limits
    limits = limits or Limits()
    images = [p for p in paths if p.suffix.lower() in IMAGE_SUFFIXES]
    if len(paths) == 1 and (not images or images_as_documents):
        return read_document(paths[0], limits)
    if not images or images_as_documents:
        from ..documents.folder import combine
        missing = [p for p in paths if not p.is_file()]
        if missing:
            raise CliError(f"file not found: {missing[0]}")
        try:
            with ocr_progress():
                return combine([str(p.absolute()) for p in paths],
                               os.path.commonpath([str(p.absolute()) for p in paths]), limits, images=True)
        except DocumentError as e:
            raise CliError(str(e)) from None
    parts = []
    for path in paths:
        if path in images:
            if not path.is_file():
                raise CliError(f"image not found: {path}")
            parts.append(path)
        else:
            parts.append(read_document(path, limits).text)
    return parts


def takes_images(pipe) -> bool:
    from ..pipeline.inputs import check_takes_images
    try:
        check_takes_images(pipe)
    except ValueError:
        return False
    return True


def run_question(pipe, text: str | None, question: str, answer_prefix: str, max_new_tokens: int, as_json: bool,
                 stream: bool = True, ctx=None, sampling: dict | None = None):
    """Answer ``question`` about ``text`` (encoded here) or about the already encoded ``ctx``."""
    try:       # a question that cannot be asked is refused before the encode, not after
        pipe.templater.question(question, answer_prefix)
    except ValueError as e:
        raise CliError(str(e)) from None
    ctx = ctx if ctx is not None else encode_text(pipe, text, as_json)
    printer = None
    if stream and not as_json:
        printer = lambda s: (out.print(s, end="", markup=False), sys.stdout.flush())
    try:
        answer = ctx.ask(question, answer_prefix=answer_prefix, max_new_tokens=max_new_tokens, on_text=printer,
                         **(sampling or {}))
    except ValueError as e:
        raise CliError(str(e)) from None
    if printer is not None:
        out.print()
    return answer


def load_saved_context(path: Path, model, dtype, device):
    """The pipeline and context of a file written by ``reform encode``: the model it names (unless
    ``--model`` says otherwise), in the dtype it was encoded in; method options are the file's."""
    from ..pipeline import DTYPE_FLAGS
    from ..store import ContextFileError, read_manifest
    try:
        manifest = read_manifest(path)
        saved = manifest.get("model") or {}
        dtype = dtype or DTYPE_FLAGS.get(saved.get("dtype"))
        pipe = build_pipeline(model or saved.get("source"), "full", None, None, None, None, device, dtype,
                              chat_template=True)
        return pipe, pipe.load_context(path)
    except ContextFileError as e:
        raise CliError(str(e)) from None


def checked_output(path: Path, flag: str, folder: bool) -> Path:
    """``path`` if a result can be written there (a file, or a folder of results), refused before any
    work otherwise."""
    from ..outputs import OutputError, check_output_dir, check_output_file
    try:
        return check_output_dir(path, flag) if folder else check_output_file(path, flag)
    except OutputError as e:
        raise CliError(str(e)) from None


def fail(e: CliError):
    say("[bold red]error:[/]", e)
    raise typer.Exit(2)


TemperatureOpt = typer.Option(0.0, "--temperature", help="0 = greedy (default); up to 2 samples more freely")
TopPOpt = typer.Option(1.0, "--top-p", help="nucleus sampling: keep the most likely tokens up to this mass")
SeedOpt = typer.Option(None, "--seed", help="random seed of a sampled answer (repeatable answers)")
StopOpt = typer.Option(None, "--stop", help="end the answer before this string (repeatable, up to 4)")


def check_sampling(temperature, top_p, seed, stop) -> dict:
    """The sampling options as ``Context.ask`` takes them, validated before any model is loaded."""
    from ..engine.sampling import Sampling
    try:
        Sampling(temperature, top_p, seed, tuple(stop or ()))
    except ValueError as e:
        raise CliError(str(e)) from None
    return {"temperature": temperature, "top_p": top_p, "seed": seed, "stop": tuple(stop or ())}
