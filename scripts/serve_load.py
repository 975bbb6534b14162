"""A bounded load and fault test of `reform serve` over loopback: starts the server (default model, a fresh
store) in its own process, then, stopping by itself:

1. concurrent clients asking about one stored document (503s retried after their ``Retry-After``), then a
   burst of clients at once, each one chat through the official ``openai`` client with its default
   retries (more clients than the queue holds: the rest wait in line, first come, first served);
2. uploads at the limit: a 50 MB text body (under the 64 MB body limit, over the token limit) and an
   80 MB multipart body sent chunked (no Content-Length);
3. clients that leave mid-stream;
4. kill -9 during an encode, a restart on the same store, and a re-upload.

It prints and writes (``--out``: results.json, results.md) requests sent / answered / lost, p50/p95
latency, the server's RSS before and after each part, and how fast each fault was answered.

    python scripts/serve_load.py --out docs/results/serve-load

``--throughput`` measures instead how many answers the server gives per second to users asking at once
(continuous batching): a ~16k-token document is stored, then, for each ``--max-tokens``, the 32 different
questions of ``TOPICS`` are asked one after another (the one-at-a-time answers), and ``--users`` of them
at once through the official ``openai`` client (greedy). It reports answers and tokens per second, p50 and
p95 latency, and how many answers equal their one-at-a-time answer:

    python scripts/serve_load.py --throughput --out docs/results/serve-throughput-smollm2
    python scripts/serve_load.py --throughput --max-batch 1 --out ...     # one answer at a time (before)
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

REFORM = str(Path(sys.executable).parent / "reform")
QUESTION = "What is the radio code for the harbour master?"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, store: str, port: int, *options: str):
        self.url, self.store, self.port = f"http://127.0.0.1:{port}", store, port
        self.proc = subprocess.Popen([REFORM, "serve", "--port", str(port), "--store", store, "--no-access-log",
                                      *options], stderr=subprocess.DEVNULL)
        while True:
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                if self.proc.poll() is not None:
                    raise SystemExit("reform serve exited")
                time.sleep(0.3)

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
        return float("nan")

    def stop(self, kill: bool = False) -> None:
        (self.proc.kill if kill else self.proc.terminate)()
        self.proc.wait()


def document(words: int, seed: int) -> str:
    import random
    from reform.data.haystack import haystack, insert_needle
    filler = haystack(words, lambda t: len(t.split()), rng=random.Random(seed))
    return insert_needle(filler, "The radio code for the harbour master is ORCHID-7.", 0.5)


def ask(url: str, context_id: str, max_tokens: int = 8) -> tuple[bool, float, int]:
    """One chat, retried on 503 after its Retry-After (as a patient client would): (answered, seconds, tries)."""
    t, tries = time.perf_counter(), 0
    while tries < 50:
        tries += 1
        try:
            r = httpx.post(f"{url}/v1/chat/completions", timeout=300, json={
                "model": "reform", "context_id": context_id, "max_tokens": max_tokens,
                "messages": [{"role": "user", "content": QUESTION}]})
        except httpx.TransportError:
            return False, time.perf_counter() - t, tries
        if r.status_code == 503:
            time.sleep(float(r.headers.get("retry-after", "1")))
            continue
        return r.status_code == 200, time.perf_counter() - t, tries
    return False, time.perf_counter() - t, tries


def ask_openai(url: str, context_id: str) -> tuple[bool, float]:
    """One chat through the official client, with its default retries (2): (answered, seconds)."""
    import openai
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=600)
    t = time.perf_counter()
    try:
        client.chat.completions.create(model="reform", max_tokens=8, extra_body={"context_id": context_id},
                                       messages=[{"role": "user", "content": QUESTION}])
        return True, time.perf_counter() - t
    except openai.OpenAIError:
        return False, time.perf_counter() - t


# what the 32 throughput questions ask about (the built-in prose is from Python's language reference)
TOPICS = ["the assert statement", "assignment statements", "augmented assignment", "the pass statement",
          "the del statement", "the return statement", "the yield statement", "the raise statement",
          "the break statement", "the continue statement", "the import statement", "the global statement",
          "the nonlocal statement", "future statements", "the if statement", "the while statement",
          "the for statement", "the try statement", "the with statement", "the match statement",
          "function definitions", "class definitions", "coroutines", "decorators", "lambda expressions",
          "comparisons", "boolean operations", "conditional expressions", "generator expressions",
          "slicings", "calls", "attribute references"]


def chat(client, key: str, topic: str, max_tokens: int) -> dict:
    """One greedy question about ``topic`` through the openai client: its answer, tokens and seconds."""
    t = time.perf_counter()
    r = client.chat.completions.create(model="reform", max_tokens=max_tokens, temperature=0,
                                       extra_body={"context_id": key},
                                       messages=[{"role": "user", "content": f"What does the text say about {topic}?"}])
    return {"text": r.choices[0].message.content, "tokens": r.usage.completion_tokens,
            "seconds": time.perf_counter() - t}


def throughput(url: str, key: str, users: list[int], max_tokens: list[int]) -> list[dict]:
    """Per ``max_tokens``: every topic asked one after another, then ``users`` at once; a row per count."""
    import openai
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=1800, max_retries=0)
    rows = []
    for n in max_tokens:
        alone = [chat(client, key, topic, n) for topic in TOPICS[:max(users)]]
        for u in users:
            steps, step_s = decode_steps(url)
            t = time.perf_counter()
            with ThreadPoolExecutor(u) as pool:
                together = list(pool.map(lambda topic: chat(client, key, topic, n), TOPICS[:u]))
            wall = time.perf_counter() - t
            steps_after, step_s_after = decode_steps(url)
            first = alone[:u]
            seq_s, seq_tokens = sum(a["seconds"] for a in first), sum(a["tokens"] for a in first)
            seconds = sorted(a["seconds"] for a in together)
            row = {"max_tokens": n, "users": u, "wall_s": round(wall, 2), "tokens": sum(a["tokens"] for a in together),
                   "answers_per_s": round(u / wall, 3),
                   "tokens_per_s": round(sum(a["tokens"] for a in together) / wall, 2),
                   "p50_s": round(statistics.median(seconds), 2), "p95_s": round(seconds[int(0.95 * (u - 1))], 2),
                   "one_at_a_time_s": round(seq_s, 2), "one_at_a_time_tokens_per_s": round(seq_tokens / seq_s, 2),
                   "speedup": round((sum(a["tokens"] for a in together) / wall) / (seq_tokens / seq_s), 2),
                   "equal_answers": sum(a["text"] == b["text"] for a, b in zip(together, first)),
                   "decode_steps": steps_after - steps,
                   "ms_per_step": round(1000 * (step_s_after - step_s) / max(1, steps_after - steps), 1)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def decode_steps(url: str) -> tuple[int, float]:
    """Decoding steps the server has run so far, and their seconds (its /metrics)."""
    found = {}
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line.startswith(("reform_decode_steps_total ", "reform_decode_step_seconds_total ")):
            name, value = line.split()
            found[name] = float(value)
    return int(found.get("reform_decode_steps_total", 0)), found.get("reform_decode_step_seconds_total", 0.0)


def throughput_table(rows: list[dict]) -> list[str]:
    out = ["| max_tokens | users | answers/s | tokens/s | p50 s | p95 s | one at a time: tokens/s | × | equal answers "
           "| ms per step |", "|---|---|---|---|---|---|---|---|---|---|"]
    out += [f"| {r['max_tokens']} | {r['users']} | {r['answers_per_s']} | {r['tokens_per_s']} | {r['p50_s']} | "
            f"{r['p95_s']} | {r['one_at_a_time_tokens_per_s']} | {r['speedup']} | {r['equal_answers']}/{r['users']} | "
            f"{r['ms_per_step']} |" for r in rows]
    return out


def tally(runs: list[tuple]) -> dict:
    """Requests sent, answered and lost, and the p50 / p95 latency of ``(answered, seconds, ...)`` runs."""
    seconds = sorted(r[1] for r in runs)
    return {"sent": len(runs), "answered": sum(r[0] for r in runs), "lost": sum(not r[0] for r in runs),
            "p50_s": round(statistics.median(seconds), 2), "p95_s": round(seconds[int(0.95 * (len(seconds) - 1))], 2)}


def count_503(url: str) -> int:
    """503s the server has answered so far (its /metrics)."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("reform_requests_total{") and 'status="503"' in line))


def wait_ready(url: str, key: str, seconds: float = 900) -> dict:
    deadline = time.time() + seconds
    while (s := httpx.get(f"{url}/v1/contexts/{key}", timeout=30).json()).get("status") in ("queued", "encoding"):
        if time.time() > deadline:
            break
        time.sleep(0.2)
    return s


def chunked_multipart(port: int, total: int) -> tuple[int | None, float]:
    """POST ``total`` bytes as a chunked multipart file; (status, seconds to the answer)."""
    import select
    sock = socket.create_connection(("127.0.0.1", port))
    t = time.perf_counter()
    sock.sendall(b"POST /v1/contexts HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=B\r\n"
                 b"Transfer-Encoding: chunked\r\n\r\n")
    head = b'--B\r\nContent-Disposition: form-data; name="file"; filename="big.txt"\r\n\r\n'
    piece, sent = b"lorem ipsum " * 20000, 0
    try:
        sock.sendall(b"%x\r\n%s\r\n" % (len(head), head))
        while sent < total and not select.select([sock], [], [], 0)[0]:
            sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
            sent += len(piece)
    except OSError:
        pass
    sock.settimeout(60)
    try:
        reply = sock.recv(4096)
        return int(reply.split(b" ", 2)[1]), time.perf_counter() - t
    except (OSError, IndexError, ValueError):
        return None, time.perf_counter() - t
    finally:
        sock.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=32, help="chats in all, spread over the clients")
    ap.add_argument("--burst", type=int, default=32, help="clients sending one chat each at once")
    ap.add_argument("--disconnects", type=int, default=60)
    ap.add_argument("--throughput", action="store_true", help="measure users asking at once instead")
    ap.add_argument("--users", default="1,4,8,16,32", help="with --throughput: users asking at once")
    ap.add_argument("--max-tokens", default="64,256", help="with --throughput: answer lengths")
    ap.add_argument("--model", default=None, help="the served model (default: reform serve's)")
    ap.add_argument("--max-batch", type=int, default=None, help="reform serve --max-batch")
    args = ap.parse_args()
    from reform.machine import cpu_name
    results: dict = {"cpu": cpu_name(), "date": time.strftime("%Y-%m-%d")}
    options = [*(["--model", args.model] if args.model else []),
               *(["--max-batch", str(args.max_batch)] if args.max_batch else [])]
    if args.throughput:
        users, lengths = [int(u) for u in args.users.split(",")], [int(n) for n in args.max_tokens.split(",")]
        with tempfile.TemporaryDirectory() as store:
            server = Server(store, free_port(), *options)
            key = httpx.post(f"{server.url}/v1/contexts", json={"text": document(11000, 0)}, timeout=120).json()["id"]
            ready = wait_ready(server.url, key, 3600)
            results.update(model=args.model or "default", max_batch=args.max_batch, context_tokens=ready.get("tokens"),
                           rows=throughput(server.url, key, users, lengths))
            server.stop()
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(results, indent=1))
        table = [f"`python scripts/serve_load.py --throughput {' '.join(options)} --out {args.out}` on {results['cpu']}, "
                 f"{results['date']}; a stored context of {results['context_tokens']} tokens", "",
                 *throughput_table(results["rows"])]
        (args.out / "results.md").write_text("\n".join(table) + "\n")
        print("\n".join(table))
        return
    with tempfile.TemporaryDirectory() as store:
        port = free_port()
        server = Server(store, port)
        url = server.url
        doc = document(3000, 0)
        key = httpx.post(f"{url}/v1/contexts", json={"text": doc}, timeout=120).json()["id"]
        wait_ready(url, key)
        ask(url, key)
        idle = server.rss_mb()
        results["idle_rss_mb"] = idle

        # 1. concurrent clients
        with ThreadPoolExecutor(args.clients) as pool:
            runs = list(pool.map(lambda _: ask(url, key), range(args.requests)))
        results["load"] = {"clients": args.clients, **tally(runs), "most_tries": max(r[2] for r in runs),
                           "rss_after_mb": server.rss_mb()}
        print(json.dumps(results["load"]), flush=True)

        # 1b. a burst: more clients at once than the queue holds, as the openai client sends them
        before_503 = count_503(url)
        with ThreadPoolExecutor(args.burst) as pool:
            runs = list(pool.map(lambda _: ask_openai(url, key), range(args.burst)))
        results["burst"] = {"clients": args.burst, **tally(runs), "answered_503": count_503(url) - before_503,
                            "rss_after_mb": server.rss_mb()}
        print(json.dumps(results["burst"]), flush=True)

        # 2. uploads at the limit
        big = ("lorem ipsum dolor sit amet " * 40 + "\n").encode() * (50 * 2**20 // 1081)
        t = time.perf_counter()
        r = httpx.post(f"{url}/v1/contexts", content=big, headers={"Content-Type": "text/plain"}, timeout=300)
        results["upload_50mb"] = {"bytes": len(big), "status": r.status_code, "seconds": round(time.perf_counter() - t, 2),
                                  "message": r.json().get("error", {}).get("message"), "rss_after_mb": server.rss_mb()}
        print(json.dumps(results["upload_50mb"]), flush=True)
        status, secs = chunked_multipart(port, 80 * 2**20)
        results["upload_80mb_chunked"] = {"status": status, "seconds": round(secs, 2), "rss_after_mb": server.rss_mb()}
        print(json.dumps(results["upload_80mb_chunked"]), flush=True)
        ask_ok = ask(url, key)
        results["answered_after_uploads"] = ask_ok[0]

        # 3. clients leaving mid-stream
        before = server.rss_mb()
        for _ in range(args.disconnects):
            with httpx.stream("POST", f"{url}/v1/chat/completions", timeout=120, json={
                    "model": "reform", "context_id": key, "max_tokens": 200, "stream": True,
                    "messages": [{"role": "user", "content": QUESTION}]}) as s:
                for line in s.iter_lines():
                    if '"content"' in line and '"content": ""' not in line:
                        break           # the first token: leave
        time.sleep(2)
        results["disconnects"] = {"count": args.disconnects, "rss_before_mb": before, "rss_after_mb": server.rss_mb(),
                                  "answered_after": ask(url, key)[0]}
        print(json.dumps(results["disconnects"]), flush=True)

        # 4. kill -9 mid-encode, restart, re-upload
        long_doc = document(40000, 1)
        long_key = httpx.post(f"{url}/v1/contexts", json={"text": long_doc}, timeout=120).json()["id"]
        while httpx.get(f"{url}/v1/contexts/{long_key}", timeout=30).json()["status"] != "encoding":
            time.sleep(0.1)
        time.sleep(2)
        server.stop(kill=True)
        t = time.perf_counter()
        server = Server(store, port)
        started = time.perf_counter() - t
        t = time.perf_counter()
        status = httpx.get(f"{url}/v1/contexts/{long_key}", timeout=30).json()
        seen = time.perf_counter() - t
        t = time.perf_counter()
        r = httpx.post(f"{url}/v1/chat/completions", timeout=60, json={
            "model": "reform", "context_id": long_key, "max_tokens": 4,
            "messages": [{"role": "user", "content": QUESTION}]})
        chat_s = time.perf_counter() - t
        again = httpx.post(f"{url}/v1/contexts", json={"text": long_doc}, timeout=120)
        final = wait_ready(url, long_key)
        answered = ask(url, long_key, max_tokens=16)
        results["kill_9"] = {"restart_s": round(started, 1), "status_after_restart": status["status"],
                             "status_seconds": round(seen, 3), "chat_on_it": r.status_code,
                             "chat_seconds": round(chat_s, 3), "reupload": again.status_code,
                             "after_reupload": final["status"], "tokens": final.get("tokens"),
                             "answered_after": answered[0]}
        print(json.dumps(results["kill_9"]), flush=True)
        server.stop()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    load, burst, up, ch, dis, k9 = (results[k] for k in ("load", "burst", "upload_50mb", "upload_80mb_chunked",
                                                          "disconnects", "kill_9"))
    table = [f"`python scripts/serve_load.py --out {args.out}` on {results['cpu']}, {results['date']}; "
             f"server idle RSS {idle:.0f} MB", "",
             "| part | result |", "|---|---|",
             f"| {load['clients']} concurrent clients, {load['sent']} chats | sent {load['sent']}, answered "
             f"{load['answered']}, **lost {load['lost']}**; p50 {load['p50_s']} s, p95 {load['p95_s']} s; most tries "
             f"{load['most_tries']}; RSS after {load['rss_after_mb']:.0f} MB |",
             f"| {burst['clients']} clients at once, one chat each (openai client, default retries) | sent "
             f"{burst['sent']}, answered {burst['answered']}, **lost {burst['lost']}**; p50 {burst['p50_s']} s, p95 "
             f"{burst['p95_s']} s; 503s answered {burst['answered_503']}; RSS after {burst['rss_after_mb']:.0f} MB |",
             f"| 50 MB text body | {up['status']} in {up['seconds']} s; RSS after {up['rss_after_mb']:.0f} MB |",
             f"| 80 MB multipart, chunked | {ch['status']} in {ch['seconds']} s; RSS after {ch['rss_after_mb']:.0f} MB |",
             f"| {dis['count']} clients leaving mid-stream | RSS {dis['rss_before_mb']:.0f} -> {dis['rss_after_mb']:.0f} MB; "
             f"answering after: {dis['answered_after']} |",
             f"| kill -9 mid-encode, restart | restart {k9['restart_s']} s; then the context reads "
             f"{k9['status_after_restart']} ({k9['status_seconds']} s), a chat on it {k9['chat_on_it']} in "
             f"{k9['chat_seconds']} s, re-upload {k9['reupload']} -> {k9['after_reupload']} ({k9['tokens']} tokens), "
             f"answered: {k9['answered_after']} |"]
    (args.out / "results.md").write_text("\n".join(table) + "\n")
    print("\n".join(table))


if __name__ == "__main__":
    main()
