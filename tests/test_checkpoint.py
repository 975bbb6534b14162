"""Resumable encodes (methods/checkpoint.py): an encode stopped after any chunk and resumed from its
checkpoint gives the context an uninterrupted encode gives, bit for bit; a checkpoint of another input or
other options is refused, never mixed in; a checkpoint is not a context to ask."""

import pytest
import torch

from reform import Checkpoint
from reform.pipeline import Pipeline
from reform.store import ContextFileError

from conftest import CharTokenizer, tiny

TEXT = "The quick brown fox jumps over the lazy dog. VAR QXZ = 4711. A cat sat on the mat near the door. " * 8
HEADS = "1:v:0,2:q:3,1:k:1"
OPTIONS = dict(heads=HEADS, chunk_size=64, cache_budget=96, recompute_budget=200)


class Stop(Exception):
    pass


def stop_after(tokens: int):
    seen = [0]

    def progress(n: int) -> None:
        seen[0] += n
        if seen[0] >= tokens:
            raise Stop
    return progress


def same_context(a, b) -> None:
    assert torch.equal(a.ids, b.ids) and torch.equal(a.state.data, b.state.data)
    assert len(a.cache.layers) == len(b.cache.layers)
    for x, y in zip(a.cache.layers, b.cache.layers):
        for part in ("keys_pre", "keys", "values", "scores"):
            assert torch.equal(getattr(x, part), getattr(y, part)), part


@pytest.mark.parametrize("method", ["reform", "reform+rag"])
def test_resumed_encode_equals_one_run(method, tmp_path):
    pipe = Pipeline(tiny("llama"), CharTokenizer(), method=method, **OPTIONS)
    whole = pipe.encode(TEXT)
    n = whole.ids.shape[0]
    assert n > 10 * 64
    path = tmp_path / "doc.reform.partial"
    for stops in ([3 * 64], [64, 5 * 64, 9 * 64]):          # once, and three times in a row
        for at in stops:
            with pytest.raises(Stop):
                pipe.encode(TEXT, progress=stop_after(at), checkpoint=Checkpoint(path, every_s=0))
            assert path.exists()
        seen = []
        resumed = pipe.encode(TEXT, progress=seen.append, checkpoint=Checkpoint(path, every_s=0))
        same_context(resumed, whole)
        assert seen[0] == stops[-1] and sum(seen) == n       # the bar starts where the checkpoint ends
        assert not path.exists()                             # done: the checkpoint has served
        part = pipe.templater.question("What is QXZ?")
        assert torch.equal(resumed.method.select(resumed, part, None), whole.method.select(whole, part, None))


def test_checkpoints_of_another_input_or_options_are_refused(tmp_path):
    pipe = Pipeline(tiny("llama"), CharTokenizer(), **OPTIONS)
    path = tmp_path / "doc.partial"
    with pytest.raises(Stop):
        pipe.encode(TEXT, progress=stop_after(4 * 64), checkpoint=Checkpoint(path, every_s=0))
    before = path.read_bytes()
    with pytest.raises(ContextFileError, match="checkpoint of another input; delete it"):
        pipe.encode(TEXT + " more", checkpoint=path)
    other = Pipeline(tiny("llama"), CharTokenizer(), **{**OPTIONS, "cache_budget": 128})
    with pytest.raises(ContextFileError, match="encoded with other options"):
        other.encode(TEXT, checkpoint=path)
    with pytest.raises(ContextFileError, match=r"is an unfinished encode \(\d+ of \d+ tokens\)"):
        pipe.load_context(path)
    assert path.read_bytes() == before                        # refusing touched nothing
    done = pipe.encode(TEXT)
    done.save(tmp_path / "done.reform")
    with pytest.raises(ContextFileError, match="finished saved context, not an encode's checkpoint"):
        pipe.encode(TEXT, checkpoint=tmp_path / "done.reform")
    pipe.encode("short", checkpoint=tmp_path / "done.reform")   # nothing to compress, nothing to resume:
    assert (tmp_path / "done.reform").exists()                  # a file it did not write is left alone


def test_only_what_can_resume_takes_a_checkpoint(tmp_path):
    h2o = Pipeline(tiny("llama"), CharTokenizer(), method="h2o", chunk_size=64, cache_budget=96)
    with pytest.raises(ValueError, match="method 'h2o' cannot checkpoint its encode"):
        h2o.encode(TEXT, checkpoint=tmp_path / "x.partial")
    segments = Pipeline(tiny("llama"), CharTokenizer(), segments=2, **OPTIONS)
    with pytest.raises(ValueError, match="segments > 1"):
        segments.encode(TEXT, checkpoint=tmp_path / "x.partial")
    with pytest.raises(ValueError, match=">= 0 seconds"):
        Checkpoint(tmp_path / "x.partial", every_s=-1)
    assert not (tmp_path / "x.partial").exists()


def test_reform_encode_resumes_after_ctrl_c(tiny_model_dir, tmp_path, monkeypatch):
    """`reform encode -o OUT` keeps its state in OUT.partial; after a Ctrl-C the same command goes on from
    it and writes the file one uninterrupted run writes (tensors equal)."""
    from safetensors.torch import load_file
    from typer.testing import CliRunner

    from reform.cli.main import app
    from reform.methods import checkpoint as module
    doc = tmp_path / "doc.txt"
    doc.write_text(TEXT * 4)
    out, once = tmp_path / "doc.reform", tmp_path / "once.reform"
    args = ["encode", str(doc), "--model", str(tiny_model_dir), "--heads", "1:v:0,2:k:1", "--chunk-size", "64",
            "--cache-budget", "96", "--recompute-budget", "200"]
    runner = CliRunner()
    assert runner.invoke(app, [*args, "-o", str(once)]).exit_code == 0
    original = module.Checkpoint.chunk_done

    def ctrl_c_after_saving(self, done, total, partial):
        original(self, done, total, partial)
        if done >= 5 * 64:
            raise KeyboardInterrupt
    monkeypatch.setattr(module.Checkpoint, "chunk_done", ctrl_c_after_saving)
    r = runner.invoke(app, [*args, "-o", str(out), "--checkpoint-minutes", "0"])
    assert r.exit_code == 130, r.output
    assert "320 of" in r.stderr and f"kept in {out}.partial" in r.stderr and "same command again" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["doc.reform.partial", "doc.txt", "once.reform"]
    r = runner.invoke(app, ["ask", "--context", str(out) + ".partial", "-q", "What?"])
    assert r.exit_code == 2 and "is an unfinished encode (320 of" in r.stderr, r.output
    monkeypatch.setattr(module.Checkpoint, "chunk_done", original)
    from reform.methods.base import Context
    save = Context.save

    def disk_full(self, path, **kw):         # the finished context cannot be written: the checkpoint stays
        if kw.get("partial") is None:
            raise ContextFileError(f"cannot write {path}: No space left on device")
        return save(self, path, **kw)
    monkeypatch.setattr(Context, "save", disk_full)
    r = runner.invoke(app, [*args, "-o", str(out)])
    assert r.exit_code == 2 and "No space left on device" in r.stderr, r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["doc.reform.partial", "doc.txt", "once.reform"]
    monkeypatch.setattr(Context, "save", save)
    r = runner.invoke(app, [*args, "-o", str(out)])
    assert r.exit_code == 0 and f"going on from {out}.partial (320 tokens" in r.stderr, r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["doc.reform", "doc.txt", "once.reform"]
    a, b = load_file(str(out)), load_file(str(once))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    r = runner.invoke(app, ["encode", str(doc), "-o", str(out), "--model", str(tiny_model_dir), "--method", "h2o",
                            "--checkpoint-minutes", "1"])
    assert r.exit_code == 2 and "method 'h2o' cannot resume an encode" in r.stderr, r.output
