"""`reform serve` over loopback: the context store across restarts, replicas, corruption, eviction, dead
processes (kill -9), SIGTERM and failed jobs; nothing is lost and nothing half-written is served."""

import asyncio
import concurrent.futures
import socket
import time

import httpx
import pytest


from live_server import DOC, DOC_CHAT, QUESTION, LiveServer, chat, make_pipe, wait_status


def test_restart_answers_from_the_store_without_encoding(store):
    with LiveServer(make_pipe(), store) as first:
        before = chat(first.client(), DOC_CHAT).choices[0].message.content
    pipe = make_pipe()
    encodes = []
    original = pipe.method.encode
    pipe.method.encode = lambda *a, **k: encodes.append(1) or original(*a, **k)
    with LiveServer(pipe, store) as second:
        r = chat(second.client(), DOC_CHAT)
        assert r.choices[0].message.content == before and r.model_extra["reform"]["encoded"] is False
        assert r.model_extra["reform"]["stats"]["load"] >= 0 and encodes == [] and second.worker.contexts.encoded == 0


def test_corrupted_context_file_is_a_clear_error_and_the_server_keeps_serving(live):
    key = chat(live.client(), DOC_CHAT).model_extra["reform"]["context_id"]
    live.worker.contexts.loaded.clear()
    path = live.worker.store.path(key)
    data = bytearray(path.read_bytes())
    data[-50] ^= 0xFF
    path.write_bytes(bytes(data))
    r = httpx.post(f"{live.url}/v1/chat/completions", timeout=60,
                   json={"model": "reform", "context_id": key, "messages": [{"role": "user", "content": QUESTION}]})
    assert r.status_code == 500 and "corrupted" in r.json()["error"]["message"]
    # the chat that carries the text heals it: the damaged file is replaced by a fresh encode
    assert chat(live.client(), DOC_CHAT).model_extra["reform"]["encoded"] is True
    assert httpx.get(f"{live.url}/health").json()["status"] == "ok"


def test_two_servers_on_one_store_see_each_others_encodes(store):
    """Replicas share only the store: an upload to one is never 'not found' on the other while it encodes
    (a status note in the store), the other's chat naming it waits for it, and a stale note (its encoder
    gone) reads as failed."""
    import json
    long_doc = DOC * 6
    expected = make_pipe().encode(long_doc).ask(QUESTION, max_new_tokens=10).text
    with LiveServer(make_pipe(), store) as a, LiveServer(make_pipe(), store) as b, \
            httpx.Client(base_url=a.url, timeout=60) as http_a, httpx.Client(base_url=b.url, timeout=60) as http_b:
        key = http_a.post("/v1/contexts", json={"text": long_doc}).json()["id"]
        seen = []
        while (r := http_b.get(f"/v1/contexts/{key}")).json()["status"] != "ready":
            assert r.status_code == 200
            seen.append(r.json()["status"])
        assert set(seen) <= {"queued", "encoding"}
        assert http_b.post("/v1/contexts", json={"text": long_doc}).json()["status"] == "ready"   # not re-encoded
        answer = b.client().chat.completions.create(model="reform", max_tokens=10, extra_body={"context_id": key},
                                                    messages=[{"role": "user", "content": QUESTION}])
        assert answer.choices[0].message.content == expected
        assert a.worker.contexts.encoded == 1 and b.worker.contexts.encoded == 0
        assert not any(p.name.endswith(".status.json") for p in store.iterdir())     # dropped once stored
        other = "f" * 32          # a note left by a replica that died mid-encode
        (store / f"{other}.status.json").write_text(json.dumps({"status": "encoding", "tokens": 5, "updated": 0}))
        assert http_b.get(f"/v1/contexts/{other}").json()["status"] == "failed"
        (store / f"{other}.status.json").write_text(json.dumps({"status": "encoding", "tokens": 5,
                                                                 "updated": time.time()}))
        assert http_b.get(f"/v1/contexts/{other}").json()["status"] == "encoding"



def test_reupload_replaces_a_corrupted_or_truncated_context(live):
    """Finding: re-uploading the text of a damaged context answered 200 "ready" (flipped bytes) or 202
    "failed" (truncated) and changed nothing. Now a context found unreadable is listed as failed and its
    text, sent again, replaces it with a fresh encode."""
    with httpx.Client(base_url=live.url, timeout=60) as http:
        for damage in ("flip", "truncate"):
            text = f"{damage}: " + DOC
            key = http.post("/v1/contexts", json={"text": text}).json()["id"]
            wait_status(http, key, "ready")
            live.worker.contexts.loaded.clear()
            path = live.worker.store.path(key)
            data = bytearray(path.read_bytes())
            if damage == "flip":
                data[-50] ^= 0xFF
            path.write_bytes(bytes(data) if damage == "flip" else bytes(data[:len(data) // 2]))
            r = http.post("/v1/chat/completions", json={"model": "reform", "context_id": key, "max_tokens": 5,
                                                        "messages": [{"role": "user", "content": QUESTION}]})
            assert r.status_code in (404, 500) and "upload the text again" in r.json()["error"]["message"] \
                or r.status_code == 404
            assert http.get(f"/v1/contexts/{key}").json()["status"] == "failed"
            r = http.post("/v1/contexts", json={"text": text})
            assert r.status_code == 202 and r.json()["status"] in ("queued", "encoding")
            wait_status(http, key, "ready")
            r = http.post("/v1/chat/completions", json={"model": "reform", "context_id": key, "max_tokens": 5,
                                                        "messages": [{"role": "user", "content": QUESTION}]})
            assert r.status_code == 200


def test_a_context_evicted_by_the_store_budget_is_not_listed_as_ready(store):
    """Finding: a context removed by the store's size budget stayed listed "ready" by the process that
    removed it, and a question on it got 404."""
    with LiveServer(make_pipe(), store, memory_contexts=1) as server, \
            httpx.Client(base_url=server.url, timeout=60) as http:
        first = http.post("/v1/contexts", json={"text": "first " + DOC}).json()["id"]
        size = wait_status(http, first, "ready")["bytes"]
        server.worker.store.max_bytes = int(size * 1.5)          # room for one context
        second = http.post("/v1/contexts", json={"text": "second " + DOC}).json()["id"]
        wait_status(http, second, "ready")
        listed = {c["id"]: c["status"] for c in http.get("/v1/contexts").json()["data"]}
        assert listed == {second: "ready"}
        assert http.get(f"/v1/contexts/{first}").status_code == 404


def test_a_note_left_by_a_dead_process_on_this_host_reads_failed_and_the_text_encodes_again(store):
    """Finding: after kill -9 mid-encode and a restart, the server read its own leftover status note as
    another replica's work: "encoding" forever, a re-upload queued nothing, a chat hung, then 404. Notes
    now carry their writer (host, pid, process start time)."""
    import json
    import os
    import socket as sock
    with LiveServer(make_pipe(), store) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        key = server.app.state.service.keys.of(DOC)[0]
        for gone in ({"pid": os.getpid(), "started": -1},          # this pid, an earlier process (a restart)
                     {"pid": 2 ** 22 + 7, "started": 1}):          # a pid that does not run
            note = {"status": "encoding", "tokens": 900, "tokens_encoded": 300, "updated": time.time(),
                    "owner": {"host": sock.gethostname(), "instance": "earlier", **gone}}
            (store / f"{key}.status.json").write_text(json.dumps(note))
            t = time.time()
            s = http.get(f"/v1/contexts/{key}").json()
            assert s["status"] == "failed" and "stopped before it finished" in s["error"]
            r = http.post("/v1/chat/completions", json={"model": "reform", "context_id": key, "max_tokens": 5,
                                                        "messages": [{"role": "user", "content": QUESTION}]})
            assert r.status_code == 404 and time.time() - t < 5
        assert http.post("/v1/contexts", json={"text": DOC}).status_code == 202
        wait_status(http, key, "ready")
        assert server.worker.contexts.encoded == 1


def test_an_upload_racing_a_chat_on_the_same_text_is_not_lost(store):
    """Finding: an upload that raced a chat encoding the same text read the chat's own note as another
    replica's work and queued nothing; when the chat's encode was cancelled, the text was never encoded."""
    pipe = make_pipe()
    original = pipe.method.encode

    def slow(p, ids, progress=None):        # a chat's encode the client will abandon
        def slower(n):
            time.sleep(0.05)
            progress(n)
        return original(p, ids, slower if progress else None)
    pipe.method.encode = slow
    long_doc = DOC * 6
    with LiveServer(pipe, store) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        key = server.app.state.service.keys.of(long_doc)[0]
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{server.url}/v1/chat/completions", timeout=1.0,
                       json={"model": "reform", "messages": [{"role": "system", "content": long_doc},
                                                             {"role": "user", "content": QUESTION}]})
        r = http.post("/v1/contexts", json={"text": long_doc})
        assert r.status_code == 202
        wait_status(http, key, "ready")


class ServeProcess:
    """`reform serve` as a user runs it: its own process, a tiny model folder, a store folder."""

    def __init__(self, model_dir, store, *extra: str):
        import subprocess
        import sys
        from pathlib import Path
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        reform = str(Path(sys.executable).parent / "reform")
        self.proc = subprocess.Popen([reform, "serve", "--model", str(model_dir), "--store", str(store), "--port",
                                      str(self.port), "--dtype", "fp32", "--heads", "1:v:0,2:q:3",
                                      "--option", "chunk_size=64", "--option", "cache_budget=96",
                                      "--no-access-log", *extra],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 120
        while True:
            assert self.proc.poll() is None, self.proc.stderr.read()
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.time() < deadline, "reform serve did not start"
            time.sleep(0.2)


LONG = DOC * 300


def test_kill_9_mid_encode_then_restart_the_context_reads_failed_and_a_reupload_encodes_it(tiny_model_dir, tmp_path):
    """Done-when: kill -9 during an encode, restart on the same store: within 5 s the context is failed,
    a re-upload encodes it, and no request waits past its timeout."""
    store = tmp_path / "store"
    first = ServeProcess(tiny_model_dir, store)
    try:
        key = httpx.post(f"{first.url}/v1/contexts", json={"text": LONG}, timeout=60).json()["id"]
        with httpx.Client(base_url=first.url, timeout=60) as http:
            wait_status(http, key, "encoding")
    finally:
        first.proc.kill()
        first.proc.wait()
    second = ServeProcess(tiny_model_dir, store)
    try:
        with httpx.Client(base_url=second.url, timeout=60) as http:
            t = time.time()
            s = http.get(f"/v1/contexts/{key}").json()
            assert s["status"] == "failed" and "stopped before it finished" in s["error"] and time.time() - t < 5
            r = http.post("/v1/chat/completions", json={"model": "reform", "context_id": key, "max_tokens": 3,
                                                        "messages": [{"role": "user", "content": QUESTION}]})
            assert r.status_code == 404 and time.time() - t < 5
            assert http.post("/v1/contexts", json={"text": LONG}).status_code == 202
            wait_status(http, key, "ready", seconds=120)
    finally:
        second.proc.kill()
        second.proc.wait()


def test_sigterm_drains_a_request_in_flight(tiny_model_dir, tmp_path):
    """Finding: the shutdown grace was a fixed 5 s and requests in flight got an empty reply. Now
    `--shutdown-grace` (30 s by default) lets them finish: the chat sent before SIGTERM gets its answer."""
    import signal
    server = ServeProcess(tiny_model_dir, tmp_path / "store", "--shutdown-grace", "60")
    try:
        pool = concurrent.futures.ThreadPoolExecutor(1)
        reply = pool.submit(httpx.post, f"{server.url}/v1/chat/completions", timeout=120, json={
            "model": "reform", "max_tokens": 5,
            "messages": [{"role": "system", "content": LONG}, {"role": "user", "content": QUESTION}]})
        deadline = time.time() + 60
        while not httpx.get(f"{server.url}/health", timeout=5).json()["busy"]:
            assert time.time() < deadline
            time.sleep(0.05)
        server.proc.send_signal(signal.SIGTERM)
        r = reply.result(timeout=120)
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] is not None
        assert server.proc.wait(timeout=60) in (0, -signal.SIGTERM)      # uvicorn ends by re-raising it
    finally:
        server.proc.kill()


def test_a_failed_or_cancelled_job_keeps_no_frames(store):
    """Finding: each client leaving mid-stream left tens of MB behind (60 disconnects: +1.25 GB with
    SmolLM2 here): the Cancelled exception kept on the job's future held, through its traceback, the frames
    of the generation and their tensors in a reference cycle. Job failures now travel without traceback."""
    from reform.server.scheduler import Cancelled
    from reform.server.worker import Worker
    from reform.store import ContextStore
    worker = Worker(make_pipe(), ContextStore(store))

    def generating(job):
        big = bytearray(10 ** 7)           # stands for the recompute's cache
        job.cancel.set()
        job.check()

    async def run():
        job = worker.submit(generating)
        await asyncio.wait({job.future})
        return job.future.exception()
    try:
        e = asyncio.run(run())
        assert isinstance(e, Cancelled) and e.__traceback__ is None
    finally:
        worker.stop()
