"""The KV cache: per-layer K and V storage plus the position of every slot.

Layout per layer: K u16[n_kv_heads, capacity, head_dim_k] and V u16[n_kv_heads,
capacity, head_dim_v], IEEE half bit patterns (the f16 cache type). Slots are filled in
order; `slot_pos[s]` is the absolute position held by slot s (-1 when empty). Attention
only reads `slot_pos` for its masks, so a later ring buffer can reuse slots in any order
without changing the attention kernel.

This is the linear f16 form of the cache. Ring wrap-around, quantized cache types and
overflow policies build on this interface (see DESIGN.md section 3).
"""

from __future__ import annotations

import numpy as np

from .errors import ContextFullError, EdgeKVError

CACHE_TYPES = ("f16",)


class KVCache:
    def __init__(self, n_layers: int, n_kv_heads: int, head_dim_k: int, head_dim_v: int,
                 capacity: int, type_k: str = "f16", type_v: str = "f16"):
        for name, t in (("cache_type_k", type_k), ("cache_type_v", type_v)):
            if t not in CACHE_TYPES:
                raise EdgeKVError(f"{name}={t!r} is not supported yet (supported: {', '.join(CACHE_TYPES)})")
        if capacity < 1:
            raise EdgeKVError(f"n_ctx must be at least 1, got {capacity}")
        self.capacity = capacity
        self.type_k, self.type_v = type_k, type_v
        self.k = [np.zeros((n_kv_heads, capacity, head_dim_k), np.uint16) for _ in range(n_layers)]
        self.v = [np.zeros((n_kv_heads, capacity, head_dim_v), np.uint16) for _ in range(n_layers)]
        self.slot_pos = np.full(capacity, -1, np.int32)  # (capacity,)
        self.n_tokens = 0

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.k) + sum(a.nbytes for a in self.v)

    def reserve(self, n: int) -> tuple[slice, np.ndarray]:
        """Slots and positions for the next n tokens, visible to attention at once (a chunk
        attends to itself); `commit` makes them part of the cache, `rollback` forgets them.
        Raises ContextFullError when they do not fit."""
        if self.n_tokens + n > self.capacity:
            raise ContextFullError(
                f"{self.n_tokens} tokens in the cache + {n} new exceed the context of {self.capacity} "
                f"tokens; use a larger n_ctx (-c) or a shorter input",
                n_tokens=self.n_tokens + n, n_ctx=self.capacity,
            )
        start = self.n_tokens
        slots, positions = slice(start, start + n), np.arange(start, start + n, dtype=np.int32)
        self.slot_pos[slots] = positions
        return slots, positions

    def write(self, layer: int, slots: slice, k: np.ndarray, v: np.ndarray) -> None:
        # k: f32[n, n_kv, hd_k], v: f32[n, n_kv, hd_v] -> stored [n_kv, slots, hd]
        self.k[layer][:, slots, :] = k.transpose(1, 0, 2).astype(np.float16).view(np.uint16)
        self.v[layer][:, slots, :] = v.transpose(1, 0, 2).astype(np.float16).view(np.uint16)

    def commit(self, slots: slice) -> None:
        """Make the reserved slots part of the cache once every layer has written them."""
        self.n_tokens = slots.stop

    def rollback(self, slots: slice) -> None:
        """Forget reserved slots after a failed or interrupted evaluation."""
        self.slot_pos[slots] = -1

    def truncate(self, n_tokens: int) -> None:
        """Keep only the first n_tokens tokens (used by prefix reuse)."""
        assert 0 <= n_tokens <= self.n_tokens
        self.slot_pos[n_tokens:] = -1
        self.n_tokens = n_tokens

    def clear(self) -> None:
        self.truncate(0)
