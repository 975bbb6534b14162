"""The user-facing object: a loaded model + prompt layout + one method. Encode once, ask many."""

from __future__ import annotations

import hashlib
import json
import time
import warnings
from pathlib import Path
from typing import Callable, NamedTuple

import torch

from .engine.core import Engine
from .engine.layout import Templater, as_tensor
from .heads import find_preset
from .methods import REGISTRY, Answer, Context, Method
from .documents.evidence import Source
from .documents.extracted import Extracted
from .methods.checkpoint import Checkpoint
from .methods.full import QuestionAlone
from .methods.options import options_from_json, options_json
from .methods.saved import restore_parts, restore_source
from .model import DEFAULT_MODEL, load_model
from .notes import PlainPromptWarning
from .store.format import ContextFileError, ids_sha256, read_manifest, read_tensors


def method_class(name: str) -> type[Method]:
    if name not in REGISTRY:
        raise ValueError(f"unknown method '{name}'; choose one of: {', '.join(sorted(REGISTRY))}")
    return REGISTRY[name]


def check_method_options(name: str, **options) -> None:
    """Refuse an unknown method, options it does not take or values of the wrong type, before any model
    is loaded."""
    if not isinstance(name, str):
        raise TypeError(f"method must be a name such as 'reform', got {name!r}")
    method_class(name).check_options(options)


def check_load(model=None, *, device=None, dtype=None, method: str = "reform", **options) -> None:
    """Everything about ``Pipeline.load(model, device=, dtype=, method=, **options)`` that can be refused
    without loading the model: the model's path (or that the hub is reachable for an id not cached), the
    device, the dtype, the method and its option values. The CLI, the eval runner and ``Pipeline.load``
    all call it first, so a bad input costs no load and leaves no output behind. Raises ``ValueError``
    (``TypeError`` for arguments of the wrong type) with a one-line message."""
    from .model import pick_device, pick_dtype, resolve
    if model is not None and not isinstance(model, (str, Path)):
        raise TypeError(f"model must be a hub id, folder or .gguf path, got {model!r}")
    check_method_options(method, **options)
    pick_dtype(pick_device(device), dtype)
    resolve(str(model) if model is not None else None, assemble=False)


def make_method(name: str, engine: Engine, model_name: str, **options) -> Method:
    """Build a registered method with its defaults scaled to the model's window; ``options`` (fields of
    the method's config dataclass, ``None`` = default) override. A model preset's tuned ``defaults`` (e.g.
    SmolLM2's recompute budget) apply to every method whose config has those fields."""
    preset = find_preset(model_name)
    return method_class(name).create(engine.shape, model_name, (preset or {}).get("defaults"), **options)


class Pipeline:
    """``pipe.encode(text)`` returns a ``Context``; ``context.ask(question)`` returns an ``Answer``."""

    def __init__(self, model: torch.nn.Module, tokenizer, *, model_name: str | None = None,
                 method: str = "reform", use_chat_template: bool = True, source: str | None = None,
                 processor=None, **method_options):
        self.engine = Engine(model)
        self.tokenizer = tokenizer
        self.processor = processor     # a vision-language model's: images in ``encode``
        self.model_name = model_name or getattr(model.config, "_name_or_path", "") or "model"
        self.source = source or self.model_name     # what ``Pipeline.load`` / ``--model`` was given
        self.templater = Templater(tokenizer, use_chat_template)
        if use_chat_template and not self.templater.has_chat_template:
            warnings.warn(f"{self.model_name} has no chat template (a base model): questions are asked as plain "
                          "text ('<context>\\n\\nQuestion: ...\\nAnswer:') and each answer ends with its first line",
                          PlainPromptWarning, stacklevel=2)
        self.eos_ids = self.templater.eos_ids(model)
        self.method = make_method(method, self.engine, self.model_name, **method_options)
        self._identity: dict | None = None
        # runs a segment-parallel encode's segments ``[(ids, skip, last), ...]`` -> ``[(embeddings, cache)]``
        # elsewhere (e.g. on Ray workers, ``reform.cluster``); None: one after another in this process
        self.segment_runner: Callable[[list], list] | None = None

    @classmethod
    def load(cls, model: str | None = None, *, device: str | None = None, dtype: str | None = None,
             **kwargs) -> "Pipeline":
        options = {k: v for k, v in kwargs.items() if k != "use_chat_template"}
        check_load(model, device=device, dtype=dtype, **options)
        loaded = load_model(str(model) if model is not None else None, device=device, dtype=dtype)
        return cls(loaded.model, loaded.tokenizer, model_name=loaded.name, source=str(model or DEFAULT_MODEL),
                   processor=loaded.processor, **kwargs)

    # ---------------------------------------------------------------- identity and saved contexts
    @property
    def identity(self) -> dict:
        """What a saved context must have been made with to be asked here: digests of the model's config,
        a sample of its weights, its tokenizer and the prompt layout, and the dtype it runs in."""
        if self._identity is None:
            self._identity = model_identity(self)
        return self._identity

    def context_key(self, ids: torch.Tensor, method: Method | None = None, image_rows: torch.Tensor | None = None,
                    document: Extracted | None = None) -> str:
        """Content address of the context ``ids`` (and the image rows its ids past the vocabulary stand
        for) would encode to: same model, method options and input, same key (the store names files by
        it, so a document is encoded once)."""
        method = method or self.method
        ident = {k: v for k, v in self.identity.items() if k not in ("name", "source")}
        content = [ids_sha256(ids)]
        if image_rows is not None:
            content.append(hashlib.sha256(image_rows.detach().float().cpu().numpy().tobytes()).hexdigest())
        if document is not None and (digest := document.digest()) is not None:
            content.append(digest)     # the same text from two documents: two maps, two contexts
        blob = json.dumps([ident, method.name, options_json(method.config), *content], sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:32]

    def method_from(self, spec: dict) -> Method:
        """The method a saved context names, rebuilt from its resolved options."""
        name = spec.get("name")
        if name not in REGISTRY:
            raise ValueError(f"method '{name}' is not known to this version of reform")
        cls = REGISTRY[name]
        method = cls.create(self.engine.shape, self.model_name, None,
                            **options_from_json(cls.Config, spec.get("options") or {}))
        if options_json(method.config) != options_json(method.config, spec.get("options") or {}):
            raise ValueError(f"method '{name}' cannot be rebuilt with the saved options {spec.get('options')}")
        return method

    def load_context(self, path: str | Path, *, unfinished: bool = False) -> Context:
        """A context saved by ``Context.save``, checked to belong to this model (config, weights, tokenizer,
        layout, dtype), rebuilt with the method and options it was encoded with. Raises
        ``ContextFileError`` (one line) for a missing, truncated, corrupted or foreign file, and for an
        unfinished encode's checkpoint unless ``unfinished`` (``methods/checkpoint.py`` reads those)."""
        t = time.perf_counter()
        manifest = read_manifest(path)
        if "partial" in manifest and not unfinished:
            done = (manifest["partial"] or {}).get("tokens", "?")
            raise ContextFileError(f"{path} is an unfinished encode ({done} of {manifest.get('tokens', '?')} tokens): "
                                   "run the encode again with it as its checkpoint to finish it")
        self.check_identity(manifest.get("model") or {}, path)
        try:
            method = self.method_from(manifest.get("method") or {})
        except ValueError as e:
            raise ContextFileError(f"{path}: {e}") from None
        tensors = read_tensors(path, manifest)
        if "ids" not in tensors or ids_sha256(tensors["ids"]) != manifest.get("ids_sha256"):
            raise ContextFileError(f"{path} is corrupted: its token ids do not match their digest")
        try:
            ids, cache, state = restore_parts(self.engine, tensors, manifest.get("cache"))
            ctx = Context(self, method, ids, cache=cache, image_rows=tensors.get("image_rows"),
                          source=restore_source(tensors, manifest.get("source")))
            if ctx.image_rows is not None:
                ctx.image_rows = ctx.image_rows.to(self.engine.device, self.engine.dtype)
            if int(ids.max()) >= self.engine.vocab + (0 if ctx.image_rows is None else ctx.image_rows.shape[0]):
                raise ValueError("its token ids name image positions it holds no embeddings for")
            method.restore_state(ctx, state)
        except (KeyError, ValueError, RuntimeError) as e:
            raise ContextFileError(f"{path} is corrupted: {e}") from None
        ctx.load_seconds = time.perf_counter() - t
        return ctx

    def check_identity(self, saved: dict, path) -> None:
        """Refuse, in one line, a context made with another model, tokenizer, layout or dtype."""
        mine, made = self.identity, saved.get("name", "another model")
        if saved.get("tokenizer_sha256") != mine["tokenizer_sha256"]:
            raise ContextFileError(f"{path} was encoded with another tokenizer (model {made}); ask it with "
                                   f"--model {saved.get('source', made)}")
        if saved.get("config_sha256") != mine["config_sha256"] or saved.get("weights_sha256") != mine["weights_sha256"]:
            raise ContextFileError(f"{path} was encoded with another model ({made}); ask it with "
                                   f"--model {saved.get('source', made)}")
        if saved.get("layout_sha256") != mine["layout_sha256"]:
            raise ContextFileError(f"{path} was encoded with another prompt layout (chat template on/off)")
        if saved.get("dtype") != mine["dtype"]:
            raise ContextFileError(f"{path} was encoded in {saved.get('dtype')} and this model runs in "
                                   f"{mine['dtype']}; load it with --dtype {DTYPE_FLAGS.get(saved.get('dtype'), '?')}")

    def tokenize_context(self, text: str) -> torch.Tensor:
        if not isinstance(text, str):
            raise TypeError(f"the context must be text (str), got {type(text).__name__}")
        if not text.strip():
            raise ValueError("the context is empty")
        return as_tensor(self.templater.context(text), self.engine.device)

    def tokenize_parts(self, parts) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(ids, image rows)`` of interleaved text and images: text parts are tokenised as text; each
        image (a ``PIL.Image``, a ``pathlib.Path`` or raw bytes) goes through the model's processor (its
        placeholder ids and pixels) and the model's own vision code (``engine.vision.image_rows``), and its
        positions get ids past the vocabulary that stand for their rows (``Engine.input_rows``)."""
        from .engine.vision import image_rows
        if isinstance(parts, str):
            return self.tokenize_context(parts), None
        if not isinstance(parts, (list, tuple)) or not parts:
            raise TypeError("the context must be text (str) or a non-empty list of text and image parts")
        ids, rows = list(self.templater.prefix), []
        for part in parts:
            if isinstance(part, str):
                ids += self.templater.encode(part)
                continue
            if not (hasattr(part, "convert") or isinstance(part, (Path, bytes, bytearray))):
                raise TypeError(f"a context part must be text (str) or an image (PIL image, Path or bytes), "
                                f"got {type(part).__name__}")
            if not rows:
                self.check_takes_images()
            placeholder, pixels = self.prepare_image(part)
            mask, image_embeds = image_rows(self.engine.model, placeholder, pixels)
            first = self.engine.vocab + sum(r.shape[0] for r in rows)
            placeholder[mask.cpu()] = torch.arange(first, first + int(mask.sum()))
            ids += placeholder.tolist()
            rows.append(image_embeds)
        if len(ids) == len(self.templater.prefix):
            raise ValueError("the context is empty")
        return as_tensor(ids, self.engine.device), torch.cat(rows) if rows else None

    def check_takes_images(self) -> None:
        """Refuse, in one line (``ValueError``), images for this pipeline: a model without a vision tower or
        processor, a method that reads the context as text, a segment-parallel encode on other workers."""
        from .engine.vision import check_vision_model
        check_vision_model(self.engine.model)
        if self.processor is None:
            raise ValueError(f"{self.model_name} has no processor to prepare images (give Pipeline one)")
        if not self.method.takes_images:
            raise ValueError(f"method '{self.method.name}' reads the context as text and cannot take images")
        if getattr(self.method.config, "segments", 1) > 1 and self.segment_runner is not None:
            raise ValueError("a segment-parallel encode on other workers (segments > 1) cannot take images yet")

    def prepare_image(self, image) -> tuple[torch.Tensor, dict]:
        """``(placeholder ids, pixel tensors)`` the model's processor makes of one image (a ``PIL.Image``,
        a ``Path`` or bytes): the ids the image occupies in the text and what its vision code reads."""
        from .documents import read_image
        image = image.convert("RGB") if hasattr(image, "convert") else read_image(image)
        got = self.processor(text=self.processor.image_token, images=[image], return_tensors="pt",
                             add_special_tokens=False)
        return got["input_ids"][0], {k: v for k, v in got.items() if k not in ("input_ids", "attention_mask")}

    def tokenize(self, content) -> Tokenized:
        """``content`` as the ids to encode: text (``str``); a document or a folder of them (``Path``, raw
        ``bytes`` or an ``Extracted``: PDF, DOCX, HTML, EPUB, Markdown, text, code, see ``reform.documents``);
        or a list of text and image parts (``tokenize_parts``). Text and documents keep a ``Source``: where
        each token came from, for the evidence of answers."""
        from .documents import Extracted, extract
        if isinstance(content, (Path, bytes, bytearray)):
            content = extract(content)
        if isinstance(content, str):
            if not content.strip():
                raise ValueError("the context is empty")
            content = Extracted.plain(content)
        if isinstance(content, Extracted):
            ids, starts = self.templater.context_offsets(content.text)
            return Tokenized(as_tensor(ids, self.engine.device), None,
                             Source(content, torch.tensor(starts, dtype=torch.int32)))
        return Tokenized(*self.tokenize_parts(content))

    def encode(self, content, progress: Callable[[int], None] | None = None,
               checkpoint: str | Path | Checkpoint | None = None) -> Context:
        """Encode ``content`` once (anything ``tokenize`` takes: text, a document's path or bytes, a folder,
        text and image parts). The tokenisation, extraction and the images' vision-tower pass are not
        included in the encode time.

        ``checkpoint`` (a path, or a ``Checkpoint`` to set the interval, default 5 min): the encode saves
        its state there every few minutes and, given a checkpoint an interrupted encode of the same input
        left, goes on from it; the file is removed once the encode is done (REFORM, one segment)."""
        ids, rows, source = self.tokenize(content)
        return self.encode_tokens(ids, rows, progress=progress, checkpoint=checkpoint, source=source)

    def encode_tokens(self, ids: torch.Tensor, image_rows: torch.Tensor | None = None,
                      progress: Callable[[int], None] | None = None,
                      checkpoint: str | Path | Checkpoint | None = None, source: Source | None = None) -> Context:
        """Encode what ``tokenize`` returned (callers that show progress over the tokens first)."""
        rows, resuming = image_rows, {}
        if checkpoint is not None:
            if not self.method.resumable:
                raise ValueError(f"method '{self.method.name}' cannot checkpoint its encode: REFORM's can")
            resuming["checkpoint"] = checkpoint = (checkpoint if isinstance(checkpoint, Checkpoint)
                                                   else Checkpoint(Path(checkpoint)))
            checkpoint.image_rows = rows
        t = time.perf_counter()
        with self.engine.input_rows(rows):
            ctx = self.method.encode(self, ids, progress, **resuming)
        ctx.image_rows = rows
        ctx.source = source
        ctx.encode_seconds = time.perf_counter() - t + (checkpoint.spent_before if checkpoint is not None else 0.0)
        if checkpoint is not None and not checkpoint.keep_when_done:
            checkpoint.discard()
        return ctx

    def without_context(self) -> Context:
        """The empty context: asking it is plain generation over the question alone (full attention over
        a short prompt), the model's own answer to a question that comes with no document."""
        return Context(self, QuestionAlone(), as_tensor(self.templater.prefix, self.engine.device))

    def ask(self, content, question: str, **kwargs) -> Answer:
        return self.encode(content).ask(question, **kwargs)


class Tokenized(NamedTuple):
    """What ``Pipeline.tokenize`` makes of a context: its ids, the rows its image ids stand for, and where
    its tokens came from (None for contexts with images)."""

    ids: torch.Tensor
    image_rows: torch.Tensor | None = None
    source: Source | None = None


DTYPE_FLAGS = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
_PROBE = "Fingerprint: The quick brown fox, 1234567890 \u00e9\u4e2d <|im_start|> \n\tend."


def _sha(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


def model_identity(pipe: Pipeline) -> dict:
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
