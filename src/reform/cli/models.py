"""``reform models``: which model types the engine runs exactly as transformers does, and which it refuses."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .common import CliError, app, checked_output, err, fail, out


@app.command()
def models(all_types: bool = typer.Option(False, "--all", help="also every other causal-LM model type transformers "
                                          "ships, with its default config (tiny sizes)"),
           out_file: Optional[Path] = typer.Option(None, "--out", "-o", help="also write the table (markdown) here"),
           device: str = typer.Option("cpu", help="where both run: cpu, cuda, cuda:1 ... (fp32, TF32 off)")):
    """Check every model type / variant against transformers (tiny random weights, offline): one-shot and
    chunked prefill logits and greedy tokens, or the engine's refusal; then the vision-language models on
    an input with two images. Prints markdown tables."""
    from ..conformance import VARIANTS, VISION_VARIANTS, all_variants, check, check_images, summary, table
    from ..model import ModelLoadError, pick_device
    from ..outputs import write_atomic

    if out_file is not None:
        try:
            out_file = checked_output(out_file, "--out", folder=False)
        except CliError as e:
            fail(e)
    try:
        device = str(pick_device(device))
    except ModelLoadError as e:
        fail(CliError(str(e)))
    variants = all_variants() if all_types else VARIANTS
    results = []
    with err.status("") as status:
        for name, (model_type, overrides) in variants.items():
            status.update(f"checking {name} ({len(results) + 1}/{len(variants)})")
            results.append(check(name, model_type, overrides, device=device))
        images = []
        for name, variant in VISION_VARIANTS.items():
            status.update(f"checking {name} with two images ({len(images) + 1}/{len(VISION_VARIANTS)})")
            images.append(check_images(name, variant, device=device))
    text = (summary(results, device) + "\n\n" + table(results) + "\n\nWith images (two images in the text; "
            + summary(images, device).split("; ", 1)[1] + "):\n\n" + table(images))
    results += images
    out.print(text, markup=False)
    if out_file is not None:
        write_atomic(out_file, text + "\n")
    if any(r.status == "different" for r in results):
        raise typer.Exit(1)
