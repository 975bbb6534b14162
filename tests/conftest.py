"""Tiny random-weight models (built in code, no downloads) and a character-level tokenizer for them."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before huggingface_hub reads it: tests never touch the network

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config, \
    Qwen2ForCausalLM

WINDOW = 512


def tiny(kind: str = "llama", window: int = WINDOW, seed: int = 0, **over):
    torch.manual_seed(seed)
    common = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=window,
                  rope_theta=10000.0, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                  pad_token_id=0, attn_implementation="eager")
    common.update(over)
    cls = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM),
           "mistral": (MistralConfig, MistralForCausalLM)}[kind]
    if kind == "mistral":
        common["sliding_window"] = None
    model = cls[1](cls[0](**common)).eval()
    # random init gives near-uniform attention; sharpen it so eviction and selection matter
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(4.0)
    return model


class CharTokenizer:
    """Byte-level tokenizer over a 128-token vocabulary: enough for prompt-layout and pipeline tests."""

    bos_token_id, eos_token_id, pad_token_id = 1, 2, 0
    chat_template = None

    def __call__(self, text, add_special_tokens=True):
        ids = [3 + b - 32 if 32 <= b < 127 else 98 if b == 10 else 99 + b % 29 for b in text.encode()]
        return {"input_ids": ([self.bos_token_id] if add_special_tokens else []) + ids}

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i - 3 + 32) if 3 <= i < 98 else "\n" if i == 98 else "?" for i in ids)


@pytest.fixture(params=["llama", "qwen2"])
def tiny_model(request):
    return tiny(request.param)


@pytest.fixture
def tokenizer():
    return CharTokenizer()


CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def real_tokenizer():
    """A byte-level BPE tokenizer trained here in a second (no download) with ChatML special tokens and
    a chat template, like SmolLM2's: for tests of special tokens in user text and of the CLI end to end."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    corpus = ["The quick brown fox jumps over the lazy dog. What is the magic number? It is 42."] * 20
    tk.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                  pad_token="<|endoftext|>", unk_token="<|endoftext|>")
    tok.chat_template = CHAT_TEMPLATE
    return tok


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A saved tiny random Llama with the real tokenizer above: ``--model DIR`` for CLI tests."""
    path = tmp_path_factory.mktemp("tiny-model")
    tok = real_tokenizer()
    tok.save_pretrained(path)
    model = tiny("llama", vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                 pad_token_id=tok.pad_token_id)
    model.save_pretrained(path)
    return path


IMAGE_SIZE = 28     # the tiny vision tower's input: 28x28 pixels in 7x7 patches, 16 image tokens


def tiny_vlm(window: int = WINDOW, seed: int = 0):
    """``(model, tokenizer, processor)``: a tiny random LLaVA (CLIP tower, Llama decoder) with the real
    tokenizer above plus an ``<image>`` token, and a LLaVA processor built in code (no download)."""
    from transformers import CLIPImageProcessorPil, LlavaConfig, LlavaForConditionalGeneration, LlavaProcessor
    tok = real_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<image>"]})
    image_token = tok.convert_tokens_to_ids("<image>")
    cfg = LlavaConfig(
        text_config=dict(model_type="llama", vocab_size=len(tok) + 16, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         max_position_embeddings=window, tie_word_embeddings=False, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id),
        vision_config=dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=2, image_size=IMAGE_SIZE, patch_size=7, projection_dim=32),
        image_token_id=image_token, projector_hidden_act="gelu", vision_feature_layer=-1,
        vision_feature_select_strategy="default")
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        for layer in model.model.language_model.layers:
            layer.self_attn.q_proj.weight.mul_(4.0)
    processor = LlavaProcessor(
        image_processor=CLIPImageProcessorPil(size={"shortest_edge": IMAGE_SIZE},
                                              crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}),
        tokenizer=tok, patch_size=7, vision_feature_select_strategy="default", num_additional_image_tokens=1,
        image_token="<image>", chat_template=tok.chat_template)
    return model, tok, processor


@pytest.fixture(scope="session")
def tiny_vlm_dir(tmp_path_factory):
    """A saved tiny random LLaVA with its processor: ``--model DIR`` for CLI, server and eval tests."""
    path = tmp_path_factory.mktemp("tiny-vlm")
    model, tok, processor = tiny_vlm()
    model.save_pretrained(path)
    processor.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture
def store(tmp_path):
    """A server's context store folder (``reform serve --store``)."""
    return tmp_path / "store"


@pytest.fixture
def live(store):
    """``live_server.LiveServer`` over the tiny model and ``store``, for the server tests."""
    from live_server import LiveServer, make_pipe
    with LiveServer(make_pipe(), store) as server:
        yield server
