"""gpu_check's `segments` mode: REFORM's segment-parallel encode of one input on S single-thread worker
processes (what `reform encode --ray` does with actors), timed against the fewest workers."""

from __future__ import annotations

import os
import time
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from multiprocessing import get_context
from pathlib import Path

import torch

from gpu_measure import SHAPES, CannotRun, Results, build_model, byte_tokenizer, machine, markdown


_worker = None


def _start_worker(folder: str, dtype: str, segments: int, heads: dict) -> None:
    """A pool process: one thread, the model loaded once (what a Ray actor of `reform encode --ray` is)."""
    global _worker
    torch.set_num_threads(1)
    from reform.pipeline import Pipeline
    _worker = Pipeline.load(folder, device="cpu", dtype=dtype, segments=segments, use_chat_template=False, **heads)


def _encode_segment(ids: torch.Tensor, skip: int, last: bool):
    return _worker.method.encode_segment(_worker, ids, skip, keep_cache=last)


@contextmanager
def worker_pool(folder: Path, dtype: str, segments: int, heads: dict):
    ctx = get_context("spawn")
    with ProcessPoolExecutor(segments, mp_context=ctx, initializer=_start_worker,
                             initargs=(str(folder), dtype, segments, heads)) as pool:
        list(pool.map(_ready, range(segments)))       # every worker up (its model loaded) before timing
        yield pool


def _ready(_: int) -> bool:
    return _worker is not None


def segments(out: Path, shape_name: str, length: int, counts: list[int], budget_s: float) -> Results:
    """One ``length``-token input encoded by REFORM with S segments on S single-thread worker processes
    (S = 1: one worker), the most workers first; an S whose estimated time (the last S's scaled by the
    ratio of workers) no longer fits ``budget_s`` is skipped with a note, and speed-ups are over the
    fewest workers measured."""
    from reform.model import pick_dtype
    from reform.pipeline import DTYPE_FLAGS, Pipeline
    started = time.perf_counter()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if max(counts) > cores:
        raise CannotRun(f"{max(counts)} workers need {max(counts)} cores; this machine has {cores}")
    shape = SHAPES[shape_name]
    dtype = DTYPE_FLAGS[str(pick_dtype(torch.device("cpu"))).removeprefix("torch.")]    # the CPU's best
    res = Results(out, "segments", {"shape": shape_name, "length": length, "dtype": dtype,
                                    "machine": machine("cpu"), "workers": "processes, 1 thread each"})
    heads = {"heads": ",".join(shape.reform_heads)} if shape.reform_heads else {}
    folder = out / f"model-{shape_name}"
    if not (folder / "config.json").exists():
        build_model(shape, "cpu", torch.float32).save_pretrained(folder)
        byte_tokenizer().save_pretrained(folder)
    ids = torch.randint(3, 259, (length,), generator=torch.Generator().manual_seed(0))
    for s in sorted(counts, reverse=True):
        left = budget_s - (time.perf_counter() - started)
        if res.rows and (estimate := res.rows[-1]["wall_s"] * res.rows[-1]["segments"] / s * 1.1) > left:
            res.note(f"skipped S = {s}: about {estimate:.0f} s, {left:.0f} s left of the budget")
            continue
        t0 = time.perf_counter()
        with worker_pool(folder, dtype, s, heads) as pool:
            pool_start = time.perf_counter() - t0
            here = Pipeline.load(str(folder), device="cpu", dtype=dtype, segments=s, use_chat_template=False, **heads)
            here.segment_runner = lambda todo: list(pool.map(_encode_segment, *zip(*todo)))
            t = time.perf_counter()
            if s == 1:     # REFORM encodes S = 1 in the calling process: on the one worker instead
                pool.submit(_encode_segment, ids, 0, True).result()
            else:
                ctx = here.method.encode(here, ids)
                if ctx.state.data.shape[0] != length:
                    raise RuntimeError(f"the joined embeddings cover {ctx.state.data.shape[0]} of {length} tokens")
            wall = time.perf_counter() - t
        res.add({"segments": s, "workers": s, "tokens": length, "wall_s": round(wall, 2),
                 "pool_start_s": round(pool_start, 1), "tokens_per_s": round(length / wall)})
    base = max(res.rows, key=lambda r: -r["segments"])
    for r in res.rows:
        r["speedup"] = round(base["wall_s"] / r["wall_s"], 2)
    res.write(markdown(res.rows, [("segments S", "segments"), ("workers x 1 thread", "workers"),
                                  ("tokens", "tokens"), ("wall s", "wall_s"), ("tokens/s", "tokens_per_s"),
                                  (f"speed-up over S = {base['segments']}", "speedup"),
                                  ("pool start s", "pool_start_s")]))
    return res
