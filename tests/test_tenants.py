"""Tenants of one `reform serve` (``--keys``): over loopback with real uvicorn, the official `openai` client
and `httpx`, two tenants with their own keys. Each sees only its own contexts and files (another's are a
404, like ones that do not exist), the same text is encoded once per tenant, quotas answer 413 or 429,
tenants take turns in the queue, a restart keeps every tenant's contexts, and a store written before
tenants stays readable under the tenant named ``default``."""

import asyncio
import json
import logging
import threading
import time

import httpx
import openai
import pytest

from reform.server import Settings
from reform.server.tenants import DailyTokens, KeysFileError, Tenant, Tenants, read_keys_file
from reform.server.scheduler import Job
from reform.store import ContextStore

from live_server import DOC, QUESTION, LiveServer, make_pipe

ALICE, BOB = "alice-key-0123456789", "bob-key-9876543210"
OPS = "operator-key-5555555555"          # --metrics-key: /metrics shows every tenant's counts
OTHER_DOC = "Rain fell on the hills while the river ran to the sea past the mill. " * 7


def keys_file(tmp_path, **quotas) -> str:
    """A TOML keys file for alice and bob; ``quotas`` are alice's."""
    lines = ["[tenants.alice]", f'key = "{ALICE}"', *(f"{k} = {v}" for k, v in quotas.items()),
             "[tenants.bob]", f'key = "{BOB}"']
    path = tmp_path / "keys.toml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def http(server, key):
    return httpx.Client(base_url=server.url, timeout=60, headers={"Authorization": f"Bearer {key}"})


def wait_ready(client: httpx.Client, context_id: str) -> dict:
    for _ in range(600):
        status = client.get(f"/v1/contexts/{context_id}").json()
        if status["status"] == "ready":
            return status
        assert status["status"] in ("queued", "encoding"), status
        time.sleep(0.05)
    raise AssertionError("the context was not encoded")


def upload(client: httpx.Client, text: str) -> httpx.Response:
    return client.post("/v1/contexts", json={"text": text})


@pytest.fixture
def store(tmp_path):
    return tmp_path / "store"


@pytest.fixture
def keys(tmp_path):
    return keys_file(tmp_path)


def test_a_tenant_cannot_see_list_ask_or_delete_anothers_context(store, keys):
    with LiveServer(make_pipe(), store, settings=Settings(keys_file=keys)) as server:
        with http(server, ALICE) as alice, http(server, BOB) as bob:
            made = upload(alice, DOC)
            assert made.status_code == 202
            theirs = made.json()["id"]
            wait_ready(alice, theirs)
            assert [c["id"] for c in alice.get("/v1/contexts").json()["data"]] == [theirs]

            assert bob.get("/v1/contexts").json()["data"] == []
            missing = "0" * 32
            for path in (f"/v1/contexts/{theirs}", f"/v1/contexts/{missing}"):
                got, deleted = bob.get(path), bob.delete(path)
                assert got.status_code == deleted.status_code == 404
            # word for word the answer for a context that does not exist
            assert bob.get(f"/v1/contexts/{theirs}").json()["error"]["message"].replace(theirs, "ID") == \
                bob.get(f"/v1/contexts/{missing}").json()["error"]["message"].replace(missing, "ID")
            with pytest.raises(openai.NotFoundError):
                server.client(BOB).chat.completions.create(
                    model="reform", max_tokens=4, extra_body={"context_id": theirs},
                    messages=[{"role": "user", "content": QUESTION}])

            # the same text from bob: a fresh encode of bob's own, under an id of bob's own
            mine = upload(bob, DOC)
            assert mine.status_code == 202 and mine.json()["status"] in ("queued", "encoding")
            assert mine.json()["id"] != theirs
            wait_ready(bob, mine.json()["id"])
            assert server.worker.contexts.encoded == 2
            assert upload(bob, DOC).status_code == 200          # within a tenant, still encoded once
            assert server.worker.contexts.encoded == 2

            # alice's context is untouched by bob's delete attempts, and answers her
            r = server.client(ALICE).chat.completions.create(
                model="reform", max_tokens=4, extra_body={"context_id": theirs},
                messages=[{"role": "user", "content": QUESTION}])
            assert r.model_extra["reform"]["context_id"] == theirs
            assert r.choices[0].message.content == make_pipe().encode(DOC).ask(QUESTION, max_new_tokens=4).text

            # a chat carrying the document is encoded per tenant as well
            chat = [{"role": "system", "content": OTHER_DOC}, {"role": "user", "content": QUESTION}]
            first = server.client(ALICE).chat.completions.create(model="reform", max_tokens=2, messages=chat)
            second = server.client(BOB).chat.completions.create(model="reform", max_tokens=2, messages=chat)
            assert first.model_extra["reform"]["encoded"] and second.model_extra["reform"]["encoded"]
            assert first.model_extra["reform"]["context_id"] != second.model_extra["reform"]["context_id"]

            # files: alice's are hers
            made = server.client(ALICE).files.create(file=("notes.txt", OTHER_DOC.encode()), purpose="user_data")
            assert [f.id for f in server.client(ALICE).files.list()] == [made.id]
            assert list(server.client(BOB).files.list()) == []
            for call in (lambda: server.client(BOB).files.retrieve(made.id),
                         lambda: server.client(BOB).files.delete(made.id)):
                with pytest.raises(openai.NotFoundError):
                    call()
            with pytest.raises(openai.NotFoundError):
                server.client(BOB).chat.completions.create(
                    model="reform", max_tokens=2,
                    messages=[{"role": "user", "content": [{"type": "file", "file": {"file_id": made.id}},
                                                           {"type": "text", "text": QUESTION}]}])
        with pytest.raises(openai.AuthenticationError):
            server.client("nobody's key").models.list()
        assert server.client(ALICE).models.list().data and server.client(BOB).models.list().data


def test_a_restart_keeps_every_tenants_contexts_and_an_old_store_reads_as_default(store, tmp_path):
    with LiveServer(make_pipe(), store) as server:           # no keys: a store from before tenants
        with httpx.Client(base_url=server.url, timeout=60) as anyone:
            old = upload(anyone, OTHER_DOC).json()["id"]
            wait_ready(anyone, old)
    path = tmp_path / "keys.txt"
    path.write_text(f"# name:key\ndefault:{ALICE}\nbob:{BOB}\n")
    with LiveServer(make_pipe(), store, settings=Settings(keys_file=str(path))) as server:
        with http(server, ALICE) as alice, http(server, BOB) as bob:
            assert [c["id"] for c in alice.get("/v1/contexts").json()["data"]] == [old]
            assert bob.get(f"/v1/contexts/{old}").status_code == 404
            bobs = upload(bob, DOC).json()["id"]
            wait_ready(bob, bobs)
    with LiveServer(make_pipe(), store, settings=Settings(keys_file=str(path))) as server:
        with http(server, ALICE) as alice, http(server, BOB) as bob:
            assert [c["id"] for c in alice.get("/v1/contexts").json()["data"]] == [old]
            assert [c["id"] for c in bob.get("/v1/contexts").json()["data"]] == [bobs]
            r = server.client(BOB).chat.completions.create(
                model="reform", max_tokens=3, extra_body={"context_id": bobs},
                messages=[{"role": "user", "content": QUESTION}])
            assert r.model_extra["reform"]["encoded"] is False and server.worker.contexts.encoded == 0
    with LiveServer(make_pipe(), store, settings=Settings(api_key=ALICE)) as server:     # one key: default
        with http(server, ALICE) as alice:
            assert [c["id"] for c in alice.get("/v1/contexts").json()["data"]] == [old]


def test_store_quotas_answer_413(store, tmp_path):
    with LiveServer(make_pipe(), store, settings=Settings(keys_file=keys_file(tmp_path, contexts=1))) as server:
        with http(server, ALICE) as alice, http(server, BOB) as bob:
            assert upload(alice, DOC).status_code == 202
            refused = upload(alice, OTHER_DOC)          # the first is still queued or encoding: it counts
            assert refused.status_code == 413 and refused.json()["error"]["code"] == "quota_exceeded"
            assert "quota of 1 contexts" in refused.json()["error"]["message"]
            assert upload(bob, OTHER_DOC).status_code == 202         # bob has no quota
            chat = [{"role": "system", "content": OTHER_DOC}, {"role": "user", "content": QUESTION}]
            with pytest.raises(openai.APIStatusError) as e:          # a chat that would encode is refused too
                server.client(ALICE).chat.completions.create(model="reform", max_tokens=2, messages=chat)
            assert e.value.status_code == 413
            ids = [c["id"] for c in alice.get("/v1/contexts").json()["data"]]
            wait_ready(alice, ids[0])
            assert alice.delete(f"/v1/contexts/{ids[0]}").status_code == 200
            assert upload(alice, OTHER_DOC).status_code == 202        # room again
    size = make_pipe().encode(DOC).stored_bytes()
    (tmp_path / "bytes").mkdir()
    settings = Settings(keys_file=keys_file(tmp_path / "bytes", store_bytes=size + 100_000), metrics_key=OPS)
    with LiveServer(make_pipe(), tmp_path / "store2", settings=settings) as server:
        with http(server, ALICE) as alice:
            wait_ready(alice, upload(alice, DOC).json()["id"])       # room for one
            refused = upload(alice, OTHER_DOC)
            assert refused.status_code == 202                        # room when accepted: refused before its write
            while (status := alice.get(f"/v1/contexts/{refused.json()['id']}").json())["status"] != "failed":
                assert status["status"] in ("queued", "encoding"), status
                time.sleep(0.05)
            assert f"quota of {size + 100_000}" in status["error"] and "needs" in status["error"]
            assert len(server.worker.store.entries("tenants/alice")) == 1      # nothing written past the quota
            metrics = httpx.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {OPS}"}).text
            assert 'reform_tenant_quota_refusals_total{quota="store_bytes",tenant="alice"} 1.0' in metrics
            chat = [{"role": "system", "content": OTHER_DOC + " more"}, {"role": "user", "content": QUESTION}]
            with pytest.raises(openai.APIStatusError) as e:      # a chat's encode: the same, as its 413
                server.client(ALICE).chat.completions.create(model="reform", max_tokens=2, messages=chat)
            assert e.value.status_code == 413 and "needs" in e.value.message
            assert len(server.worker.store.entries("tenants/alice")) == 1


def test_daily_tokens_answer_429_until_the_next_day_and_survive_a_restart(store, tmp_path):
    n = len(make_pipe().tokenize(DOC).ids)
    settings = Settings(keys_file=keys_file(tmp_path, daily_tokens=n + 10), metrics_key=OPS)
    with LiveServer(make_pipe(), store, settings=settings) as server:
        with http(server, ALICE) as alice, http(server, BOB) as bob:
            wait_ready(alice, upload(alice, DOC).json()["id"])
            assert upload(alice, DOC).status_code == 200               # stored: no new tokens
            refused = upload(alice, OTHER_DOC)
            assert refused.status_code == 429 and refused.json()["error"]["type"] == "rate_limit_error"
            wait = int(refused.headers["retry-after"])
            assert 1 <= wait <= 86401 and abs(wait - (86400 - time.time() % 86400)) < 5
            assert upload(bob, OTHER_DOC).status_code == 202
            metrics = httpx.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {OPS}"}).text
            assert f'reform_tenant_encode_tokens_total{{tenant="alice"}} {float(n)}' in metrics
    with LiveServer(make_pipe(), store, settings=settings) as server:
        with http(server, ALICE) as alice:
            assert upload(alice, OTHER_DOC).status_code == 429         # the day's count is in the store


def test_requests_in_flight_answer_429_for_that_tenant_only(store, tmp_path):
    settings = Settings(keys_file=keys_file(tmp_path, in_flight=1))
    with LiveServer(make_pipe(), store, settings=settings) as server:
        release, loop = threading.Event(), asyncio.new_event_loop()
        server.worker.put(Job(lambda job: release.wait(30), loop, loop.create_future()))   # holds the model
        try:
            chat = [{"role": "system", "content": DOC}, {"role": "user", "content": QUESTION}]
            waiting = threading.Thread(target=lambda: server.client(ALICE).chat.completions.create(
                model="reform", max_tokens=2, messages=chat), daemon=True)       # waits for its answer
            waiting.start()
            deadline = time.time() + 10
            while server.app.state.service.in_flight["alice"] < 1:
                assert time.time() < deadline
                time.sleep(0.01)
            with pytest.raises(openai.RateLimitError) as e:
                server.client(ALICE).models.list()
            assert int(e.value.response.headers["retry-after"]) >= 1
            assert server.client(BOB).models.list().data                  # bob is not held back
        finally:
            release.set()
            waiting.join(30)
            loop.close()
        assert server.client(ALICE).models.list().data


def test_tenants_take_turns_in_the_queue(store, keys):
    """Alice's five uploads are queued first; bob's question on his stored context is taken up first, not
    sixth (alice had the last turn), and alice's uploads past her share of the queue wait in her own line,
    not in bob's way."""
    with LiveServer(make_pipe(), store, queue_size=3, settings=Settings(keys_file=keys)) as server:
        with http(server, BOB) as bob:
            bobs = upload(bob, DOC).json()["id"]
            wait_ready(bob, bobs)
        release, loop = threading.Event(), asyncio.new_event_loop()
        server.worker.put(Job(lambda job: release.wait(30), loop, loop.create_future(), tenant="alice"))
        while server.worker.busy_since is None:
            time.sleep(0.01)
        order, execute = [], server.worker.execute

        def started(job):
            if job.runner is None:              # its first unit: the job starts
                order.append(job.tenant)
            return execute(job)
        server.worker.execute = started
        texts = [f"Upload {i}. " + OTHER_DOC for i in range(5)]
        threads = [threading.Thread(target=lambda t=t: upload(http(server, ALICE), t), daemon=True) for t in texts]
        try:
            for t in threads:
                t.start()
            service = server.app.state.service
            deadline = time.time() + 10
            while server.worker.queued("alice") + len(service.lines["alice"]) < 5:
                assert time.time() < deadline
                time.sleep(0.01)
            assert server.worker.queued("alice") == 3 and len(service.lines["alice"]) == 2
            answer = {}
            asking = threading.Thread(target=lambda: answer.setdefault("r", server.client(BOB).chat.completions.create(
                model="reform", max_tokens=3, extra_body={"context_id": bobs},
                messages=[{"role": "user", "content": QUESTION}])), daemon=True)
            asking.start()
            while server.worker.queued("bob") < 1:      # in the queue at once: alice's share is hers
                assert time.time() < deadline
                time.sleep(0.01)
        finally:
            release.set()
        asking.join(60)
        for t in threads:
            t.join(60)
        assert answer["r"].choices[0].message.content is not None
        deadline = time.time() + 60
        while order.count("alice") < 5 and time.time() < deadline:    # the last ones are queued, not yet run
            time.sleep(0.05)
        assert order[0] == "bob" and order.count("alice") == 5      # alice had the last turn (the blocker)
        loop.close()


def test_turns_hold_for_questions_asked_while_another_tenants_document_encodes(store, keys):
    """Alice's long upload encodes chunk by chunk; alice queues four questions on her stored context, then
    bob one on his. Bob's question starts first (alice had the last turn), before alice's, which arrived
    earlier; alice's encode goes on between the questions and stores the same context as alone."""
    from live_server import slow_pipe
    long_doc = DOC * 6
    expected_long = make_pipe().encode(long_doc).ask(QUESTION, max_new_tokens=5).text
    with LiveServer(slow_pipe(0.2), store, settings=Settings(keys_file=keys)) as server:
        alice, bob = http(server, ALICE), http(server, BOB)
        mine, bobs = upload(alice, DOC).json()["id"], upload(bob, DOC).json()["id"]
        wait_ready(alice, mine), wait_ready(bob, bobs)
        long = upload(alice, long_doc).json()["id"]
        while alice.get(f"/v1/contexts/{long}").json()["tokens_encoded"] == 0:
            time.sleep(0.02)
        started, release, loop = threading.Event(), threading.Event(), asyncio.new_event_loop()
        server.worker.put(Job(lambda job: (started.set(), release.wait(30)), loop, loop.create_future(),
                              tenant="alice"))                          # holds the model between two chunks
        assert started.wait(30)
        order, execute = [], server.worker.execute

        def recorded(job):
            if job.runner is None or job.kind == "encode":
                order.append((job.tenant, job.kind))
            return execute(job)
        server.worker.execute = recorded

        def ask(key, context_id):
            return server.client(key).chat.completions.create(
                model="reform", max_tokens=5, extra_body={"context_id": context_id},
                messages=[{"role": "user", "content": QUESTION}]).choices[0].message.content
        pool = [threading.Thread(target=ask, args=(ALICE, mine), daemon=True) for _ in range(4)]
        for t in pool:
            t.start()
        deadline = time.time() + 10
        while server.worker.queued("alice") < 4:
            assert time.time() < deadline
            time.sleep(0.01)
        answer = {}
        asking = threading.Thread(target=lambda: answer.setdefault("bob", ask(BOB, bobs)), daemon=True)
        asking.start()
        while server.worker.queued("bob") < 1:
            assert time.time() < deadline
            time.sleep(0.01)
        assert alice.get(f"/v1/contexts/{long}").json()["status"] == "encoding"
        release.set()
        asking.join(60)
        for t in pool:
            t.join(60)
        assert order[0] == ("bob", "question") and order.count(("alice", "question")) == 4
        wait_ready(alice, long)
        assert ("alice", "encode") in order[1:]          # the encode went on after the questions
        assert ask(ALICE, long) == expected_long
        loop.close()


def test_metrics_and_the_access_log_name_tenants_never_keys(store, keys, caplog):
    with LiveServer(make_pipe(), store, settings=Settings(keys_file=keys, metrics_key=OPS)) as server:
        with caplog.at_level(logging.INFO, logger="reform.access"):
            with http(server, ALICE) as alice:
                wait_ready(alice, upload(alice, DOC).json()["id"])
            server.client(BOB).models.list()
            with pytest.raises(openai.AuthenticationError):
                server.client(ALICE + "x").models.list()
        metrics = httpx.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {OPS}"}).text
    assert 'reform_tenant_requests_total{status="202",tenant="alice"} 1.0' in metrics
    assert 'reform_tenant_requests_total{status="200",tenant="bob"} 1.0' in metrics
    assert 'reform_tenant_store_contexts{tenant="alice"} 1.0' in metrics
    assert 'reform_tenant_store_contexts{tenant="bob"} 0.0' in metrics
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "reform.access"]
    assert {line.get("tenant") for line in lines} >= {"alice", "bob"}
    assert any(line["status"] == 401 and "tenant" not in line for line in lines)
    for text in [metrics, *(r.getMessage() for r in caplog.records)]:
        assert ALICE not in text and BOB not in text


# ---------------------------------------------------------------------- keys files
def test_keys_files_in_three_formats(tmp_path):
    (tmp_path / "k.json").write_text(json.dumps({"tenants": {"a": {"key": "ka", "contexts": 3}, "b": {"key": "kb"}}}))
    (tmp_path / "k.toml").write_text('[tenants.a]\nkey = "ka"\ncontexts = 3\n[tenants.b]\nkey = "kb"\n')
    (tmp_path / "k.txt").write_text("# comment\n\na: ka\nb:kb\n")
    for name in ("k.json", "k.toml", "k.txt"):
        tenants = Tenants(read_keys_file(tmp_path / name))
        assert tenants.find("Bearer ka").name == "a" and tenants.find("bearer kb").name == "b"
        assert tenants.find("Bearer kc") is None and tenants.find("") is None and tenants.find("Basic ka") is None
    assert read_keys_file(tmp_path / "k.toml")[0].quotas.contexts == 3
    assert "ka" not in repr(read_keys_file(tmp_path / "k.toml"))


@pytest.mark.parametrize("name, content, says", [
    ("empty.txt", "", "names no tenants"),
    ("comments.txt", "# nobody\n\n", "names no tenants"),
    ("empty.json", '{"tenants": {}}', "names no tenants"),
    ("twice.txt", "a:same-key\nb:same-key\n", "tenants 'a' and 'b' have the same key"),
    ("names.txt", "a:k1\na:k2\n", "named twice"),
    ("names.json", '{"tenants": {"a": {"key": "k1"}, "a": {"key": "k2"}}}', "given twice"),
    ("space.txt", "a:two words\n", "printable ASCII"),
    ("control.txt", "a:key\x07bell\n", "printable ASCII"),
    ("unicode.txt", "a:clé\n", "printable ASCII"),
    ("long.txt", "a:" + "k" * 5000 + "\n", "longer than 4096"),
    ("nokey.txt", "a:\n", "the key is empty"),
    ("colon.txt", "just-a-key\n", "not 'name:key'"),
    ("badname.txt", "../up:k\n", "tenant name"),
    ("field.toml", '[tenants.a]\nkey = "k"\nquota = 3\n', "unknown field 'quota'"),
    ("negative.toml", '[tenants.a]\nkey = "k"\ncontexts = -1\n', "positive whole number"),
    ("broken.toml", "[tenants.a\n", "keys file"),
    ("shape.json", '["a", "k"]', "one 'tenants' table"),
])
def test_bad_keys_files_are_refused_in_one_line_without_the_key(tmp_path, name, content, says):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(KeysFileError) as e:
        read_keys_file(path)
    assert says in str(e.value) and "\n" not in str(e.value)
    assert "same-key" not in str(e.value) and "bell" not in str(e.value)


def test_keys_with_odd_bytes_and_a_missing_file(tmp_path):
    path = tmp_path / "bytes.txt"
    path.write_bytes(b"a:\xff\xfe\n")
    with pytest.raises(KeysFileError, match="not UTF-8"):
        read_keys_file(path)
    with pytest.raises(KeysFileError, match="cannot read the keys file"):
        read_keys_file(tmp_path / "missing.toml")
    with pytest.raises(KeysFileError, match="not both"):
        Tenants.of("k", str(path))


def test_serve_refuses_a_bad_keys_file_before_loading_the_model(tmp_path):
    from typer.testing import CliRunner

    from reform.cli.main import app
    path = tmp_path / "keys.txt"
    path.write_text("a:k\nb:k\n")
    result = CliRunner().invoke(app, ["serve", "--keys", str(path), "--model", str(tmp_path / "no-such-model"),
                                      "--store", str(tmp_path / "store")])
    assert result.exit_code != 0 and "have the same key" in result.output and "Traceback" not in result.output


def test_context_ids_are_per_tenant_and_daily_tokens_add_up_over_processes(tmp_path):
    alice, default = Tenant("alice", "k"), Tenant("default", "k2")
    key = "ab" * 16
    assert default.context_key(key) == key                                  # a store from before tenants
    assert alice.context_key(key).startswith("tenants/alice/") and alice.context_key(key)[-32:] != key
    assert alice.owns(alice.context_key(key)) and not default.owns(alice.context_key(key))
    store = ContextStore(tmp_path / "store")
    one, two = DailyTokens(store), DailyTokens(store)
    assert one.take("tenants/alice", 60, 100) == 60
    assert two.take("tenants/alice", 50, 100) is None and two.take("tenants/alice", 40, 100) == 100
    assert one.used("tenants/alice") == 100 and one.used("") == 0


def test_a_refused_upload_costs_no_daily_tokens_and_files_count_toward_store_bytes(store, tmp_path):
    most = make_pipe().encode(DOC).stored_bytes() + 3000        # room for DOC's context
    settings = Settings(keys_file=keys_file(tmp_path, daily_tokens=10_000, store_bytes=most), max_waiting=0)
    with LiveServer(make_pipe(), store, queue_size=1, settings=settings) as server:
        service, n = server.app.state.service, len(make_pipe().tokenize(DOC).ids)
        release, loop = threading.Event(), asyncio.new_event_loop()
        server.worker.put(Job(lambda job: release.wait(30), loop, loop.create_future(), tenant="alice"))
        while server.worker.busy_since is None:
            time.sleep(0.01)
        try:
            with http(server, ALICE) as alice:
                accepted = upload(alice, DOC)
                assert accepted.status_code == 202                          # takes alice's one queue place
                refused = upload(alice, OTHER_DOC)
                assert refused.status_code == 503                           # her queue and line are full
                assert service.usage.used("tenants/alice") == n              # the refused one was given back
        finally:
            release.set()
            loop.close()
        with http(server, ALICE) as alice:                                  # an empty store for the files part
            wait_ready(alice, accepted.json()["id"])
            assert alice.delete(f"/v1/contexts/{accepted.json()['id']}").status_code == 200
        client = server.client(ALICE)
        client.files.create(file=("big.txt", b"x" * (most + 500)), purpose="user_data")
        with pytest.raises(openai.APIStatusError) as e:                     # files count toward store bytes
            client.files.create(file=("more.txt", b"y" * 10), purpose="user_data")
        assert e.value.status_code == 413 and "contexts and files" in e.value.message
        with http(server, ALICE) as alice:
            assert upload(alice, OTHER_DOC).status_code == 413


def test_other_tenants_activity_is_for_the_operator_only(store, tmp_path):
    """/metrics and /openapi.json need the --metrics-key or an admin tenant's key; /health without one is
    liveness alone (issue 100: they named every tenant and its counts to anyone)."""
    path = tmp_path / "keys.toml"
    path.write_text(f'[tenants.alice]\nkey = "{ALICE}"\n[tenants.ops]\nkey = "{BOB}"\nadmin = true\n')
    with LiveServer(make_pipe(), store, settings=Settings(keys_file=str(path), metrics_key=OPS)) as server:
        get = lambda url, key=None: httpx.get(f"{server.url}{url}", headers={"Authorization": f"Bearer {key}"} if key else {})
        for url in ("/metrics", "/openapi.json"):
            for key in (None, ALICE, ALICE + "x"):
                r = get(url, key)
                assert r.status_code == 401 and r.json()["error"]["code"] == "operator_key_required", (url, key)
            assert get(url, OPS).status_code == 200 and get(url, BOB).status_code == 200    # BOB: admin
        assert get("/health").json() == {"status": "ok"} and get("/health", ALICE).json() == {"status": "ok"}
        assert "stored_contexts" in get("/health", OPS).json()
        assert "alice" in get("/metrics", BOB).text
    with LiveServer(make_pipe(), tmp_path / "one", settings=Settings(api_key=ALICE)) as server:   # one tenant
        assert httpx.get(f"{server.url}/metrics").status_code == 401
        assert httpx.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {ALICE}"}).status_code == 200
    with pytest.raises(KeysFileError, match="admin must be true or false"):
        path.write_text(f'[tenants.alice]\nkey = "{ALICE}"\nadmin = "yes"\n')
        read_keys_file(path)
