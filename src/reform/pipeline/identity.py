"""Who made a context: the model's identity (digests of its config, weights, tokenizer and prompt layout,
and its dtype), which a saved context must match to be read, and the content key a context is stored
under (same model, method options and input: same key, so a document is encoded once)."""

from __future__ import annotations

import hashlib
import json

import torch

from ..documents.extracted import Extracted
from ..methods import Method
from ..methods.options import options_json
from ..store.format import ids_sha256


def context_key(pipe, ids: torch.Tensor, method: Method | None = None, image_rows: torch.Tensor | None = None,
                document: Extracted | None = None) -> str:
    """Content address of the context ``ids`` (and the image rows its ids past the vocabulary stand
    for) would encode to under ``pipe`` (a ``Pipeline``): same model, method options and input, same key
    (the store names files by it, so a document is encoded once)."""
    method = method or pipe.method_for(document)
    ident = {k: v for k, v in pipe.identity.items() if k not in ("name", "source")}
    content = [ids_sha256(ids)]
    if image_rows is not None:
        content.append(hashlib.sha256(image_rows.detach().float().cpu().numpy().tobytes()).hexdigest())
    if document is not None and (digest := document.digest()) is not None:
        content.append(digest)     # the same text from two documents: two maps, two contexts
    blob = json.dumps([ident, method.name, options_json(method.config), *content], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


_PROBE = "Fingerprint: The quick brown fox, 1234567890 \u00e9\u4e2d <|im_start|> \n\tend."


def _sha(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


def model_identity(pipe) -> dict:
    """Digests that tell models apart without hashing every weight: the config (paths and dtype left
    out), 256 evenly spaced values of every parameter (rounded to bf16, so fp32 and bf16 copies agree),
    the tokenizer (its full definition where it has one, plus a probe encoding) and the prompt layout."""
    model, tok = pipe.engine.model, pipe.tokenizer
    config = {k: v for k, v in model.config.to_dict().items()
              if not k.startswith("_") and k not in ("transformers_version", "dtype", "torch_dtype", "name_or_path")}
    weights = hashlib.sha256()
    for name, p in model.named_parameters():
        flat = p.detach().reshape(-1)
        sample = flat[::max(1, flat.numel() // 256)][:256].to("cpu", torch.bfloat16).view(torch.int16)
        weights.update(name.encode() + sample.numpy().tobytes())
    parts = [type(tok).__name__]
    if (backend := getattr(tok, "backend_tokenizer", None)) is not None:
        parts.append(backend.to_str())
    elif hasattr(tok, "get_vocab"):
        parts.append(json.dumps(sorted(tok.get_vocab().items())))
    parts.append(json.dumps(tok(_PROBE, add_special_tokens=True)["input_ids"]))
    t = pipe.templater
    return {"name": pipe.model_name, "source": pipe.source, "dtype": str(pipe.engine.dtype).removeprefix("torch."),
            "config_sha256": _sha(json.dumps(config, sort_keys=True, default=str)),
            "weights_sha256": weights.hexdigest(), "tokenizer_sha256": _sha("\n".join(parts)),
            "layout_sha256": _sha(json.dumps([t.prefix, t.head, t.tail]))}
