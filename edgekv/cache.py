"""The KV cache: per-layer K and V storage in a chosen type, plus the position of every slot.

Layout per layer: K u8[n_kv_heads, capacity, row_bytes_k] and V u8[n_kv_heads, capacity,
row_bytes_v], one token's head_dim values per row, stored in the cache type's ggml block
format (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1; K and V chosen separately), so V
is never transposed and a quantized row is quantized once, on write. `slot_pos[s]` is
the absolute position held by slot s (-1 when empty). Attention only reads `slot_pos`
for its masks, so slots can be reused in any order without copying.

What does not live here: attention over the storage (kernels/attention*.py), which
slots a chunk gets beyond filling in order (ring wrap-around and overflow policies are
the next step, DESIGN.md section 3).
"""

from __future__ import annotations

import numpy as np

from .errors import ContextFullError, EdgeKVError
from .kernels.attention_q import dequant_rows
from .kernels.quantize import quantize_rows
from .quants import KV_CACHE_TYPES, kv_cache_type

CACHE_TYPES = tuple(KV_CACHE_TYPES)


def hadamard(n: int) -> np.ndarray:
    """The orthonormal n x n Walsh-Hadamard matrix (Sylvester order; symmetric, H @ H = I)."""
    h = np.full((1, 1), 1.0 / np.sqrt(n), np.float32)
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h


def _rotation(quantized: bool, head_dim: int, largest: bool) -> np.ndarray | None:
    """llama.cpp rotates K (and V) with a Walsh-Hadamard matrix before storing them in a
    quantized cache: outliers spread over the block, so 4-bit blocks lose far less
    (q4_0 perplexity of SmolLM2: 22.5 unrotated, 19.5 rotated). Scores are unchanged
    (orthonormal Q and K rotation) and V's rotation is undone on the attention output.
    K uses the largest power of two >= 64 dividing head_dim, V blocks of 64."""
    if not quantized or head_dim % 64:
        return None
    n = 64
    while largest and head_dim % (2 * n) == 0:
        n *= 2
    return hadamard(n)


def rotate(x: np.ndarray, h: np.ndarray | None) -> None:
    """Multiply every run of h.shape[0] values of x by h, in place (no-op when h is None)."""
    if h is not None:
        n = h.shape[0]
        x[...] = (x.reshape(-1, n) @ h).reshape(x.shape)


def _cache_type(option: str, name: str, head_dim: int):
    try:
        t = kv_cache_type(name)
    except EdgeKVError as exc:
        raise EdgeKVError(f"{option}={name!r}: {exc}") from None
    block = t.quant.block_size
    if head_dim % block:
        raise EdgeKVError(f"{option}={name!r} stores blocks of {block} values, but this model's head size is "
                          f"{head_dim}, not a multiple of {block}; choose f16, bf16 or f32 for {option}")
    return t


class KVCache:
    def __init__(self, n_layers: int, n_kv_heads: int, head_dim_k: int, head_dim_v: int,
                 capacity: int, type_k: str = "f16", type_v: str = "f16"):
        if capacity < 1:
            raise EdgeKVError(f"n_ctx must be at least 1, got {capacity}")
        self.kind_k = _cache_type("cache_type_k", type_k, head_dim_k)
        self.kind_v = _cache_type("cache_type_v", type_v, head_dim_v)
        self.capacity = capacity
        self.type_k, self.type_v = self.kind_k.name, self.kind_v.name
        self.head_dim_k, self.head_dim_v = head_dim_k, head_dim_v
        rb_k, rb_v = self.kind_k.row_nbytes(head_dim_k), self.kind_v.row_nbytes(head_dim_v)
        self.k = [np.zeros((n_kv_heads, capacity, rb_k), np.uint8) for _ in range(n_layers)]
        self.v = [np.zeros((n_kv_heads, capacity, rb_v), np.uint8) for _ in range(n_layers)]
        self.slot_pos = np.full(capacity, -1, np.int32)  # (capacity,)
        self.n_tokens = 0
        quantized = {name: kind.quant.block_size > 1 for name, kind in (("k", self.kind_k), ("v", self.kind_v))}
        self.rot_k = _rotation(quantized["k"], head_dim_k, largest=True)  # applied to Q and K
        self.rot_v = _rotation(quantized["v"], head_dim_v, largest=False)  # to V, undone on the output

    @property
    def f16(self) -> bool:
        """Both K and V are f16: the path that reproduces llama.cpp's arithmetic exactly."""
        return self.type_k == "f16" and self.type_v == "f16"

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.k) + sum(a.nbytes for a in self.v)

    def bytes_per_token(self) -> tuple[int, int]:
        """(K, V) bytes one token takes over all layers."""
        n_layers, n_kv = len(self.k), self.k[0].shape[0]
        return n_layers * n_kv * self.k[0].shape[2], n_layers * n_kv * self.v[0].shape[2]

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
        # k: f32[n, n_kv, hd_k], v: f32[n, n_kv, hd_v] -> rows [n_kv, slots, row_bytes]
        for src, dst, kind in ((k, self.k[layer], self.kind_k), (v, self.v[layer], self.kind_v)):
            rows = np.ascontiguousarray(src.transpose(1, 0, 2))  # [n_kv, n, hd]
            n_kv, n, hd = rows.shape
            if kind.name == "f16":  # numpy's conversion is IEEE round-to-nearest-even, as ggml's
                dst[:, slots, :] = rows.astype(np.float16).view(np.uint8).reshape(n_kv, n, -1)
            else:
                out = np.empty((n_kv * n, dst.shape[2]), np.uint8)
                quantize_rows(rows.reshape(n_kv * n, hd), kind.quant.ggml_type, out)
                dst[:, slots, :] = out.reshape(n_kv, n, -1)

    def dequantized(self, layer: int, n_slots: int) -> tuple[np.ndarray, np.ndarray]:
        """float32 copies of the first n_slots slots of a layer's K and V, for prefill
        attention through BLAS: f32[n_kv, n_slots, head_dim] each."""
        out = []
        for arr, kind, hd in ((self.k[layer], self.kind_k, self.head_dim_k), (self.v[layer], self.kind_v, self.head_dim_v)):
            n_kv = arr.shape[0]
            f = np.empty((n_kv * n_slots, hd), np.float32)
            dequant_rows(np.ascontiguousarray(arr[:, :n_slots]).reshape(n_kv * n_slots, -1), kind.quant.ggml_type, f)
            out.append(f.reshape(n_kv, n_slots, hd))
        return out[0], out[1]

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
