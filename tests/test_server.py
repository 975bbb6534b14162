"""`reform serve` over loopback: a real uvicorn server on 127.0.0.1 with a tiny random-weight model, spoken
to by the official `openai` client and by `httpx`."""

import asyncio
import concurrent.futures
import json
import socket
import threading
import time

import httpx
import openai
import pytest
import torch
import uvicorn

from reform.pipeline import Pipeline
from reform.server import Settings, build_app
from reform.server.scheduler import Job

from conftest import WINDOW, CharTokenizer, tiny

DOC = "The quick brown fox jumps over the lazy dog. A cat sat on the mat near the door. " * 7
QUESTION = "What does the fox do?"
OPTIONS = dict(heads="1:v:0,2:q:3,1:k:1", chunk_size=64, cache_budget=96, recompute_budget=200)


def make_pipe():
    return Pipeline(tiny("llama"), CharTokenizer(), **OPTIONS)


class LiveServer:
    """uvicorn serving ``build_app(...)`` on a free loopback port in a background thread."""

    def __init__(self, pipe, store, **kw):
        self.app = build_app(pipe, store, **kw)
        self.worker = self.app.state.worker
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning"))

    def __enter__(self):
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 20
        while not self.server.started:
            assert time.time() < deadline, "server did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(timeout=20)
        self.worker.stop()

    def client(self, key="unused", timeout=60):
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=key, max_retries=0, timeout=timeout)


@pytest.fixture
def store(tmp_path):
    return tmp_path / "store"


@pytest.fixture
def live(store):
    with LiveServer(make_pipe(), store) as server:
        yield server


def chat(client, messages, **kw):
    return client.chat.completions.create(model="reform", messages=messages, **{"max_tokens": 10, **kw})


DOC_CHAT = [{"role": "system", "content": DOC}, {"role": "user", "content": QUESTION}]


def test_chat_plain_and_streamed_equal_the_library(live):
    expected = make_pipe().encode(DOC).ask(QUESTION, max_new_tokens=10)
    client = live.client()
    r = chat(client, DOC_CHAT)
    assert r.choices[0].message.content == expected.text and r.choices[0].finish_reason == expected.finish_reason
    assert r.usage.completion_tokens == len(expected.tokens) and r.usage.prompt_tokens == expected.input_tokens
    assert r.model_extra["reform"]["encoded"] is True
    chunks = list(chat(client, DOC_CHAT, stream=True, stream_options={"include_usage": True}))
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip() == expected.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == expected.finish_reason
    assert chunks[-1].usage.completion_tokens == len(expected.tokens)
    assert live.worker.contexts.encoded == 1                   # the re-sent document was not encoded again


def test_raw_stream_ends_with_done(live):
    with httpx.stream("POST", f"{live.url}/v1/chat/completions", timeout=60,
                      json={"model": "reform", "messages": DOC_CHAT, "max_tokens": 5, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines) and lines[-1] == "data: [DONE]"


def test_later_turns_ride_with_the_question_and_the_document_is_encoded_once(live):
    client = live.client()
    first = chat(client, DOC_CHAT)
    turns = DOC_CHAT + [{"role": "assistant", "content": first.choices[0].message.content},
                        {"role": "user", "content": "And the cat?"}]
    second = chat(client, turns)
    assert second.model_extra["reform"]["context_id"] == first.model_extra["reform"]["context_id"]
    assert second.model_extra["reform"]["encoded"] is False and live.worker.contexts.encoded == 1


def test_contexts_api(live):
    with httpx.Client(base_url=live.url, timeout=60) as http:
        r = http.post("/v1/contexts", json={"text": DOC})
        assert r.status_code == 202 and r.json()["status"] in ("queued", "encoding", "ready")
        key = r.json()["id"]
        for _ in range(200):
            status = http.get(f"/v1/contexts/{key}").json()
            if status["status"] == "ready":
                break
            time.sleep(0.05)
        assert status["status"] == "ready" and status["tokens_encoded"] == status["tokens"] > 500
        assert status["bytes"] > 0 and status["encode_seconds"] >= 0
        again = http.post("/v1/contexts", files={"file": ("doc.txt", DOC.encode(), "text/plain")})
        assert again.status_code == 200 and again.json()["id"] == key        # same text, same id, no encode
        assert [c["id"] for c in http.get("/v1/contexts").json()["data"]] == [key]
        answer = live.client().chat.completions.create(model="reform", max_tokens=10, extra_body={"context_id": key},
                                                       messages=[{"role": "user", "content": QUESTION}])
        assert answer.model_extra["reform"]["encoded"] is False and live.worker.contexts.encoded == 1
        assert http.delete(f"/v1/contexts/{key}").json()["deleted"] is True
        assert http.get(f"/v1/contexts/{key}").status_code == 404
        assert http.delete(f"/v1/contexts/{key}").status_code == 404
        # a UTF-16 byte-order mark and half a character: no text in any encoding
        for bad, code in (({"json": {"txt": "x"}}, 400), ({"content": b"\xff\xfe\x00"}, 400),
                          ({"content": b"a\x00b binary"}, 400), ({"json": {"text": "  "}}, 400)):
            assert http.post("/v1/contexts", **bad).status_code == code
        assert http.get("/v1/models").json()["data"][0]["id"] == live.worker.pipe.model_name
        assert http.get("/health").json()["status"] == "ok"


def test_one_document_per_upload_in_any_encoding_and_nothing_ignored(live):
    """A form-encoded upload is its 'text' field (it used to be encoded as the raw 'text=...' body); two
    documents in one upload, or a JSON field other than 'text', are refused rather than half-read."""
    with httpx.Client(base_url=live.url, timeout=60) as http:
        key = http.post("/v1/contexts", json={"text": DOC}).json()["id"]
        assert http.post("/v1/contexts", data={"text": DOC}).json()["id"] == key
        two = http.post("/v1/contexts", files=[("file", ("a.txt", DOC.encode())), ("file", ("b.txt", b"other"))])
        assert two.status_code == 400 and "(got 2)" in two.json()["error"]["message"]
        latin1 = http.post("/v1/contexts", content=DOC.replace("fox", "fox caf\u00e9").encode("latin-1"))
        assert latin1.status_code == 202                   # any encoding: detected, not refused
        http.delete(f"/v1/contexts/{latin1.json()['id']}")
        extra = http.post("/v1/contexts", json={"text": DOC, "name": "contract"})
        assert extra.status_code == 400 and extra.json()["error"]["param"] == "name"
        assert [c["id"] for c in http.get("/v1/contexts").json()["data"]] == [key]


def test_unknown_endpoints_and_methods_answer_in_the_openai_shape_and_models_can_be_retrieved(live):
    with httpx.Client(base_url=live.url, timeout=60) as http:
        r = http.post("/v1/completions", json={"model": "reform", "prompt": "hi"})
        assert r.status_code == 404 and r.json()["error"]["message"] == "no such endpoint: POST /v1/completions"
        r = http.get("/v1/chat/completions")
        assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed" and "POST" in r.headers["allow"]
    client = live.client()
    name = live.worker.pipe.model_name
    assert client.models.retrieve(name).id == name == client.models.retrieve("reform").id
    with pytest.raises(openai.NotFoundError, match="not served here"):
        client.models.retrieve("gpt-4o")


def test_a_request_without_max_tokens_answers_within_the_window(live):
    """The default answer length (512) is an upper bound: on a small-window model it shrinks to the room
    the prompt leaves (such a request used to be a 400 here); a max_tokens given that cannot fit is a 400."""
    answer = live.client().chat.completions.create(model="reform", messages=DOC_CHAT)
    room = WINDOW - answer.model_extra["reform"]["stats"]["recomputed_tokens"]
    assert 0 < room < live.app.state.settings.default_max_tokens
    assert answer.usage.completion_tokens <= room
    assert (answer.choices[0].finish_reason == "length") == (answer.usage.completion_tokens == room)
    with pytest.raises(openai.BadRequestError, match="window"):
        chat(live.client(), DOC_CHAT, max_tokens=room + 1)


def test_eight_concurrent_clients_are_all_answered(live):
    expected = make_pipe().encode(DOC).ask(QUESTION, max_new_tokens=10).text
    client = live.client()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: chat(client, DOC_CHAT, stream=bool(i % 2)), range(8)))
    texts = [a.choices[0].message.content if not isinstance(a, openai.Stream) else None for a in answers]
    for a, t in zip(answers, texts):
        if t is None:
            t = "".join(c.choices[0].delta.content or "" for c in a if c.choices).strip()
        assert t == expected
    assert live.worker.contexts.encoded == 1 and httpx.get(f"{live.url}/health").json()["status"] == "ok"


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


def test_api_key(store):
    with LiveServer(make_pipe(), store, settings=Settings(api_key="s3cret")) as server:
        with pytest.raises(openai.AuthenticationError):
            chat(server.client("wrong"), DOC_CHAT)
        assert httpx.get(f"{server.url}/v1/models").status_code == 401
        assert httpx.get(f"{server.url}/health").status_code == 200
        assert chat(server.client("s3cret"), DOC_CHAT).choices[0].message.content


def test_oversize_body_and_context(store):
    with LiveServer(make_pipe(), store, settings=Settings(max_body_bytes=2000, max_context_tokens=400)) as server:
        big = [{"role": "system", "content": "x" * 5000}, {"role": "user", "content": QUESTION}]
        r = httpx.post(f"{server.url}/v1/chat/completions", json={"model": "reform", "messages": big})
        assert r.status_code == 413 and "over the limit" in r.json()["error"]["message"]
        r = httpx.post(f"{server.url}/v1/contexts", json={"text": DOC[:1500]})
        assert r.status_code == 413 and "tokens" in r.json()["error"]["message"]


def test_full_queue_answers_503_with_retry_after(store):
    with LiveServer(make_pipe(), store, queue_size=1, settings=Settings(max_waiting=0)) as server:
        release, loop = threading.Event(), asyncio.new_event_loop()
        blocker = lambda: Job(lambda job: release.wait(30), loop, loop.create_future())
        server.worker.put(blocker())                      # the worker takes this one and blocks
        while server.worker.busy_since is None:
            time.sleep(0.01)
        server.worker.put(blocker())                      # this one fills the queue
        try:
            with pytest.raises(openai.APIStatusError) as e:
                chat(server.client(), DOC_CHAT)
            assert e.value.status_code == 503 and int(e.value.response.headers["retry-after"]) >= 1
            server.worker.job_seconds = 40.0        # from the expected wait, no longer the queue's length
            with pytest.raises(openai.APIStatusError) as e:
                chat(server.client(), DOC_CHAT)
            assert 40 <= int(e.value.response.headers["retry-after"]) <= 90
        finally:
            release.set()
        assert chat(server.client(), DOC_CHAT).choices[0].message.content is not None
        loop.close()


def test_full_queue_serves_waiting_requests_in_arrival_order(store):
    """A finding: with the queue full every request got 503 at once, and clients retrying raced each other
    (one of 32 needed 11 tries). Now requests wait in line for a place and are served first come, first
    served; only a full line answers 503."""
    with LiveServer(make_pipe(), store, queue_size=1, settings=Settings(max_waiting=6)) as server:
        release, loop = threading.Event(), asyncio.new_event_loop()
        server.worker.put(Job(lambda job: release.wait(30), loop, loop.create_future()))  # holds the model
        while server.worker.busy_since is None:
            time.sleep(0.01)
        client, order = server.client(), []
        question = lambda i: [{"role": "user", "content": f"Question {i}: what is a fox?"}]
        execute = server.worker.execute

        def started(job):       # the order the model thread takes them up (answers then decode together)
            if hasattr(job.fn, "__self__") and job.runner is None:
                order.append(int(job.fn.__self__.question.split()[1].rstrip(":")))
            return execute(job)
        server.worker.execute = started
        ask = lambda i: chat(client, question(i), max_tokens=3)
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            futures = []
            for i in range(7):            # one takes the queue's place, six wait in line, in this order
                futures.append(pool.submit(ask, i))
                deadline = time.time() + 10
                while server.worker.queued() + len(server.app.state.service.lines["default"]) < i + 1:
                    assert time.time() < deadline, "request did not arrive"
                    time.sleep(0.01)
            with pytest.raises(openai.APIStatusError) as e:       # the line is full: refused at once
                chat(client, question(7))
            assert e.value.status_code == 503 and int(e.value.response.headers["retry-after"]) >= 1
            metrics = httpx.get(f"{server.url}/metrics").text
            assert "reform_requests_waiting 6.0" in metrics
            release.set()
            answers = [f.result(timeout=60) for f in futures]
        assert all(a.choices[0].message.content is not None for a in answers)
        assert order == list(range(7))
        loop.close()


def test_question_alone_is_answered_by_the_model_without_a_context(live):
    """A finding: a chat whose only message is the question (a chat UI's first message) got 400 "no
    context". It is the model's own answer: the same tokens as transformers' greedy generate over the chat
    template of the question alone."""
    pipe = make_pipe()
    r = chat(live.client(), [{"role": "user", "content": QUESTION}], max_tokens=8)
    expected = pipe.without_context().ask(QUESTION, max_new_tokens=8)
    assert r.choices[0].message.content == expected.text
    assert r.model_extra["reform"]["context_id"] is None and live.worker.contexts.encoded == 0
    prompt = pipe.templater.prefix + pipe.templater.question(QUESTION, after_context=False).ids
    with torch.no_grad():
        out = pipe.engine.model.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False)
    assert expected.tokens == out[0, len(prompt):].tolist()[:len(expected.tokens)]
    streamed = chat(live.client(), [{"role": "user", "content": QUESTION}], max_tokens=8, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices).strip() == expected.text


def test_questions_do_not_wait_behind_an_encode(store):
    """While a long upload encodes, a question on a context already stored is answered between two of its
    chunks, exactly as the library answers it; questions that need the encode wait for it; and the
    interleaved encode stores the same context as an encode left alone."""
    long_doc = DOC * 6
    expected = make_pipe().encode(DOC).ask(QUESTION, max_new_tokens=10).text
    expected_long = make_pipe().encode(long_doc).ask(QUESTION, max_new_tokens=10).text
    pipe = make_pipe()
    chunk = pipe.engine._chunk

    def slow_chunk(*args):             # an encode's chunks (they report progress) take 0.2 s each
        if args[-1] is not None:
            time.sleep(0.2)
        return chunk(*args)

    pipe.engine._chunk = slow_chunk
    with LiveServer(pipe, store) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        client = server.client()
        assert chat(client, DOC_CHAT).choices[0].message.content == expected          # DOC is stored now
        key = http.post("/v1/contexts", json={"text": long_doc}).json()["id"]
        while (status := http.get(f"/v1/contexts/{key}").json())["tokens_encoded"] == 0:
            time.sleep(0.02)
        with concurrent.futures.ThreadPoolExecutor(2) as pool:   # a question on the context being encoded
            waiting = pool.submit(client.chat.completions.create, model="reform", max_tokens=10,
                                  extra_body={"context_id": key}, messages=[{"role": "user", "content": QUESTION}])
            answer = chat(client, DOC_CHAT)
            during = http.get(f"/v1/contexts/{key}").json()
            assert during["status"] == "encoding" and during["tokens_encoded"] < during["tokens"]
            assert answer.choices[0].message.content == expected
            assert answer.model_extra["reform"]["encoded"] is False
            assert not waiting.done()
            assert waiting.result().choices[0].message.content == expected_long
        assert http.get(f"/v1/contexts/{key}").json()["status"] == "ready" and server.worker.contexts.encoded == 2
    restored = make_pipe().load_context(store / f"{key}.reform")
    assert restored.ask(QUESTION, max_new_tokens=10).text == expected_long


def test_client_leaving_mid_stream_frees_the_worker(store, caplog):
    """... and leaves no "Future exception was never retrieved" traceback behind (a finding: 22 lines per
    disconnect)."""
    import gc
    pipe = make_pipe()
    logits = pipe.engine.logits
    pipe.engine.logits = lambda h: (time.sleep(0.05), logits(h))[1]      # ~20 tokens a second
    with LiveServer(pipe, store) as server:
        with httpx.stream("POST", f"{server.url}/v1/chat/completions", timeout=60,
                          json={"model": "reform", "messages": DOC_CHAT, "max_tokens": 250, "stream": True}) as r:
            next(r.iter_lines())
        t = time.time()
        while server.worker.busy():
            assert time.time() - t < 5, "the worker kept generating for a client that left"
            time.sleep(0.05)
        assert chat(server.client(), DOC_CHAT, max_tokens=3).choices[0].message.content is not None
        gc.collect()
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]


def test_a_streamed_chat_waiting_for_its_encode_gets_keep_alive_comments_with_progress(store, monkeypatch):
    """Finding: a streamed chat carrying an 8k document sent its first byte after 10 s, so a proxy with a
    read timeout dropped it. Now the stream opens at once and, until the answer starts, sends an SSE comment
    every few seconds with the encode's progress; the answer is the library's."""
    from reform.server import app as server_app
    monkeypatch.setattr(server_app, "KEEP_ALIVE_S", 0.2)
    monkeypatch.setattr(server_app, "FIRST_EVENT_S", 0.2)
    long_doc = DOC * 6
    messages = [{"role": "system", "content": long_doc}, {"role": "user", "content": QUESTION}]
    expected = make_pipe().encode(long_doc).ask(QUESTION, max_new_tokens=10).text
    pipe = make_pipe()
    original = pipe.method.encode

    def slow(p, ids, progress=None):
        def slower(n):
            time.sleep(0.05)
            progress(n)
        return original(p, ids, slower if progress else None)
    pipe.method.encode = slow
    with LiveServer(pipe, store) as server:
        t, first, comments, text = time.time(), None, [], ""
        with httpx.stream("POST", f"{server.url}/v1/chat/completions", timeout=60,
                          json={"model": "reform", "messages": messages, "max_tokens": 10, "stream": True}) as r:
            for line in r.iter_lines():
                first = first or time.time() - t
                if line.startswith(": "):
                    comments.append(json.loads(line[2:])["reform"]["encoding"])
                elif line.startswith("data: {"):
                    chunk = json.loads(line[6:])
                    text += "".join(c["delta"].get("content") or "" for c in chunk["choices"])
        assert first < 1.0 and len(comments) >= 3 and text == expected
        done = [c["tokens_encoded"] for c in comments if c]
        assert done == sorted(done) and len(set(done)) >= 2          # the progress moves


@pytest.mark.parametrize("body,status,words", [
    ({"n": 2}, 400, "n > 1"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, 400, "tool calls"),
    ({"logprobs": True}, 400, "log-probabilities"),
    ({"temperature": 5}, 400, "temperature"),
    ({"bogus_field": 1}, 400, "unknown field"),
    ({"model": "gpt-4o"}, 404, "not served here"),
    ({"messages": [{"role": "user", "content": DOC}, {"role": "assistant", "content": "ok"}]}, 400, "last message"),
    ({"messages": [{"role": "user", "content": "why? " * WINDOW}]}, 400, "window"),   # a question alone, too long
    ({"messages": []}, 400, "messages"),
    ({"context_id": "0" * 32}, 404, "not found"),
])
def test_bad_requests_get_openai_errors(live, body, status, words):
    payload = {"model": "reform", "messages": DOC_CHAT, **body}
    r = httpx.post(f"{live.url}/v1/chat/completions", json=payload, timeout=60)
    assert r.status_code == status and words in r.json()["error"]["message"]


@pytest.mark.parametrize("raw,words", [(b"{", "invalid request: Invalid JSON"), (b"[]", "invalid request: Input should be an object"),
                                       (b"", "invalid request: Invalid JSON")])
def test_a_body_that_is_no_json_object_is_a_400_that_says_so(live, raw, words):
    r = httpx.post(f"{live.url}/v1/chat/completions", content=raw, headers={"Content-Type": "application/json"}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["message"].startswith(words), r.text
    assert r.json()["error"]["param"] is None


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


def chunked_post(port: int, path: str, content_type: str, total: int, head: bytes = b"", piece: bytes = b"x" * 65536):
    """POST ``total`` bytes with ``Transfer-Encoding: chunked`` (no Content-Length) over a raw socket,
    reading the answer as soon as the server sends one; returns (status, bytes sent)."""
    import select
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: {content_type}\r\n"
                 "Transfer-Encoding: chunked\r\n\r\n".encode())
    sent, reply = 0, b""
    try:
        if head:
            sock.sendall(b"%x\r\n%s\r\n" % (len(head), head))
        while sent < total and not select.select([sock], [], [], 0)[0]:
            sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
            sent += len(piece)
        if sent >= total:
            sock.sendall(b"0\r\n\r\n")
    except (BrokenPipeError, ConnectionResetError):
        pass
    sock.settimeout(30)
    try:
        reply = sock.recv(65536)
    finally:
        sock.close()
    return int(reply.split(b" ", 2)[1]), sent


MULTIPART_HEAD = (b'--XyZ\r\nContent-Disposition: form-data; name="file"; filename="a.txt"\r\n'
                  b"Content-Type: text/plain\r\n\r\n")


@pytest.mark.parametrize("content_type,head", [("text/plain", b""), ("multipart/form-data; boundary=XyZ", MULTIPART_HEAD),
                                               ("application/json", b'{"text": "')])
def test_a_chunked_body_past_the_limit_is_refused_while_it_streams(store, content_type, head):
    """Finding: only Content-Length was checked, so a chunked multipart upload of 80 MB was read whole.
    Now the body is counted as it arrives, whatever its framing."""
    with LiveServer(make_pipe(), store, settings=Settings(max_body_bytes=200_000)) as server:
        status, sent = chunked_post(server.port, "/v1/contexts", content_type, total=20_000_000, head=head)
        assert status == 413 and sent < 5_000_000
        assert httpx.get(f"{server.url}/health").status_code == 200


def test_a_huge_text_is_refused_by_its_token_count_without_tokenising_it_whole(store):
    """Finding: a 50 MB upload was tokenised whole (61 s, +7 GB) before its 413. Now tokens are counted a
    piece at a time and counting stops at the limit."""
    from reform.server.app import Keys
    pipe = make_pipe()
    keys, text = Keys(pipe), DOC * 2000                  # ~1.2M characters, ~1.2M tokens of CharTokenizer
    counted = []
    encode = keys.templater.encode
    keys.templater.encode = lambda t: counted.append(len(t)) or encode(t)
    key, n = keys.of(text, limit=1000)
    assert key is None and n > 1000 and sum(counted) <= 2 * Keys.PIECE_CHARS
    assert keys.of(DOC, limit=1000)[0] == pipe.context_key(pipe.tokenize_context(DOC))


@pytest.mark.parametrize("raw,words", [
    (b'{"text": "hello \\ud800"}', "lone surrogate"),
    (b"[" * 100_000 + b"]" * 100_000, "not valid JSON"),
])
def test_upload_json_that_python_cannot_take_is_a_400(live, raw, words):
    r = httpx.post(f"{live.url}/v1/contexts", content=raw, headers={"Content-Type": "application/json"}, timeout=60)
    assert r.status_code == 400 and words in r.json()["error"]["message"], r.text


def test_a_nested_or_surrogate_chat_body_is_a_400(live):
    for raw in (b"[" * 100_000 + b"]" * 100_000,
                b'{"model": "reform", "messages": [{"role": "user", "content": "hello \\ud800"}]}'):
        r = httpx.post(f"{live.url}/v1/chat/completions", content=raw, headers={"Content-Type": "application/json"},
                       timeout=60)
        assert r.status_code == 400 and r.json()["error"]["message"].startswith("invalid request"), r.text


def wait_status(http, key: str, want: str, seconds: float = 60) -> dict:
    deadline = time.time() + seconds
    while (s := http.get(f"/v1/contexts/{key}").json()).get("status") != want:
        assert time.time() < deadline, f"context {key} is {s}, not {want}"
        time.sleep(0.05)
    return s


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


def test_metrics_request_ids_access_log_and_cors(store, caplog):
    import logging
    caplog.set_level(logging.INFO, logger="reform.access")
    settings = Settings(allowed_origins=("http://localhost:3000",))
    with LiveServer(make_pipe(), store, settings=settings) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        chat(server.client(), DOC_CHAT)
        r = http.get("/v1/models", headers={"X-Request-Id": "abc-123"})
        assert r.headers["x-request-id"] == "abc-123" and len(http.get("/health").headers["x-request-id"]) == 32
        logged = [json.loads(rec.getMessage()) for rec in caplog.records if rec.name == "reform.access"]
        assert {"request_id": "abc-123", "path": "/v1/models", "status": 200}.items() <= logged[-2].items()
        text = http.get("/metrics").text
        assert 'reform_requests_total{path="/v1/chat/completions",status="200"} 1.0' in text
        assert "reform_contexts_encoded_total 1.0" in text and "reform_queue_depth 0.0" in text
        tokens = float(next(l.split()[1] for l in text.splitlines() if l.startswith("reform_encoded_tokens_total")))
        assert tokens == server.worker.contexts.tokens_encoded > 0
        assert float(next(l.split()[1] for l in text.splitlines() if l.startswith("reform_store_bytes "))) > 0
        pre = http.options("/v1/chat/completions", headers={"Origin": "http://localhost:3000",
                                                            "Access-Control-Request-Method": "POST"})
        assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "http://localhost:3000"
        other = http.options("/v1/chat/completions", headers={"Origin": "http://evil.example",
                                                              "Access-Control-Request-Method": "POST"})
        assert "access-control-allow-origin" not in other.headers


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


def slow_pipe(seconds_per_chunk: float = 0.05):
    pipe = make_pipe()
    original = pipe.method.encode

    def slow(p, ids, progress=None):
        def slower(n):
            time.sleep(seconds_per_chunk)
            progress(n)
        return original(p, ids, slower if progress else None)
    pipe.method.encode = slow
    return pipe


def test_an_encode_started_by_a_chat_outlives_its_client_for_a_retry_then_stops_if_nobody_comes(store, monkeypatch):
    """Finding: a chat's client leaving cancelled and discarded its encode, so every retry started from
    zero. Now the encode goes on while another chat waits for it, or for a grace period after the last one
    left: a retry finds it in progress and the text is encoded once; with nobody back, it stops."""
    from reform.server import scheduler as scheduler_module
    long_doc = DOC * 6
    messages = [{"role": "system", "content": long_doc}, {"role": "user", "content": QUESTION}]
    expected = make_pipe().encode(long_doc).ask(QUESTION, max_new_tokens=10).text
    with LiveServer(slow_pipe(), store) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        key = server.app.state.service.keys.of(long_doc)[0]
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{server.url}/v1/chat/completions", timeout=0.8,
                       json={"model": "reform", "messages": messages, "max_tokens": 10})
        time.sleep(0.5)
        assert http.get(f"/v1/contexts/{key}").json()["status"] == "encoding"    # still going
        r = http.post("/v1/chat/completions", json={"model": "reform", "messages": messages, "max_tokens": 10})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == expected
        assert server.worker.contexts.encoded == 1
    monkeypatch.setattr(scheduler_module, "ABANDONED_GRACE_S", 0.3)
    other = "other " + long_doc
    with LiveServer(slow_pipe(), tmp_store := store.parent / "store2") as server, \
            httpx.Client(base_url=server.url, timeout=60) as http:
        key = server.app.state.service.keys.of(other)[0]
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{server.url}/v1/chat/completions", timeout=0.8, json={
                "model": "reform", "max_tokens": 10,
                "messages": [{"role": "system", "content": other}, {"role": "user", "content": QUESTION}]})
        s = wait_status(http, key, "failed", seconds=20)
        assert "cancelled" in s["error"] and server.worker.contexts.encoded == 0 and not tmp_store.joinpath(f"{key}.reform").exists()


QUESTIONS = ["What does the fox do?", "Where did the cat sit?", "What is near the door?", "Is the dog lazy?",
             "What colour is the fox?", "Who jumps?"]


def slow_logits(pipe, seconds: float = 0.03):
    logits = pipe.engine.logits
    pipe.engine.logits = lambda h: (time.sleep(seconds), logits(h))[1]
    return pipe


def test_questions_asked_at_once_decode_together_and_equal_the_library(live):
    """Continuous batching: six different questions sent at once (plain and streamed) are answered as the
    library answers each alone, and the worker gave them their tokens in fewer steps than tokens."""
    ctx = make_pipe().encode(DOC)
    expected = [ctx.ask(q, max_new_tokens=n).text for q, n in zip(QUESTIONS, (12, 5, 9, 12, 3, 7))]
    client = live.client()
    chat(client, DOC_CHAT, max_tokens=1)                  # the document is stored once
    steps = live.worker.steps

    def ask(i):
        messages = [DOC_CHAT[0], {"role": "user", "content": QUESTIONS[i]}]
        n = (12, 5, 9, 12, 3, 7)[i]
        if i % 2:
            return "".join(c.choices[0].delta.content or "" for c in chat(client, messages, max_tokens=n, stream=True)
                           if c.choices).strip(), None
        r = chat(client, messages, max_tokens=n)
        return r.choices[0].message.content, r.usage.completion_tokens
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        got = list(pool.map(ask, range(6)))
    assert [text for text, _ in got] == expected
    tokens = sum(len(make_pipe().tokenizer(e, add_special_tokens=False)["input_ids"]) for e in expected)
    assert live.worker.steps - steps < tokens            # steps served several answers each
    assert not live.worker.together and live.worker.together.batch.nbytes() == 0


def test_a_client_leaving_mid_batch_frees_its_place_and_the_others_are_unchanged(store):
    pipe = slow_logits(make_pipe())
    ctx = make_pipe().encode(DOC)
    expected = [ctx.ask(q, max_new_tokens=40).text for q in QUESTIONS[1:3]]
    with LiveServer(pipe, store) as server:
        client = server.client()
        chat(client, DOC_CHAT, max_tokens=1)
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            others = [pool.submit(chat, client, [DOC_CHAT[0], {"role": "user", "content": q}], max_tokens=40)
                      for q in QUESTIONS[1:3]]
            with httpx.stream("POST", f"{server.url}/v1/chat/completions", timeout=60,
                              json={"model": "reform", "messages": DOC_CHAT, "max_tokens": 200, "stream": True}) as r:
                for line in r.iter_lines():
                    if '"content"' in line:
                        break                           # the first token arrived: leave
            deadline = time.time() + 5
            while len(server.worker.together) > 2:      # its place is freed at the next step
                assert time.time() < deadline, "the answer of a client that left kept decoding"
                time.sleep(0.01)
            assert [f.result().choices[0].message.content for f in others] == expected
        assert "reform_batch_size 0.0" in httpx.get(f"{server.url}/metrics").text


def test_an_encode_runs_while_answers_decode_and_neither_waits_for_the_other(store):
    """An upload encodes chunk by chunk while a batch decodes: answers keep coming during the encode (they
    end before it), the encode finishes, and both equal what the library computes alone."""
    long_doc = DOC * 6
    ctx = make_pipe().encode(DOC)
    expected = [ctx.ask(q, max_new_tokens=30).text for q in QUESTIONS[:3]]
    expected_long = make_pipe().encode(long_doc).ask(QUESTION, max_new_tokens=10).text
    pipe = slow_logits(slow_pipe(0.2), 0.01)
    with LiveServer(pipe, store) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        client = server.client()
        chat(client, DOC_CHAT, max_tokens=1)
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            answers = [pool.submit(chat, client, [DOC_CHAT[0], {"role": "user", "content": q}], max_tokens=30)
                       for q in QUESTIONS[:3]]
            while len(server.worker.together) < 3:
                time.sleep(0.005)
            key = http.post("/v1/contexts", json={"text": long_doc}).json()["id"]
            assert [f.result().choices[0].message.content for f in answers] == expected
            assert http.get(f"/v1/contexts/{key}").json()["status"] == "encoding"     # answered during it
        wait_status(http, key, "ready")
        long = client.chat.completions.create(model="reform", max_tokens=10, extra_body={"context_id": key},
                                              messages=[{"role": "user", "content": QUESTION}])
        assert long.choices[0].message.content == expected_long
