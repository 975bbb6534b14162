"""What every prepared GPU measurement (scripts/gpu_check.py) is built from: model shapes and random-weight
models of them, a byte-level tokenizer, the results written as JSON and markdown after every row, the
machine, and the one-line refusal of a machine that lacks what a mode needs."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch

K = 1024


@dataclass(frozen=True)
class Shape:
    """A decoder's shape (public config.json values) and the REFORM settings the paper ran it with."""
    model_type: str
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    layers: int
    vocab: int
    window: int
    rope_theta: float = 1e6
    chunk: int = 32 * K                  # the paper's chunk and cache (§4 setup; REFORM §3.1)
    recompute: int = 8 * K               # 8k for Mistral-NeMo, 16k for the other models (§4 setup)
    reform_heads: tuple[str, ...] = ()   # the model's published heads (its preset); () = the fallback guess


SHAPES = {
    # mistralai/Mistral-Nemo-Instruct-2407, heads from REFORM appendix C.6 (heads/presets)
    "mistral-nemo-12b": Shape("mistral", 5120, 32, 8, 128, 14336, 40, 131072, 128 * K,
                              reform_heads=("15:q:9", "19:v:5", "27:v:0", "27:v:7")),
    # Qwen/Qwen2.5-7B-Instruct (128k window with YaRN, as the paper runs it past 32k)
    "qwen2.5-7b": Shape("qwen2", 3584, 28, 4, 128, 18944, 28, 152064, 128 * K, recompute=16 * K,
                        reform_heads=("7:v:3", "14:k:0", "14:v:3", "19:v:0")),
    # HuggingFaceTB/SmolLM2-135M-Instruct, the default model's shape and preset heads
    "smollm2-135m": Shape("llama", 576, 9, 3, 64, 1536, 30, 49152, 8 * K, rope_theta=1e5, chunk=2 * K,
                          recompute=1 * K, reform_heads=("5:v:2", "3:k:2", "12:v:1", "18:v:2")),
    # toy shapes for `smoke`: the same code paths in seconds on a CPU
    "toy": Shape("mistral", 128, 4, 2, 32, 256, 4, 512, 2 * K, chunk=512, recompute=256,
                 reform_heads=("1:q:0", "2:v:1")),
    "toy-llama": Shape("llama", 64, 4, 2, 16, 128, 4, 512, 2 * K, chunk=512, recompute=256,
                       reform_heads=("1:q:0", "2:v:1")),
}


def build_model(shape: Shape, device: str, dtype: torch.dtype, seed: int = 0) -> torch.nn.Module:
    """A random-weight causal LM of ``shape``, built directly on ``device`` in ``dtype`` (no download)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    config = AutoConfig.for_model(
        shape.model_type, hidden_size=shape.hidden, num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads, head_dim=shape.head_dim, intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers, vocab_size=shape.vocab, max_position_embeddings=shape.window,
        rope_theta=shape.rope_theta, tie_word_embeddings=False, bos_token_id=0, eos_token_id=1, pad_token_id=2,
        sliding_window=None)
    torch.manual_seed(seed)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)             # no fp32 copy of a 12B model on the way
    try:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config)
    finally:
        torch.set_default_dtype(default)
    return model.eval()


def byte_tokenizer():
    """A byte-level tokenizer made here (256 byte tokens + 3 specials, no merges, no download): one token
    per byte of text, so an input of N tokens is N bytes of prose."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    vocab = {"<s>": 0, "</s>": 1, "<pad>": 2}
    vocab.update({ch: i + 3 for i, ch in enumerate(pre_tokenizers.ByteLevel.alphabet())})
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


# ------------------------------------------------------------------------------------------- output
class Results:
    """Rows of one mode, rewritten to ``OUT/MODE.json`` and ``OUT/MODE.md`` after every row."""

    def __init__(self, out: Path, mode: str, header: dict):
        self.out, self.mode, self.header, self.rows, self.notes, self.table = out, mode, header, [], [], ""
        out.mkdir(parents=True, exist_ok=True)

    def add(self, row: dict) -> None:
        self.rows.append(row)
        self.write()
        print(json.dumps(row), flush=True)

    def note(self, line: str) -> None:
        self.notes.append(line)
        self.write()
        print(line, flush=True)

    def write(self, table: str | None = None) -> None:
        from reform.outputs import write_atomic
        write_atomic(self.out / f"{self.mode}.json",
                     json.dumps({**self.header, "rows": self.rows, "notes": self.notes}, indent=1))
        if table is not None:
            self.table = table
        m = self.header.get("machine") or {}
        where = ", ".join(str(m[k]) for k in ("gpu", "cpu") if m.get(k)) + f", {m.get('cpu_cores')} cores"
        versions = ", ".join(f"{k} {m[k]}" for k in ("torch", "cuda", "transformers") if m.get(k))
        lines = [f"# gpu_check {self.mode}", "", f"{where}; {versions}; {m.get('date')}", "",
                 ", ".join(f"{k}: {v}" for k, v in self.header.items() if not isinstance(v, (dict, list))), ""]
        write_atomic(self.out / f"{self.mode}.md", "\n".join(lines + [self.table] +
                                                              [""] + [f"- {n}" for n in self.notes]) + "\n")


def markdown(rows: list[dict], columns: list[tuple[str, str]]) -> str:
    """``columns``: (header, key) pairs; missing values print as blanks."""
    def cell(v) -> str:
        return "" if v is None else f"{v:.3g}" if isinstance(v, float) else str(v)
    out = ["| " + " | ".join(h for h, _ in columns) + " |", "|" + "---|" * len(columns)]
    out += ["| " + " | ".join(cell(r.get(k)) for _, k in columns) + " |" for r in rows]
    return "\n".join(out)


def machine(device: str) -> dict:
    import transformers
    from reform.machine import machine_info
    info = machine_info(torch.device(device)) | {"transformers": transformers.__version__,
                                                  "date": time.strftime("%Y-%m-%d")}
    if device.startswith("cuda"):
        free, total = torch.cuda.mem_get_info()
        info |= {"gpu_memory_gib": round(total / 2**30, 1), "cuda": torch.version.cuda}
    return info


class CannotRun(Exception):
    """This machine lacks what the mode needs: one line, exit status 2."""


def need_bm25s() -> None:
    """REFORM picks the question's content tokens with bm25s's stop-word list; the lent machines lack it."""
    import importlib.util
    if importlib.util.find_spec("bm25s") is None:
        raise CannotRun("bm25s is not installed (REFORM's question tokens need its stop-word list): carry its "
                        "package folder and put it on PYTHONPATH (docs/gpu.md, \"The prepared checks\")")


def need_cuda(device: str, gib: float = 0) -> None:
    if not device.startswith("cuda"):
        return
    if not torch.cuda.is_available():
        raise CannotRun(f"no CUDA device here (torch {torch.__version__}); run this mode on a GPU machine, "
                        "or `smoke` on a CPU")
    total = torch.cuda.mem_get_info()[1] / 2**30
    if total < gib:
        raise CannotRun(f"{torch.cuda.get_device_name()} has {total:.0f} GiB; this mode needs {gib:.0f} GiB")
