"""Saved contexts: save -> load -> ask equals the in-memory context for every method; foreign, damaged and
old files are refused in one line; writes are atomic; the store's size budget; sampling options."""

import json
import struct

import pytest
import torch

from reform.pipeline import Pipeline
from reform.store import ContextFileError, ContextStore

from conftest import CharTokenizer, tiny

CONTEXT = "The quick brown fox jumps over the lazy dog. A cat sat on the mat near the door. " * 7   # ~570 tokens
QUESTION = "What does the fox do?"
HEADS = "1:v:0,2:q:3,1:k:1"

METHODS = {
    "reform": dict(heads=HEADS, chunk_size=64, cache_budget=96, recompute_budget=200),
    "reform+rag": dict(heads=HEADS, chunk_size=64, cache_budget=96, recompute_budget=200),
    "reform+rag:retriever=dense+bm25": dict(heads=HEADS, chunk_size=64, cache_budget=96, recompute_budget=200,
                                            retriever="dense+bm25"),
    "full": {},
    "truncate": dict(recompute_budget=200),
    "streaming": dict(chunk_size=64, cache_budget=96),
    "h2o": dict(chunk_size=64, cache_budget=96),
    "tova": dict(chunk_size=64, cache_budget=96),
    "infinipot": dict(chunk_size=64, cache_budget=96),
    "infllm": dict(chunk_size=64, cache_budget=200, block_size=32),
    "ilre": dict(recompute_budget=200),
    "reattention": dict(chunk_size=64, cache_budget=200, local_size=100),
    "rag-bm25": dict(recompute_budget=200),
    "rag-dense": dict(recompute_budget=200),
}


def make(method="reform", seed=0, tokenizer=None, **kw):
    return Pipeline(tiny("llama", seed=seed), tokenizer or CharTokenizer(), method=method.split(":")[0],
                    **(kw or METHODS[method]))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A REFORM context of the tiny model, saved once."""
    pipe = make()
    ctx = pipe.encode(CONTEXT)
    path = tmp_path_factory.mktemp("ctx") / "book.reform"
    ctx.save(path)
    return pipe, ctx, path


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("method", sorted(METHODS))
def test_save_load_ask_equals_in_memory(method, tmp_path):
    pipe = make(method)
    ctx = pipe.encode(CONTEXT)
    path = tmp_path / "c.reform"
    size = ctx.save(path)
    assert size == path.stat().st_size > 0
    assert 0 < size - ctx.stored_bytes() < 16_384        # what a quota counts before the write: all but the header
    # a fresh pipeline over the same weights, built with another method: the file brings its own
    other = make("full", tokenizer=CharTokenizer(), **{}) if method != "full" else make("truncate")
    loaded = other.load_context(path)
    assert loaded.method.name == method.split(":")[0] and torch.equal(loaded.ids, ctx.ids)
    assert loaded.method.config == pipe.method.config
    for question in (QUESTION, "Where did the cat sit?"):
        a, b = ctx.ask(question, max_new_tokens=10), loaded.ask(question, max_new_tokens=10)
        assert a.tokens == b.tokens and a.text == b.text
        assert a.stats["recomputed_tokens"] == b.stats["recomputed_tokens"]
    assert b.stats["encode"] == 0.0 and b.stats["load"] >= 0.0


def test_loaded_cache_and_state_are_bit_identical(saved):
    pipe, ctx, path = saved
    loaded = make().load_context(path)
    assert len(loaded.cache.layers) == len(ctx.cache.layers)
    for a, b in zip(ctx.cache.layers, loaded.cache.layers):
        for part in ("keys_pre", "keys", "values", "scores"):
            x, y = getattr(a, part), getattr(b, part)
            assert (x is None and y is None) or torch.equal(x, y)
    assert torch.equal(ctx.state.data, loaded.state.data)


def test_file_is_safetensors_with_a_json_manifest_and_no_pickle(saved):
    _, ctx, path = saved
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])               # plain JSON header, then raw tensor bytes
    manifest = json.loads(header["__metadata__"]["reform"])
    assert manifest["format"] == "reform-context" and manifest["format_version"] == 1
    assert manifest["method"]["name"] == "reform" and manifest["method"]["options"]["heads"] == HEADS.split(",")
    assert manifest["tokens"] == ctx.ids.shape[0] and len(manifest["ids_sha256"]) == 64
    assert {"config_sha256", "weights_sha256", "tokenizer_sha256", "dtype"} <= set(manifest["model"])
    # U8: the extracted text of the evidence map, as UTF-8 bytes
    assert all(v["dtype"] in ("I32", "F32", "F16", "BF16", "U8") for k, v in header.items() if k != "__metadata__")
    assert [k for k, v in header.items() if v.get("dtype") == "U8"] == ["source.text"]
    assert b"\x80\x04\x95" not in raw and b"\x80\x02" not in raw[:8 + n]     # no pickle stream


class OtherTokenizer(CharTokenizer):
    def __call__(self, text, add_special_tokens=True):
        ids = super().__call__(text, add_special_tokens)["input_ids"]
        return {"input_ids": [(i + 1) % 128 for i in ids]}


def corrupt(path, out, at):
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    out.write_bytes(bytes(data))
    return out


def rewrite_manifest(path, out, **changes):
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file
    with safe_open(str(path), "pt") as f:
        manifest = json.loads(f.metadata()["reform"])
    manifest.update(changes)
    save_file(load_file(str(path)), str(out), metadata={"reform": json.dumps(manifest)})
    return out


@pytest.mark.parametrize("case,message", [
    ("other weights", "encoded with another model"),
    ("other tokenizer", "encoded with another tokenizer"),
    ("other dtype", "encoded in float32 and this model runs in bfloat16"),
    ("flipped byte", "corrupted"),
    ("truncated", "not a readable saved context"),
    ("not a context", "not a readable saved context"),
    ("newer format", "format version 99"),
    ("missing", "saved context not found"),
])
def test_refusals_are_one_line(saved, tmp_path, case, message):
    pipe, _, path = saved
    bad = tmp_path / "bad.reform"
    if case == "other weights":
        pipe, bad = make(seed=1), path
    elif case == "other tokenizer":
        pipe, bad = make(tokenizer=OtherTokenizer()), path
    elif case == "other dtype":
        pipe, bad = Pipeline(tiny("llama").to(torch.bfloat16), CharTokenizer(), method="full"), path
    elif case == "flipped byte":
        corrupt(path, bad, path.stat().st_size - 100)
    elif case == "truncated":
        bad.write_bytes(path.read_bytes()[:path.stat().st_size // 2])
    elif case == "not a context":
        bad.write_bytes(b"hello, I am a text file\n" * 10)
    elif case == "newer format":
        rewrite_manifest(path, bad, format_version=99)
    with pytest.raises(ContextFileError) as e:
        pipe.load_context(bad)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_failed_write_leaves_the_old_file_and_no_temporaries(saved, tmp_path, monkeypatch):
    pipe, ctx, path = saved
    target = tmp_path / "book.reform"
    target.write_bytes(path.read_bytes())
    before = target.read_bytes()
    import safetensors.torch

    def half_write(tensors, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", half_write)
    with pytest.raises(ContextFileError, match="No space left"):
        ctx.save(target)
    assert target.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["book.reform"]
    assert pipe.load_context(target).ids.shape == ctx.ids.shape


def test_store_is_content_addressed_with_an_lru_budget(saved, tmp_path):
    pipe, ctx, path = saved
    size = path.stat().st_size
    store = ContextStore(tmp_path / "store", max_bytes=int(2.5 * size))
    texts = [CONTEXT, CONTEXT + " More.", CONTEXT + " Even more."]
    keys = [pipe.context_key(pipe.tokenize_context(t)) for t in texts]
    assert len(set(keys)) == 3 and keys[0] == pipe.context_key(ctx.ids)
    assert make().context_key(ctx.ids) == keys[0]                       # same model and options: same key
    assert make(recompute_budget=180, heads=HEADS, chunk_size=64, cache_budget=96).context_key(ctx.ids) != keys[0]
    import os
    import time
    for i, (key, text) in enumerate(zip(keys, texts)):
        store.put(key, pipe.encode(text))
        os.utime(store.path(key), (time.time() - 100 + i, time.time() - 100 + i))
        if i == 1:
            store.touch(keys[0])            # used again: now the second one is the least recently used
    assert store.has(keys[0]) and not store.has(keys[1]) and store.has(keys[2])
    assert store.total_bytes() <= store.max_bytes
    with pytest.raises(KeyError):
        store.path("../../etc/passwd")


def test_sampling_options(saved):
    pipe, ctx, _ = saved
    greedy = ctx.ask(QUESTION, max_new_tokens=12)
    # a nucleus this small keeps only the most likely token: sampling becomes greedy
    assert ctx.ask(QUESTION, max_new_tokens=12, temperature=1.0, top_p=1e-6, seed=3).tokens == greedy.tokens
    a = ctx.ask(QUESTION, max_new_tokens=12, temperature=1.5, seed=7)
    assert ctx.ask(QUESTION, max_new_tokens=12, temperature=1.5, seed=7).tokens == a.tokens
    assert any(ctx.ask(QUESTION, max_new_tokens=12, temperature=1.5, seed=s).tokens != a.tokens for s in range(8, 12))
    stop = greedy.text[3:5]
    streamed = []
    cut = ctx.ask(QUESTION, max_new_tokens=12, stop=[stop], on_text=streamed.append)
    assert cut.text == greedy.text[:greedy.text.index(stop)].strip() and cut.finish_reason == "stop"
    assert stop not in "".join(streamed) and "".join(streamed).strip() == cut.text
    assert greedy.finish_reason == "length" and len(greedy.tokens) == 12
    for bad in (dict(temperature=-1), dict(temperature=3), dict(top_p=0), dict(seed="x"), dict(stop=[""])):
        with pytest.raises(ValueError):
            ctx.ask(QUESTION, **bad)


@pytest.mark.parametrize("where", ["local", "url"])
def test_store_at_a_url_behaves_like_a_folder(saved, tmp_path, where):
    """The same store operations over fsspec (``memory://``: no local path at all) and a local folder:
    put, has, manifest from the header only, open_local -> load -> ask, listing, delete; killed writes'
    hidden files are never listed and are removed by ``remove_stale_temporaries``."""
    import uuid
    pipe, ctx, path = saved
    location = str(tmp_path / "store") if where == "local" else f"memory://store-{uuid.uuid4().hex[:8]}/ctx"
    store = ContextStore(location)
    assert store.local == (where == "local")
    key = pipe.context_key(ctx.ids)
    assert not store.has(key) and store.get(key) is None
    size = store.put(key, ctx)
    assert store.has(key) and store.get(key).bytes == size == path.stat().st_size
    assert store.manifest(key)["tokens"] == ctx.ids.shape[0]
    with store.open_local(key) as local:
        again = pipe.load_context(local)
    assert again.ask(QUESTION, max_new_tokens=6).tokens == ctx.ask(QUESTION, max_new_tokens=6).tokens
    hidden = f"{store.root}/.{key}.reform.0123abcd.tmp"
    with store.fs.open(hidden, "wb") as f:        # a write whose process was killed
        f.write(b"partial")
    assert [e.key for e in store.entries()] == [key] and len(store.temporaries()) == 1
    assert store.remove_stale_temporaries(older_than_s=3600) == 0
    assert store.remove_stale_temporaries(older_than_s=0) == 1 and store.temporaries() == []
    with store.fs.open(f"{store.root}/{'0' * 32}.reform", "wb") as f:      # damaged: refused in one line
        f.write(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(ContextFileError, match="not a readable saved context"):
        store.manifest("0" * 32)
    assert store.delete(key) and not store.has(key) and not store.delete(key)
    if where == "url":
        with pytest.raises(ValueError, match="not a local folder"):
            store.path(key)


def test_store_refuses_an_unknown_protocol():
    with pytest.raises(ContextFileError, match="cannot use nosuch://x as a context store"):
        ContextStore("nosuch://x")


def test_an_option_added_later_keeps_old_files_and_keys(saved, tmp_path):
    """REFORM's ``match_run`` came after contexts were first saved: at its default it is not in the saved
    options nor in the content key (old files load, store keys stay), and set it is saved and restored."""
    pipe, ctx, path = saved
    manifest_options = pipe.load_context(path).method.config
    assert manifest_options.match_run == 0
    from reform.methods.options import options_json
    assert "match_run" not in options_json(ctx.method.config)
    matched = make(**{**METHODS["reform"], "match_run": 8, "query_aggregate": "max"})
    assert matched.context_key(ctx.ids) != pipe.context_key(ctx.ids)
    mctx = matched.encode(CONTEXT)
    mctx.save(tmp_path / "m.reform")
    loaded = pipe.load_context(tmp_path / "m.reform")
    assert loaded.method.config.match_run == 8
    assert loaded.ask(QUESTION, max_new_tokens=8).tokens == mctx.ask(QUESTION, max_new_tokens=8).tokens


def test_a_default_that_changed_keeps_old_files_and_runs_as_they_ran(saved, tmp_path):
    """REFORM's ``run_peaks`` is on by default since after contexts were first saved: a file saved without
    it (every file before; today's ``run_peaks=0``) is rebuilt with it off, as it ran; today's default is
    saved, restored and keyed apart; an eval run before the change is not resumed as today's ``reform``."""
    from reform.eval.specs import MethodSpec
    from reform.methods.options import options_json
    pipe, ctx, path = saved
    assert pipe.load_context(path).method.config.run_peaks == 1
    paper = make(**{**METHODS["reform"], "run_peaks": 0})
    assert "run_peaks" not in options_json(paper.method.config)
    assert paper.context_key(ctx.ids) != pipe.context_key(ctx.ids)
    paper.encode(CONTEXT).save(tmp_path / "paper.reform")
    assert pipe.load_context(tmp_path / "paper.reform").method.config.run_peaks == 0
    # the hash eval folders were written with before the defaults changed (options []), kept by naming the
    # values they ran with (run_peaks=0, and query_tokens=all and query_aggregate=max, REFORM's defaults
    # before 2026-11-29)
    before = "76184dbbc44a"
    assert MethodSpec.parse("reform:run_peaks=0:query_tokens=all:query_aggregate=max").config_hash("x") == before
    assert MethodSpec.parse("reform:run_peaks=0:query_tokens=all").config_hash("x") != before
    assert MethodSpec.parse("reform:run_peaks=0").config_hash("x") != before
    assert MethodSpec.parse("reform").config_hash("x") != before
    assert MethodSpec.parse("reform").config_hash("x") == MethodSpec.parse("reform:run_peaks=1").config_hash("x")
