"""A context's input as the ids the engine encodes: text, documents (with the map from tokens back to
their pages and sections, for evidence) and images (the model's processor and vision tower; their
positions get ids past the vocabulary, ``Engine.input_rows``)."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import torch

from ..documents.evidence import Source
from ..engine.layout import as_tensor


class Tokenized(NamedTuple):
    """What ``Pipeline.tokenize`` makes of a context: its ids, the rows its image ids stand for, and where
    its tokens came from (None for contexts with images)."""

    ids: torch.Tensor
    image_rows: torch.Tensor | None = None
    source: Source | None = None


def tokenize(pipe, content) -> Tokenized:
    """``content`` as the ids to encode: text (``str``); a document or a folder of them (``Path``, raw
    ``bytes`` or an ``Extracted``: PDF, DOCX, HTML, EPUB, Markdown, text, code, see ``reform.documents``);
    or a list of text and image parts (``tokenize_parts``). Text and documents keep a ``Source``: where
    each token came from, for the evidence of answers."""
    from ..documents import Extracted, extract
    if isinstance(content, (Path, bytes, bytearray)):
        content = extract(content)
    if isinstance(content, str):
        if not content.strip():
            raise ValueError("the context is empty")
        content = Extracted.plain(content)
    if isinstance(content, Extracted):
        ids, starts = pipe.templater.context_offsets(content.text)
        return Tokenized(as_tensor(ids, pipe.engine.device), None,
                         Source(content, torch.tensor(starts, dtype=torch.int32)))
    return Tokenized(*tokenize_parts(pipe, content))


def tokenize_context(pipe, text: str) -> torch.Tensor:
    """The ids of ``text`` laid out as a context (the template's prefix, then the text)."""
    if not isinstance(text, str):
        raise TypeError(f"the context must be text (str), got {type(text).__name__}")
    if not text.strip():
        raise ValueError("the context is empty")
    return as_tensor(pipe.templater.context(text), pipe.engine.device)


def tokenize_parts(pipe, parts) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(ids, image rows)`` of interleaved text and images: text parts are tokenised as text; each
    image (a ``PIL.Image``, a ``pathlib.Path`` or raw bytes) goes through the model's processor (its
    placeholder ids and pixels) and the model's own vision code (``engine.vision.image_rows``), and its
    positions get ids past the vocabulary that stand for their rows (``Engine.input_rows``)."""
    from ..engine.vision import image_rows
    if isinstance(parts, str):
        return tokenize_context(pipe, parts), None
    if not isinstance(parts, (list, tuple)) or not parts:
        raise TypeError("the context must be text (str) or a non-empty list of text and image parts")
    ids, rows = list(pipe.templater.prefix), []
    for part in parts:
        if isinstance(part, str):
            ids += pipe.templater.encode(part)
            continue
        if not (hasattr(part, "convert") or isinstance(part, (Path, bytes, bytearray))):
            raise TypeError(f"a context part must be text (str) or an image (PIL image, Path or bytes), "
                            f"got {type(part).__name__}")
        if not rows:
            check_takes_images(pipe)
        placeholder, pixels = prepare_image(pipe, part)
        mask, image_embeds = image_rows(pipe.engine.model, placeholder, pixels)
        first = pipe.engine.vocab + sum(r.shape[0] for r in rows)
        placeholder[mask.cpu()] = torch.arange(first, first + int(mask.sum()))
        ids += placeholder.tolist()
        rows.append(image_embeds)
    if len(ids) == len(pipe.templater.prefix):
        raise ValueError("the context is empty")
    return as_tensor(ids, pipe.engine.device), torch.cat(rows) if rows else None


def check_takes_images(pipe) -> None:
    """Refuse, in one line (``ValueError``), images for this pipeline: a model without a vision tower or
    processor, a method that reads the context as text, a segment-parallel encode on other workers."""
    from ..engine.vision import check_vision_model
    check_vision_model(pipe.engine.model)
    if pipe.processor is None:
        raise ValueError(f"{pipe.model_name} has no processor to prepare images (give Pipeline one)")
    if not pipe.method.takes_images:
        raise ValueError(f"method '{pipe.method.name}' reads the context as text and cannot take images")
    if getattr(pipe.method.config, "segments", 1) > 1 and pipe.segment_runner is not None:
        raise ValueError("a segment-parallel encode on other workers (segments > 1) cannot take images yet")


def prepare_image(pipe, image) -> tuple[torch.Tensor, dict]:
    """``(placeholder ids, pixel tensors)`` the model's processor makes of one image (a ``PIL.Image``,
    a ``Path`` or bytes): the ids the image occupies in the text and what its vision code reads."""
    from ..documents import read_image
    image = image.convert("RGB") if hasattr(image, "convert") else read_image(image)
    got = pipe.processor(text=pipe.processor.image_token, images=[image], return_tensors="pt",
                         add_special_tokens=False)
    return got["input_ids"][0], {k: v for k, v in got.items() if k not in ("input_ids", "attention_mask")}
