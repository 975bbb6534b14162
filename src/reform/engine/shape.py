"""What the engine drives, read off a transformers causal LM: its decoder stack (embeddings, layers, final
norm, rotary module, LM head) and its dimensions, with every structural refusal up front
(docs/architecture.md, "Where per-model behaviour lives"). ``Engine`` then checks numerically
(``load_check``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


class UnsupportedModelError(ValueError):
    """The engine cannot run this model exactly as transformers does; the message says what it lacks."""


@dataclass(frozen=True)
class ModelShape:
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    window: int
    sliding_layers: tuple[int, ...] = ()   # layers with a sliding attention window (kept exactly, not compressed)

    @property
    def n_rep(self) -> int:
        """Query heads per KV head: query head h reads KV head h // n_rep."""
        return self.n_heads // self.n_kv_heads


def layer_window(config, i: int) -> int | None:
    """The sliding window of layer ``i`` as transformers' configs describe it (None: full attention)."""
    window = getattr(config, "sliding_window", None)
    if not window:
        return None
    types = getattr(config, "layer_types", None)
    if types is not None:
        return window if types[i] == "sliding_attention" else None
    if getattr(config, "use_sliding_window", True) is False:     # Qwen2-style switch
        return None
    if (max_window := getattr(config, "max_window_layers", None)) is not None and i >= max_window:
        return None
    return window


def _first(obj, names: tuple[str, ...]):
    return next((getattr(obj, n) for n in names if getattr(obj, n, None) is not None), None)


@dataclass
class DecoderStack:
    """Where a causal LM keeps what the engine drives, under the names transformers' families use."""

    config: object                   # the decoder's (text) config
    embed: torch.nn.Module
    layers: torch.nn.ModuleList
    norm: torch.nn.Module
    rotary: torch.nn.Module | None
    lm_head: torch.nn.Module
    attention: list                  # each layer's attention module


def decoder_stack(model: torch.nn.Module) -> DecoderStack | None:
    """Find embeddings, layers, final norm, rotary module and LM head (``model.model.layers`` as in Llama,
    ``gpt_neox.layers``, ``transformer.h``, ...); for a multimodal checkpoint class (e.g. Gemma 3 4B+)
    the language model inside it, which the engine runs on text alone. None: not found."""
    base = _first(model, ("model", "gpt_neox", "transformer"))
    inner = _first(base, ("language_model", "text_model"))      # a vision-language model's decoder
    base, config = (inner, inner.config) if inner is not None and hasattr(inner, "layers") else (base, model.config)
    parts = dict(embed=_first(base, ("embed_tokens", "embed_in", "word_embeddings", "wte")),
                 layers=_first(base, ("layers", "h")),
                 norm=_first(base, ("norm", "final_layernorm", "final_layer_norm", "ln_f")),
                 lm_head=model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None)
    if base is None or any(v is None for v in parts.values()):
        return None
    return DecoderStack(config, rotary=getattr(base, "rotary_emb", None),
                        attention=[_first(layer, ("self_attn", "attention", "self_attention")) for layer in parts["layers"]],
                        **parts)


def model_shape(model: torch.nn.Module) -> ModelShape:
    """Check that ``model`` is a rotary decoder-only LM whose layers the engine can drive, and read its
    dimensions. Refusals here are up-front and structural; ``Engine`` then checks numerically."""
    stack = decoder_stack(model)
    cfg = stack.config if stack is not None else model.config
    name = getattr(model.config, "model_type", type(model).__name__)
    rotary = any(hasattr(cfg, a) for a in ("rope_parameters", "rope_theta", "rotary_dim", "rotary_pct"))
    if (stack is None or stack.rotary is None) and not rotary:
        raise UnsupportedModelError(f"model type '{name}' has no rotary position embedding the engine can drive "
                                    "(model.rotary_emb); REFORM re-packs positions with RoPE and cannot run it")
    if stack is None or stack.rotary is None:
        raise UnsupportedModelError(f"model type '{name}' is not laid out as embeddings, decoder layers, final "
                                    "norm, one rotary module (model.rotary_emb) and LM head, the layout the "
                                    "engine drives")
    for why, present in (
            ("multi-head latent attention (keys with separately rotated parts)", hasattr(cfg, "kv_lora_rank")),
            ("bidirectional attention", bool(getattr(cfg, "use_bidirectional_attention", False))),
            ("chunked local attention", bool(getattr(cfg, "attention_chunk_size", None)))):
        if present:
            raise UnsupportedModelError(f"model type '{name}' uses {why}, which the engine does not support")
    for i, attn in enumerate(stack.attention):
        if attn is None or getattr(attn, "layer_idx", None) != i:
            raise UnsupportedModelError(f"model type '{name}': decoder layer {i} has no attention module "
                                        "(self_attn / attention / self_attention) with its own layer index, which "
                                        "the engine drives")
        if not getattr(attn, "is_causal", True):
            raise UnsupportedModelError(f"model type '{name}': layer {i}'s attention is not causal")
    n_heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // n_heads
    if (v_dim := getattr(cfg, "v_head_dim", None)) not in (None, head_dim):
        raise UnsupportedModelError(f"model type '{name}' has value heads of {v_dim} dimensions beside key heads "
                                    f"of {head_dim}, which the engine's cache does not support")
    return ModelShape(n_layers=len(stack.layers), n_heads=n_heads,
                      n_kv_heads=getattr(cfg, "num_key_value_heads", None) or n_heads,
                      head_dim=head_dim, window=cfg.max_position_embeddings,
                      sliding_layers=tuple(i for i in range(len(stack.layers)) if layer_window(cfg, i)))
