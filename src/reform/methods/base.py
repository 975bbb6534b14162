"""What every method shares: encode a context once, answer questions from it, report stats.

A method decides three things (docs/architecture.md, "Where a method's logic lives"): how the context is encoded (eviction policy + what is
stored per token), which context tokens a question brings back, and how the answer is produced.
``Method.encode`` and ``Method.select`` are the plug-in points; recompute-then-generate lives here, and
``CachedMethod`` is the other answerer: generate straight from the compressed cache of all layers.
A method's options are the fields of its ``Config`` dataclass (``Method.create`` builds it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, NamedTuple, Protocol, Sequence

import torch

from ..documents.evidence import Source, passages
from ..engine.cache import KVCache
from ..engine.core import Engine
from ..engine.plugins import EvictionPolicy
from ..engine.shape import ModelShape
from ..engine.layout import QuestionPart, Templater, as_tensor
from ..engine.sampling import Sampling
from ..stats import Timer
from .answering import Answer, Answering, answer_together
from .options import build_config, typed_options



class Runtime(Protocol):
    """What a method uses of the pipeline that runs it (``reform.pipeline.Pipeline`` is one): the engine
    driving the model, its tokenizer and prompt layout, and the model's identity. Methods sit below the
    pipeline (docs/architecture.md, "Layers"), so they know it only by this interface."""

    engine: Engine
    tokenizer: Any
    templater: Templater
    eos_ids: list[int]
    model_name: str
    identity: dict
    segment_runner: Callable[[list], list] | None

    def save_context(self, ctx: "Context", path, *, partial: dict | None = None) -> int: ...
    def context_bytes(self, ctx: "Context") -> int: ...


@dataclass
class Context:
    """An encoded context: independent of any question, so it can be asked many times.

    ``ids`` are the context's token ids (template prefix included); ``cache`` the final compressed KV
    cache of the encoder layers; ``state`` whatever the method stored per token (e.g. embeddings).
    """

    pipeline: Runtime
    method: "Method"
    ids: torch.Tensor
    cache: KVCache | None = None
    state: object = None
    encode_seconds: float = 0.0
    extra: dict = field(default_factory=dict)
    load_seconds: float | None = None      # set for a context read from a saved file
    # the input embeddings of the context's image positions, which its ids past the vocabulary stand for
    # (``Engine.input_rows``; docs/architecture.md, "Where per-model behaviour lives"); None: text only
    image_rows: torch.Tensor | None = None
    # where the context's tokens came from (documents, pages, lines), for the evidence of answers; None for
    # contexts with images, built from token ids, or saved before contexts kept it
    source: Source | None = None

    def ask(self, question: str, **options) -> Answer:
        """Answer ``question`` about this context (``options``: ``start``'s, ``max_new_tokens``, ``on_text``,
        the sampling and the layout)."""
        return self.start(question, **options).run()

    def ask_many(self, questions: Sequence[str | dict], *, max_batch: int = 8, refusals: bool = False,
                 **options) -> list[Answer]:
        """Answer several questions at once: their gathers and prompts one by one, their tokens decoded
        together, up to ``max_batch`` in one step (``methods/answering.py``). Each question is text, or a
        dict of ``ask``'s arguments (``{"question": ..., "max_new_tokens": ...}``) over ``options`` (the
        same for all). Every answer equals ``ask``'s, token for token (``Engine.step``); a method whose
        generation re-selects its cache (ReAttention) answers one at a time. ``refusals``: a question
        refused (``ValueError``) gets the refusal in its place instead of stopping the others."""
        if isinstance(questions, (str, dict)) or not isinstance(questions, Sequence):
            raise TypeError("questions must be a list of questions (text, or dicts of ask's arguments)")
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise ValueError(f"max_batch must be a whole number of at least 1, got {max_batch!r}")
        asked = [{**options, **(q if isinstance(q, dict) else {"question": q})} for q in questions]
        for one in asked:
            if "question" not in one:
                raise ValueError("each question given as a dict needs its 'question'")
        return answer_together([lambda one=one: self.start(**one) for one in asked], max_batch, refusals)

    def start(self, question: str, *, answer_prefix: str = "", max_new_tokens: int = 64,
              on_text: Callable[[str], None] | None = None, temperature: float = 0.0, top_p: float = 1.0,
              seed: int | None = None, stop: str | tuple[str, ...] = (), fit_window: bool = False,
              layout: str = "question", instruction: str = "", top_k: int = 0, min_p: float = 0.0,
              repetition_penalty: float = 1.0, frequency_penalty: float = 0.0,
              presence_penalty: float = 0.0) -> Answering:
        """``ask``'s answer under way: the question checked, gathered and its prompt prefilled; its tokens
        come one at a time (``Answering``), alone or decoded with others (``methods/answering.py``).

        ``on_text`` receives the answer as it is generated. ``layout``: ``verbatim`` lays the question and
        answer prefix after the context exactly as given (a benchmark's own prompt), ``continuation`` also
        without closing a chat turn (``Templater.question``). ``instruction``: text the model reads right
        before the question that the gather does not search with (a benchmark's instruction). Greedy at ``temperature`` 0 (the default);
        otherwise sampled (``top_k``, ``top_p``, ``min_p``, ``seed``); ``repetition_penalty``,
        ``frequency_penalty`` and ``presence_penalty`` apply either way (``engine.sampling.Sampling``); the
        answer ends before the first of the ``stop`` strings.
        A prompt plus ``max_new_tokens`` past the model's window is refused, unless ``fit_window``: then
        ``max_new_tokens`` is an upper bound, lowered to the room the window leaves after the prompt
        (finish reason "length" when that room runs out)."""
        for name, value in (("question", question), ("answer_prefix", answer_prefix), ("instruction", instruction)):
            if not isinstance(value, str):
                raise TypeError(f"the {name} must be text (str), got {type(value).__name__}")
        if not question.strip():
            raise ValueError("the question is empty")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
            raise TypeError(f"max_new_tokens must be a whole number, got {max_new_tokens!r}")
        if max_new_tokens < 1:
            raise ValueError("max_new_tokens must be at least 1")
        if on_text is not None and not callable(on_text):
            raise TypeError(f"on_text must be a function that takes the new text, got {on_text!r}")
        sampling = Sampling(temperature, top_p, seed, stop, top_k, min_p, repetition_penalty, frequency_penalty,
                            presence_penalty)
        templater = self.pipeline.templater
        part = templater.question(question, answer_prefix, after_context=self.ids.shape[0] > len(templater.prefix),
                                  layout=layout, instruction=instruction)
        with self.pipeline.engine.input_rows(self.image_rows):
            return self.method.start(self, part, max_new_tokens=max_new_tokens, on_text=on_text,
                                     sampling=sampling, fit_window=fit_window)

    def attach_evidence(self, answer: Answer) -> None:
        """``answer.evidence``: the passages of the context tokens it was recomputed from (or why none)."""
        if answer.kept is None:
            answer.evidence_note = (f"method '{self.method.name}' answers from its compressed cache, which keeps "
                                    "other tokens in every layer and head: no recomputed passages to show")
        elif self.source is None:
            answer.evidence_note = ("this context keeps no map back to its text (it holds images, was built "
                                    "from token ids, or was saved before contexts kept one)")
        else:
            answer.evidence = passages(self.source, answer.kept, answer.kept_scores)

    def save(self, path, *, partial: dict | None = None) -> int:
        """Write this context to ``path`` (one safetensors file with a JSON manifest, atomically, see
        ``reform.store.format``); ``Pipeline.load_context(path)`` reads it back. Returns bytes written.
        ``partial``: this is an unfinished encode's state (``methods/checkpoint.py``), not a context to ask.
        The pipeline writes it (``methods/saved.py``, the round trip in one place)."""
        return self.pipeline.save_context(self, path, partial=partial)

    def stored_bytes(self) -> int:
        """About what ``save`` would write, in bytes, without writing (a quota counts it first)."""
        return self.pipeline.context_bytes(self)


class Prompt(NamedTuple):
    """What generation starts from: token ids, the cache they extend (None: a fresh one) and which context
    tokens ``ids`` recomputes (None when the context is read from ``cache`` instead)."""

    ids: torch.Tensor
    cache: KVCache | None = None
    kept: torch.Tensor | None = None
    scores: torch.Tensor | None = None     # the gather scores of ``kept``, where the method scores tokens


class Method:
    """Base class. Plug-in points: ``encode`` (what is kept of the context), ``select`` (which context
    tokens are recomputed) or, for methods that answer from their compressed cache, ``prompt``."""

    name: ClassVar[str]
    Config: ClassVar[type | None] = None   # dataclass of the method's options; None: it takes none
    # False for methods whose per-layer cache arrangement assumes every layer attends to all it holds
    sliding_windows: ClassVar[bool] = True
    # False for methods that read the context as text (retrievers), which an image's positions are not
    takes_images: ClassVar[bool] = True
    # True for methods whose ``encode`` takes a ``checkpoint`` to save its state to and resume from
    resumable: ClassVar[bool] = False

    def __init__(self, config=None):
        self.config = config

    @classmethod
    def check_options(cls, options: dict) -> None:
        """Refuse options the method does not take, or values of the wrong type (no model needed)."""
        typed_options(cls.name, cls.Config, options)

    @classmethod
    def create(cls, shape: ModelShape, model_name: str, defaults: dict | None = None, **options) -> "Method":
        """The method with its config built from ``options`` (``None`` values: default) over ``defaults``
        (a model preset's tuned values, for the fields the config has), scaled to ``shape``'s window."""
        if shape.sliding_layers and not cls.sliding_windows:
            raise ValueError(f"method '{cls.name}' does not support models with sliding-window layers "
                             f"(layers {', '.join(map(str, shape.sliding_layers[:8]))}"
                             f"{' ...' if len(shape.sliding_layers) > 8 else ''})")
        config = build_config(cls.name, cls.Config, options, defaults)
        return cls(config.resolve(shape) if config is not None else None)

    def encode(self, pipe: Runtime, ids: torch.Tensor, progress: Callable[[int], None] | None = None) -> Context:
        return Context(pipe, self, ids)

    # Saved contexts (reform.store): ids and cache are saved for every method; these two carry the rest.
    def saved_state(self, ctx: Context) -> dict[str, torch.Tensor]:
        """What ``ctx`` keeps besides its ids and cache, as named tensors (default: nothing)."""
        if ctx.state is not None or ctx.extra:
            raise ValueError(f"method '{self.name}' cannot save its contexts")
        return {}

    def restore_state(self, ctx: Context, tensors: dict[str, torch.Tensor]) -> None:
        """Rebuild ``ctx.state``/``ctx.extra`` from ``saved_state``'s tensors (ids and cache are in place)."""

    def select(self, ctx: Context, part: QuestionPart, timer: Timer) -> torch.Tensor:
        """Indices (ascending) of the context tokens the answer is computed from; default: all."""
        return torch.arange(ctx.ids.shape[0], device=ctx.ids.device)

    def select_scored(self, ctx: Context, part: QuestionPart, timer: Timer) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``select``'s indices and their scores (None: the method does not score tokens)."""
        return self.select(ctx, part, timer), None

    def prompt(self, ctx: Context, part: QuestionPart, timer: Timer) -> Prompt:
        """What generation starts from: by default the selected context tokens + the question, recomputed
        on a fresh cache at contiguous positions. Methods that answer from their compressed cache return
        the question alone and a copy of that cache."""
        with timer.stage("gather"):
            keep, scores = self.select_scored(ctx, part, timer)
        return Prompt(torch.cat([ctx.ids[keep], as_tensor(part.ids, ctx.ids.device)]), None, keep, scores)

    def generation_policy(self, ctx: Context) -> EvictionPolicy | None:
        """A policy the prompt and every generated token run under (None: plain decoding)."""
        return None

    def start(self, ctx: Context, part: QuestionPart, *, max_new_tokens: int,
              on_text: Callable[[str], None] | None = None, sampling: Sampling = Sampling(),
              fit_window: bool = False) -> Answering:
        """Build the prompt and prefill it: the answer, ready to decode with the full model (greedy unless
        ``sampling`` says otherwise; ``fit_window`` as in ``Context.ask``)."""
        return Answering(self, ctx, part, max_new_tokens=max_new_tokens, on_text=on_text, sampling=sampling,
                         fit_window=fit_window)


class CachedMethod(Method):
    """A recurrent method that answers from its compressed cache: the context runs chunk by chunk
    through ALL layers with ``policy()`` evicting after every chunk (``Engine.prefill``); the question is
    then prefilled on a copy of the final cache and the answer generated from it."""

    def policy(self, pipe: Runtime) -> EvictionPolicy:
        """A fresh eviction policy for one encode (by default the config builds it)."""
        return self.config.policy()

    def state(self, policy: EvictionPolicy) -> object:
        """What the context keeps of the policy besides the cache (InfLLM: its block memory)."""
        return None

    def encode(self, pipe: Runtime, ids: torch.Tensor, progress: Callable[[int], None] | None = None) -> Context:
        cache, policy = KVCache.empty(pipe.engine.shape.n_layers), self.policy(pipe)
        pipe.engine.prefill(ids, cache, chunk_size=self.config.chunk_size, policy=policy, progress=progress)
        for lc in cache.layers:
            lc.scores = None    # eviction state: not needed once the context is encoded
        return Context(pipe, self, ids, cache=cache, state=self.state(policy))

    def prompt(self, ctx: Context, part: QuestionPart, timer: Timer) -> Prompt:
        return Prompt(as_tensor(part.ids, ctx.ids.device), ctx.cache.clone())


REGISTRY: dict[str, type] = {}


def register(cls):
    REGISTRY[cls.name] = cls
    return cls
