"""What a backend is handed, besides weights: the records of the backend's contract.

What lives here: `LayerView` (one layer of a KV cache, as kv/cache.py describes it to the
backend's attention), `RowCodec` (how that layer's K or V rows are stored: type, rotation,
saturation, a calibrated key map), `SessionRings` (every layer of a batched decode step in
arrays, kv/batch.py makes it) and `Scratch` (the activations a session's forward passes
write, made by `Backend.scratch`). They are plain records: the cache fills them, the
backend reads them, and neither imports the other (backends never import kv/ or models/).
What does not: the Backend interface (backends/base.py), the cache's bookkeeping (kv/).

A new cache feature is a field of the codec (a way of storing rows) or of the view's
policy state (`attn_mass`: what an overflow policy needs measured), filled in kv/ and read
by the kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as T


@dataclass(frozen=True)
class RowCodec:
    """How a layer's K (or V) rows are stored: rows of `ggml_type` blocks, each row first
    multiplied by `rotation` (the Hadamard matrix of kernels/rows.py; None: not rotated),
    values beyond |limit| saturated (KVCacheType.limit). A calibrated K type (kv/key_map.py)
    also stores K as (k - key_mean) * key_scale and divides queries by key_scale (both
    f32[n_kv_heads, head_dim]), and keeps the stored K of the first positions in f32 in
    sink_k f32[n_kv_heads, SINKS, head_dim] (kv/cache.py SINKS), read instead of the slot."""

    ggml_type: int
    rotation: np.ndarray | None = None
    limit: float = float("inf")
    key_mean: np.ndarray | None = None
    key_scale: np.ndarray | None = None
    sink_k: np.ndarray | None = None

    @property
    def plain_f16(self) -> bool:
        return self.ggml_type == T.F16 and self.rotation is None and self.key_scale is None and self.sink_k is None


@dataclass
class LayerView:
    """One layer of the KV cache as a backend sees it (kv/cache.py KVCache.layer_view).

    k, v: u8[n_kv_heads, cap, row_bytes], one token's head in the codec's ggml blocks per
    row; slot_pos: i32[cap], the position in each slot (-1 empty); n_slots: slots ever
    written (attention scans [0, n_slots)); window: a sliding-window layer's size (0: the
    whole context); codec_k / codec_v: how the rows are stored."""

    k: np.ndarray
    v: np.ndarray
    slot_pos: np.ndarray
    n_slots: int
    window: int
    codec_k: RowCodec
    codec_v: RowCodec
    # policy state: f32[n_kv_heads, cap] or None, where a full-context layer adds the softmax weight
    # each slot receives, per KV head summed over its query heads and queries (`keep`, kv/heavy_hitters.py)
    attn_mass: np.ndarray | None = None
    # i64[3]: the data addresses of k, v and slot_pos (a kernel that takes several sessions'
    # rings at once reads them by address: kernels/attention_sessions.py)
    addresses: np.ndarray | None = None
    index: int = -1  # which layer of its cache this is (-1: unknown)

    @property
    def plain_f16(self) -> bool:
        """An f16 K and V ring with nothing stored beside it (no key map, sinks, rotation or
        tally), whose arrays' addresses its cache gave."""
        return (self.codec_k.plain_f16 and self.codec_v.plain_f16 and self.attn_mass is None
                and self.addresses is not None)


@dataclass
class SessionRings:
    """Every layer's rings in one batched decode step (kv/batch.py), gathered once for the
    step: what a backend that attends to all the sessions in one call reads per layer
    instead of each cache's layer view. Row i is session i; per layer l:

      addresses[l]  i64[n, 3]  the data addresses of its k, v and slot_pos arrays
      n_slots[l]    i64[n]     slots ever written (attention scans [0, n_slots))
      windows[l]    i64[n]     the sliding window (0: none)
      slots[l]      i64[n]     the slot its token is written into
      plain[l]      bool[n]    its layer a plain f16 ring (LayerView.plain_f16) of the
                               first session's capacity, caps[l]
      limit_k[l]    f32[n]     |K values| above it are saturated on write (and limit_v[l])"""

    addresses: np.ndarray
    n_slots: np.ndarray
    windows: np.ndarray
    slots: np.ndarray
    caps: list[int]
    limit_k: np.ndarray
    limit_v: np.ndarray
    plain: np.ndarray


class Scratch:
    """Every buffer a forward pass writes, made once per session for up to n_batch tokens
    (hp: the model's hyperparameters, models/base.py HParams); n_workers: threads the
    backend's kernels run on (each has its own attention rows)."""

    def __init__(self, hp, n_batch: int, n_workers: int):
        q_dim, kv_dim = hp.n_heads * hp.head_dim, hp.n_kv_heads * hp.head_dim
        self.x = np.zeros((n_batch, hp.dim), np.float32)  # residual stream
        self.h = np.zeros((n_batch, hp.dim), np.float32)  # normed input of a block
        self.o = np.zeros((n_batch, hp.dim), np.float32)  # block output
        self.q = np.zeros((n_batch, q_dim), np.float32)
        self.k = np.zeros((n_batch, kv_dim), np.float32)
        self.v = np.zeros((n_batch, hp.n_kv_heads * hp.head_dim_v), np.float32)
        self.att = np.zeros((n_batch, hp.n_heads * hp.head_dim_v), np.float32)
        self.gate = np.zeros((n_batch, hp.ff), np.float32)
        self.up = np.zeros((n_batch, hp.ff), np.float32)
        half = hp.rope_dims // 2
        self.cos = {kind: np.zeros((n_batch, half), np.float32) for kind in ("global", "local")}
        self.sin = {kind: np.zeros((n_batch, half), np.float32) for kind in ("global", "local")}
        self.n_batch = n_batch
        self._scores = np.zeros((0, 0), np.float32)
        self._pv = np.zeros((n_workers, 4, 16, max(hp.head_dim_v, 64)), np.float32)
        self._probs = np.zeros((0, 0), np.float32)
        self._lanes = np.zeros((hp.n_heads, 4, 16, hp.head_dim_v), np.float32)
        self.kv_rows = np.zeros((n_workers, 2, max(hp.head_dim, hp.head_dim_v)), np.float32)  # dequantized K/V rows

    def attn_scratch(self, rows: int, capacity: int) -> tuple[np.ndarray, np.ndarray]:
        """Score rows and lane accumulators for the per-query attention kernel; the score
        rows grow once to the largest need (decode then allocates nothing)."""
        if self._scores.shape[0] < rows or self._scores.shape[1] < capacity:
            self._scores = np.zeros((max(rows, self._scores.shape[0]), max(capacity, self._scores.shape[1])),
                                    np.float32)
        return self._scores, self._pv

    def deep_scratch(self, rows: int, capacity: int) -> tuple[np.ndarray, np.ndarray]:
        """Softmax weights and per-head accumulator rows for one query over a deep f16
        cache (attention_decode.py); the weights grow once, like the score rows."""
        if self._probs.shape[0] < rows or self._probs.shape[1] < capacity:
            self._probs = np.zeros((max(rows, self._probs.shape[0]), max(capacity, self._probs.shape[1])), np.float32)
        return self._probs, self._lanes
