"""Vector stores over `reform serve` (docs/server.md, "Vector stores"), spoken to by the official `openai` client
over loopback: a library of uploaded files, each encoded once by a queued job; questions through the
Responses API's `file_search` tool and through a chat's `vector_store_ids`, with evidence naming the file;
another tenant's vector store is a 404; bad input gets its status and nothing is lost."""

import time

import httpx
import openai
import pytest

from reform.server import Settings

from live_server import LiveServer, make_pipe
from test_tenants import ALICE, BOB, keys_file

WORDS = "apple river stone cloud maple harbor lantern violet copper meadow".split()


def text(i: int) -> bytes:
    import random
    rng = random.Random(i)
    filler = lambda: " ".join(rng.choice(WORDS) for _ in range(80))
    return f"# Lighthouse {i}\n\n{filler()}\n\nThe keeper of lighthouse {i} was named Keeper{i}.\n\n{filler()}\n".encode()


QUESTION = "Who was the keeper of lighthouse 2?"
FILE_SEARCH = lambda *ids: [{"type": "file_search", "vector_store_ids": list(ids)}]


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    keys = keys_file(tmp_path_factory.mktemp("keys"))
    with LiveServer(make_pipe(), tmp_path_factory.mktemp("store"), settings=Settings(keys_file=keys)) as server:
        yield server


def test_a_vector_store_of_files_answers_through_responses_and_chat(live):
    client = live.client(ALICE)
    files = [client.files.create(file=(f"light{i}.md", text(i)), purpose="assistants") for i in (1, 2, 3)]
    with pytest.raises(openai.BadRequestError, match="no format reform reads"):     # refused at upload
        client.files.create(file=("broken.md", b"\x00\x01binary"), purpose="assistants")
    missing = "file-" + "0" * 24
    store = client.vector_stores.create(name="lighthouses")
    assert store.id.startswith("vs_") and store.name == "lighthouses" and store.file_counts.total == 0
    first = client.vector_stores.files.create_and_poll(vector_store_id=store.id, file_id=files[0].id,
                                                       poll_interval_ms=50)
    assert first.status == "completed" and first.usage_bytes > 0
    batch = client.vector_stores.file_batches.create_and_poll(
        vector_store_id=store.id, file_ids=[files[1].id, files[2].id, missing], poll_interval_ms=50)
    assert (batch.file_counts.completed, batch.file_counts.failed, batch.file_counts.total) == (2, 1, 3)
    failed = client.vector_stores.files.retrieve(missing, vector_store_id=store.id)     # the others are added
    assert failed.status == "failed" and failed.last_error.code == "invalid_file" and "not found" in failed.last_error.message
    listed = client.vector_stores.files.list(vector_store_id=store.id)
    assert {f.id for f in listed.data} == {f.id for f in files} | {missing}
    assert client.vector_stores.retrieve(store.id).file_counts.completed == 3
    assert client.vector_stores.update(store.id, name="lights").name == "lights"
    assert store.id in [s.id for s in client.vector_stores.list().data]

    response = client.responses.create(model="reform", input=QUESTION, tools=FILE_SEARCH(store.id),
                                       include=["file_search_call.results"], max_output_tokens=6)
    search, message = response.output
    assert search.type == "file_search_call" and search.queries == [QUESTION] and search.results
    assert {r.filename for r in search.results} <= {"light1.md", "light2.md", "light3.md"}
    assert isinstance(response.output_text, str) and response.usage.output_tokens <= 6
    cited = {a.file_id for a in message.content[0].annotations}
    assert cited and cited <= {f.id for f in files}
    reform = response.model_extra["reform"]
    assert {e["document"] for e in reform["evidence"]} <= {"light1.md", "light2.md", "light3.md"}
    assert reform["stats"]["library"]["documents"] == 3

    chunks = list(client.chat.completions.create(model="reform", messages=[{"role": "user", "content": QUESTION}],
                                                 max_tokens=6, stream=True,
                                                 extra_body={"vector_store_ids": [store.id]}))
    last = [c for c in chunks if c.choices and c.choices[0].finish_reason][-1]
    assert last.model_extra["reform"]["evidence"]
    whole = client.chat.completions.create(model="reform", messages=[{"role": "user", "content": QUESTION}],
                                           max_tokens=6, extra_body={"vector_store_ids": [store.id]})
    assert whole.choices[0].message.content == "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert whole.model_extra["reform"]["evidence"] == reform["evidence"]

    removed = client.vector_stores.files.delete(files[0].id, vector_store_id=store.id)
    assert removed.deleted and client.vector_stores.retrieve(store.id).file_counts.total == 3
    assert client.vector_stores.delete(store.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.vector_stores.retrieve(store.id)


def test_another_tenants_vector_store_is_not_found(live):
    alice, bob = live.client(ALICE), live.client(BOB)
    made = alice.files.create(file=("light1.md", text(1)), purpose="assistants")
    store = alice.vector_stores.create(name="alice's")
    alice.vector_stores.files.create_and_poll(vector_store_id=store.id, file_id=made.id, poll_interval_ms=50)
    assert store.id not in [s.id for s in bob.vector_stores.list().data]
    for call in (lambda: bob.vector_stores.retrieve(store.id),
                 lambda: bob.vector_stores.files.list(vector_store_id=store.id),
                 lambda: bob.vector_stores.delete(store.id),
                 lambda: bob.vector_stores.files.create(vector_store_id=store.id, file_id=made.id),
                 lambda: bob.responses.create(model="reform", input=QUESTION, tools=FILE_SEARCH(store.id))):
        with pytest.raises(openai.NotFoundError):
            call()
    mine = bob.vector_stores.create(name="bob's")
    with pytest.raises(openai.NotFoundError):          # alice's file is no file of bob's
        bob.vector_stores.files.create(vector_store_id=mine.id, file_id=made.id)
    assert alice.vector_stores.retrieve(store.id).file_counts.completed == 1      # nothing of alice's is gone


def test_bad_requests_get_their_status(live):
    client = live.client(ALICE)
    empty = client.vector_stores.create(name="empty")
    bad = [(lambda: client.vector_stores.retrieve("vs_nope"), openai.NotFoundError),
           (lambda: client.responses.create(model="reform", input=QUESTION, tools=FILE_SEARCH(empty.id)),
            openai.BadRequestError),
           (lambda: client.responses.create(model="reform", input=QUESTION, tools=[{"type": "web_search"}]),
            openai.BadRequestError),
           (lambda: client.responses.create(model="reform", input=QUESTION, tools=FILE_SEARCH(empty.id), stream=True),
            openai.BadRequestError),
           (lambda: client.vector_stores.files.create(vector_store_id=empty.id, file_id="file-" + "0" * 24),
            openai.NotFoundError)]
    for call, error in bad:
        with pytest.raises(error):
            call()
    r = httpx.post(f"{live.url}/v1/chat/completions", headers={"Authorization": f"Bearer {ALICE}"},
                   json={"model": "reform", "messages": [{"role": "user", "content": QUESTION}],
                         "vector_store_ids": [empty.id]}, timeout=60)
    assert r.status_code == 400 and "no file ready" in r.json()["error"]["message"]
    alone = client.responses.create(model="reform", input=QUESTION, max_output_tokens=4)     # no tool: the model
    assert alone.output[0].type == "message"


def test_a_library_over_the_tenants_quota_is_refused_and_keeps_what_it_had(tmp_path):
    with LiveServer(make_pipe(), tmp_path / "store", settings=Settings(keys_file=keys_file(tmp_path, contexts=1))) as live:
        client = live.client(ALICE)
        store = client.vector_stores.create(name="small")
        one, two = (client.files.create(file=(f"light{i}.md", text(i)), purpose="assistants") for i in (1, 2))
        assert client.vector_stores.files.create_and_poll(vector_store_id=store.id, file_id=one.id,
                                                          poll_interval_ms=50).status == "completed"
        with pytest.raises(openai.APIStatusError) as refused:
            client.vector_stores.files.create(vector_store_id=store.id, file_id=two.id)
        assert refused.value.status_code == 413 and "quota" in refused.value.message
        assert [f.id for f in client.vector_stores.files.list(vector_store_id=store.id).data] == [one.id]


def test_the_store_budget_never_removes_a_librarys_documents(tmp_path):
    """`--store-max-gb` removes the least recently used contexts, but not those a vector store holds."""
    with LiveServer(make_pipe(), tmp_path / "store", store_max_bytes=1) as live:
        client = live.client()
        made = client.files.create(file=("light1.md", text(1)), purpose="assistants")
        store = client.vector_stores.create(name="kept")
        kept = client.vector_stores.files.create_and_poll(vector_store_id=store.id, file_id=made.id, poll_interval_ms=50)
        assert kept.status == "completed"
        key = [d.key for d in live.worker.contexts.store.entries()][0]
        for i in (5, 6):          # two chats' contexts, each over the budget: the older chat's goes
            client.chat.completions.create(model="reform", max_tokens=2, messages=[
                {"role": "system", "content": text(i).decode()}, {"role": "user", "content": QUESTION}])
        assert live.worker.store.has(key) and len(live.worker.store.entries()) == 2
        assert client.vector_stores.files.retrieve(made.id, vector_store_id=store.id).status == "completed"


def test_vector_store_search_returns_the_passages_an_answer_cites(live):
    """``client.vector_stores.search`` (issue 101): the gather's passages, best first, with nothing generated;
    the same passages as the answer's evidence; another tenant's store is a 404, filters a 400."""
    client = live.client(ALICE)
    files = [client.files.create(file=(f"light{i}.md", text(i)), purpose="assistants") for i in (1, 2, 3)]
    store = client.vector_stores.create(name="search")
    client.vector_stores.file_batches.create_and_poll(vector_store_id=store.id, file_ids=[f.id for f in files],
                                                      poll_interval_ms=50)
    found = client.vector_stores.search(store.id, query=QUESTION, max_num_results=5)
    assert 1 <= len(found.data) <= 5
    scores = [r.score for r in found.data]
    assert scores == sorted(scores, reverse=True)
    assert {r.file_id for r in found.data} <= {f.id for f in files} and {r.filename for r in found.data} <= \
        {"light1.md", "light2.md", "light3.md"}
    answer = client.responses.create(model="reform", input=QUESTION, tools=FILE_SEARCH(store.id), max_output_tokens=2)
    cited = answer.model_extra["reform"]["evidence"]
    assert [r.content[0].text for r in found.data] == [e["text"] for e in cited][:len(found.data)]
    assert "Keeper2" in " ".join(r.content[0].text for r in found.data)      # the evidence sentence is found
    with pytest.raises(openai.NotFoundError):
        live.client(BOB).vector_stores.search(store.id, query=QUESTION)
    with pytest.raises(openai.BadRequestError, match="filters"):
        client.vector_stores.search(store.id, query=QUESTION, filters={"type": "eq", "key": "a", "value": "b"})


def test_a_store_made_with_500_files_answers_at_once_and_every_file_completes(tmp_path):
    """Issue 99: ``vector_stores.create(file_ids=...)`` with 500 files answers in under 5 s (the files in
    progress), then adds them in the background in the tenant's turn; every file reaches completed or failed,
    a missing one is failed, and ``file_batches.create_and_poll`` sees a batch through the same way."""
    with LiveServer(make_pipe(), tmp_path / "store") as live:
        client = live.client()
        # ten documents, each uploaded ~50 times: a file of the same name and bytes is encoded once
        ids = [client.files.create(file=(f"light{i % 10}.md", text(i % 10)), purpose="assistants").id
               for i in range(499)]
        missing = "file-" + "0" * 24
        started = time.monotonic()
        store = client.vector_stores.create(name="many", file_ids=ids + [missing])
        assert time.monotonic() - started < 5
        assert store.file_counts.total == 500 and store.file_counts.in_progress > 0 and store.status == "in_progress"
        until = time.monotonic() + 600
        while (counts := client.vector_stores.retrieve(store.id).file_counts).in_progress and time.monotonic() < until:
            time.sleep(0.5)
        assert (counts.completed, counts.failed) == (499, 1)
        listed = {f.id: f for f in client.vector_stores.files.list(vector_store_id=store.id, limit=100)}
        assert len(listed) == 500 and listed[missing].status == "failed" and "not found" in listed[missing].last_error.message
        assert {listed[i].attributes["filename"] for i in ids} == {f"light{i}.md" for i in range(10)}

        more = [client.files.create(file=(f"more{i}.md", text(100 + i)), purpose="assistants").id for i in range(3)]
        batch = client.vector_stores.file_batches.create_and_poll(vector_store_id=store.id, file_ids=more,
                                                                  poll_interval_ms=50)
        assert (batch.file_counts.completed, batch.file_counts.total) == (3, 3)
        assert {f.id for f in client.vector_stores.files.list(vector_store_id=store.id, filter="completed")} >= set(more)
