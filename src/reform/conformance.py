"""The conformance contract: for every decoder model type transformers ships, the engine either computes
exactly what transformers computes, or refuses the model up front with one true sentence.

Each model type (and the variants that matter for long inputs: sliding windows, every ``rope_type``,
soft-capping, multipliers, MoE, qk-norms, partial rotary, NoPE layers) is built from its config class
with tiny random weights, offline, and run three ways against transformers itself:

- one-shot prefill logits vs ``model(ids).logits``;
- chunked prefill (several chunks, unbounded cache) vs the same logits;
- greedy tokens vs ``model.generate``;
- the same greedy tokens decoded in a batch (``Engine.step``) beside a shorter prompt, against each
  prompt decoded alone.

Inputs are longer than any sliding window in the variants, so sliding-window layers are exercised.
``reform models`` prints the table; ``tests/test_conformance.py`` asserts "equal or refused" for every row.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from .engine.batch import DecodeBatch
from .engine.cache import KVCache
from .engine.core import Engine
from .engine.shape import UnsupportedModelError

SEQ = 80            # prompt tokens: longer than the variants' sliding window (32)
CHUNK = 24          # chunked-prefill chunk size
NEW_TOKENS = 6      # greedy tokens compared with model.generate
TOLERANCE = 1e-4    # max |logit difference| (fp32) for "equal"
WINDOW = 256        # max_position_embeddings of the tiny configs
MAX_PARAMETERS = 60_000_000  # a "tiny" build larger than this did not take the tiny sizes: not built

TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=WINDOW, initializer_range=0.1,
            pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
            num_local_experts=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
            shared_expert_intermediate_size=32, n_routed_experts=4, n_shared_experts=1)


def _rope(kind: str, **extra) -> dict:
    return {"rope_parameters": {"rope_type": kind, "rope_theta": 10000.0, **extra}}


_LONGROPE = dict(short_factor=[1.0 + i / 16 for i in range(8)], long_factor=[2.0 + i / 8 for i in range(8)],
                 original_max_position_embeddings=64)

# name -> (model type, config overrides): the families people run on long documents, and the variants
# of each that change what a layer computes.
VARIANTS: dict[str, tuple[str, dict]] = {
    "llama": ("llama", {}),
    "llama (llama3 rope)": ("llama", _rope("llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                           original_max_position_embeddings=64)),
    "llama (yarn rope)": ("llama", _rope("yarn", factor=4.0, original_max_position_embeddings=64)),
    "llama (linear rope)": ("llama", _rope("linear", factor=2.0)),
    "llama (dynamic rope)": ("llama", _rope("dynamic", factor=2.0)),
    "llama (longrope)": ("llama", _rope("longrope", **_LONGROPE)),
    "mistral": ("mistral", {"sliding_window": None}),
    "mistral (sliding window)": ("mistral", {"sliding_window": 32}),
    "mixtral": ("mixtral", {"sliding_window": None}),
    "mixtral (sliding window)": ("mixtral", {"sliding_window": 32}),
    "qwen2": ("qwen2", {}),
    "qwen2 (sliding window)": ("qwen2", {"use_sliding_window": True, "sliding_window": 32, "max_window_layers": 2}),
    "qwen2_moe": ("qwen2_moe", {}),
    "qwen3": ("qwen3", {}),
    "qwen3 (sliding window)": ("qwen3", {"use_sliding_window": True, "sliding_window": 32, "max_window_layers": 2}),
    "qwen3_moe": ("qwen3_moe", {}),
    "gemma": ("gemma", {}),
    "gemma2": ("gemma2", {"sliding_window": 32}),
    "gemma3 (5 local : 1 global)": ("gemma3_text", {"sliding_window": 32, "num_hidden_layers": 6}),
    "gemma3 (multimodal checkpoint class, text only)": (
        "gemma3", {"text_config": {**TINY, "sliding_window": 32, "num_hidden_layers": 6},
                   "vision_config": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                                     "num_attention_heads": 2, "image_size": 28, "patch_size": 14},
                   "mm_tokens_per_image": 4}),
    "phi3": ("phi3", {}),
    "phi3 (longrope, partial rotary)": ("phi3", {**_rope("longrope", short_factor=[1.0, 1.1, 1.2, 1.3],
                                                         long_factor=[2.0, 2.5, 3.0, 3.5],
                                                         original_max_position_embeddings=64,
                                                         partial_rotary_factor=0.5),
                                                 "partial_rotary_factor": 0.5}),
    "smollm3 (NoPE layers)": ("smollm3", {"no_rope_layer_interval": 2}),
    "granite (multipliers)": ("granite", {"embedding_multiplier": 4.0, "residual_multiplier": 0.5,
                                          "attention_multiplier": 0.2, "logits_scaling": 3.0}),
    "olmo": ("olmo", {}),
    "olmo (clip_qkv)": ("olmo", {"clip_qkv": 0.5}),
    "olmo2": ("olmo2", {}),
    "cohere": ("cohere", {"logit_scale": 0.5}),
    "stablelm (partial rotary)": ("stablelm", {"partial_rotary_factor": 0.25}),
    "stablelm (qk-layernorm)": ("stablelm", {"qk_layernorm": True}),
    "starcoder2": ("starcoder2", {"sliding_window": None}),
    "starcoder2 (sliding window)": ("starcoder2", {"sliding_window": 32}),
    "glm": ("glm", {}),
    "phi": ("phi", {}),
    "gpt_neox": ("gpt_neox", {}),
    "falcon": ("falcon", {}),
    "deepseek_v3": ("deepseek_v3", {}),
}


def decoder_model_types() -> list[str]:
    """Every model type transformers maps to a causal-LM class."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def all_variants() -> dict[str, tuple[str, dict]]:
    """The named variants, then every other causal-LM model type with its defaults (tiny sizes)."""
    out = dict(VARIANTS)
    named = {t for t, _ in VARIANTS.values()}
    out.update({t: (t, {}) for t in decoder_model_types() if t not in named})
    return out


class NotBuildable(Exception):
    """The model type cannot be built offline from its config class with tiny sizes."""


def build(model_type: str, overrides: dict | None = None, seed: int = 0, device: str = "cpu") -> torch.nn.Module:
    """A tiny random-weight model of ``model_type`` (fp32, eager attention: transformers' reference path),
    initialised on the CPU (the same weights for every ``device``) and then moved to ``device``."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    sizes = {**TINY, **(overrides or {})}
    for attempt in (sizes, {k: v for k, v in sizes.items() if k != "head_dim"}):   # some configs derive head_dim
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cfg = AutoConfig.for_model(model_type, **attempt)
                with torch.device("meta"):   # count first: sub-configs may keep full-size defaults
                    size = sum(p.numel() for p in AutoModelForCausalLM.from_config(cfg).parameters())
                if size > MAX_PARAMETERS:
                    raise NotBuildable(f"{size / 1e6:.0f}M parameters at tiny sizes (sub-configs keep full-size "
                                       "defaults)")
                torch.manual_seed(seed)
                model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=torch.float32)
                return model.to(device).eval()
        except NotBuildable:
            raise
        except Exception as e:  # unknown to this transformers, sub-configs, optional packages...
            error = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:120]}"
    raise NotBuildable(error)


@dataclass
class Result:
    name: str
    model_type: str
    status: str            # "equal", "refused", "different", "not built"
    detail: str = ""
    one_shot: float | None = None   # max |logit difference|
    chunked: float | None = None
    tokens_equal: bool | None = None


@torch.inference_mode()
def check(name: str, model_type: str, overrides: dict | None = None, device: str = "cpu") -> Result:
    """Build one variant on ``device`` and compare the engine with transformers there (see the module
    docstring); on CUDA both run in fp32 with TF32 off, so the same tolerance applies."""
    try:
        model = build(model_type, overrides, device=device)
    except NotBuildable as e:
        return Result(name, model_type, "not built", str(e))
    try:
        engine = Engine(model)
    except UnsupportedModelError as e:
        return Result(name, model_type, "refused", str(e))
    g = torch.Generator().manual_seed(1)
    vocab = model.get_output_embeddings().weight.shape[0]
    ids = torch.randint(3, vocab, (SEQ,), generator=g).to(device)
    ref = model(ids[None]).logits[0].float()
    one = engine.logits(engine.forward(ids, KVCache.empty(engine.shape.n_layers)))
    cache, parts = KVCache.empty(engine.shape.n_layers), []
    with engine.rotary.spanning(SEQ):   # one sequence in chunks, as Engine.prefill runs it
        for s in range(0, SEQ, CHUNK):
            parts.append(engine.logits(engine.forward(ids[s:s + CHUNK], cache)))
    chunked = torch.cat(parts)
    eos = model.generation_config.eos_token_id
    eos = [eos] if isinstance(eos, int) else list(eos or [])
    hf_tokens = model.generate(ids[None], max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)[0, SEQ:].tolist()
    hf_tokens = hf_tokens[:next((i for i, x in enumerate(hf_tokens) if x in eos), len(hf_tokens))]
    ours = list(engine.generate(ids, max_new_tokens=NEW_TOKENS, eos_ids=eos, chunk_size=CHUNK))
    prompts = [ids, ids[:SEQ // 2 + 3]]
    alone = [list(engine.generate(p, max_new_tokens=NEW_TOKENS, eos_ids=[], chunk_size=CHUNK)) for p in prompts]
    batched = batched_greedy(engine, prompts, NEW_TOKENS)
    d1, d2 = float((one - ref).abs().max()), float((chunked - ref).abs().max())
    ok = d1 <= TOLERANCE and d2 <= TOLERANCE and ours == hf_tokens and batched == alone
    return Result(name, model_type, "equal" if ok else "different",
                  "" if ok else f"one-shot {d1:.1e}, chunked {d2:.1e}, tokens {ours} vs {hf_tokens}, "
                                f"batched {batched} vs alone {alone}",
                  d1, d2, ours == hf_tokens)


def batched_greedy(engine: Engine, prompts: list[torch.Tensor], n: int) -> list[list[int]]:
    """``n`` greedy tokens of each prompt (no end-of-sequence stop), the prompts decoded together."""
    batch, tokens = DecodeBatch(engine.shape.n_layers, len(prompts)), []
    for prompt in prompts:
        cache = KVCache.empty(engine.shape.n_layers)
        hidden = engine.prefill(prompt, cache, chunk_size=CHUNK)
        batch.join(cache)
        tokens.append([int(engine.logits(hidden[-1:])[0].argmax())])
    for _ in range(n - 1):
        for seq, row in zip(tokens, engine.step(batch, [seq[-1] for seq in tokens])):
            seq.append(int(row.argmax()))
    return tokens


# ---------------------------------------------------------------- vision-language models
_TEXT = {k: TINY[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                              "num_key_value_heads", "head_dim", "max_position_embeddings", "initializer_range",
                              "pad_token_id", "bos_token_id", "eos_token_id", "tie_word_embeddings")}
_VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=28,
               patch_size=7)
IMAGE_TOKEN = 100     # the placeholder id of the tiny vision configs (inside the 128-token vocabulary)
IMAGE_START = 101     # Qwen2-VL's <|vision_start|>


@dataclass(frozen=True)
class VisionVariant:
    """A tiny vision-language model: its config, how many placeholder tokens one 28x28 image takes, and
    the pixel tensors its processor would return for ``n`` images (``pixels``: "plain" [n, 3, H, W],
    "sizes" the same with ``image_sizes``, "tiles" [n, 2, 3, H, W] (the whole image and one tile, as
    LLaVA-NeXT's processor cuts them) with ``image_sizes``, "batched" [1, n, 3, H, W], "patches"
    Qwen2-VL's flattened patches with ``image_grid_thw``)."""

    model_type: str
    config: dict
    tokens_per_image: int
    pixels: str = "plain"


VISION_VARIANTS: dict[str, VisionVariant] = {
    "llava (CLIP)": VisionVariant("llava", dict(
        text_config={**_TEXT, "model_type": "llama"}, image_token_id=IMAGE_TOKEN, projector_hidden_act="gelu",
        vision_config={**_VISION, "model_type": "clip_vision_model", "projection_dim": 32},
        vision_feature_layer=-1, vision_feature_select_strategy="default"), 16),
    "llava_next (any resolution)": VisionVariant("llava_next", dict(
        text_config={**_TEXT, "model_type": "llama"}, image_token_id=IMAGE_TOKEN, image_grid_pinpoints=[[28, 28]],
        vision_config={**_VISION, "model_type": "clip_vision_model", "projection_dim": 32},
        vision_feature_layer=-1, vision_feature_select_strategy="default"), 36, "tiles"),
    "mistral3 (Pixtral)": VisionVariant("mistral3", dict(
        text_config={**_TEXT, "model_type": "mistral", "sliding_window": None}, image_token_id=IMAGE_TOKEN,
        vision_config={**_VISION, "model_type": "pixtral", "head_dim": 16}, spatial_merge_size=2,
        vision_feature_layer=-1), 4, "sizes"),
    "idefics3 (SmolVLM's architecture)": VisionVariant("idefics3", dict(
        text_config={**_TEXT, "model_type": "llama"}, image_token_id=IMAGE_TOKEN, scale_factor=2,
        vision_config=_VISION), 4, "batched"),
    "gemma3 (with images)": VisionVariant("gemma3", dict(
        text_config={**_TEXT, "model_type": "gemma3_text", "sliding_window": 32}, image_token_index=IMAGE_TOKEN,
        vision_config={**_VISION, "model_type": "siglip_vision_model", "patch_size": 14}, mm_tokens_per_image=4,
        boi_token_index=102, eoi_token_index=103), 4),
    "qwen2_vl (with images)": VisionVariant("qwen2_vl", dict(
        text_config={**_TEXT, "model_type": "qwen2_vl_text",
                     "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}},
        vision_config=dict(depth=1, embed_dim=32, hidden_size=64, num_heads=2, patch_size=7, spatial_merge_size=2,
                           temporal_patch_size=2, in_channels=3),
        image_token_id=IMAGE_TOKEN, vision_start_token_id=IMAGE_START), 4, "patches"),
}


def build_vision(variant: VisionVariant, seed: int = 0, device: str = "cpu") -> torch.nn.Module:
    """A tiny random-weight vision-language model (fp32, eager attention), as ``build`` makes decoders."""
    from transformers import AutoConfig, AutoModelForImageTextToText
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cfg = AutoConfig.for_model(variant.model_type, **variant.config)
            torch.manual_seed(seed)
            model = AutoModelForImageTextToText.from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    except Exception as e:
        raise NotBuildable(f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:120]}") from None
    return model.to(device).eval()


def vision_input(variant: VisionVariant, images: int = 2, seed: int = 1) -> tuple[torch.Tensor, dict]:
    """``(ids, pixels)``: text with ``images`` random images between its pieces, as a processor lays them
    out (one placeholder token per image position), and the pixel tensors the model's forward takes."""
    g = torch.Generator().manual_seed(seed)
    text = lambda n: torch.randint(3, 90, (n,), generator=g)
    start = [torch.tensor([IMAGE_START])] if variant.pixels == "patches" else []
    pieces = [text(20)]
    for i in range(images):
        pieces += [*start, torch.full((variant.tokens_per_image,), IMAGE_TOKEN), text(15 - 5 * i)]
    ids = torch.cat(pieces)
    if variant.pixels == "patches":        # 28x28 at patch 7: a 4x4 grid, merged 2x2 into 4 tokens
        pixels = {"pixel_values": torch.randn(16 * images, 3 * 2 * 7 * 7, generator=g),
                  "image_grid_thw": torch.tensor([[1, 4, 4]] * images),
                  "mm_token_type_ids": (ids == IMAGE_TOKEN).long()[None]}
    else:
        pv = torch.randn(images, *((2,) if variant.pixels == "tiles" else ()), 3, 28, 28, generator=g)
        pixels = {"pixel_values": pv[None] if variant.pixels == "batched" else pv}
        if variant.pixels in ("sizes", "tiles"):
            pixels["image_sizes"] = torch.tensor([[28, 28]] * images)
    return ids, pixels


def with_image_ids(engine: Engine, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``ids`` with each image position replaced by its own id past the vocabulary (``Engine.input_rows``)."""
    out = ids.clone()
    out[mask.to(ids.device)] = engine.vocab + torch.arange(int(mask.sum()), device=ids.device)
    return out


@torch.inference_mode()
def check_images(name: str, variant: VisionVariant, device: str = "cpu") -> Result:
    """The conformance check on an input with two images: one-shot and chunked logits against
    ``model(input_ids, pixel_values, ...)``, greedy tokens against ``model.generate`` with the images."""
    from .engine.vision import image_rows
    try:
        model = build_vision(variant, device=device)
    except NotBuildable as e:
        return Result(name, variant.model_type, "not built", str(e))
    ids, pixels = vision_input(variant)
    ids, pixels = ids.to(device), {k: v.to(device) for k, v in pixels.items()}
    try:
        engine = Engine(model)
        mask, rows = image_rows(model, ids, pixels)
    except UnsupportedModelError as e:
        return Result(name, variant.model_type, "refused", str(e))
    n = ids.shape[0]
    ref = model(input_ids=ids[None], **pixels).logits[0].float()
    hf_tokens = model.generate(input_ids=ids[None], **pixels, max_new_tokens=NEW_TOKENS, do_sample=False,
                               pad_token_id=0)[0, n:].tolist()
    eos = model.generation_config.eos_token_id
    eos = [eos] if isinstance(eos, int) else list(eos or [])
    hf_tokens = hf_tokens[:next((i for i, x in enumerate(hf_tokens) if x in eos), len(hf_tokens))]
    vids = with_image_ids(engine, ids, mask)
    with engine.input_rows(rows):
        one = engine.logits(engine.forward(vids, KVCache.empty(engine.shape.n_layers)))
        cache = KVCache.empty(engine.shape.n_layers)
        chunked = torch.cat([engine.logits(engine.forward(vids[s:s + CHUNK], cache)) for s in range(0, n, CHUNK)])
        ours = list(engine.generate(vids, max_new_tokens=NEW_TOKENS, eos_ids=eos, chunk_size=CHUNK))
    d1, d2 = float((one - ref).abs().max()), float((chunked - ref).abs().max())
    ok = d1 <= TOLERANCE and d2 <= TOLERANCE and ours == hf_tokens
    return Result(name, variant.model_type, "equal" if ok else "different",
                  "" if ok else f"one-shot {d1:.1e}, chunked {d2:.1e}, tokens {ours} vs {hf_tokens}",
                  d1, d2, ours == hf_tokens)


def summary(results: list[Result], device: str) -> str:
    """The first line of ``reform models``: counts per outcome, with the transformers version and device."""
    import transformers
    count = {s: sum(r.status == s for r in results) for s in ("equal", "refused", "not built", "different")}
    return (f"transformers {transformers.__version__} on {device}; {count['equal']} equal, {count['refused']} refused, "
            f"{count['not built']} not built offline, {count['different']} different")


def table(results: list[Result]) -> str:
    """Markdown table: model type / variant -> supported or refused, and why."""
    rows = ["| model type / variant | result | max logit diff (one-shot / chunked) | why |", "|---|---|---|---|"]
    for r in results:
        diff = f"{r.one_shot:.1e} / {r.chunked:.1e}" if r.one_shot is not None else ""
        label = {"equal": "**equal to transformers**", "refused": "refused", "different": "DIFFERENT",
                 "not built": "not built offline"}[r.status]
        rows.append(f"| {r.name} | {label} | {diff} | {r.detail.replace('|', '/')} |")
    return "\n".join(rows)
