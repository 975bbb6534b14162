"""`reform serve` over loopback: the step loop's scheduling seen from clients: a full queue, arrival
order, questions beside encodes, clients that leave, keep-alive while an encode runs, and answers decoded
together."""

import asyncio
import concurrent.futures
import json
import threading
import time

import httpx
import openai
import pytest

from reform.server import Settings
from reform.server.scheduler import Job

from live_server import DOC, DOC_CHAT, QUESTION, LiveServer, chat, make_pipe, slow_pipe, wait_status


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
