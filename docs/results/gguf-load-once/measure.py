"""First (converting) loads and cache-off loads of the packaged models, with and without
``model.gguf_parsed_once``, in one process; the converted weights compared tensor by tensor.

    python docs/results/gguf-load-once/measure.py        # the venv active; converts into /tmp/gguf-once-*
"""
import contextlib
import os
import shutil
import time
import warnings
from pathlib import Path

import torch
from safetensors.torch import load_file

import reform.model as model
from reform.pipeline import Pipeline

warnings.simplefilter("ignore")
parsed_once = model.gguf_parsed_once
for name in ("gemma-3-270m", None):
    weights = {}
    for once in (False, True):
        root = Path(f"/tmp/gguf-once-{once}")
        shutil.rmtree(root, ignore_errors=True)
        model.gguf_parsed_once = parsed_once if once else contextlib.nullcontext
        os.environ["REFORM_CACHE_DIR"] = str(root)
        start = time.time()
        Pipeline.load(name)
        converting = time.time() - start
        weights[once] = load_file(next(root.glob("gguf/*/model.safetensors")))
        os.environ["REFORM_CACHE_DIR"] = "off"
        start = time.time()
        Pipeline.load(name)
        direct = time.time() - start
        print(f"{name or 'smollm2'}, parsed once: {once}: converting load {converting:.1f} s, "
              f"cache off {direct:.1f} s", flush=True)
    same = weights[False].keys() == weights[True].keys() and all(torch.equal(weights[False][k], weights[True][k])
                                                                   for k in weights[False])
    print(f"{name or 'smollm2'}: converted weights the same tensors: {same}", flush=True)
model.gguf_parsed_once = parsed_once
