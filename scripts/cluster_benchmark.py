"""Corpus encoding in one process vs on a local Ray cluster, and one long document split into segments
(issue: Ray). Everything runs through the `reform` command line, as a user would run it:

    # documents per minute: `reform encode DIR --store` in one process vs `--ray` (a local cluster)
    python scripts/cluster_benchmark.py corpus --docs 8 --length 16384 --out docs/results/cluster-local
    # one document, REFORM's segment-parallel encode: S = 1 in one process, S > 1 over min(S, CPUs) actors
    python scripts/cluster_benchmark.py segments --length 131072 --segments 1,2,4,8 --out docs/results/cluster-local
    # the same, every S on the cluster with one thread per actor (S = 1: one actor): the gain of S workers
    # over one, with the threads per worker held fixed (what a machine with fewer cores than S x threads shows)
    python scripts/cluster_benchmark.py segments --one-thread --length 131072 --segments 1,2 --out docs/results/cluster-local
    # each segment's own encode time on one thread (--threads), in this process, one segment after another:
    # the wall time S such workers would need is the slowest segment's, plus start-up and the join
    python scripts/cluster_benchmark.py segment-times --length 131072 --segments 1,2,4,8 --out docs/results/cluster-local
    python scripts/cluster_benchmark.py segment-times --length 1048576 --segments 8 --threads 2 --out docs/results/cluster-local

Each run appends to ``OUT/results.jsonl`` (resumable: a finished configuration is skipped) and every
answer is checked against the needle; the machine is recorded with every row.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
from pathlib import Path

REFORM = str(Path(sys.executable).parent / "reform")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def write_documents(folder: Path, count: int, length: int, seed: int) -> list[dict]:
    """``count`` haystacks of ``length`` tokens with one magic-number needle each (at spread depths)."""
    from reform.data.haystack import haystack, insert_needle, magic_number_needle
    from reform.model import load_model
    tok = load_model().tokenizer
    folder.mkdir(parents=True, exist_ok=True)
    rng, docs = random.Random(seed), []
    for i in range(count):
        needle = magic_number_needle(rng)
        depth = (i + 0.5) / count
        path = folder / f"doc{i:03d}.txt"
        text = insert_needle(haystack(length, lambda t: len(tok(t, add_special_tokens=False)["input_ids"]), rng=rng),
                             needle.sentence, depth)       # drawn every time: the needles follow the same draws
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
        docs.append({"path": str(path), "question": needle.question, "answer": needle.answer,
                     "answer_prefix": needle.answer_prefix, "depth": depth})
    return docs


def encode(source: Path, store: Path, extra: list[str]) -> dict:
    out = subprocess.run([REFORM, "encode", str(source), "--store", str(store), "--json", *extra],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"reform encode failed: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout)


def answers(store: Path, results: list[dict], docs: list[dict]) -> list[bool]:
    """Ask every stored context its needle's question (one process, the stored files)."""
    from reform.pipeline import Pipeline
    from reform.store import ContextStore
    pipe, st, ok = Pipeline.load(), ContextStore(str(store)), []
    by_path = {str(Path(d["path"]).absolute()): d for d in docs}
    for r in results:
        d = by_path[r["document"]]
        with st.open_local(r["key"]) as file:
            ctx = pipe.load_context(file)
        text = ctx.ask(d["question"], answer_prefix=d["answer_prefix"], max_new_tokens=16).text
        ok.append(d["answer"] in text)
    return ok


def timed_segments(doc: dict, segments: int, threads: int) -> dict:
    """Encode ``doc`` with ``segments`` on ``threads`` threads, timing every segment on its own (through
    ``Pipeline.segment_runner``, the hook the Ray actors use), then ask its needle."""
    import time
    import torch
    from reform.pipeline import Pipeline
    torch.set_num_threads(threads)
    pipe, seconds = Pipeline.load(segments=segments), []

    def one_by_one(todo: list) -> list:
        parts = []
        for ids, skip, last in todo:
            t = time.perf_counter()
            parts.append(pipe.method.encode_segment(pipe, ids, skip, keep_cache=last))
            seconds.append(round(time.perf_counter() - t, 2))
        return parts

    pipe.segment_runner = one_by_one
    ctx = pipe.encode(Path(doc["path"]).read_text())
    seconds = seconds or [round(ctx.encode_seconds, 2)]          # S = 1 does not go through the runner
    text = ctx.ask(doc["question"], answer_prefix=doc["answer_prefix"], max_new_tokens=16).text
    return {"tokens": int(ctx.ids.shape[0]), "dtype": str(pipe.engine.dtype).removeprefix("torch."),
            "encode_seconds": round(ctx.encode_seconds, 2), "segment_seconds": seconds,
            "slowest_segment_seconds": max(seconds), "needles_answered": int(doc["answer"] in text)}


def append(out: Path, row: dict) -> None:
    with open(out / "results.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")


def done(out: Path) -> set[str]:
    path = out / "results.jsonl"
    return {json.loads(line)["config"] for line in path.read_text().splitlines()} if path.exists() else set()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["corpus", "segments", "segment-times"])
    ap.add_argument("--docs", type=int, default=8)
    ap.add_argument("--length", type=int, default=16384)
    ap.add_argument("--segments", default="1,2,4,8")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--threads", type=int, default=1, help="segment-times: torch threads")
    ap.add_argument("--one-thread", action="store_true",
                    help="segments: every S on Ray with min(S, CPUs) actors x 1 thread, S = 1 included")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    cpus = os.cpu_count() or 1
    machine = {"cpu": cpu_model(), "cpus": cpus}
    if args.mode == "segment-times":
        doc = write_documents(args.out / f"long-{args.length}", 1, args.length, seed=1)[0]
        finished = done(args.out)
        for s in (int(x) for x in args.segments.split(",")):
            threads = "one thread" if args.threads == 1 else f"{args.threads} threads"
            config = f"segment-times 1x{args.length}: segments={s}, {threads}"
            if config not in finished:
                row = {"config": config, **machine, **timed_segments(doc, s, args.threads)}
                append(args.out, row)
                print(json.dumps(row))
        return
    if args.mode == "corpus":
        docs = write_documents(args.out / f"corpus-{args.docs}x{args.length}", args.docs, args.length, seed=0)
        runs = {"one process": [], f"ray, {cpus} workers x 1 thread": ["--ray", "--workers", str(cpus)]}
        source = Path(docs[0]["path"]).parent
    else:
        docs = write_documents(args.out / f"long-{args.length}", 1, args.length, seed=1)
        runs = {}
        for s in (int(x) for x in args.segments.split(",")):
            # S = 1 is the sequential encode in one process; the accuracy of S > 1 does not depend on where
            # the segments run (tests/test_segments.py), so only their wall time on the cluster is measured
            extra = ["--option", f"segments={s}"]
            if args.one_thread:
                workers = min(s, cpus)
                runs[f"segments={s}, ray, {workers} workers x 1 thread"] = extra + [
                    "--ray", "--workers", str(workers), "--threads-per-worker", "1"]
            elif s == 1:
                runs["segments=1, one process"] = extra
            else:
                runs[f"segments={s}, ray, {min(s, cpus)} workers"] = extra + ["--ray", "--workers", str(min(s, cpus))]
        source = Path(docs[0]["path"])
    finished = done(args.out)
    for name, extra in runs.items():
        config = f"{args.mode} {len(docs)}x{args.length}: {name}"
        if config in finished:
            continue
        store = args.out / "stores" / config.replace(" ", "_").replace(",", "").replace(":", "").replace("=", "")
        saved = args.out / f"{store.name}.json"       # the encode's own report, kept if answering fails
        if saved.exists():
            result = json.loads(saved.read_text())
        else:
            result = encode(source, store, extra)
            saved.write_text(json.dumps(result))
        ok = answers(store, [r for r in result["results"] if r["status"] == "encoded"], docs)
        row = {"config": config, **machine, "documents": result["documents"], "encoded": result["encoded"],
               "tokens": result["tokens_encoded"], "seconds": result["seconds"],
               "documents_per_minute": result["documents_per_minute"],
               "tokens_per_second": round(result["tokens_encoded"] / result["seconds"], 1),
               "needles_answered": sum(ok), "command": f"reform encode {source} --store STORE " + " ".join(extra)}
        append(args.out, row)
        print(json.dumps(row))


if __name__ == "__main__":
    main()
