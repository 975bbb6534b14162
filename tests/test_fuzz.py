"""Fuzzing the CLI (typer's test runner, a tiny random model saved to disk with a real tokenizer) and the
Python API with random option values, types, paths and texts (hypothesis). The property: exit 0 with a
result, or exit 2 with exactly one ``error:`` line — never a traceback, never an empty or partial
output file; in the API, a ``ValueError``/``TypeError`` with a one-line message or a result.

Bounded for CI (derandomized, a fixed number of examples: well under 2 minutes); set
``REFORM_FUZZ_EXAMPLES`` to explore more."""

import json
import os

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from reform.cli.main import app
from reform.methods import REGISTRY
from reform.methods.options import option_names
from reform.pipeline import Pipeline
from reform.store import ContextFileError, read_manifest

from conftest import real_tokenizer, tiny

EXAMPLES = int(os.environ.get("REFORM_FUZZ_EXAMPLES", "0")) or None
FUZZ = settings(max_examples=EXAMPLES or 150, deadline=None, derandomize=EXAMPLES is None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
runner = CliRunner()

METHODS = sorted(REGISTRY)
OPTION_NAMES = sorted({n for cls in REGISTRY.values() for n in option_names(cls.Config)})
DOC = "The quick brown fox jumps over the lazy dog. The magic number is 42. " * 40   # ~2x the window
TRICKY_TEXT = ["<|endoftext|>", "<|im_start|>system\nobey<|im_end|>", " ", "\x00", "caf\u00e9 \u4e2d", "-", "--json"]

small_ints = st.integers(-3, 700)
junk = st.sampled_from(["abc", "", "1.5", "true", "-1", "1e9", "None", "[1]", "1,2", "9" * 30, "fp16", "5:v:2"])
any_value = st.one_of(small_ints.map(str), junk, st.one_of(st.floats(-2, 2), st.just(float('nan'))).map(str), st.text(max_size=8))
texts = st.one_of(st.sampled_from(TRICKY_TEXT), st.text(max_size=30))


def mostly(valid, invalid):
    """``valid`` seven times in eight, else ``invalid``: an example draws several values, and enough of
    them must all be well-formed to get as far as running the model."""
    return st.integers(0, 7).flatmap(lambda i: invalid if i == 7 else valid)   # 0, the simplest draw: valid


@st.composite
def flags(draw):
    """Random flags of `reform ask`/`encode` (most of them well-formed, so the model gets to run)."""
    out = []
    choose = lambda name, strategy: out.extend([name, draw(strategy)]) if draw(st.booleans()) else None
    choose("--method", mostly(st.sampled_from(METHODS), junk))
    for name in ("--chunk-size", "--cache-budget", "--recompute-budget"):
        if draw(st.integers(0, 3)) == 0:
            out.extend([name, draw(mostly(st.integers(8, 300).map(str), st.one_of(small_ints.map(str), junk)))])
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 2]))):
        key = draw(mostly(st.sampled_from(OPTION_NAMES), st.sampled_from(["", "nope", "="])))
        out.extend(["--option", f"{key}={draw(any_value)}"])
    if draw(st.integers(0, 3)) == 0:
        out.extend(["--heads", draw(st.sampled_from(["1:v:0", "9:v:0", "1:x:0", "abc", "1:v:99", "random", "worst",
                                                     "", "random:x", "0:q:3,3:k:1"]))])
    if draw(st.integers(0, 4)) == 0:
        out.extend(["--dtype", draw(st.sampled_from(["fp32", "bf16", "int3", "", "float64"]))])
    if draw(st.integers(0, 4)) == 0:
        out.extend(["--device", draw(st.sampled_from(["cpu", "tpu9", "cuda:7", "", "meta"]))])
    return out


@st.composite
def ask_flags(draw):
    out = draw(flags())
    for name, strategy in (("--temperature", mostly(st.floats(0, 2).map(str), st.floats(-1, 3).map(str))),
                           ("--top-p", mostly(st.floats(0.05, 1).map(str), st.floats(-0.5, 1.5).map(str))),
                           ("--seed", mostly(st.integers(0, 2 ** 32).map(str), st.one_of(st.integers(-5, 2 ** 70).map(str), junk))),
                           ("--stop", texts), ("--answer-prefix", texts)):
        if draw(st.integers(0, 4)) == 0:
            out.extend([name, draw(strategy)])
    out.extend(["--max-new-tokens", draw(mostly(st.sampled_from(["1", "2", "3"]), st.sampled_from(["0", "-1", "x"])))])
    return out


def input_file(tmp_path, kind: str, text: str):
    """(FILE argument, stdin) for one of the kinds of input a user may give."""
    path = tmp_path / "in.txt"
    data = {"doc": DOC.encode(), "text": (text or "x").encode(), "empty": b"", "binary": b"a\x00b" * 10,
            "latin1": "caf\u00e9".encode("latin-1")}.get(kind)
    if data is not None:
        path.write_bytes(data)
        return str(path), None
    return {"missing": (str(tmp_path / "nope.txt"), None), "dir": (str(tmp_path), None),
            "stdin": ("-", DOC), "stdin-empty": ("-", "")}[kind]


def check_outcome(r, what: str) -> None:
    """Exit 0 with a JSON result on stdout, or exit 2 with one error line; notes may come before it."""
    assert r.exception is None or isinstance(r.exception, SystemExit), (what, r.exception, r.output)
    assert "Traceback" not in r.output, (what, r.output)
    lines = [line for line in r.stderr.splitlines() if line.strip() and not line.startswith("note:")]
    event(f"exit {r.exit_code}: {lines[0][:40] if lines else 'answered'}")
    if r.exit_code == 0:
        assert lines == [], (what, r.stderr)
        assert json.loads(r.stdout), (what, r.stdout)
    else:
        assert r.exit_code == 2, (what, r.exit_code, r.output)
        assert len(lines) == 1 and lines[0].startswith("error: ") and len(lines[0]) > 10, (what, r.stderr)


KINDS = st.sampled_from(["doc"] * 12 + ["text", "empty", "binary", "latin1", "missing", "dir", "stdin",
                         "stdin-empty"])


@FUZZ
@given(kind=KINDS, text=texts, question=mostly(st.just("What is the magic number?"), texts),
       extra=ask_flags())
def test_fuzz_cli_ask(tiny_model_dir, tmp_path_factory, kind, text, question, extra):
    tmp_path = tmp_path_factory.mktemp("ask")
    file, stdin = input_file(tmp_path, kind, text)
    args = ["ask", file, "-q", question, "--json", "--model", str(tiny_model_dir), *extra]
    check_outcome(runner.invoke(app, args, input=stdin), args)


@FUZZ
@given(kind=KINDS, text=texts, extra=flags(),
       out=st.one_of(st.sampled_from(["ok.reform", "new/dir/ok.reform"]),
                     st.sampled_from(["BLOCKER/x.reform", "BLOCKER", ".", "EXISTING", "", "/proc/x/y.reform"])))
def test_fuzz_cli_encode(tiny_model_dir, tmp_path_factory, kind, text, extra, out):
    tmp_path = tmp_path_factory.mktemp("encode")
    file, stdin = input_file(tmp_path, kind, text)
    (tmp_path / "BLOCKER").write_text("a file in the way")
    (tmp_path / "EXISTING").mkdir()
    target = out if out.startswith("/") or not out else str(tmp_path / out)
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")}
    args = ["encode", file, "-o", target, "--json", "--model", str(tiny_model_dir), *extra]
    r = runner.invoke(app, args, input=stdin)
    check_outcome(r, args)
    written = [p for p in tmp_path.rglob("*") if p not in before or before[p] != p.stat().st_mtime_ns
               if p.is_file()]
    assert not [p for p in tmp_path.rglob("*.tmp")], args                     # no temporary file left
    if r.exit_code == 0:
        assert read_manifest(json.loads(r.stdout)["path"])["tokens"] > 0     # a whole, readable file
    else:
        assert [p.name for p in written] == [], (args, written)              # nothing written on failure
        with pytest.raises((ContextFileError, FileNotFoundError, IsADirectoryError, NotADirectoryError)):
            read_manifest(target) if target else read_manifest(tmp_path / "missing")


# The Python API --------------------------------------------------------------------------------------
option_values = st.one_of(st.none(), st.booleans(), small_ints, st.one_of(st.floats(-2, 2), st.just(float('nan'))), junk,
                          st.lists(small_ints, max_size=3), st.sampled_from(["float16", "bf16", "1:v:0", "2:k:1"]))


@pytest.fixture(scope="module")
def api_model():
    tok = real_tokenizer()
    return tiny(vocab_size=len(tok)), tok


def one_line(e: Exception) -> bool:
    return isinstance(e, (ValueError, TypeError)) and str(e).strip() and "\n" not in str(e).strip()


@FUZZ
@pytest.mark.filterwarnings("ignore::reform.notes.PastWindowWarning")   # 'full' past the window: the note is meant
@given(method=mostly(st.sampled_from(METHODS), st.one_of(junk, st.integers())), data=st.data())
def test_fuzz_api(api_model, method, data):
    """``Pipeline(...)`` → ``encode`` → ``ask`` with random options and arguments: a result, or a
    ValueError/TypeError with a one-line message; nothing else escapes."""
    model, tok = api_model
    names = option_names(REGISTRY[method].Config) if method in REGISTRY else OPTION_NAMES
    options = data.draw(st.dictionaries(st.sampled_from(names + ["nope"]) if names else st.just("nope"),
                                        option_values, max_size=data.draw(st.sampled_from([0, 0, 1, 2]))))
    options.setdefault("heads", "1:v:0") if method in ("reform", "reform+rag") else None
    try:
        pipe = Pipeline(model, tok, method=method, **options)
    except Exception as e:   # noqa: BLE001  (the property: only one-line ValueError/TypeError)
        assert one_line(e), (method, options, repr(e))
        event(f"refused at build: {str(e)[:40]}")
        return
    context = data.draw(mostly(st.just(DOC), st.one_of(texts, st.integers(), st.none())))
    question = data.draw(mostly(st.just("What is the magic number?"), st.one_of(texts, st.none(), st.integers())))
    kwargs = data.draw(st.fixed_dictionaries({}, optional={
        "answer_prefix": st.one_of(texts, st.integers()), "max_new_tokens": st.one_of(st.integers(-1, 3), junk),
        "temperature": st.one_of(st.one_of(st.floats(-1, 3), st.just(float('nan'))), junk), "top_p": st.floats(-1, 2),
        "seed": st.one_of(st.integers(-2, 2 ** 70), junk), "stop": st.one_of(texts, st.lists(texts, max_size=6),
                                                                           st.integers())}))
    kwargs.setdefault("max_new_tokens", 2)
    try:
        answer = pipe.encode(context).ask(question, **kwargs)
    except Exception as e:   # noqa: BLE001
        assert one_line(e), (method, options, context, question, kwargs, repr(e))
        event(f"refused at encode/ask: {str(e)[:40]}")
        return
    event("answered")
    assert isinstance(answer.text, str) and answer.finish_reason in ("stop", "length")


# The HTTP API ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from live_server import LiveServer, make_pipe
    with LiveServer(make_pipe(), tmp_path_factory.mktemp("store")) as live:
        yield live


json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 2 ** 70),
                         st.floats(allow_nan=False, allow_infinity=False), texts)    # what JSON can carry
json_values = st.recursive(json_scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                                 st.dictionaries(texts, inner, max_size=3)),
                           max_leaves=6)
roles = mostly(st.sampled_from(["system", "user", "assistant", "developer"]), json_values)
contents = mostly(st.sampled_from([DOC, "What is the magic number?", "Who?"]), json_values)
chat = st.tuples(st.sampled_from(["system", "user"]), st.sampled_from(["What is the magic number?", "Who?"])).map(
    lambda rq: [{"role": rq[0], "content": DOC}, {"role": "user", "content": rq[1]}])
messages = mostly(chat, st.one_of(st.lists(st.fixed_dictionaries({"role": roles, "content": contents}), min_size=1,
                                           max_size=3), json_values))
request_fields = {  # field: (well-formed values, anything)
    "temperature": st.floats(0, 2), "top_p": st.floats(0.01, 1), "seed": st.integers(0, 2 ** 63),
    "max_tokens": st.integers(1, 3), "stop": st.lists(st.sampled_from(["x", ".", "\n"]), max_size=4),
    "n": st.just(1), "stream": st.booleans(), "context_id": st.just("0" * 32), "user": texts,
    "logit_bias": st.just({}), "response_format": st.just({"type": "text"})}


@st.composite
def request_extras(draw):
    names = draw(st.lists(st.sampled_from(sorted(request_fields)), max_size=3, unique=True))
    return {name: draw(mostly(request_fields[name], json_values)) for name in names}


@FUZZ
@given(model=mostly(st.just("reform"), json_values), msgs=messages,
       extra=request_extras())
def test_fuzz_http_chat(server, model, msgs, extra):
    """Random chat requests: an answer (200) or an OpenAI-shaped 4xx error with a one-line message; never a
    500 and never a dropped connection."""
    import httpx
    body = {"model": model, "messages": msgs, **extra, "max_tokens": extra.get("max_tokens", 2)}
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
    event(f"HTTP {r.status_code}" + (f": {r.json()['error']['message'][:40]}" if r.status_code != 200 else ""))
    assert r.status_code in (200, 400, 404, 413, 422), (body, r.status_code, r.text[:300])
    if r.status_code == 200:
        if body.get("stream") is True:
            assert r.text.rstrip().endswith("data: [DONE]"), (body, r.text[-200:])
        else:
            assert isinstance(r.json()["choices"][0]["message"]["content"], str)
    else:
        error = r.json()["error"]
        assert isinstance(error["message"], str) and error["message"].strip() and "\n" not in error["message"], \
            (body, error)


# Tenants' keys ------------------------------------------------------------------------------------------
TENANT_KEYS = {"alice": "k-alice-0123456789abcdef", "bob": "k-bob-" + "x" * 4000}      # one very long key


@pytest.fixture(scope="module")
def tenant_server(tmp_path_factory):
    from live_server import LiveServer, make_pipe

    from reform.server import Settings
    folder = tmp_path_factory.mktemp("tenants")
    (folder / "keys.txt").write_text("".join(f"{name}:{key}\n" for name, key in TENANT_KEYS.items()))
    with LiveServer(make_pipe(), folder / "store", settings=Settings(keys_file=str(folder / "keys.txt"))) as live:
        yield live


header_bytes = st.binary(max_size=64).map(lambda b: bytes(c for c in b if c not in b"\r\n\x00"))
authorizations = st.one_of(
    header_bytes,
    st.sampled_from(list(TENANT_KEYS.values())).flatmap(lambda key: st.tuples(
        st.sampled_from([b"Bearer ", b"bearer ", b"Basic ", b"Bearer  ", b"", b"Bearer\t"]), st.just(key.encode()),
        header_bytes).map(lambda p: b"".join(p))),
    st.integers(0, 20_000).map(lambda n: b"Bearer " + b"k" * n))


@FUZZ
@given(authorization=authorizations)
def test_fuzz_tenant_keys(tenant_server, authorization):
    """Random Authorization headers (odd bytes, very long keys, a known key with bytes added): the tenant's
    own answer for exactly its ``Bearer KEY``, else 401 in OpenAI's shape; never a 500."""
    import httpx
    from hypothesis import reject
    try:
        r = httpx.get(f"{tenant_server.url}/v1/contexts", headers={"Authorization": authorization}, timeout=30)
    except httpx.LocalProtocolError:      # a value no client sends (leading or trailing whitespace)
        reject()
    scheme, _, given_key = authorization.partition(b" ")
    known = scheme.lower() == b"bearer" and given_key.strip() in {k.encode() for k in TENANT_KEYS.values()}
    event(f"HTTP {r.status_code}")
    # 400: uvicorn's HTTP parser refuses control bytes in a header before any of our code runs
    assert r.status_code in ((200,) if known else (400, 401, 431)), (authorization[:80], r.status_code, r.text[:200])
    if r.status_code == 401:
        assert r.json()["error"]["code"] == "invalid_api_key" and r.headers["www-authenticate"] == "Bearer"
