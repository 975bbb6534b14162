"""`reform serve` over loopback: bad and oversize requests each get a clear OpenAI-shaped error, refused
as early as they can be (a chunked body while it streams, a huge text by its token count)."""

import socket

import httpx
import pytest

from reform.server import Settings

from conftest import WINDOW
from live_server import DOC, DOC_CHAT, QUESTION, LiveServer, make_pipe


def test_oversize_body_and_context(store):
    with LiveServer(make_pipe(), store, settings=Settings(max_body_bytes=2000, max_context_tokens=400)) as server:
        big = [{"role": "system", "content": "x" * 5000}, {"role": "user", "content": QUESTION}]
        r = httpx.post(f"{server.url}/v1/chat/completions", json={"model": "reform", "messages": big})
        assert r.status_code == 413 and "over the limit" in r.json()["error"]["message"]
        r = httpx.post(f"{server.url}/v1/contexts", json={"text": DOC[:1500]})
        assert r.status_code == 413 and "tokens" in r.json()["error"]["message"]


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
    # JSON types as sent, as OpenAI checks them: no coercion of strings or booleans (issue 100)
    ({"max_tokens": True}, 400, "max_tokens"),
    ({"max_tokens": "5"}, 400, "max_tokens"),
    ({"stream": "yes"}, 400, "stream"),
    ({"temperature": "0.5"}, 400, "temperature"),
    ({"stream_options": {"include_usage": 1}}, 400, "include_usage"),
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
