"""Corpus encoding in one process vs on a local Ray cluster, and one long document split into segments
(issue: Ray). Everything runs through the `reform` command line, as a user would run it:

    # documents per minute: `reform encode DIR --store` in one process vs `--ray` (a local cluster)
    python scripts/cluster_benchmark.py corpus --docs 8 --length 16384 --out docs/results/cluster-local
    # one document, REFORM's segment-parallel encode: S = 1 in one process, S > 1 over min(S, CPUs) actors
    python scripts/cluster_benchmark.py segments --length 131072 --segments 1,2,4,8 --out docs/results/cluster-local

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


def append(out: Path, row: dict) -> None:
    with open(out / "results.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")


def done(out: Path) -> set[str]:
    path = out / "results.jsonl"
    return {json.loads(line)["config"] for line in path.read_text().splitlines()} if path.exists() else set()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["corpus", "segments"])
    ap.add_argument("--docs", type=int, default=8)
    ap.add_argument("--length", type=int, default=16384)
    ap.add_argument("--segments", default="1,2,4,8")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    cpus = os.cpu_count() or 1
    machine = {"cpu": cpu_model(), "cpus": cpus}
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
            if s == 1:
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
