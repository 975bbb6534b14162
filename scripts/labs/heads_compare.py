"""Held-out MNR of several head presets on the same samples, one scoring pass for all of them (the sets
score as REFORM combines heads: the mean of per-head cosines), on each calibration data.

    python scripts/labs/heads_compare.py OUT.json PRESET.json [PRESET.json ...] [--model M] [--samples 6]
        [--seed 1] [--data real,synthetic] [--length N]

A preset may be ``shipped`` (the model's shipped preset). Writes one JSON object: per data, per preset,
its heads and MNR per task.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from reform.engine.extractors import HeadSpec
from reform.heads import find_preset, load_preset
from reform.heads.select import evaluate_sets
from reform.machine import cpu_name
from reform.pipeline import Pipeline


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("presets", nargs="+")
    ap.add_argument("--model", default=None)
    ap.add_argument("--samples", type=int, default=6)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--data", default="real,synthetic")
    ap.add_argument("--length", type=int, default=None, help="tokens per sample (default: window-512)")
    args = ap.parse_args()
    pipe = Pipeline.load(args.model)
    sets = {}
    for name in args.presets:
        preset = find_preset(pipe.model_name) if name == "shipped" else load_preset(name)
        sets[name] = [h if isinstance(h, HeadSpec) else HeadSpec.parse(h) for h in preset["heads"]]
    result = {"model": pipe.model_name, "cpu": cpu_name(), "samples_per_task": args.samples, "seed": args.seed,
              "length": args.length,
              "sets": {n: [str(h) for h in hs] for n, hs in sets.items()}, "mnr": {}, "seconds": {}}
    for data in args.data.split(","):
        t = time.perf_counter()
        result["mnr"][data] = evaluate_sets(pipe, sets, samples=args.samples, seed=args.seed, data=data,
                                              length=args.length)
        result["seconds"][data] = round(time.perf_counter() - t, 1)
        print(data, json.dumps(result["mnr"][data]), flush=True)
    args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
