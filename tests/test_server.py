"""`reform serve` over loopback: the OpenAI API (chat, streams, contexts, models, keys, metrics) of a real
uvicorn server on 127.0.0.1 with a tiny random-weight model, spoken to by the official `openai` client and by
`httpx`."""

import concurrent.futures
import json
import time

import httpx
import openai
import pytest
import torch

from reform.server import Settings

from conftest import WINDOW
from live_server import DOC, DOC_CHAT, QUESTION, LiveServer, chat, make_pipe


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
    assert chunks[-1].usage.completion_tokens == len(expected.tokens) and chunks[-1].choices == []
    # usage comes once, only when asked: summed over chunks as langchain-openai sums it, it is the answer's
    assert sum(c.usage.prompt_tokens for c in chunks if c.usage) == r.usage.prompt_tokens
    assert all(c.usage is None for c in chat(client, DOC_CHAT, stream=True))
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
    card = client.models.retrieve(name).model_extra      # how long an input may be, not only the window (issue 101)
    assert card["max_model_len"] == Settings().max_context_tokens and card["window"] == WINDOW


def test_a_served_model_name_is_listed_and_answered_to(store):
    with LiveServer(make_pipe(), store, settings=Settings(model_id="acme-reader")) as server:
        client = server.client()
        assert [m.id for m in client.models.list()] == ["acme-reader"]
        assert chat(client, DOC_CHAT, model="acme-reader").choices[0].finish_reason in ("stop", "length")


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


def test_api_key(store):
    with LiveServer(make_pipe(), store, settings=Settings(api_key="s3cret")) as server:
        with pytest.raises(openai.AuthenticationError):
            chat(server.client("wrong"), DOC_CHAT)
        assert httpx.get(f"{server.url}/v1/models").status_code == 401
        assert httpx.get(f"{server.url}/health").status_code == 200
        assert chat(server.client("s3cret"), DOC_CHAT).choices[0].message.content


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
