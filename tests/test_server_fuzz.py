"""Every endpoint, fuzzed (issue 100): request bodies built by hypothesis from each endpoint's own fields
with values of any JSON type (and paths with any id), sent to a real server. None may answer 500, hang,
or take the server down; a fixed seed and a bounded count keep it a test."""

import json
from urllib.parse import quote

import httpx
from hypothesis import HealthCheck, given, settings, strategies as st

JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=False) |
                    st.text(max_size=40), lambda inner: st.lists(inner, max_size=4) |
                    st.dictionaries(st.text(max_size=12), inner, max_size=4), max_leaves=12)
MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "tool", "x"]) | JSON},
                                optional={"content": st.text(max_size=200) | JSON})
FIELDS = {
    "/v1/chat/completions": {"model": st.just("reform") | JSON, "messages": st.lists(MESSAGE, max_size=4) | JSON,
                             "max_tokens": st.integers(-3, 8) | JSON, "stream": st.booleans() | JSON,
                             "temperature": JSON, "top_p": JSON, "stop": JSON, "seed": JSON, "n": JSON,
                             "stream_options": JSON, "context_id": JSON, "vector_store_ids": JSON,
                             "response_format": JSON, "tools": JSON},
    "/v1/contexts": {"text": st.text(max_size=300) | JSON, "name": JSON},
    "/v1/responses": {"model": st.just("reform") | JSON, "input": st.text(max_size=100) | JSON,
                      "max_output_tokens": st.integers(-3, 8) | JSON, "instructions": JSON, "tools": JSON,
                      "stream": JSON, "temperature": JSON},
    "/v1/vector_stores": {"name": JSON, "file_ids": JSON, "metadata": JSON},
}
VALID = {    # a body each endpoint answers, so the fuzz reaches past validation: 0 to 2 of its fields changed
    "/v1/chat/completions": {"model": "reform", "messages": [{"role": "user", "content": "Why?"}], "max_tokens": 2},
    "/v1/contexts": {"text": "The keeper's cat is named Maren. " * 3},
    "/v1/responses": {"model": "reform", "input": "Why?", "max_output_tokens": 2},
    "/v1/vector_stores": {"name": "notes"},
}


def changed(path: str):
    fields = FIELDS[path]
    return st.lists(st.sampled_from(sorted(fields)), max_size=2, unique=True).flatmap(
        lambda names: st.fixed_dictionaries({n: fields[n] for n in names})).map(lambda over: {**VALID[path], **over})


BODIES = st.sampled_from(sorted(FIELDS)).flatmap(lambda path: st.tuples(st.just(path), changed(path)))
IDS = st.text(min_size=1, max_size=40).map(lambda s: quote(s, safe=""))
GETS = st.sampled_from(["/v1/contexts/{}", "/v1/files/{}", "/v1/files/{}/content", "/v1/models/{}",
                        "/v1/vector_stores/{}", "/v1/vector_stores/{}/files"])


def test_no_body_gets_a_500_or_hangs(live):
    with httpx.Client(base_url=live.url, timeout=60) as http:
        @settings(max_examples=200, derandomize=True, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(BODIES)
        def post(case):
            path, body = case
            r = http.post(path, content=json.dumps(body), headers={"Content-Type": "application/json"})
            assert r.status_code < 500, (path, body, r.status_code, r.text[:300])
        post()

        @settings(max_examples=60, derandomize=True, deadline=None, database=None)
        @given(GETS, IDS, st.sampled_from(["GET", "DELETE"]))
        def fetch(route, id_, method):
            r = http.request(method, route.format(id_))
            assert r.status_code < 500, (method, route, id_, r.status_code, r.text[:300])
        fetch()
        assert http.get("/health").json()["status"] == "ok"
