"""Scale-out on a real local Ray cluster (2 CPUs) with a tiny random-weight model saved to disk: a corpus
encoded into a store by a pool of actors answers like the same documents encoded in-process, a re-run
skips what is stored, a worker killed mid-document is retried and its document stored once, and two Ray
Serve replicas answer from one store over HTTP (official ``openai`` client and ``httpx``), each tenant of
a shared keys file seeing only its own contexts on every replica."""

import concurrent.futures
import os
import signal
import socket
import time

import pytest

ray = pytest.importorskip("ray")

from reform.cluster.encode import encode_in_process, encode_on_ray, load_pipeline  # noqa: E402
from reform.store import ContextStore  # noqa: E402

QUESTION = "Which city is the meeting in?"
OPTIONS = dict(heads="1:v:0,2:q:3,1:k:1", chunk_size=64, cache_budget=96, recompute_budget=200, device="cpu",
               dtype="fp32")


def document(i: int, repeat: int = 12) -> str:
    city = ["Lisbon", "Osaka", "Quito", "Tromso", "Perth"][i % 5]
    return (f"Document {i}. " + "The harbour was quiet and the gulls were loud. " * repeat
            + f"The meeting is in {city}. " + "Ships came and went all afternoon. " * repeat)


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
             ignore_reinit_error=True)
    yield
    try:
        from ray import serve
        serve.shutdown()
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def load(tiny_model_dir):
    return {"model": str(tiny_model_dir), "method": "reform", **OPTIONS}


@pytest.fixture(scope="module")
def local_pipe(load):
    return load_pipeline(load)


def write_corpus(folder, n):
    folder.mkdir()
    paths = []
    for i in range(n):
        paths.append(folder / f"doc{i}.txt")
        paths[-1].write_text(document(i, repeat=8 + 3 * i))
    return [str(p) for p in paths]


def test_corpus_on_ray_answers_like_in_process_and_skips_stored(cluster, load, local_pipe, tmp_path):
    from reform.documents import extract
    docs = write_corpus(tmp_path / "corpus", 4)
    (tmp_path / "corpus" / "broken.txt").write_bytes(b"\x00\x01binary")
    docs.append(str(tmp_path / "corpus" / "broken.txt"))
    store_url = str(tmp_path / "store")
    events = []
    results = encode_on_ray(docs, store_url, load, workers=2, on_event=events.append)
    by_doc = {r.document: r for r in results}
    assert sorted(by_doc) == sorted(docs)
    assert by_doc[docs[-1]].status == "failed" and "binary" in by_doc[docs[-1]].error
    store = ContextStore(store_url)
    assert len(store.entries()) == 4 and store.temporaries() == []
    assert {e[3] for e in events if e[0] == "start"}.__len__() == 2          # both workers took documents
    for path in docs[:-1]:
        text = open(path).read()
        result = by_doc[path]
        assert result.status == "encoded" and result.tokens == local_pipe.tokenize_context(text).shape[0]
        # named by content and by its map (the file's name is in the evidence of its answers)
        assert result.key == local_pipe.context_key(local_pipe.tokenize_context(text), document=extract(path))
        with store.open_local(result.key) as file:
            from_cluster = local_pipe.load_context(file).ask(QUESTION, max_new_tokens=8)
        here = local_pipe.encode(text).ask(QUESTION, max_new_tokens=8)
        assert from_cluster.tokens == here.tokens
    again = encode_on_ray(docs[:-1], store_url, load, workers=2)
    assert sorted(r.status for r in again) == ["stored"] * 4
    in_process = encode_in_process(docs[:-1], store_url, load)        # the same keys in one process
    assert [r.status for r in in_process] == ["stored"] * 4


def test_a_killed_worker_is_retried_and_its_document_stored_once(cluster, load, local_pipe, tmp_path):
    long_doc = tmp_path / "long.txt"
    long_doc.write_text(document(3, repeat=100))        # ~110 chunks: still running when killed
    store_url = str(tmp_path / "store")
    killed, starts = [], []

    def on_event(event):
        kind, _, _, pid = event
        if kind == "start":
            starts.append(pid)
        elif kind == "tokens" and not killed:
            killed.append(pid)
            os.kill(pid, signal.SIGKILL)

    [result] = encode_on_ray([str(long_doc)], store_url, load, workers=1, on_event=on_event)
    assert killed and len(starts) == 2 and starts[1] != killed[0]     # started again in a new process
    assert result.status == "encoded"
    store = ContextStore(store_url)
    assert [e.key for e in store.entries()] == [result.key] and store.temporaries() == []
    with store.open_local(result.key) as file:
        ctx = local_pipe.load_context(file)
    assert ctx.ask(QUESTION, max_new_tokens=8).tokens == \
        local_pipe.encode(long_doc.read_text()).ask(QUESTION, max_new_tokens=8).tokens


def test_one_document_split_over_workers_answers_like_in_process(cluster, load, tmp_path):
    """REFORM's segment-parallel encode with its segments on two actors equals the same split in-process."""
    import torch
    doc = tmp_path / "doc.txt"
    doc.write_text(document(2, repeat=40))
    split = {**load, "segments": 3}
    [result] = encode_on_ray([str(doc)], str(tmp_path / "store"), split, workers=2)
    assert result.status == "encoded"
    pipe = load_pipeline(split)
    here = pipe.encode(doc.read_text())
    from reform.documents import extract
    assert result.key == pipe.context_key(here.ids, document=extract(str(doc)))
    with ContextStore(str(tmp_path / "store")).open_local(result.key) as file:
        there = pipe.load_context(file)
    torch.testing.assert_close(there.state.data, here.state.data, atol=2e-3, rtol=0)   # 1 vs 2 threads
    assert there.ask(QUESTION, max_new_tokens=8).tokens == here.ask(QUESTION, max_new_tokens=8).tokens


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def serve_port():
    """The one port of Serve's HTTP proxy: it is started once per cluster and keeps its first port."""
    return free_port()


def test_two_serve_replicas_answer_from_one_store(cluster, load, local_pipe, tmp_path, serve_port):
    import httpx
    import openai
    from ray import serve

    from reform.cluster import serve as cluster_serve

    from reform.server import Settings

    store_url = str(tmp_path / "store")
    port = serve_port
    (tmp_path / "keys.txt").write_text("alice:key-a\nbob:key-b\n")       # every replica reads the same file
    cluster_serve.run(load, store_url, host="127.0.0.1", port=port, replicas=2, blocking=False,
                      settings=Settings(keys_file=str(tmp_path / "keys.txt")))
    base = f"http://127.0.0.1:{port}"
    try:
        text = document(1)
        with httpx.Client(base_url=base, timeout=120, headers={"Authorization": "Bearer key-a"}) as http:
            key = http.post("/v1/contexts", json={"text": text}).json()["id"]
            store = ContextStore(store_url)
            deadline = time.time() + 120
            while not store.has(f"tenants/alice/{key}"):    # encoded by whichever replica took the upload
                assert time.time() < deadline, "the context was not stored"
                time.sleep(0.2)
        with httpx.Client(base_url=base, timeout=120, headers={"Authorization": "Bearer key-b"}) as bob:
            replicas = set()
            for _ in range(40):                   # until both replicas have answered bob
                listed, got = bob.get("/v1/contexts").json()["data"], bob.get(f"/v1/contexts/{key}")
                assert listed == [] and got.status_code == 404
                replicas.add(got.headers["x-reform-worker"])
                if len(replicas) == 2:
                    break
            assert len(replicas) == 2
        expected = local_pipe.encode(text).ask(QUESTION, max_new_tokens=8).text
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="key-a", max_retries=0, timeout=120)

        def ask(_):
            raw = client.chat.completions.with_raw_response.create(
                model="reform", max_tokens=8, extra_body={"context_id": key},
                messages=[{"role": "user", "content": QUESTION}])
            return raw.headers["x-reform-worker"], raw.parse().choices[0].message.content

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(ask, range(12)))
        assert {text for _, text in answers} == {expected}
        assert len({worker for worker, _ in answers}) == 2           # both replicas answered from the store
    finally:
        serve.delete(cluster_serve.APP_NAME)


def test_a_library_encoded_on_ray_is_asked_by_serve_replicas(cluster, load, local_pipe, tmp_path, serve_port):
    """`reform encode DIR --store S --library L --ray`: the workers prepare each document (encoded, its passages
    written) and the driver enters them; `reform serve --ray` replicas then ask the library as a vector store,
    with the answer the library gives in this process."""
    import openai
    from ray import serve

    from reform.cluster import serve as cluster_serve
    from reform.cluster.encode import enter_library
    from reform.library import Library

    docs = write_corpus(tmp_path / "corpus", 3)
    store_url = str(tmp_path / "store")
    results = encode_on_ray(docs, store_url, load, workers=2, library=("harbour", str(tmp_path / "corpus")))
    assert sorted(r.status for r in results) == ["encoded"] * 3 and enter_library(store_url, "harbour", results) == 3
    library = Library(local_pipe, store_url, name="harbour")
    assert [d.name for d in library.documents()] == ["doc0.txt", "doc1.txt", "doc2.txt"]
    expected = library.ask(QUESTION, max_new_tokens=8)
    port = serve_port
    cluster_serve.run(load, store_url, host="127.0.0.1", port=port, replicas=1, blocking=False)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=120)
        assert "harbour" in [s.id for s in client.vector_stores.list().data]
        response = client.responses.create(model="reform", input=QUESTION, max_output_tokens=8,
                                           tools=[{"type": "file_search", "vector_store_ids": ["harbour"]}])
        assert response.output_text == expected.text
        assert response.model_extra["reform"]["evidence"] == [p.to_json() for p in expected.evidence]
    finally:
        serve.delete(cluster_serve.APP_NAME)
