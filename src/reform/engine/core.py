"""The one recurrent engine: decoder-layer loop with early exit, chunk loop, and greedy generation.

Every method runs through ``Engine``. It reads the weights of a Llama-style HF model (Llama, Mistral,
Qwen2/3, SmolLM, ...) and runs the decoder layers itself, so it controls what HF's forward does not
expose: which layers run (early exit), the position of every token (contiguous re-packing after
eviction), the pre-RoPE Q/K/V states (retrieval embeddings) and attention scores computed from the last
queries only (eviction). With no eviction it computes exactly what the HF model computes, which the
tests check against ``model(...)`` and ``model.generate(...)``.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Protocol, Sequence

import torch

from .attention import attention_received, causal_attention
from .cache import KVCache, LayerCache
from .flops import FlopCounter, causal_attention_flops, linear_flops_per_token
from .rope import Rotary


class UnsupportedModelError(ValueError):
    """The model is not a decoder-only transformer with rotary positions that the engine can drive."""


class Hook(Protocol):
    """Sees each chunk as it is encoded (e.g. to store retrieval embeddings)."""

    def begin(self, offset: int, length: int) -> None: ...
    def on_qkv(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None: ...


class EvictionPolicy(Protocol):
    """Scores cached tokens while a chunk runs and shrinks each layer's cache after it.

    A policy may also define ``observe_output(ids, hidden)``: ``Engine.prefill`` then hands it each
    chunk's ids and last-layer hidden states before ``compress`` (InfiniPot's novelty scores need them);
    and ``arrange(layer, q, cache, rotary)``: called in every layer with the block's pre-RoPE queries
    before it attends, it may replace the layer's cached entries (re-packed at 0..n-1), e.g. InfLLM
    loading the memory blocks those queries retrieve.
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

    @property
    def n_rep(self) -> int:
        """Query heads per KV head: query head h reads KV head h // n_rep."""
        return self.n_heads // self.n_kv_heads


_LAYER_PARTS = ("input_layernorm", "post_attention_layernorm", "self_attn", "mlp")
_ATTN_PARTS = ("q_proj", "k_proj", "v_proj", "o_proj")
_EXTRA_NORMS = ("pre_feedforward_layernorm", "post_feedforward_layernorm")


def model_shape(model: torch.nn.Module) -> ModelShape:
    """Check that ``model`` is a Llama-style rotary decoder and read its dimensions."""
    cfg = model.config
    base = getattr(model, "model", None)
    name = getattr(cfg, "model_type", type(model).__name__)
    if base is None or not hasattr(base, "layers") or not hasattr(base, "embed_tokens"):
        raise UnsupportedModelError(f"model type '{name}' is not a decoder-only model with `model.layers`")
    if getattr(base, "rotary_emb", None) is None:
        raise UnsupportedModelError(f"model type '{name}' has no rotary position embedding; REFORM re-packs "
                                    "positions with RoPE and cannot run it")
    layer = base.layers[0]
    missing = [p for p in _LAYER_PARTS if not hasattr(layer, p)] + \
        [p for p in _ATTN_PARTS if not hasattr(layer.self_attn, p)]
    if missing or any(hasattr(layer, p) for p in _EXTRA_NORMS):
        raise UnsupportedModelError(f"model type '{name}' has a decoder layer the engine does not know "
                                    f"(missing {missing or 'nothing'}; extra norms present)")
    n_heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // n_heads
    return ModelShape(n_layers=len(base.layers), n_heads=n_heads,
                      n_kv_heads=getattr(cfg, "num_key_value_heads", None) or n_heads,
                      head_dim=head_dim, window=cfg.max_position_embeddings)


class Engine:
    """Runs a Llama-style HF causal LM chunk by chunk on a (possibly compressed) KV cache."""

    def __init__(self, model: torch.nn.Module):
        self.shape = model_shape(model)
        self.model = model.eval()
        base = model.model
        self.embed, self.layers, self.norm = base.embed_tokens, base.layers, base.norm
        self.lm_head = model.lm_head
        self.rotary = Rotary(base.rotary_emb, self.shape.head_dim)
        attn = self.layers[0].self_attn
        self.scaling = getattr(attn, "scaling", self.shape.head_dim ** -0.5)
        self.device = self.embed.weight.device
        self.dtype = self.embed.weight.dtype
        self.max_positions = self.shape.window   # positions beyond are refused (see ``past_window``)
        self.flops = FlopCounter()               # model FLOPs executed so far (the benchmark reads it)
        self._layer_flops = [linear_flops_per_token(layer) for layer in self.layers]
        self._qkv_flops = [linear_flops_per_token(torch.nn.ModuleList([layer.self_attn.q_proj, layer.self_attn.k_proj,
                                                                       layer.self_attn.v_proj])) for layer in self.layers]
        self._head_flops = 2 * self.lm_head.weight.numel()

    @contextmanager
    def past_window(self, positions: int):
        """Allow positions up to ``positions`` (beyond the window the model was trained on) inside the
        ``with`` block: only the full-attention baseline asks for this, to show what happens past W."""
        old, self.max_positions = self.max_positions, max(self.max_positions, positions)
        try:
            yield
        finally:
            self.max_positions = old

    # ---------------------------------------------------------------- one block of tokens
    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, cache: KVCache, *, hook: Hook | None = None,
                policy: EvictionPolicy | None = None, qkv_only_next: bool = False) -> torch.Tensor:
        """Run ``ids`` (1-D) through the first ``len(cache.layers)`` layers on top of ``cache``.

        The block sits at positions ``cache.length ..``; returns the last layer's hidden states [T, hidden].
        ``qkv_only_next``: then compute only the Q/K/V states of the following layer for ``hook`` (early exit
        at a layer whose attention output nobody reads: its attention and MLP are skipped).
        """
        start, t = cache.length, ids.shape[0]
        self._check_positions(start, t)
        x = self.embed(ids.to(self.device))
        for i, lc in enumerate(cache.layers):
            x = self._layer(i, x, lc, start, hook, policy)
        if qkv_only_next:
            i = len(cache.layers)
            hook.on_qkv(i, *self._qkv(i, x))
            self.flops.add("linear", self._qkv_flops[i] * t)
        return x

    def _check_positions(self, start: int, t: int) -> None:
        if start + t > self.max_positions:
            raise ValueError(f"positions up to {start + t - 1} would exceed the model's window "
                             f"({self.max_positions}); lower the chunk size or the cache budget")

    def _qkv(self, i: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Layer ``i``'s pre-RoPE query, key and value states of hidden states ``x``, each [heads, T, D]."""
        attn, s, t = self.layers[i].self_attn, self.shape, x.shape[0]
        h = self.layers[i].input_layernorm(x)
        q = attn.q_proj(h).view(t, s.n_heads, s.head_dim)
        k = attn.k_proj(h).view(t, s.n_kv_heads, s.head_dim)
        v = attn.v_proj(h).view(t, s.n_kv_heads, s.head_dim)
        if hasattr(attn, "q_norm"):  # Qwen3-style per-head norms come before RoPE
            q, k = attn.q_norm(q), attn.k_norm(k)
        return q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)

    def _layer(self, i: int, x: torch.Tensor, lc: LayerCache, start: int, hook, policy) -> torch.Tensor:
        layer, s = self.layers[i], self.shape
        attn, t = layer.self_attn, x.shape[0]
        q, k, v = self._qkv(i, x)
        if hook is not None:
            hook.on_qkv(i, q, k, v)
        if (arrange := getattr(policy, "arrange", None)) is not None:
            arrange(i, q, lc, self.rotary)          # the policy may swap in what these queries retrieve
            start = lc.length
            self._check_positions(start, t)
        q_rot = self.rotary.rotate(q, start)
        lc.append(k, self.rotary.rotate(k, start), v)
        out = causal_attention(q_rot, lc.keys, lc.values, start, self.scaling)
        self.flops.add("linear", self._layer_flops[i] * t)
        self.flops.add("attention", causal_attention_flops(s.n_heads, s.head_dim, start, t))
        if policy is not None and policy.score_window:
            w = min(policy.score_window, t)
            policy.observe(i, attention_received(q_rot[:, -w:], lc.keys, self.scaling), lc, t)
            self.flops.add("eviction_scores", 2 * s.n_heads * s.head_dim * w * lc.length)
        x = x + attn.o_proj(out.transpose(0, 1).reshape(t, -1))
        return x + layer.mlp(layer.post_attention_layernorm(x))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """LM-head logits (float32) of hidden states from the full stack of layers."""
        self.flops.add("lm_head", self._head_flops * hidden.shape[0])
        with torch.inference_mode():
            return self.lm_head(self.norm(hidden)).float()

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
        for s in range(0, ids.shape[0], chunk_size):
            piece = ids[s:s + chunk_size]
            if hook is not None:
                hook.begin(offset + s, piece.shape[0])
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
                 policy: EvictionPolicy | None = None) -> Iterator[int]:
        """Greedy decoding with the full model: prefill ``prompt`` on ``cache`` (a fresh one by default;
        a compressed cache of all layers for methods that answer from it), then yield tokens until an
        EOS id (not yielded) or ``max_new_tokens``. With ``policy``, the prompt and every new token run
        under it and are followed by its ``compress`` (ReAttention re-selects at every decoded token)."""
        cache = cache if cache is not None else KVCache.empty(self.shape.n_layers)
        if len(cache.layers) != self.shape.n_layers:
            raise ValueError(f"generation needs a cache of all {self.shape.n_layers} layers, got {len(cache.layers)}")
        used = cache.length + prompt.shape[0]
        if used + max_new_tokens > self.max_positions:
            raise ValueError(f"prompt ({used} tokens with the cache) + max_new_tokens ({max_new_tokens}) exceeds "
                             f"the model's window ({self.max_positions})")
        hidden = self.prefill(prompt, cache, chunk_size=chunk_size or self.shape.window, policy=policy)
        for step in range(max_new_tokens):
            token = int(self.logits(hidden[-1:]).argmax(-1))
            if token in eos_ids:
                return
            yield token
            if step + 1 < max_new_tokens:
                hidden = self.prefill(torch.tensor([token], device=self.device), cache, chunk_size=1, policy=policy)
