"""An unexpected error answers 500 in the OpenAI shape, logs its traceback once, and leaves the
keep-alive connection usable for the client's next request (issue 100)."""

import logging
import socket

from live_server import DOC_CHAT


def exchange(sock: socket.socket, request: bytes) -> bytes:
    """Send one HTTP/1.1 request on ``sock`` and read its whole response (by Content-Length)."""
    sock.sendall(request)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the server closed the connection: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection mid-body"
        body += chunk
    return head + b"\r\n\r\n" + body


def test_a_500_keeps_the_connection_and_logs_its_traceback(live, monkeypatch, caplog):
    def broken(model):
        raise RuntimeError("a bug, with /secret/path in its words")
    monkeypatch.setattr(live.app.state.service, "check_model", broken)
    import json
    body = json.dumps({"model": "reform", "messages": DOC_CHAT, "max_tokens": 2}).encode()
    chat = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    with caplog.at_level(logging.ERROR, logger="reform.server"), socket.create_connection(("127.0.0.1", live.port)) as s:
        first = exchange(s, chat)
        assert first.startswith(b"HTTP/1.1 500") and b'"internal error: RuntimeError"' in first
        assert b"/secret/path" not in first
        second = exchange(s, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")    # the same connection
        assert second.startswith(b"HTTP/1.1 200") and b'"object":"list"' in second
    logged = [r for r in caplog.records if r.name == "reform.server"]
    assert len(logged) == 1 and logged[0].exc_info and "/v1/chat/completions" in logged[0].getMessage()


def test_a_client_that_sends_its_headers_a_byte_at_a_time_is_cut_at_the_header_timeout(store):
    """Slowloris (issue 100): every byte resets uvicorn's keep-alive timer, not the head's deadline."""
    import time

    from live_server import LiveServer, make_pipe
    with LiveServer(make_pipe(), store, header_timeout=1.0) as live:
        with socket.create_connection(("127.0.0.1", live.port)) as s:
            began, answer = time.monotonic(), b""
            s.settimeout(0.2)
            for byte in b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 40:
                try:
                    s.sendall(bytes([byte]))
                except OSError:          # the server closed the connection
                    break
                try:
                    if (got := s.recv(4096)) == b"" or got:
                        answer += got
                        break
                except socket.timeout:
                    continue
            assert answer.startswith(b"HTTP/1.1 408") or answer == b""
            assert 0.9 < time.monotonic() - began < 3.0
        with socket.create_connection(("127.0.0.1", live.port)) as s:        # a prompt client is served
            assert exchange(s, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n").startswith(b"HTTP/1.1 200")


def test_a_failed_job_logs_its_traceback_and_encodes_log_their_start_and_end(live, monkeypatch, caplog):
    """The operator sees why a job failed, and each encode's tokens, seconds and bytes (issue 102)."""
    import httpx
    import openai
    import pytest

    from live_server import DOC, chat, wait_status
    with caplog.at_level(logging.INFO, logger="reform.server"), httpx.Client(base_url=live.url, timeout=60) as http:
        key = http.post("/v1/contexts", json={"text": DOC}).json()["id"]
        wait_status(http, key, "ready")
        def broken(*a, **k):
            raise RuntimeError("a bug in the model thread")
        monkeypatch.setattr(live.worker.contexts, "context", broken)
        with pytest.raises(openai.InternalServerError):
            chat(live.client(), [{"role": "user", "content": "Why?"}], extra_body={"context_id": key})
    lines = [r for r in caplog.records if r.name == "reform.server"]
    assert any(r.getMessage().startswith(f"encode started: context {key}") for r in lines)
    assert any(r.getMessage().startswith(f"encode finished: context {key}") and "bytes stored" in r.getMessage()
               for r in lines)
    failed = [r for r in lines if "job failed" in r.getMessage()]
    assert len(failed) == 1 and failed[0].exc_info[0] is RuntimeError
