"""Attention over a cached prefix, and the attention-received scores eviction policies need.

Neither function materialises a chunk x cache attention matrix: the chunk's own attention goes through
``scaled_dot_product_attention`` (fused kernels on CPU and CUDA), and eviction scores use only the last
few queries of the chunk, one KV-head group at a time.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


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
    if window is not None or softcap is not None or sinks is not None:
        return _masked_attention(q, k, v, start, scaling, window, softcap, sinks)
    gqa = q.shape[0] != k.shape[0]
    if start == 0:
        out = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=t > 1, scale=scaling,
                                             enable_gqa=gqa)
    elif t == 1:
        out = F.scaled_dot_product_attention(q[None], k[None], v[None], scale=scaling, enable_gqa=gqa)
    elif q.device.type == "cpu" and _CPU_FLASH is not None:
        return _split_attention(q, k, v, start, scaling)
    else:
        mask = torch.arange(n, device=q.device)[None, :] <= (start + torch.arange(t, device=q.device))[:, None]
        out = F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask, scale=scaling,
                                             enable_gqa=gqa)
    return out[0]


def _masked_attention(q, k, v, start, scaling, window, softcap, sinks=None, block: int = 256):
    """Sliding-window, soft-capped and/or sink attention, ``block`` queries at a time over only the keys
    that block can read (so no chunk x cache matrix is held); softmax in float32."""
    h, t, d = q.shape
    rep = h // k.shape[0]
    out = torch.empty_like(q)
    for s in range(0, t, block):
        e = min(t, s + block)
        lo = 0 if window is None else max(0, start + s - window + 1)
        kb = k[:, lo:start + e].repeat_interleave(rep, 0)
        vb = v[:, lo:start + e].repeat_interleave(rep, 0)
        q_pos = start + torch.arange(s, e, device=q.device)[:, None]
        k_pos = lo + torch.arange(kb.shape[1], device=q.device)[None, :]
        allowed = k_pos <= q_pos
        if window is not None:
            allowed &= k_pos > q_pos - window
        logits = (q[:, s:e] @ kb.transpose(1, 2)) * scaling
        if softcap is not None:
            logits = torch.tanh(logits / softcap) * softcap
        logits = logits.float().masked_fill_(~allowed, float("-inf"))
        out[:, s:e] = _softmax(logits, sinks).to(q.dtype) @ vb
    return out


def _softmax(logits: torch.Tensor, sinks: torch.Tensor | None) -> torch.Tensor:
    """Softmax over the last dimension of ``logits`` ([H, rows, N]); with ``sinks`` ([H]) each head's sink
    logit joins the normalisation and its share is dropped."""
    if sinks is None:
        return torch.softmax(logits, -1)
    sink = sinks.float().view(-1, 1, 1).expand(logits.shape[0], logits.shape[1], 1)
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
