"""Attention over a cached prefix, and the attention-received scores eviction policies need.

Neither function materialises a chunk x cache attention matrix. The chunk's own attention takes one of
two CPU paths, chosen by dtype and CPU because their speeds differ by both (measured with
``scripts/attention_kernel_throughput.py``; docs/benchmarks.md, "bf16 CPUs: attention built from matmuls"
and "AMX: the flash kernel again"):

- fp32: PyTorch's fused flash kernel (``scaled_dot_product_attention``), near the fp32 matmul rate.
- bf16/fp16 on a CPU with AMX tiles: the flash kernel too. There it multiplies with AMX and exponentiates
  with a fused fast ``exp``: 650-690 GFLOP/s on the encode's shapes, twice the blocked path's 315-355,
  whose separate softmax pass costs more than its two matmuls (Sapphire Rapids, 2 cores).
- bf16/fp16 elsewhere (AVX512-BF16, AVX2): blocked attention built from half-precision matmuls, a block of
  query rows at a time, with the softmax accumulated in fp32 (the precision of transformers' eager
  attention): 379-409 GFLOP/s against the flash kernel's 162-181 on a Zen 5 with AVX512-BF16.

On a GPU the chunk attends through the fused kernel with a bottom-right-aligned causal bias (no mask
tensor). Sliding windows, soft-capping and attention sinks always take the blocked path. ``REFORM_CPU_ATTENTION``
(``auto``, ``flash`` or ``blocked``) overrides the choice, for measuring one against the other.
Eviction scores use only the last few queries of the chunk, one KV-head group at a time; on CPU they are
summed from the probabilities the blocked pass computes for those queries (on the flash path the kernel
runs the other queries), so they cost no pass of their own.
"""

from __future__ import annotations

import functools
import os

import torch
import torch.nn.functional as F

CPU_ATTENTION_PATHS = ("auto", "flash", "blocked")
BLOCK_ROWS = 384        # query rows (positions x heads of one KV group) per block: fastest measured (bf16)


def cpu_attention_path(dtype: torch.dtype) -> str:
    """The CPU path for ``dtype``: ``REFORM_CPU_ATTENTION`` if set, else flash for fp32 and on AMX CPUs,
    blocked for half precision elsewhere (the faster of the two on each, see the module docstring)."""
    chosen = os.environ.get("REFORM_CPU_ATTENTION", "auto")
    if chosen not in CPU_ATTENTION_PATHS:
        raise ValueError(f"REFORM_CPU_ATTENTION must be one of {', '.join(CPU_ATTENTION_PATHS)}, got {chosen!r}")
    if chosen != "auto":
        return chosen
    return "flash" if dtype == torch.float32 or cpu_has_amx() else "blocked"


def cpu_has_amx() -> bool:
    """Whether PyTorch's CPU kernels can use AMX tiles here: the CPU has them (as PyTorch detects) and
    oneDNN is not capped below them (``ONEDNN_MAX_CPU_ISA``, e.g. ``AVX512_CORE_BF16``)."""
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    if cap and cap != "ALL" and "AMX" not in cap:
        return False
    return _amx_usable()


@functools.cache
def _amx_usable() -> bool:
    """The CPU has AMX tiles and the kernel lets this process use them (Linux asks per process; before 5.16
    it cannot, and oneDNN then runs AVX-512, where the flash kernel is the slower path). PyTorch's own
    checks, private, hence the fallback."""
    has, init = getattr(torch.cpu, "_is_amx_tile_supported", None), getattr(torch.cpu, "_init_amx", None)
    return bool(has is not None and init is not None and has() and init())


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, scaling: float, *,
                     window: int | None = None, softcap: float | None = None,
                     sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of ``q`` ([H, T, D], at positions start..start+T-1) over ``k``/``v`` ([H_kv, start+T, D]).

    Query head ``h`` reads KV head ``h // (H / H_kv)`` (``enable_gqa``), the layout of HF's ``repeat_kv``.
    ``window``: a sliding-window layer, where a query at position p reads only keys at p-window+1..p (as
    transformers' sliding masks); ``softcap``: logits squashed to ``softcap * tanh(logits / softcap)``
    (Gemma 2); ``sinks``: one learned logit per query head that joins every softmax and then is dropped
    (GPT-OSS's attention sinks, ``s_aux``).
    """
    t, n = q.shape[1], k.shape[1]
    if n != start + t:
        raise ValueError(f"cache holds {n} keys, expected {start + t}")
    cpu = q.device.type == "cpu"
    if t == 1 and cpu:
        return decode_attention(q.transpose(0, 1), k[None], v[None], scaling, window=window, softcap=softcap,
                                sinks=sinks).transpose(0, 1)
    if window is not None or softcap is not None or sinks is not None or _blocked_path(q):
        return blocked_attention(q, k, v, start, scaling, window, softcap, sinks)[0]
    gqa = q.shape[0] != k.shape[0]
    if start == 0:
        out = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=t > 1, scale=scaling,
                                             enable_gqa=gqa)
    elif t == 1:
        out = F.scaled_dot_product_attention(q[None], k[None], v[None], scale=scaling, enable_gqa=gqa)
    elif cpu and _CPU_FLASH is not None:
        return _split_attention(q, k, v, start, scaling)
    else:
        # GPU: the chunk's causal mask aligned to the bottom right of the [t, n] scores, which the flash
        # kernel applies itself (a bool mask would be t x n: 2 GB for the paper's 32k chunk on a 32k cache);
        # imported here: the module imports torch._dynamo, 1.4 s on a Zen 3, which a refused command need not pay
        from torch.nn.attention.bias import causal_lower_right
        out = F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=causal_lower_right(t, n),
                                             scale=scaling, enable_gqa=gqa)
    return out[0]


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scaling: float, *,
                     window: int | None = None, softcap: float | None = None,
                     sinks: torch.Tensor | None = None) -> torch.Tensor:
    """One new query per head (decoding alone, ``Engine.forward`` with one token on CPU): ``q`` [1, H, D] at
    the last position of ``k``/``v`` [1, H_kv, N, D]; [1, H, D].

    Two matmuls with the query heads of one KV group as the rows (K/V never repeated per head), the softmax
    accumulated in fp32: the precision of transformers' eager attention and of the blocked path. In bf16
    the fused kernel took 0.58 ms per layer for one query over 1,000 keys, these matmuls 0.12 ms (2-core
    Zen 4). ``window``, ``softcap`` and ``sinks`` as in ``causal_attention``."""
    logits = decode_logits(q, k, scaling, softcap)
    b, h_kv, rep, n = logits.shape
    if window is not None and n > window:                                     # keys left of the window
        logits = logits.clone()
        logits[..., :n - window] = float("-inf")
    if sinks is None:
        probs = torch.softmax(logits, -1)
    else:
        probs = _softmax(logits.float().reshape(b, h_kv * rep, n), sinks[None].expand(b, h_kv * rep))
        probs = probs.to(v.dtype).view(b, h_kv, rep, n)
    return torch.matmul(probs, v).reshape(b, h_kv * rep, v.shape[-1])


DECODE_BLOCK = 256     # keys per block of ``batch_decode_attention``'s sums


def batch_decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, first: torch.Tensor,
                           end: torch.Tensor, scaling: float, *, softcap: float | None = None,
                           sinks: torch.Tensor | None = None, first_block: int = 0) -> torch.Tensor:
    """One new query per sequence of a batch (``Engine.step``): ``q`` [B, H, D]; sequence b reads its keys
    ``first[b] .. end[b] - 1`` of ``k``/``v`` [B, H_kv, N, D], N a multiple of ``DECODE_BLOCK``, whose key 0
    begins block ``first_block`` of the cache (the blocks before it are reached by no sequence). Returns
    [B, H, D].

    Every sum over keys runs per block of ``DECODE_BLOCK`` keys, and the blocks' sums are added by a fixed
    pairwise tree over their block numbers (``_tree_sum``): a block a sequence does not reach adds exactly
    zero, so a sequence gets the same numbers whatever the batch pads it to, alone included. A plain
    softmax or product over a padded length rounded differently (9 of 480 sequences in bf16). Probabilities
    in fp32, then the precision of the values, as eager attention."""
    b, h, d = q.shape
    h_kv, n = k.shape[1], k.shape[2]
    rep, blocks = h // h_kv, n // DECODE_BLOCK
    keys = torch.arange(n, device=q.device)
    outside = (keys < first[:, None].to(q.device)) | (keys >= end[:, None].to(q.device))            # [B, N]
    logits = decode_logits(q, k, scaling, softcap).float().masked_fill(outside[:, None, None, :], float("-inf"))
    top = logits.amax(-1, keepdim=True)
    if sinks is not None:
        sink = sinks.float().view(1, h_kv, rep, 1)
        top = torch.maximum(top, sink)
    weights = torch.exp(logits - top).contiguous()                                    # [B, H_kv, rep, N]
    total = _tree_sum(weights.view(b, h_kv, rep, blocks, DECODE_BLOCK).sum(-1).movedim(-1, 0), first_block)
    if sinks is not None:
        total = total + torch.exp(sink - top)[..., 0]
    probs = (weights / total[..., None]).to(v.dtype).view(b, h_kv, rep, blocks, DECODE_BLOCK).transpose(2, 3)
    mixed = torch.matmul(probs, v.reshape(b, h_kv, blocks, DECODE_BLOCK, v.shape[-1]))   # [B, H_kv, blocks, rep, D]
    return _tree_sum(mixed.float().movedim(2, 0), first_block).to(v.dtype).reshape(b, h, v.shape[-1])


def _tree_sum(parts: torch.Tensor, first_block: int) -> torch.Tensor:
    """``parts.sum(0)``, where ``parts[i]`` is block ``first_block + i``, added in place (``parts`` is used
    up) as one fixed tree over block numbers: blocks 2j and 2j + 1, then pairs of those, and so on; a node
    whose partner lies outside ``parts`` (an exact zero) goes up as it is. A sequence's sum is then the same
    however many blocks a batch adds before or after its own (x + 0 == x), where a reduction kernel may
    group parts differently by their count; and it takes at most two additions a level, log2(blocks)
    levels, not one addition per block (each is a kernel launch, and decoding on a GPU waits on them).
    Node j of a level is kept at its first block, ``max(j * size, first_block) - first_block``."""
    last, size = first_block + parts.shape[0] - 1, 1
    while first_block // size < last // size:              # more than one node at this level
        k, top = first_block // size, last // size
        k += k & 1                                         # an odd first node's partner is before the buffer
        if k * size < first_block and k < top:             # the first pair's left node begins before it
            parts[0] += parts[(k + 1) * size - first_block]
            k += 2
        if (pairs := (top - k + 1) // 2) > 0:
            at, span = k * size - first_block, (pairs - 1) * 2 * size + 1
            parts[at:at + span:2 * size] += parts[at + size:at + size + span:2 * size]
        size *= 2
    return parts[0]


def decode_logits(q: torch.Tensor, k: torch.Tensor, scaling: float, softcap: float | None = None) -> torch.Tensor:
    """``decode_attention``'s logits, ``[B, H_kv, rep, N]`` for ``q`` [B, H, D] over ``k`` [B, H_kv, N, D]:
    each a dot product over the head dimension alone, so the same number however many sequences or keys
    share the call (``Engine.step`` computes a batch's at once, padded to the longest)."""
    b, h, d = q.shape
    h_kv = k.shape[1]
    scaled = q if softcap is not None else q * scaling
    # keys on the left: a slice of a batch's buffer multiplies in place (as the right operand, transposed,
    # it was copied first: 1.07 against 0.28 ms for 8 sequences of 1,200 keys, bf16)
    logits = torch.matmul(k, scaled.reshape(b, h_kv, h // h_kv, d).transpose(-1, -2)).transpose(-1, -2)
    if softcap is not None:
        logits = torch.tanh(logits * (scaling / softcap)) * softcap
    return logits


def attention_and_received(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, scaling: float,
                           score_window: int, softcap: float | None = None, sinks: torch.Tensor | None = None):
    """``causal_attention`` and ``attention_received`` of its last ``score_window`` queries, in one pass on
    CPU (the scores are sums of probabilities the blocked pass computes anyway)."""
    t = q.shape[1]
    w = min(score_window, t)
    if not scores_fused(q, softcap, sinks):          # GPU: the fused kernel, then the scores on their own
        return causal_attention(q, k, v, start, scaling), attention_received(q[:, -w:], k, scaling)
    if softcap is not None or sinks is not None or _blocked_path(q) or t == w:
        return blocked_attention(q, k, v, start, scaling, None, softcap, sinks, received_by_last=w)
    # CPU flash path: the kernel for all but the last w queries, the blocked pass for those w (their
    # probabilities summed as it goes); a separate scoring pass cost ~20 % of the attention (AMX, bf16)
    head = causal_attention(q[:, :t - w], k[:, :start + t - w], v[:, :start + t - w], start, scaling)
    tail, received = blocked_attention(q[:, t - w:], k, v, start + t - w, scaling, received_by_last=w)
    return torch.cat([head, tail], 1), received


def scores_fused(q: torch.Tensor, softcap: float | None = None, sinks: torch.Tensor | None = None) -> bool:
    """Whether ``attention_and_received`` gets the scores from the attention pass itself (no extra FLOPs):
    always on CPU, and with soft-capping or sinks (which take the blocked path) anywhere."""
    return softcap is not None or sinks is not None or q.device.type == "cpu"


def _blocked_path(q: torch.Tensor) -> bool:
    return q.device.type == "cpu" and q.shape[1] > 1 and cpu_attention_path(q.dtype) == "blocked"


def blocked_attention(q, k, v, start, scaling, window=None, softcap=None, sinks=None, *,
                      received_by_last: int = 0, rows: int = BLOCK_ROWS):
    """``causal_attention`` a block of query positions at a time, over only the keys that block can read.

    A block's rows are its positions x the query heads of one KV group, so each block is one 2-D matmul
    per side and K/V are never repeated per head. Only the block's diagonal (future keys) and, with a
    window, its left edge are masked; the softmax accumulates in fp32 (inside the kernel for half inputs).
    Blocks are laid out from the end, so the last ``received_by_last`` queries usually share one block.
    Returns the output and, with ``received_by_last`` = w > 0, ``attention_received`` of the last w queries
    ([H_kv, start+T] float32; else None).
    """
    h, t, d = q.shape
    h_kv, n = k.shape[0], k.shape[1]
    rep = h // h_kv
    block = max(1, rows // rep)
    scaled = q if softcap is not None else q * scaling   # softcap wants the raw scaled logits below
    # rows in (position, head) order, so a block's rows are one contiguous slice of these, in and out
    grouped = scaled.view(h_kv, rep, t, d).transpose(1, 2).reshape(h_kv, t * rep, d)
    out = torch.empty(h_kv, t * rep, d, dtype=q.dtype, device=q.device)
    received = torch.zeros(h_kv, n, dtype=torch.float32, device=q.device) if received_by_last else None
    offsets = torch.arange(block, device=q.device)
    full_future = offsets[None, :] > offsets.repeat_interleave(rep)[:, None]  # a full block's diagonal mask
    for e in range(t, 0, -block):
        s = max(0, e - block)
        lo = 0 if window is None else max(0, start + s - window + 1)
        q_pos = (start + s + offsets[:e - s]).repeat_interleave(rep)[:, None]     # row -> its position
        future = full_future if e - s == block else start + s + offsets[None, :e - s] > q_pos
        edge = None if window is None else lo + offsets[None, :e - s] <= q_pos - window    # left of window
        first_scored = max(0, t - received_by_last - s) * rep if e > t - received_by_last else None
        for g in range(h_kv):
            logits = grouped[g, s * rep:e * rep] @ k[g, lo:start + e].T
            if softcap is not None:
                logits = torch.tanh(logits * (scaling / softcap)) * softcap
            logits[:, start + s - lo:].masked_fill_(future, float("-inf"))
            if edge is not None:
                logits[:, :e - s].masked_fill_(edge, float("-inf"))
            if sinks is None:
                probs = torch.softmax(logits, -1)
            else:
                row_sinks = sinks[g * rep:(g + 1) * rep].repeat(e - s)
                probs = _softmax(logits.float()[None], row_sinks[None])[0].to(q.dtype)
            if first_scored is not None:
                received[g, lo:start + e] += probs[first_scored:].sum(0, dtype=torch.float32)
            torch.mm(probs, v[g, lo:start + e], out=out[g, s * rep:e * rep])
    return out.view(h_kv, t, rep, d).transpose(1, 2).reshape(h, t, d), received


def _softmax(logits: torch.Tensor, sinks: torch.Tensor | None) -> torch.Tensor:
    """Softmax over the last dimension of ``logits`` ([B, rows, N]); with ``sinks`` ([B, rows], or [B]
    for one per batch entry) each row's sink logit joins the normalisation and its share is dropped."""
    if sinks is None:
        return torch.softmax(logits, -1)
    sink = sinks.float().reshape(logits.shape[0], -1, 1).expand(*logits.shape[:2], 1)
    return torch.softmax(torch.cat([logits, sink], -1), -1)[..., :-1]


_CPU_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def _split_attention(q, k, v, start, scaling):
    """CPU: a masked SDPA call computes every masked score. Instead attend to the cached prefix (no mask)
    and to the chunk itself (causal, upper blocks skipped) separately and merge by log-sum-exp: the same
    result with ~1/3 less work when chunk and cache are of a size. The kernel maps GQA heads itself."""
    o1, lse1 = _CPU_FLASH(q[None], k[None, :, :start], v[None, :, :start], scale=scaling)
    o2, lse2 = _CPU_FLASH(q[None], k[None, :, start:], v[None, :, start:], is_causal=True, scale=scaling)
    # softmax over both parts = lerp of the partial outputs by the prefix's share of the total mass
    prefix_share = torch.sigmoid(lse1 - lse2).unsqueeze(-1)
    return torch.lerp(o2.float(), o1.float(), prefix_share)[0].to(q.dtype)


def attention_received(q_last: torch.Tensor, k: torch.Tensor, scaling: float,
                       softcap: float | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax attention that each key receives from the last ``w`` queries, summed over queries and over
    the query heads sharing a KV head. ``q_last`` is [H, w, D] and sits at the last ``w`` positions of
    ``k`` ([H_kv, N, D]), so causality masks only keys among the last ``w``; ``softcap`` and ``sinks`` as in
    ``causal_attention``. Returns [H_kv, N] float32."""
    h, w, d = q_last.shape
    h_kv, n, _ = k.shape
    rep = h // h_kv
    future = torch.ones(w, w, dtype=torch.bool, device=k.device).triu_(1)      # query i sits at n - w + i
    out = torch.empty(h_kv, n, dtype=torch.float32, device=k.device)
    for g in range(h_kv):                                                      # one group at a time
        logits = (q_last[g * rep:(g + 1) * rep].reshape(rep * w, d) @ k[g].T).float().mul_(scaling)
        if softcap is not None:
            logits = torch.tanh(logits / softcap) * softcap
        logits.view(rep, w, n)[:, :, n - w:].masked_fill_(future, float("-inf"))
        group_sinks = None if sinks is None else sinks[g * rep:(g + 1) * rep]
        out[g] = _softmax(logits.view(rep, w, n), group_sinks).sum((0, 1))
    return out
