"""Per-layer KV cache with pre-RoPE keys, so positions can be re-packed exactly after eviction.

Every cached key is stored twice: as projected (before rotary embedding) and rotated at its current
position. The rotated copy is what attention reads; appending rotates only the new keys. Eviction
gathers the kept pre-RoPE keys and rotates them afresh at positions 0..n-1, so kept keys always equal
the keys the model would compute at their new positions (no error piles up over many re-rotations).
Positions are therefore implicit: the i-th cached entry of a head sits at position i.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .rope import Rotary

SMALL_APPEND = 64    # appends of at most this many entries (decoding) write into a buffer with room
RESERVE = 256        # entries of room such a buffer gets, so it is re-allocated once per 256 decoded tokens


@dataclass
class LayerCache:
    """Keys/values of one layer, shaped ``[n_kv_heads, length, head_dim]`` (batch size is always 1)."""

    keys_pre: torch.Tensor | None = None   # projected keys, no rotation
    keys: torch.Tensor | None = None       # keys rotated at positions 0..length-1
    values: torch.Tensor | None = None
    scores: torch.Tensor | None = None     # eviction policy state, [n_kv_heads, length] float32
    window: int | None = None              # a sliding-window layer: only the last ``window - 1`` entries matter

    @property
    def length(self) -> int:
        return 0 if self.keys is None else self.keys.shape[1]

    # Buffers with room for appends owned by this cache (never by a clone), so decoding a token writes
    # in place instead of copying the whole cache three times per layer (at 8k entries those copies took
    # ~8.6 ms per layer, ~250 ms per token on 30 layers). The public tensors view the first ``length``.
    _buffers: tuple[torch.Tensor, ...] | None = field(default=None, repr=False)
    layer: int = 0                         # which decoder layer (its RoPE is the one re-packing uses)

    def append(self, k_pre: torch.Tensor, k_rot: torch.Tensor, v: torch.Tensor) -> None:
        new, n, t = (k_pre, k_rot, v), self.length, k_pre.shape[1]
        if self.keys is None and t > SMALL_APPEND:          # bulk prefill: take the tensors as they are
            self.keys_pre, self.keys, self.values = new
            return
        if not self._views_of_buffers() or self._buffers[0].shape[1] < n + t:
            room = n + t + (RESERVE if t <= SMALL_APPEND else 0)
            old = (self.keys_pre, self.keys, self.values)
            self._buffers = tuple(x.new_empty(x.shape[0], room, x.shape[2]) for x in new)
            if n:
                for buf, x in zip(self._buffers, old):
                    buf[:, :n] = x
        for buf, x in zip(self._buffers, new):
            buf[:, n:n + t] = x
        self.keys_pre, self.keys, self.values = (buf[:, :n + t] for buf in self._buffers)

    def _views_of_buffers(self) -> bool:
        """The tensors are still our buffers' views (a policy may have swapped in others)."""
        return self._buffers is not None and all(
            x is not None and x.data_ptr() == buf.data_ptr()
            for x, buf in zip((self.keys_pre, self.keys, self.values), self._buffers))

    def keep(self, index: torch.Tensor, rotary: Rotary) -> None:
        """Keep entries ``index`` ([n_kv_heads, m], ascending per head) and re-pack them at 0..m-1."""
        self._buffers = None
        idx = index.unsqueeze(-1).expand(-1, -1, self.keys.shape[-1])
        self.keys_pre = self.keys_pre.gather(1, idx)
        self.values = self.values.gather(1, idx)
        self.keys = rotary.rotate(self.keys_pre, 0, self.layer)
        if self.scores is not None:
            self.scores = self.scores.gather(1, index)

    def keep_last(self, m: int, rotary: Rotary) -> None:
        """Keep the last ``m`` entries, re-packed at 0..m-1."""
        self.keep(torch.arange(self.length - m, self.length, device=self.keys.device).expand(self.keys.shape[0], -1),
                  rotary)

    def trim_to_window(self, rotary: Rotary, slack: int = 0) -> None:
        """A sliding-window layer's next query reads only the last ``window - 1`` entries: drop the rest
        (exact, not an approximation). Done once ``slack`` entries have piled up (decoding passes some, so
        it does not re-pack every token)."""
        if self.window is not None and self.length > self.window - 1 + slack:
            self.keep_last(self.window - 1, rotary)

    def truncate(self, n: int) -> None:
        """Drop the entries from ``n`` on (the buffers with room stay ours)."""
        self.keys_pre, self.keys, self.values = self.keys_pre[:, :n], self.keys[:, :n], self.values[:, :n]
        if self.scores is not None:
            self.scores = self.scores[:, :n]


@dataclass
class KVCache:
    """The caches of the first ``len(layers)`` decoder layers (fewer than the model has when exiting early)."""

    layers: list[LayerCache] = field(default_factory=list)

    @classmethod
    def empty(cls, n_layers: int) -> "KVCache":
        return cls([LayerCache(layer=i) for i in range(n_layers)])

    @property
    def length(self) -> int:
        """Entries per head of the fullest layer: the next position it uses. Full-attention layers hold the
        same count; sliding-window layers may hold fewer."""
        return max((c.length for c in self.layers), default=0)

    def clone(self) -> "KVCache":
        """A copy whose appends do not touch this cache (tensors are shared until replaced)."""
        return KVCache([LayerCache(c.keys_pre, c.keys, c.values, c.scores, c.window, layer=c.layer)
                        for c in self.layers])

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for c in self.layers
                   for t in (c.keys_pre, c.keys, c.values, c.scores) if t is not None)
