"""Images in the input: the vision-language model's own code turns an image into input embeddings, which
then travel through the engine as ids past the vocabulary (``Engine.input_rows``).

REFORM "operates at the architecture level" (the paper's multi-modal experiments, Pixtral-12B on MM-NIAH):
an image's positions are compressed, scored, gathered and recomputed like text positions. What differs is
only where a position's input embedding comes from. Here it comes from transformers itself: the model's
forward runs on the image's placeholder ids and pixels (vision tower, projector and the placeholder merge
of its own code) and is stopped at the entrance of its language model, whose ``inputs_embeds`` are taken
(``image_embeddings``). The rows at the image-token positions are the image; everything else is text.

What the engine cannot reproduce is refused there, by what the model hands its language model: its own
attention mask (Gemma 3 lets an image's tokens attend to each other both ways) or positions of more than
one axis (Qwen2-VL's multimodal RoPE). See docs/architecture.md, "Where per-model behaviour lives".
"""

from __future__ import annotations

import torch

from .shape import UnsupportedModelError, decoder_stack


class _Stop(Exception):
    """Raised at the language model's entrance once its input embeddings are captured."""


def image_token_id(model: torch.nn.Module) -> int | None:
    """The placeholder token the model's processor writes once per image position (None: no vision)."""
    cfg = model.config
    if getattr(cfg, "vision_config", None) is None:
        return None
    value = next((getattr(cfg, n) for n in ("image_token_id", "image_token_index") if getattr(cfg, n, None) is not None),
                 None)
    return int(value) if value is not None else None


def check_vision_model(model: torch.nn.Module) -> None:
    """Refuse, in one line, a model that cannot take images at all (no vision tower or no image token)."""
    name = getattr(model.config, "model_type", type(model).__name__)
    if image_token_id(model) is None:
        raise ValueError(f"model type '{name}' takes no images (no vision tower and image token in its config)")


@torch.inference_mode()
def image_embeddings(model: torch.nn.Module, ids: torch.Tensor, pixels: dict) -> torch.Tensor:
    """The language model's input embeddings [T, hidden] for ``ids`` (1-D, an image's placeholder run and
    any text around it) with ``pixels`` (the processor's image tensors: ``pixel_values`` and whatever else
    it returned, e.g. ``image_sizes``), computed by the model's own forward up to its language model."""
    name = getattr(model.config, "model_type", type(model).__name__)
    check_vision_model(model)
    stack = decoder_stack(model)
    language_model = next((m for m in model.modules() if getattr(m, "layers", None) is stack.layers
                           and m is not model), None) if stack is not None else None
    if language_model is None:
        raise UnsupportedModelError(f"model type '{name}': its language model could not be found")
    captured: dict = {}

    def capture(module, args, kwargs):
        captured.update(kwargs)
        raise _Stop

    handle = language_model.register_forward_pre_hook(capture, with_kwargs=True)
    try:
        model(input_ids=ids[None].to(model.device), **{k: v.to(model.device) if torch.is_tensor(v) else v
                                                      for k, v in pixels.items()})
    except _Stop:
        pass
    finally:
        handle.remove()
    embeds = captured.get("inputs_embeds")
    if embeds is None:
        raise UnsupportedModelError(f"model type '{name}' does not hand its language model input embeddings, "
                                    "which the engine needs to take its images")
    positions = captured.get("position_ids")
    if positions is not None and positions.dim() == 3:
        raise UnsupportedModelError(f"model type '{name}' places image tokens with multimodal RoPE (positions "
                                    "on several axes), which REFORM's contiguous re-positioning does not support")
    if captured.get("attention_mask") is not None:
        raise UnsupportedModelError(f"model type '{name}' gives image tokens an attention mask of its own (e.g. "
                                    "bidirectional within an image), which the engine's causal attention does "
                                    "not reproduce")
    return embeds[0]


def image_rows(model: torch.nn.Module, ids: torch.Tensor, pixels: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """``(mask, rows)``: which of ``ids`` are image positions, and their input embeddings [n, hidden].
    The other positions must keep their plain token embeddings (checked: a model that changes text
    embeddings around its images is refused)."""
    embeds = image_embeddings(model, ids, pixels)
    stack = decoder_stack(model)
    ids = ids.to(embeds.device)
    mask = ids == image_token_id(model)
    with torch.inference_mode():
        text = stack.embed(ids[None])[0]
    if not torch.equal(text[~mask], embeds[~mask]):
        name = getattr(model.config, "model_type", type(model).__name__)
        raise UnsupportedModelError(f"model type '{name}' changes the embeddings of text tokens around its images, "
                                    "which the engine does not reproduce")
    return mask, embeds[mask]
