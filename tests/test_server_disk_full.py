"""A full disk is a 507 Insufficient Storage on every path that writes, and leaves no part behind
(issue 100): an upload to /v1/files, and a chat whose new document's context cannot be saved."""

import errno
import os

import httpx
import openai
import pytest
from fsspec.implementations.local import LocalFileSystem
from safetensors import SafetensorError

from live_server import DOC, DOC_CHAT, chat


def test_a_file_upload_on_a_full_disk_is_a_507_and_leaves_no_temporary(live, store, monkeypatch):
    move = LocalFileSystem.mv

    def full(self, path1, path2, *a, **k):
        if "/files/" in str(path2):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path2))
        return move(self, path1, path2, *a, **k)
    monkeypatch.setattr(LocalFileSystem, "mv", full)
    r = httpx.post(f"{live.url}/v1/files", files={"file": ("notes.txt", DOC.encode())}, data={"purpose": "user_data"})
    assert r.status_code == 507 and r.json()["error"]["code"] == "insufficient_storage", r.text
    assert [p.name for p in store.rglob("*") if p.is_file() and "/files/" in str(p)] == []
    monkeypatch.setattr(LocalFileSystem, "mv", move)
    again = httpx.post(f"{live.url}/v1/files", files={"file": ("notes.txt", DOC.encode())}, data={"purpose": "user_data"})
    assert again.status_code == 200 and httpx.get(f"{live.url}/v1/files").json()["data"][0]["id"] == again.json()["id"]
    assert len(httpx.get(f"{live.url}/v1/files").json()["data"]) == 1           # the failed one is not listed


def test_a_chat_whose_new_context_cannot_be_saved_is_a_507_and_the_next_one_is_answered(live, monkeypatch):
    contexts = live.worker.contexts
    put = contexts.store.put

    def full(key, ctx):
        raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, '
                              'message: "No space left on device" })')
    monkeypatch.setattr(contexts.store, "put", full)
    with pytest.raises(openai.APIStatusError) as refused:
        chat(live.client(), DOC_CHAT)
    assert refused.value.status_code == 507 and "storage is full" in refused.value.message
    monkeypatch.setattr(contexts.store, "put", put)
    assert chat(live.client(), DOC_CHAT).choices[0].finish_reason in ("stop", "length")
