"""A live `reform serve` for tests: uvicorn on a free loopback port serving ``build_app`` over a tiny
random-weight model, the document and question the server tests ask, and a pipe whose encode is slowed."""

import socket
import threading
import time

import openai
import uvicorn

from reform.pipeline import Pipeline
from reform.server import build_app
from reform.server.http import HEADER_TIMEOUT_S, KEEP_ALIVE_S, protocol

from conftest import CharTokenizer, tiny


DOC = "The quick brown fox jumps over the lazy dog. A cat sat on the mat near the door. " * 7
QUESTION = "What does the fox do?"
OPTIONS = dict(heads="1:v:0,2:q:3,1:k:1", chunk_size=64, cache_budget=96, recompute_budget=200)


def make_pipe():
    return Pipeline(tiny("llama"), CharTokenizer(), **OPTIONS)


class LiveServer:
    """uvicorn serving ``build_app(...)`` on a free loopback port in a background thread."""

    def __init__(self, pipe, store, header_timeout: float = HEADER_TIMEOUT_S, **kw):
        self.app = build_app(pipe, store, **kw)
        self.worker = self.app.state.worker
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    http=protocol(header_timeout), timeout_keep_alive=KEEP_ALIVE_S))

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


def chat(client, messages, **kw):
    return client.chat.completions.create(messages=messages, **{"model": "reform", "max_tokens": 10, **kw})


DOC_CHAT = [{"role": "system", "content": DOC}, {"role": "user", "content": QUESTION}]


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


def wait_status(http, key: str, want: str, seconds: float = 60) -> dict:
    deadline = time.time() + seconds
    while (s := http.get(f"/v1/contexts/{key}").json()).get("status") != want:
        assert time.time() < deadline, f"context {key} is {s}, not {want}"
        time.sleep(0.05)
    return s
