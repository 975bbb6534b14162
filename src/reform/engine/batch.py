"""Sequences decoded together: the keys and values of every sequence in a decoding batch, in slots of
per-layer buffers, so that one ``Engine.step`` gives each its next token with one batched attention
product per layer (docs/architecture.md, "Answering many at once").

A sequence joins with the cache its prompt left (``join``: copied once into a free slot) and leaves when
its answer ends (``leave``: its slot is freed at once, and the last occupied slot moves into it, so the
occupied slots are always ``0..size-1`` and a step reads them as one view, never a gathered copy).
"""

from __future__ import annotations

import torch

from .attention import DECODE_BLOCK
from .cache import KVCache

ROOM = 256     # entries of room a buffer is given past the longest sequence when it grows


class DecodeBatch:
    """Up to ``max_size`` sequences decoding on one engine's model. ``lengths[s, layer]``: the entries slot
    ``s`` holds in that layer (sliding-window layers may hold fewer than full ones)."""

    def __init__(self, n_layers: int, max_size: int):
        if max_size < 1:
            raise ValueError("a decoding batch holds at least one sequence")
        self.n_layers, self.max_size = n_layers, max_size
        self.keys: list[torch.Tensor] = []          # per layer [slots, H_kv, capacity, D], rotated keys
        self.values: list[torch.Tensor] = []
        self.lengths = torch.zeros(0, n_layers, dtype=torch.long)
        self.size = 0

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2] if self.keys else 0

    def free(self) -> int:
        return self.max_size - self.size

    def join(self, cache: KVCache) -> int:
        """Copy ``cache`` (all layers, as a prompt's prefill left it) into a slot; returns the slot."""
        if self.size >= self.max_size:
            raise ValueError(f"the decoding batch is full ({self.max_size} sequences)")
        if len(cache.layers) != self.n_layers:
            raise ValueError(f"decoding needs a cache of all {self.n_layers} layers, got {len(cache.layers)}")
        layers = cache.layers
        self.reserve(self.size + 1, max(lc.length for lc in layers) + 1, like=layers)
        slot = self.size
        for i, lc in enumerate(layers):
            self.keys[i][slot, :, :lc.length] = lc.keys
            self.values[i][slot, :, :lc.length] = lc.values
        self.lengths[slot] = torch.tensor([lc.length for lc in layers])
        self.size += 1
        return slot

    def leave(self, slot: int) -> int | None:
        """Free ``slot``; the last occupied slot moves into it. Returns the slot that moved (now ``slot``),
        or None when ``slot`` was the last."""
        if not 0 <= slot < self.size:
            raise ValueError(f"slot {slot} is not in use")
        last = self.size - 1
        if slot != last:
            n = int(self.lengths[last].max())
            for buf in (*self.keys, *self.values):
                buf[slot, :, :n] = buf[last, :, :n]
            self.lengths[slot] = self.lengths[last]
        self.size -= 1
        if self.size == 0:                 # nobody is decoding: give the memory back
            self.keys, self.values, self.lengths = [], [], torch.zeros(0, self.n_layers, dtype=torch.long)
        return last if slot != last else None

    def reserve(self, slots: int, entries: int, like=None) -> None:
        """Room for ``slots`` sequences of ``entries`` entries per layer (the buffers grow, keeping what
        they hold); ``like``: layer caches to take shapes, dtype and device from when there are no buffers."""
        allocated = self.lengths.shape[0]
        if self.keys and slots <= allocated and entries <= self.capacity:
            return
        grown_slots = allocated if slots <= allocated else min(self.max_size, max(slots, 2 * allocated))
        # whole blocks: a step reads the slots up to the end of the last block in use (``Engine.step``)
        capacity = max(-(-(entries + ROOM) // DECODE_BLOCK) * DECODE_BLOCK, self.capacity)
        old = self.keys + self.values
        shapes = [(t.shape[1], t.shape[3], t.dtype, t.device) for t in old] or \
                 [(t.shape[0], t.shape[2], t.dtype, t.device) for t in [lc.keys for lc in like] + [lc.values for lc in like]]
        new = [torch.zeros(grown_slots, h, capacity, d, dtype=dt, device=dev) for h, d, dt, dev in shapes]
        for fresh, held in zip(new, old):
            fresh[:held.shape[0], :, :held.shape[2]] = held
        lengths = torch.zeros(grown_slots, self.n_layers, dtype=torch.long)
        lengths[:allocated] = self.lengths
        self.keys, self.values, self.lengths = new[:self.n_layers], new[self.n_layers:], lengths

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))
