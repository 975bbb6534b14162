"""Two tenants sharing one `reform serve` (``--keys``), over loopback, stopping by itself. It measures:

1. **Fair turns.** Bob stores a document and asks about it on an idle server (the baseline). Then Alice
   posts ``--uploads`` different documents at once (more than the queue holds: the rest wait in her
   line), and Bob asks the same question ``--asks`` times while her encodes run. Bob's delay over the
   baseline is compared with one encode chunk's time (the encode's seconds per token times the chunk
   size, read from the stored context's manifest).
2. **No timing leak.** Bob uploads one of Alice's documents (already stored, for her) and a new document
   of the same length: both are fresh encodes of his own, and take the same time.

``--one-key`` runs the same with both users on one key (one tenant: one queue and one line, as every
server was before tenants), for the before/after comparison.

    python scripts/serve_tenants.py --out docs/results/serve-tenants
    python scripts/serve_tenants.py --one-key --out docs/results/serve-tenants/one-key
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from serve_load import QUESTION, Server, document, free_port  # noqa: E402

KEYS = {"alice": "alice-3f9c1e7a52d84b06", "bob": "bob-8d2a6c0e4f1b9375"}


def client(url: str, who: str) -> httpx.Client:
    return httpx.Client(base_url=url, timeout=900, headers={"Authorization": f"Bearer {KEYS[who]}"})


def ready(http: httpx.Client, context_id: str, seconds: float = 1800) -> dict:
    deadline = time.time() + seconds
    while (s := http.get(f"/v1/contexts/{context_id}").json()).get("status") in ("queued", "encoding"):
        if time.time() > deadline:
            raise SystemExit(f"context {context_id} not ready after {seconds} s")
        time.sleep(0.1)
    return s


def timed_upload(http: httpx.Client, text: str) -> dict:
    """Upload ``text`` and wait for it: its status code, id, encode seconds and wall seconds to ready."""
    t = time.perf_counter()
    r = http.post("/v1/contexts", json={"text": text})
    status = ready(http, r.json()["id"])
    return {"status": r.status_code, "id": r.json()["id"], "tokens": status["tokens"],
            "encode_seconds": status["encode_seconds"], "seconds": round(time.perf_counter() - t, 3)}


def ask(http: httpx.Client, context_id: str) -> float:
    t = time.perf_counter()
    r = http.post("/v1/chat/completions", json={"model": "reform", "context_id": context_id, "max_tokens": 8,
                                                "temperature": 0, "messages": [{"role": "user", "content": QUESTION}]})
    if r.status_code != 200:
        raise SystemExit(f"bob's question answered {r.status_code}: {r.text[:200]}")
    return time.perf_counter() - t


def chunk_seconds(store: str, key: str, scope: str) -> tuple[int, float]:
    """(chunk size, seconds one chunk took) of a stored context's encode, from its manifest."""
    from reform.store import read_manifest
    manifest = read_manifest(Path(store) / scope / f"{key}.reform")
    size = manifest["method"]["options"]["chunk_size"]
    return size, manifest["encode"]["seconds"] * size / manifest["tokens"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--uploads", type=int, default=20, help="Alice's uploads at once")
    ap.add_argument("--words", type=int, default=3000, help="words in each document (~1.3 tokens a word)")
    ap.add_argument("--asks", type=int, default=5, help="Bob's questions while Alice's encodes run")
    ap.add_argument("--one-key", action="store_true", help="both users on one key (one tenant)")
    ap.add_argument("--model", default=None)
    args = ap.parse_args()
    from reform.machine import cpu_name
    results: dict = {"cpu": cpu_name(), "date": time.strftime("%Y-%m-%d"), "one_key": args.one_key,
                     "uploads": args.uploads, "words": args.words}
    if args.one_key:
        KEYS["bob"] = KEYS["alice"]
    with tempfile.TemporaryDirectory() as folder:
        keys = Path(folder) / "keys.txt"
        keys.write_text("".join(f"{name}:{key}\n" for name, key in KEYS.items() if not args.one_key or name == "alice"))
        store = str(Path(folder) / "store")
        server = Server(store, free_port(), "--keys", str(keys), *(["--model", args.model] if args.model else []))
        scope = {"alice": "tenants/alice", "bob": "tenants/alice" if args.one_key else "tenants/bob"}
        alice, bob = client(server.url, "alice"), client(server.url, "bob")

        mine = timed_upload(bob, document(args.words, 1000))
        size, chunk = chunk_seconds(store, mine["id"], scope["bob"])
        ask(bob, mine["id"])                                            # warm
        idle = [ask(bob, mine["id"]) for _ in range(3)]
        results.update(chunk_size=size, chunk_seconds=round(chunk, 3), bob_context_tokens=mine["tokens"],
                       idle_ask_seconds=[round(s, 3) for s in idle])
        print(json.dumps(results), flush=True)

        # 1. Alice's uploads at once; Bob asks while they encode
        texts = [document(args.words, i) for i in range(args.uploads)]
        posted: list = []
        started = time.perf_counter()
        threads = [threading.Thread(target=lambda t=t: posted.append(client(server.url, "alice").post(
            "/v1/contexts", json={"text": t}))) for t in texts]
        for t in threads:
            t.start()
        time.sleep(2.0)                       # her uploads are queued and in line; the first is encoding
        busy = []
        for _ in range(args.asks):
            busy.append((round(time.perf_counter() - started, 2), round(ask(bob, mine["id"]), 3)))
            time.sleep(1.0)
        for t in threads:
            t.join()
        ids = [r.json()["id"] for r in posted]
        for i in ids:
            ready(alice, i)
        results.update(alice_statuses=sorted({r.status_code for r in posted}),
                       alice_encode_seconds=round(time.perf_counter() - started, 1),
                       busy_asks=[{"at_s": at, "seconds": s} for at, s in busy])
        delays = [s - statistics.median(idle) for _, s in busy]
        results.update(median_delay_s=round(statistics.median(delays), 3), max_delay_s=round(max(delays), 3),
                       max_delay_chunks=round(max(delays) / chunk, 2))
        print(json.dumps({k: results[k] for k in ("busy_asks", "median_delay_s", "max_delay_s", "max_delay_chunks")}),
              flush=True)

        # 2. Bob uploads one of Alice's documents, and a new one of the same length
        if not args.one_key:
            theirs = timed_upload(bob, texts[0])
            new = timed_upload(bob, document(args.words, 2000))
            results.update(bob_uploads_alices_text=theirs, bob_uploads_a_new_text=new)
            print(json.dumps({"alices_text": theirs, "new_text": new}), flush=True)
        server.stop()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    print(f"wrote {args.out / 'results.json'}")


if __name__ == "__main__":
    main()
