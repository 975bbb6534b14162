"""The one recurrent engine: decoder-layer loop with early exit, chunk loop, and greedy generation.

Every method runs through ``Engine``. It drives the HF model's *own* decoder-layer modules (so norms,
multipliers, soft-capping, MoE blocks, q/k norms, partial and per-layer RoPE all come from the model's
code), routing their attention through transformers' attention interface (``bridge.py``). What REFORM needs and HF's forward does not expose is the engine's:
which layers run (early exit), the position of every token (contiguous re-packing after eviction), what
the cache holds (pre-RoPE keys; sliding-window layers only their window), the pre-RoPE Q/K/V taps
(retrieval embeddings) and attention scores from the last queries only (eviction). A model the engine
cannot run exactly is refused at construction: structurally (``model_shape``) or numerically (its logits
against the model's own forward, ``load_check.py``). ``reform.conformance`` checks every model type
transformers ships against ``model(...)`` and ``model.generate(...)``.
"""

from __future__ import annotations

import inspect
from contextlib import contextmanager
from typing import Callable, Iterator, Sequence

import torch

from .attention import DECODE_BLOCK, attention_and_received, batch_decode_attention, causal_attention, scores_fused
from .batch import DecodeBatch
from .bridge import INPUT_ROWS, CacheAdapter, Call, Exit, StepCall, driving, register_attention
from .cache import RESERVE, KVCache, LayerCache
from .flops import FlopCounter, causal_attention_flops, linear_flops_per_token, qkv_flops_per_token
from .load_check import cannot_drive, check_against_model
from .plugins import EvictionPolicy, Hook
from .rope import Rotary
from .shape import ModelShape, UnsupportedModelError, decoder_stack, layer_window, model_shape

__all__ = ["Engine", "EvictionPolicy", "Hook", "ModelShape", "STEP_ROWS", "UnsupportedModelError", "model_shape"]

# A decoding step computes at least this many rows, padding with copies of the first: the matrix products
# then take the same kernel whatever the batch holds, one sequence or many. Alone, a row took another
# (1-row) kernel whose sums over more than 1,024 inputs round differently: in bf16 about one row in ten
# had an output one unit in the last place apart (oneDNN, Zen 4), enough to turn greedy answers. fp32 (MKL)
# agreed from 8 rows on. With this and ``batch_decode_attention``, 8 of 8 answers equal their lone selves.
STEP_ROWS = 8


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
            raise cannot_drive(self, e) from None
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
        self._windows = [layer_window(cfg, i) for i in range(self.shape.n_layers)]
        self._adapter = CacheAdapter(self)
        params = inspect.signature(self.layers[0].forward).parameters
        self._cache_arg = next((a for a in ("cache", "past_key_values", "layer_past", "past_key_value") if a in params),
                               "cache")   # what the model's decoder layers call their cache argument
        self._call: Call | StepCall | None = None
        self.check_distance: float | None = None   # the load check's relative logit difference, once run
        self.check_reference: float | None = None  # half precision: transformers' own forward's distance from fp32
        register_attention()
        if check:
            check_against_model(self)

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
        token = INPUT_ROWS.set(rows)
        try:
            yield
        finally:
            INPUT_ROWS.reset(token)

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        """The input embeddings of ``ids`` [B, T] as the model's first layer takes them [B, T, hidden]:
        image rows put in where ids say so (in the order transformers' vision-language models merge them),
        then the model-level multiplier (Granite)."""
        ids = ids.to(self.device)
        extra = ids >= self.vocab
        if bool(extra.any()):
            rows = INPUT_ROWS.get()
            if rows is None or int(ids.max()) - self.vocab >= rows.shape[0]:
                raise ValueError("token ids past the vocabulary stand for image positions, and this input's image "
                                 "embeddings are not in place (Engine.input_rows)")
            x = self.embed(ids.masked_fill(extra, 0))
            x[extra] = rows[ids[extra] - self.vocab].to(x.device, x.dtype)
        else:
            x = self.embed(ids)
        return x if self.embedding_multiplier is None else x * self.embedding_multiplier

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
        x = self._embed(ids[None])
        starts = [lc.length for lc in cache.layers]
        if qkv_only_next:
            starts.append(cache.length)
        call = Call(cache, starts, hook, policy, n if qkv_only_next else None)
        with driving(self, call):
            try:
                for i, start in enumerate(starts):
                    x = self._layer(i, x, torch.arange(start, start + t)[None], self.rotary.cos_sin(i, start, t, x), t)
            except Exit:
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

    def _layer(self, i: int, x: torch.Tensor, positions: torch.Tensor, tables, tokens: int) -> torch.Tensor:
        """Decoder layer ``i`` on ``x`` [B, T, hidden] at ``positions`` [B, T] with their cos/sin ``tables``,
        through the cache adapter; ``tokens``: how many rows are the model's work (not padding)."""
        out = self.layers[i](x, attention_mask=None, position_ids=positions.to(x.device), use_cache=True,
                             position_embeddings=tables, **{self._cache_arg: self._adapter})
        self.flops.add("linear", self.layer_flops[i] * tokens)
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
            raise Exit
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
        whole blocks), in one ``batch_decode_attention`` whose sums over blocks run as one tree over block
        numbers, so an answer's numbers are the same in any batch. Padding rows get zeros."""
        call, s = self._call, self.shape
        scaling = self.scaling if scaling is None else scaling
        end = call.starts[:, i] + 1
        first = (end - window).clamp(min=0) if window is not None else torch.zeros_like(end)   # a sliding window
        skip = int(first.min()) // DECODE_BLOCK * DECODE_BLOCK              # whole blocks nobody reaches
        out = q.new_zeros(q.shape[0], 1, q.shape[1], q.shape[3])
        out[:call.n, 0] = batch_decode_attention(q[:call.n, :, -1], k[:, :, skip:], v[:, :, skip:], first - skip,
                                                 end - skip, scaling, softcap=softcap, sinks=sinks,
                                                 first_block=skip // DECODE_BLOCK)
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
        at least ``STEP_ROWS`` rows and the attention sums blocks by one tree over block numbers
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
        x = self._embed(torch.cat([ids, ids[:1].expand(rows - n)])[:, None])
        spans = (starts.max(1).values + 1).tolist()
        with driving(self, StepCall(batch, n, starts, spans)):
            for i in range(len(self.layers)):
                at = torch.cat([starts[:, i], starts[:1, i].expand(rows - n)])     # padding: the first's
                tables = self._step_tables(i, at.tolist(), spans + spans[:1] * (rows - n), x)
                x = self._layer(i, x, at[:, None], tables, n)
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
