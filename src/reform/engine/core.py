"""The one recurrent engine: decoder-layer loop with early exit, chunk loop, and greedy generation.

Every method runs through ``Engine``. It drives the HF model's *own* decoder-layer modules (so norms,
multipliers, soft-capping, MoE blocks, q/k norms, partial and per-layer RoPE all come from the model's
code), routing their attention through transformers' attention interface to ``_attention`` and their
cache updates to ``_CacheAdapter``. What REFORM needs and HF's forward does not expose is the engine's:
which layers run (early exit), the position of every token (contiguous re-packing after eviction), what
the cache holds (pre-RoPE keys; sliding-window layers only their window), the pre-RoPE Q/K/V taps
(retrieval embeddings) and attention scores from the last queries only (eviction). A model the engine
cannot run exactly is refused at construction: structurally (``model_shape``) or numerically (its logits
against the model's own forward, ``_check_against_model``). ``reform.conformance`` checks every model type
transformers ships against ``model(...)`` and ``model.generate(...)``.
"""

from __future__ import annotations

import inspect
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Callable, Iterator, Protocol, Sequence

import torch

from .attention import DECODE_BLOCK, attention_and_received, batch_decode_attention, causal_attention, scores_fused
from .batch import DecodeBatch
from .cache import RESERVE, KVCache, LayerCache
from .flops import FlopCounter, causal_attention_flops, linear_flops_per_token, qkv_flops_per_token
from .rope import Rotary



class UnsupportedModelError(ValueError):
    """The engine cannot run this model exactly as transformers does; the message says what it lacks."""


class Hook(Protocol):
    """Sees each chunk as it is encoded (e.g. to store retrieval embeddings). ``on_qkv`` receives the
    pre-RoPE query, key and value states of a layer; a hook may list the ``layers`` it reads."""

    def begin(self, offset: int, length: int) -> None: ...
    def on_qkv(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None: ...


class EvictionPolicy(Protocol):
    """Scores cached tokens while a chunk runs and shrinks each layer's cache after it.

    A policy may also define ``observe_output(ids, hidden)``: ``Engine.prefill`` then hands it each
    chunk's ids and last-layer hidden states before ``compress`` (InfiniPot's novelty scores need them);
    and ``arrange(layer, q, cache, rotary)``: called in every layer with the block's pre-RoPE queries
    before it attends, it may replace the layer's cached entries (re-packed at 0..n-1), e.g. InfLLM
    loading the memory blocks those queries retrieve. Sliding-window layers are never handed to a
    policy: the engine keeps their last ``window - 1`` entries itself (see ``LayerCache.window``).
    """

    score_window: int  # how many of the chunk's last queries the policy looks at (0: none)

    def observe(self, layer: int, received: torch.Tensor, cache: LayerCache, n_new: int) -> None: ...
    def compress(self, cache: KVCache, rotary: Rotary) -> None: ...


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


def _layer_window(config, i: int) -> int | None:
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
                      sliding_layers=tuple(i for i in range(len(stack.layers)) if _layer_window(cfg, i)))


class _Exit(Exception):
    """Raised inside the layer loop to stop after the early-exit layer's Q/K/V."""


# Keyword arguments model attention modules pass to the attention function that the engine either
# honours (scaling, sliding_window, softcap) or that do not change the result at inference.
_ATTN_KWARGS = {"dropout", "scaling", "sliding_window", "softcap", "position_ids", "cache_position", "use_cache",
                "output_attentions", "layer_idx", "cache", "past_key_values"}


@dataclass
class _Call:
    """One ``Engine.forward``: what the attention function and the cache adapter need to know."""

    cache: KVCache
    starts: list[int]
    hook: Hook | None
    policy: EvictionPolicy | None
    exit_layer: int | None    # the layer whose Q/K/V alone run (early exit), or None


@dataclass
class _StepCall:
    """One ``Engine.step``: one new token for each of the first ``n`` sequences of a ``DecodeBatch`` (the
    rows past ``n`` are padding, ``STEP_ROWS``)."""

    batch: DecodeBatch
    n: int
    starts: torch.Tensor      # [n, layers]: where each sequence's new token sits in each layer
    spans: list[int]          # each sequence's length once its token is in (length-dependent RoPE)


# A decoding step computes at least this many rows, padding with copies of the first: the matrix products
# then take the same kernel whatever the batch holds, one sequence or many. Alone, a row took another
# (1-row) kernel whose sums over more than 1,024 inputs round differently: in bf16 about one row in ten
# had an output one unit in the last place apart (oneDNN, Zen 4), enough to turn greedy answers. fp32 (MKL)
# agreed from 8 rows on. With this and ``batch_decode_attention``, 8 of 8 answers equal their lone selves.
STEP_ROWS = 8


class _CacheAdapter:
    """What a transformers attention module sees as its cache: appends the new keys (keeping their
    pre-RoPE copy) and values of layer ``layer_idx`` to our ``KVCache`` and returns all of them."""

    is_compileable = False

    def __init__(self, engine: "Engine"):
        self.engine = engine

    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        call = self.engine._call
        if isinstance(call, _StepCall):           # each sequence's key and value go to its own slot
            n, at = call.n, call.starts[:, layer_idx]
            keys, values = call.batch.keys[layer_idx], call.batch.values[layer_idx]
            keys[torch.arange(n), :, at] = key_states[:n, :, -1]
            values[torch.arange(n), :, at] = value_states[:n, :, -1]
            # the slots as one view, padded to the end of the longest sequence's last block
            held = -(-(int(at.max()) + 1) // DECODE_BLOCK) * DECODE_BLOCK
            return keys[:n, :, :held], values[:n, :, :held]
        if layer_idx >= len(call.cache.layers):   # the early-exit layer: nothing is cached
            return key_states, value_states
        lc = call.cache.layers[layer_idx]
        k_rot = key_states[0]
        lc.append(self.engine.rotary.unrotate(k_rot, call.starts[layer_idx], layer_idx), k_rot, value_states[0])
        return lc.keys[None], lc.values[None]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        call = self.engine._call
        if isinstance(call, _StepCall):
            return int(call.starts[:, layer_idx].max())
        return call.starts[layer_idx] if layer_idx < len(call.starts) else 0


ATTENTION_NAME = "reform"
_DRIVING: ContextVar["Engine"] = ContextVar("reform_engine")   # the engine whose forward is running
# the input embeddings that token ids past the vocabulary stand for (image positions; ``Engine.input_rows``)
_INPUT_ROWS: ContextVar["torch.Tensor | None"] = ContextVar("reform_input_rows", default=None)


def _attention(module, query, key, value, attention_mask, scaling=None, sliding_window=None, softcap=None,
               s_aux=None, **kwargs):
    """The attention function the model's own attention modules call while the engine drives them
    (registered in transformers' ``AttentionInterface``). Queries and keys arrive rotated by the model."""
    engine = _DRIVING.get()
    unknown = sorted(k for k, v in kwargs.items() if k not in _ATTN_KWARGS and v is not None)
    if unknown:
        raise UnsupportedModelError(f"its attention takes {', '.join(unknown)}, which the engine does not support")
    if isinstance(engine._call, _StepCall):
        return engine._attend_step(module.layer_idx, query, key, value, scaling, sliding_window, softcap, s_aux)
    return engine._attend(module.layer_idx, query[0], key[0], value[0], scaling, sliding_window, softcap, s_aux)


def _register_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, _attention)


# In half precision the engine may be HALF_MARGIN times as far from the fp32 forward as transformers' own
# half-precision forward is, plus HALF_SLACK (relative RMS). Measured in bf16 on the real SmolLM2-135M and
# Gemma 3 270M (12 tokens, 2-core Zen 3): transformers 0.019 / 0.036 from fp32, the engine 0.022 / 0.033;
# one layer's attention logits scaled by 2 (SmolLM2) or 1.2 (Gemma), or its values by 1.2 (SmolLM2):
# 0.040 / 0.064, 0.034, all refused. The largest difference instead of the RMS hides such breaks: it is
# set by the head's rounding of the largest logits, the same on both sides (0.040 and 0.040 on SmolLM2).
HALF_MARGIN = 1.5
HALF_SLACK = 2e-3


def relative_distance(truth: torch.Tensor, *others: torch.Tensor) -> float:
    """The largest absolute difference of any of ``others`` from ``truth``, relative to its largest logit."""
    scale = truth.abs().max().clamp(min=1e-6)
    return max(float((o - truth).abs().max() / scale) for o in others)


def relative_rms(truth: torch.Tensor, *others: torch.Tensor) -> float:
    """The largest root-mean-square difference of any of ``others`` from ``truth``, relative to its RMS."""
    scale = truth.pow(2).mean().sqrt().clamp(min=1e-6)
    return max(float((o - truth).pow(2).mean().sqrt() / scale) for o in others)


class float32_weights:
    """Context manager: the floating-point parameters and buffers of ``modules`` (their children too unless
    ``recurse`` is False) swapped in place for fp32 copies, and the very same tensors put back on exit
    (``restore``), so tied weights stay tied and nothing is rounded twice."""

    def __init__(self, modules, recurse: bool = True):
        self.saved: list[tuple[torch.Tensor, torch.Tensor]] = []
        for m in modules:
            for t in (*m.parameters(recurse=recurse), *m.buffers(recurse=recurse)):
                if t.is_floating_point() and t.dtype != torch.float32:
                    self.saved.append((t, t.data))
                    t.data = t.data.float()

    def __enter__(self) -> "float32_weights":
        return self

    def __exit__(self, *exc) -> None:
        self.restore()

    def restore(self) -> None:
        for t, data in reversed(self.saved):
            t.data = data
        self.saved = []


class Engine:
    """Runs an HF causal LM chunk by chunk on a (possibly compressed) KV cache.

    The model's own decoder-layer modules run (so norms, multipliers, soft-capping, MoE blocks and
    per-layer RoPE come from the model's code); the engine owns only what REFORM needs: which layers run
    (early exit), every token's position (re-packing after eviction), what the cache holds, the pre-RoPE
    Q/K/V taps and the eviction scores from the last queries. At construction it checks numerically that
    it computes what the model's own forward computes, and refuses the model otherwise.
    """

    def __init__(self, model: torch.nn.Module, *, check: bool = True):
        self.shape = model_shape(model)
        self.model = model.eval()
        stack = decoder_stack(model)
        cfg = self.config = stack.config
        self.name = getattr(model.config, "model_type", type(model).__name__)
        self.embed, self.layers, self.norm, self.lm_head = stack.embed, stack.layers, stack.norm, stack.lm_head
        self.attention = stack.attention
        self.embedding_multiplier = getattr(cfg, "embedding_multiplier", None)   # Granite
        try:
            self.rotary = Rotary(stack.rotary, stack.attention, cfg)
        except Exception as e:   # a rotary module called in a way the engine does not know
            raise self._cannot_drive(e) from None
        attn = self.attention[0]
        self.scaling = getattr(attn, "scaling", self.shape.head_dim ** -0.5)
        self.device = self.embed.weight.device
        self.dtype = self.embed.weight.dtype
        self.vocab = self.embed.weight.shape[0]   # ids from here on stand for rows of ``input_rows``
        self.max_positions = self.shape.window   # positions beyond are refused (see ``past_window``)
        self.flops = FlopCounter()               # model FLOPs executed so far (the benchmark reads it)
        self.layer_flops = [linear_flops_per_token(layer) for layer in self.layers]   # per token, per layer
        self._qkv_flops = [qkv_flops_per_token(attn) for attn in self.attention]
        self._head_flops = 2 * self.lm_head.weight.numel()
        self._windows = [_layer_window(cfg, i) for i in range(self.shape.n_layers)]
        self._adapter = _CacheAdapter(self)
        params = inspect.signature(self.layers[0].forward).parameters
        self._cache_arg = next((a for a in ("cache", "past_key_values", "layer_past", "past_key_value") if a in params),
                               "cache")   # what the model's decoder layers call their cache argument
        self._call: _Call | _StepCall | None = None
        self.check_distance: float | None = None   # the load check's relative logit difference, once run
        self.check_reference: float | None = None  # half precision: transformers' own forward's distance from fp32
        _register_attention()
        if check:
            self._check_against_model()

    @contextmanager
    def past_window(self, positions: int):
        """Allow positions up to ``positions`` (beyond the window the model was trained on) inside the
        ``with`` block: only the full-attention baseline asks for this, to show what happens past W."""
        old, self.max_positions = self.max_positions, max(self.max_positions, positions)
        try:
            yield
        finally:
            self.max_positions = old

    @contextmanager
    def input_rows(self, rows: torch.Tensor | None):
        """Inside the ``with`` block, token id ``vocab + j`` is embedded as ``rows[j]`` instead of a row of
        the embedding table: how an image's positions travel through every method unchanged (gathered,
        recomputed, saved) as ids, while their input embeddings, the vision tower's output, come from
        ``rows`` (docs/architecture.md, "Where per-model behaviour lives")."""
        token = _INPUT_ROWS.set(rows)
        try:
            yield
        finally:
            _INPUT_ROWS.reset(token)

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        """The input embeddings of ``ids`` [1, T, hidden], image rows put in where ids say so, before the
        model-level multiplier, in the order the vision-language models of transformers merge them."""
        ids = ids.to(self.device)
        extra = ids >= self.vocab
        if not bool(extra.any()):
            return self.embed(ids[None])
        rows = _INPUT_ROWS.get()
        if rows is None or int(ids.max()) - self.vocab >= rows.shape[0]:
            raise ValueError("token ids past the vocabulary stand for image positions, and this input's image "
                             "embeddings are not in place (Engine.input_rows)")
        x = self.embed(ids.masked_fill(extra, 0)[None])
        x[0, extra] = rows[ids[extra] - self.vocab].to(x.device, x.dtype)
        return x

    @contextmanager
    def _driving(self, call: _Call):
        """Route the model's attention modules to ``_attention`` for the duration of one forward."""
        configs = {id(c): c for c in [self.model.config, self.config, *(getattr(a, "config", None)
                                                                           for a in self.attention)] if c is not None}
        saved = {k: c._attn_implementation for k, c in configs.items()}
        self._call, token = call, _DRIVING.set(self)
        try:
            for c in configs.values():
                c._attn_implementation = ATTENTION_NAME
            yield
        finally:
            for k, c in configs.items():
                c._attn_implementation = saved[k]
            self._call = None
            _DRIVING.reset(token)

    # ---------------------------------------------------------------- one block of tokens
    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, cache: KVCache, *, hook: Hook | None = None,
                policy: EvictionPolicy | None = None, qkv_only_next: bool = False) -> torch.Tensor:
        """Run ``ids`` (1-D) through the first ``len(cache.layers)`` layers on top of ``cache``.

        In each layer the block sits at positions ``layer cache length ..`` (sliding-window layers keep
        fewer entries; attention depends only on distances); returns the last layer's hidden states
        [T, hidden] (before the final norm). ``qkv_only_next``: then compute only the Q/K/V states of the
        following layer for ``hook`` (early exit at a layer whose attention output nobody reads).
        """
        t, n = ids.shape[0], len(cache.layers)
        self._check_positions(cache.length, t)
        x = self._embed(ids)
        if self.embedding_multiplier is not None:
            x = x * self.embedding_multiplier
        starts = [lc.length for lc in cache.layers]
        if qkv_only_next:
            starts.append(cache.length)
        call = _Call(cache, starts, hook, policy, n if qkv_only_next else None)
        with self._driving(call):
            try:
                for i in range(len(starts)):
                    x = self._layer(i, x, starts[i])
            except _Exit:
                self.flops.add("linear", self._qkv_flops[n] * t)
        for i, lc in enumerate(cache.layers):
            if self._windows[i] is not None:
                lc.window = self._windows[i]
                lc.trim_to_window(self.rotary, slack=min(RESERVE, lc.window) if t == 1 else 0)
        return x[0]

    def _check_positions(self, start: int, t: int) -> None:
        if start + t > self.max_positions:
            raise ValueError(f"positions up to {start + t - 1} would exceed the model's window "
                             f"({self.max_positions}); lower the chunk size or the cache budget")

    def _layer(self, i: int, x: torch.Tensor, start: int) -> torch.Tensor:
        t = x.shape[1]
        out = self.layers[i](x, attention_mask=None, position_ids=torch.arange(start, start + t, device=x.device)[None],
                             use_cache=True, position_embeddings=self.rotary.cos_sin(i, start, t, x),
                             **{self._cache_arg: self._adapter})
        self.flops.add("linear", self.layer_flops[i] * t)
        return out[0] if isinstance(out, tuple) else out

    def _attend(self, i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scaling, window, softcap, sinks):
        """Layer ``i``'s attention for the current call: Q/K/V taps, the policy's arrangement and scores."""
        call, s = self._call, self.shape
        start, t = call.starts[i], q.shape[1]
        scaling = self.scaling if scaling is None else scaling
        hook, policy = call.hook, call.policy
        if i != call.exit_layer and call.cache.layers[i].length != start + t:
            raise UnsupportedModelError("its attention does not store keys and values through the cache it is "
                                        "handed, which the engine needs")
        if hook is not None and i in getattr(hook, "layers", (i,)):
            k_pre = self.rotary.unrotate(k, start, i) if i == call.exit_layer else call.cache.layers[i].keys_pre[:, start:]
            hook.on_qkv(i, self.rotary.unrotate(q, start, i), k_pre, v[:, -t:])
        if i == call.exit_layer:
            raise _Exit
        lc = call.cache.layers[i]
        if (arrange := getattr(policy, "arrange", None)) is not None:
            q, start = self._arrange(arrange, i, q, lc, start)
            k, v = lc.keys, lc.values
        if policy is not None and policy.score_window and window is None:
            out, received = attention_and_received(q, k, v, start, scaling, policy.score_window, softcap, sinks)
            policy.observe(i, received, lc, t)
            if not scores_fused(q, softcap, sinks):       # else they cost no FLOPs of their own
                self.flops.add("eviction_scores", 2 * s.n_heads * s.head_dim * min(policy.score_window, t) * lc.length)
        else:
            out = causal_attention(q, k, v, start, scaling, window=window, softcap=softcap, sinks=sinks)
        self.flops.add("attention", causal_attention_flops(s.n_heads, s.head_dim, start, t, window))
        return out.transpose(0, 1)[None], None

    def _attend_step(self, i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scaling, window, softcap,
                     sinks) -> tuple[torch.Tensor, None]:
        """Layer ``i``'s attention in ``step``: each sequence's query (``q`` [rows, H, 1, D]) over its own
        entries of the keys and values the cache handed the model (``k``/``v`` [n, H_kv, N, D], padded to
        whole blocks), in one ``batch_decode_attention`` whose sums run block by block from key 0, so an
        answer's numbers are the same in any batch. Padding rows get zeros."""
        call, s = self._call, self.shape
        scaling = self.scaling if scaling is None else scaling
        end = call.starts[:, i] + 1
        first = (end - window).clamp(min=0) if window is not None else torch.zeros_like(end)   # a sliding window
        skip = int(first.min()) // DECODE_BLOCK * DECODE_BLOCK              # whole blocks nobody reaches
        out = q.new_zeros(q.shape[0], 1, q.shape[1], q.shape[3])
        out[:call.n, 0] = batch_decode_attention(q[:call.n, :, -1], k[:, :, skip:], v[:, :, skip:], first - skip,
                                                 end - skip, scaling, softcap=softcap, sinks=sinks)
        for start in call.starts[:, i].tolist():
            self.flops.add("attention", causal_attention_flops(s.n_heads, s.head_dim, start, 1, window))
        return out, None

    def _arrange(self, arrange, i: int, q: torch.Tensor, lc: LayerCache, start: int):
        """Let the policy replace layer ``i``'s entries before the block (the block's own entries are set
        aside and re-appended after them); the block then sits right after what the policy arranged."""
        q_pre = self.rotary.unrotate(q, start, i)
        block_pre, block_v = lc.keys_pre[:, start:], lc.values[:, start:]
        lc.truncate(start)
        arrange(i, q_pre, lc, self.rotary)
        start = lc.length
        self._check_positions(start, q.shape[1])
        lc.append(block_pre, self.rotary.rotate(block_pre, start, i), block_v)
        return self.rotary.rotate(q_pre, start, i), start

    def _check_against_model(self, n: int = 12) -> None:
        """Refuse the model unless the engine's logits equal the model's own forward on a short input:
        once in one block, and once in two blocks with the cache re-packed in between (pre-RoPE keys
        rotated afresh). Catches model-level code the engine does not run (embedding or logit scaling),
        attention features it does not honour, and layers that do not go through the attention interface.

        In fp32 "equal" means within 1e-4 of the largest logit. In half precision both sides carry
        rounding noise of their own, so both are judged against the truth, the same weights' forward in
        fp32: the engine's logits must land no further from it (relative RMS) than transformers' own
        half-precision forward does, up to ``HALF_MARGIN`` times that plus ``HALF_SLACK``; and the engine
        run on the same weights in fp32 must equal it within 1e-4, which catches a wrong layer that half
        precision's rounding noise would hide."""
        g = torch.Generator().manual_seed(0)
        vocab = self.lm_head.weight.shape[0]
        ids = torch.randint(0, vocab, (n,), generator=g).to(self.device)
        try:
            with torch.inference_mode():
                ref = self.model(ids[None]).logits[0].float()
            ours, chunked = self._engine_logits(ids)
        except UnsupportedModelError as e:
            raise UnsupportedModelError(f"model type '{self.name}': {e}") from None
        except Exception as e:  # a layer the engine cannot drive: refuse, never half-run
            raise self._cannot_drive(e) from None
        if self.dtype == torch.float32:
            self.check_distance = distance = relative_distance(ref, ours, chunked)
            tol, judged = 1e-4, f"relative difference {distance:.1e}"
        else:
            try:
                with self._float32_weights_per_layer():
                    truth = self.model(ids[None]).logits[0].float()
            except Exception:    # weights that have no fp32 form (e.g. quantised layers): the model's own
                truth = None     # half-precision forward is the reference, within a fixed 3e-2
            if truth is None:
                self.check_distance = distance = relative_distance(ref, ours, chunked)
                tol, judged = 3e-2, f"relative difference {distance:.1e} from its own forward"
            else:
                # the same weights in fp32 through the engine: equal within fp32's 1e-4, so a wrong layer
                # is caught even where half precision's own rounding noise would hide it
                try:
                    with self._float32_weights_per_layer():
                        exact = relative_distance(truth, *self._engine_logits(ids))
                except Exception as e:
                    raise self._cannot_drive(e) from None
                if not exact <= 1e-4:
                    raise UnsupportedModelError(
                        f"model type '{self.name}': the engine's logits differ from the model's own forward "
                        f"with the same weights in fp32 (relative difference {exact:.1e}, on a {n}-token check), "
                        "so it computes something this engine does not")
                self.check_distance = distance = relative_rms(truth, ours, chunked)
                self.check_reference = reference = relative_rms(truth, ref)
                tol = HALF_MARGIN * reference + HALF_SLACK
                judged = (f"{distance:.1e} from the fp32 forward (relative RMS), where transformers' own "
                          f"{str(self.dtype).removeprefix('torch.')} forward is {reference:.1e}")
        if not distance <= tol:
            raise UnsupportedModelError(f"model type '{self.name}': the engine's logits differ from the model's "
                                        f"own forward ({judged}, on a {n}-token check), so it computes something "
                                        "this engine does not")

    def _cannot_drive(self, e: Exception) -> UnsupportedModelError:
        first_line = (str(e).strip().splitlines() or [""])[0][:160]
        return UnsupportedModelError(f"model type '{self.name}': the engine cannot drive its decoder layers "
                                     f"({type(e).__name__}: {first_line})")

    @torch.inference_mode()
    def _engine_logits(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The engine's logits on ``ids`` in one block, and in two blocks with the cache re-packed in
        between (pre-RoPE keys rotated afresh); FLOPs of the check are not counted."""
        n = ids.shape[0]
        ours = self.logits(self.forward(ids, KVCache.empty(self.shape.n_layers)))
        cache = KVCache.empty(self.shape.n_layers)
        first = self.logits(self.forward(ids[:n // 2], cache))
        for lc in cache.layers:
            lc.keep(torch.arange(lc.length, device=self.device).expand(lc.keys.shape[0], -1), self.rotary)
        chunked = torch.cat([first, self.logits(self.forward(ids[n // 2:], cache))])
        self.flops.reset()
        if any(lc.length == 0 for lc in cache.layers):
            raise UnsupportedModelError("its attention does not go through transformers' attention interface "
                                        "and cache, which the engine drives")
        return ours, chunked

    @contextmanager
    def _float32_weights_per_layer(self):
        """Inside, the model computes in fp32 (the truth half precision rounds), through its own forward
        or the engine's: each decoder layer is held in fp32 only while it runs (the embedding, final norm
        and head for the whole block), so this costs one layer's fp32 copy, not the model's; the
        half-precision weights are put back untouched."""
        in_layers = {id(m) for layer in self.layers for m in layer.modules()}
        held: dict[int, float32_weights] = {}          # the layer in fp32 right now (one at a time)
        hooks = [h for layer in self.layers for h in (
            layer.register_forward_pre_hook(lambda mod, args: held.__setitem__(id(mod), float32_weights([mod]))),
            layer.register_forward_hook(lambda mod, args, out: held.pop(id(mod)).restore()))]
        try:
            with float32_weights([m for m in self.model.modules() if id(m) not in in_layers], recurse=False), \
                    torch.inference_mode():
                yield
        finally:
            for h in hooks:
                h.remove()
            for weights in held.values():                 # a layer whose forward raised
                weights.restore()

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """LM-head logits (float32) of hidden states from the full stack of layers, with the model's own
        output scaling: Granite's ``logits_scaling``, Cohere's ``logit_scale``, Gemma's final soft-cap."""
        self.flops.add("lm_head", self._head_flops * hidden.shape[0])
        cfg = self.config
        with torch.inference_mode():
            logits = self.lm_head(self.norm(hidden))
            if (div := getattr(cfg, "logits_scaling", None)) is not None:
                logits = logits / div
            if (mul := getattr(self.model, "logit_scale", None)) is not None and not isinstance(mul, torch.nn.Module):
                logits = logits * mul
            if (cap := getattr(cfg, "final_logit_softcapping", None)) is not None:
                logits = torch.tanh(logits / cap) * cap
            return logits.float()

    # ---------------------------------------------------------------- the chunk loop
    def prefill(self, ids: torch.Tensor, cache: KVCache, *, chunk_size: int, hook: Hook | None = None,
                policy: EvictionPolicy | None = None, offset: int = 0, qkv_only_next: bool = False,
                progress: Callable[[int], None] | None = None) -> torch.Tensor:
        """Feed ``ids`` chunk by chunk: forward on the cache, then let ``policy`` compress it.

        ``offset`` is the index of ``ids[0]`` in the whole input (for hooks that store per-token data);
        ``qkv_only_next`` as in ``forward``.
        Returns the hidden states of the last chunk.
        """
        if chunk_size < 1:
            raise ValueError("chunk size must be positive")
        hidden = None
        # without eviction the chunks form one sequence: length-dependent RoPE picks its frequencies for
        # all of it, as transformers does for one forward call over it
        span = cache.length + ids.shape[0] if policy is None else None
        with self.rotary.spanning(span):
            for s in range(0, ids.shape[0], chunk_size):
                hidden = self._chunk(ids[s:s + chunk_size], cache, offset + s, hook, policy, qkv_only_next, progress)
        return hidden

    def _chunk(self, piece, cache, offset, hook, policy, qkv_only_next, progress) -> torch.Tensor:
        """One chunk of ``prefill``: forward, then the policy's compression."""
        if hook is not None:
            hook.begin(offset, piece.shape[0])
        hidden = self.forward(piece, cache, hook=hook, policy=policy, qkv_only_next=qkv_only_next)
        if policy is not None:
            if (observe_output := getattr(policy, "observe_output", None)) is not None:
                observe_output(piece, hidden)
            policy.compress(cache, self.rotary)
        if progress is not None:
            progress(piece.shape[0])
        return hidden

    # ---------------------------------------------------------------- generation
    def generate(self, prompt: torch.Tensor, *, max_new_tokens: int, eos_ids: Sequence[int],
                 cache: KVCache | None = None, chunk_size: int | None = None,
                 policy: EvictionPolicy | None = None,
                 choose: Callable[[torch.Tensor], int] | None = None) -> Iterator[int]:
        """Decoding with the full model: prefill ``prompt`` on ``cache`` (a fresh one by default;
        a compressed cache of all layers for methods that answer from it), then yield tokens until an
        EOS id (not yielded) or ``max_new_tokens``. With ``policy``, the prompt and every new token run
        under it and are followed by its ``compress`` (ReAttention re-selects at every decoded token).
        ``choose`` picks each token from the last position's logits (default: greedy)."""
        cache = cache if cache is not None else KVCache.empty(self.shape.n_layers)
        if len(cache.layers) != self.shape.n_layers:
            raise ValueError(f"generation needs a cache of all {self.shape.n_layers} layers, got {len(cache.layers)}")
        used = cache.length + prompt.shape[0]
        if used + max_new_tokens > self.max_positions:
            raise ValueError(f"prompt ({used} tokens with the cache) + max_new_tokens ({max_new_tokens}) exceeds "
                             f"the model's window ({self.max_positions})")
        hidden = self.prefill(prompt, cache, chunk_size=chunk_size or self.shape.window, policy=policy)
        for step in range(max_new_tokens):
            logits = self.logits(hidden[-1:])[0]
            token = choose(logits) if choose is not None else int(logits.argmax(-1))
            if token in eos_ids:
                return
            yield token
            if step + 1 < max_new_tokens:
                hidden = self.prefill(torch.tensor([token], device=self.device), cache, chunk_size=1, policy=policy)

    @torch.inference_mode()
    def step(self, batch: DecodeBatch, tokens: Sequence[int]) -> torch.Tensor:
        """One decoding step of the first ``len(tokens)`` sequences of ``batch`` at once (continuous
        batching): ``tokens[b]`` goes through every layer at sequence b's own next position, its key and
        value into b's slot; returns the next-token logits ``[B, vocab]`` (float32). No eviction policy runs.

        The weights are read once for the whole batch, which is why a step of eight costs little more than
        a step of one. A sequence gets the same numbers in any batch, alone included: the products run on
        at least ``STEP_ROWS`` rows and the attention's sums run block by block from key 0
        (``_attend_step``), so the padding a batch adds contributes exact zeros.
        Generated ids are in the vocabulary: no image rows are needed here."""
        n = len(tokens)
        if not 0 < n <= batch.size:
            raise ValueError(f"step takes one token for each of the batch's first sequences (1 to {batch.size})")
        starts = batch.lengths[:n].clone()
        for length in starts.max(1).values.tolist():
            self._check_positions(length, 1)
        ids = torch.tensor(list(tokens), device=self.device)
        if int(ids.max()) >= self.vocab or int(ids.min()) < 0:
            raise ValueError("step takes generated token ids, which are in the vocabulary")
        rows = max(n, STEP_ROWS)
        batch.reserve(n, int(starts.max()) + 1)
        x = self.embed(torch.cat([ids, ids[:1].expand(rows - n)])[:, None])
        if self.embedding_multiplier is not None:
            x = x * self.embedding_multiplier
        spans = (starts.max(1).values + 1).tolist()
        call = _StepCall(batch, n, starts, spans)
        with self._driving(call):
            for i, layer in enumerate(self.layers):
                at = torch.cat([starts[:, i], starts[:1, i].expand(rows - n)])     # padding: the first's
                out = layer(x, attention_mask=None, position_ids=at.to(self.device)[:, None], use_cache=True,
                            position_embeddings=self._step_tables(i, at.tolist(), spans + spans[:1] * (rows - n), x),
                            **{self._cache_arg: self._adapter})
                x = out[0] if isinstance(out, tuple) else out
                self.flops.add("linear", self.layer_flops[i] * n)
        batch.lengths[:n] += 1
        logits = self.logits(x[:, -1])[:n]
        self.flops.add("lm_head", -self._head_flops * (rows - n))         # padding rows are not the model's work
        return logits

    def _step_tables(self, i: int, starts: list[int], spans: list[int], like: torch.Tensor):
        """Layer ``i``'s cos/sin for one token per sequence at ``starts`` ([B, 1, rot_dim] each)."""
        if not self.rotary.length_dependent:
            cos, sin = self.rotary.cos_sin(i, 0, max(starts) + 1, like)
            at = torch.tensor(starts, device=cos.device)
            return cos[0, at][:, None], sin[0, at][:, None]
        tables = []
        for start, span in zip(starts, spans):
            with self.rotary.spanning(span):
                tables.append(self.rotary.cos_sin(i, start, 1, like))
        return tuple(torch.cat(t) for t in zip(*tables))
