"""A deleted context stays deleted (issue 100): a delete while it encodes leaves no file, note or status
behind, in this process or after a restart on the same store."""

import time

import httpx

from live_server import DOC, LiveServer, make_pipe, slow_pipe, wait_status


def settle(live, seconds: float = 30) -> None:
    """Wait until no encode runs or waits on ``live``'s worker."""
    deadline = time.time() + seconds
    while live.worker.contexts.uploads or live.worker.contexts.scheduler.encoder is not None:
        assert time.time() < deadline, "the encode did not end"
        time.sleep(0.05)
    time.sleep(0.2)


def test_a_context_deleted_while_it_encodes_stays_deleted_across_a_restart(store):
    with LiveServer(slow_pipe(0.2), store) as live, httpx.Client(base_url=live.url, timeout=60) as http:
        key = http.post("/v1/contexts", json={"text": DOC * 4}).json()["id"]
        wait_status(http, key, "encoding")
        assert http.delete(f"/v1/contexts/{key}").status_code == 200
        settle(live)
        assert http.get(f"/v1/contexts/{key}").status_code == 404
        assert key not in [c["id"] for c in http.get("/v1/contexts").json()["data"]]
    assert [p.name for p in store.rglob("*") if p.is_file() and key in p.name] == []   # no file, no note
    with LiveServer(make_pipe(), store) as live, httpx.Client(base_url=live.url, timeout=60) as http:
        assert http.get(f"/v1/contexts/{key}").status_code == 404
        # the same text uploaded again is encoded again and reads ready
        assert http.post("/v1/contexts", json={"text": DOC * 4}).json()["id"] == key
        wait_status(http, key, "ready")


def test_a_context_deleted_as_its_encode_saves_it_is_not_kept(store, monkeypatch):
    """The delete lands between the encode's last chunk and its save: the saved file is removed and the
    context is not kept in memory."""
    pipe = make_pipe()
    with LiveServer(pipe, store) as live, httpx.Client(base_url=live.url, timeout=60) as http:
        contexts = live.worker.contexts
        put = contexts.store.put

        def put_then_delete(key, ctx):
            n = put(key, ctx)
            contexts.forget(key)            # as DELETE does, from another thread
            return n
        monkeypatch.setattr(contexts.store, "put", put_then_delete)
        key = http.post("/v1/contexts", json={"text": DOC}).json()["id"]
        settle(live)
        assert http.get(f"/v1/contexts/{key}").status_code == 404
        assert not contexts.at_hand(key) and key not in contexts.loaded
