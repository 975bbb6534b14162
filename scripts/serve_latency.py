"""How long a question waits while `reform serve` encodes a long upload (the server answers questions on
stored contexts between two chunks of an encode).

    python scripts/serve_latency.py --short 8192 --long 65536 --questions 3 --out docs/results/serve-latency

Starts the real server (`reform serve`, default model) on a free loopback port, uploads a short document
and waits until it is stored, uploads a long one, and while that encodes asks the short one's question
``--questions`` times with the official `openai` client. Each latency is set beside what the question
would have waited in a first-in-first-out queue: the rest of the encode when it was asked, less the
latencies of this and the later questions (a lower bound: the encode stood paused only while they were
answered, not while each waited for its chunk to end).
The same question is then asked with the server idle, and the long document's own question is checked.
Writes ``OUT/result.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import openai

from cluster_benchmark import REFORM, cpu_model, write_documents


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(http: httpx.Client, key: str) -> dict:
    while (status := http.get(f"/v1/contexts/{key}").json())["status"] != "ready":
        if status["status"] == "failed":
            raise SystemExit(f"encode failed: {status.get('error')}")
        time.sleep(0.2)
    return status


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--short", type=int, default=8192)
    ap.add_argument("--long", type=int, default=65536)
    ap.add_argument("--questions", type=int, default=3)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    short, = write_documents(args.out / f"short-{args.short}", 1, args.short, seed=2)
    long_, = write_documents(args.out / f"long-{args.long}", 1, args.long, seed=3)
    port, store = free_port(), tempfile.TemporaryDirectory()     # a fresh store: both uploads are encoded
    server = subprocess.Popen([REFORM, "serve", "--port", str(port), "--store", store.name],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=url, timeout=900) as http:
            while True:
                if server.poll() is not None:
                    raise SystemExit(f"reform serve exited: {server.stderr.read()[-500:]}")
                try:
                    if http.get("/health").status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.5)
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=900)

            def ask(key: str, doc: dict) -> tuple[float, bool]:
                t = time.perf_counter()
                r = client.chat.completions.create(model="reform", max_tokens=32, extra_body={"context_id": key},
                                                   messages=[{"role": "user", "content": doc["question"]}])
                return time.perf_counter() - t, doc["answer"] in r.choices[0].message.content

            upload = lambda doc: http.post("/v1/contexts", content=Path(doc["path"]).read_bytes(),
                                           headers={"content-type": "text/plain"}).json()["id"]
            short_key = upload(short)
            wait_ready(http, short_key)
            long_key = upload(long_)
            while http.get(f"/v1/contexts/{long_key}").json()["tokens_encoded"] == 0:
                time.sleep(0.1)
            during = []
            for _ in range(args.questions):
                asked = time.perf_counter()
                seconds, correct = ask(short_key, short)
                status = http.get(f"/v1/contexts/{long_key}").json()
                during.append({"asked_at_s": asked, "seconds": round(seconds, 2), "correct": correct,
                               "long_status_after": status["status"],
                               "long_tokens_encoded_after": status["tokens_encoded"]})
            long_status = wait_ready(http, long_key)
            done = time.perf_counter()
            for i, q in enumerate(during):   # FIFO: it would have run once the encode was over; the encode
                answering = sum(later["seconds"] for later in during[i:])   # paused at most this long
                q["fifo_wait_s"] = round(done - q.pop("asked_at_s") - answering, 2)
            idle = [ask(short_key, short) for _ in range(args.questions)]
            long_seconds, long_correct = ask(long_key, long_)
    finally:
        server.terminate()
        server.wait(timeout=30)
        store.cleanup()
    result = {"machine": {"cpu": cpu_model(), "cpus": os.cpu_count()},
              "command": " ".join([Path(sys.executable).name, *sys.argv]),
              "short_tokens_target": args.short, "long_tokens": long_status["tokens"],
              "long_encode_seconds": long_status["encode_seconds"], "questions_during_encode": during,
              "questions_idle": [{"seconds": round(s, 2), "correct": c} for s, c in idle],
              "long_question": {"seconds": round(long_seconds, 2), "correct": long_correct}}
    (args.out / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
