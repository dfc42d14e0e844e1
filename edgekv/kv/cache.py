"""The KV cache: per-layer rings of K and V rows in a chosen type, and every slot's position.

Layout per layer: K u8[n_kv_heads, cap, row_bytes_k] and V u8[n_kv_heads, cap,
row_bytes_v], one token's head_dim values per row, stored in the cache type's ggml block
format (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, iq4_cal; K and V chosen
separately, and per layer when the type spec is a mix: kv/layer_types.py), so V is never
transposed and a quantized row is quantized once, on write. A calibrated K type (iq4_cal)
stores K through the model's `KeyMap` (kv/calibration.py says why and how it is
measured). `pos[layer][s]` is the absolute position held by slot s (-1 when empty);
attention reads positions only for its masks, so slots are used in any order and nothing
is ever copied on wrap.

Two kinds of layer ring:
- full (cap = n_ctx): a new token takes the lowest free slot, so before the first overflow
  slots fill in order; when full, the session's overflow policy frees slots (`evict`:
  drop positions, re-rotate the surviving K by RoPE so positions stay contiguous).
- windowed (a sliding-window layer, or one limited by `layer_windows`; cap = window +
  n_batch + n_keep): a ring with a write pointer `cur` that overwrites its oldest slot,
  which no query can still see, except the n_keep pinned first positions: after a shift
  they are back inside every window, as they are for the full layers. Its positions are
  shifted with the full layers, so the two stay consistent (llama.cpp loses them here:
  its issue 12357, "Gemma 3 gibberish after context shift").
What does not live here: attention and the row codecs (the backend's `attend`,
`store_kv`, `load_kv`; the cache hands it a `layer_view`), what to evict and when (kv/overflow.py, session.py),
how RoPE rotates a key (the model's `shift_keys`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..backends.base import Backend
from ..backends.contract import LayerView, RowCodec
from ..errors import ContextFullError, EdgeKVError
from .heavy_hitters import AttentionTallies
from ..kernels.rows import keep_sinks, rotate, rotation_for
from .key_map import KeyMap
from .layer_types import layer_kinds, spec_name
from .types import KV_CACHE_TYPES

CACHE_TYPES = tuple(KV_CACHE_TYPES)
# A calibrated K type keeps the K of the first SINKS positions also in f32 beside the ring
# (sink_k): the first token draws much of every query's attention and its key lies far from
# K's mean, so its 4-bit error moves every score (SmolLM2, kv4_study's codec: mean KLD
# 0.030 without, 0.021 with; 2 or 4 positions measured no better than 1).
SINKS = 1
# Numerical policy: a K or V value beyond what the cache type stores finite is saturated
# (KVCacheType.limit: +-65504 for f16, the f16 block scale's reach for the quantized types;
# llama.cpp would store inf and produce NaN scores); NaN stays NaN, and NaN or infinite
# logits make the session raise NumericalError instead of sampling garbage (session.py).


@dataclass
class Reservation:
    """Slots for a chunk of n tokens: per layer the slot indices, and their positions."""

    positions: np.ndarray  # i32[n]
    slots: list[np.ndarray]  # per layer i64[n]
    cur: np.ndarray  # the ring pointers before the chunk, for rollback


class KVCache:
    """The rings of every layer (see the module docstring). Made by the session with the
    backend its model runs on; the model's one call is `attend`."""

    def __init__(self, *, n_layers: int, n_kv_heads: int, head_dim_k: int, head_dim_v: int, capacity: int,
                 backend: Backend, type_k: str = "f16", type_v: str = "f16", windows: Sequence[int] = (),
                 n_batch: int = 512, n_keep: int = 0, key_map: KeyMap | None = None, track_attention: bool = False):
        if capacity < 1:
            raise EdgeKVError(f"n_ctx must be at least 1, got {capacity}")
        # per layer: a cache type spec may mix types over the layers (kv/layer_types.py)
        self.kinds_k = layer_kinds("cache_type_k", type_k, head_dim_k, n_layers)
        self.kinds_v = layer_kinds("cache_type_v", type_v, head_dim_v, n_layers)
        if self.calibrated and key_map is None:
            raise EdgeKVError(f"cache_type_k={type_k!r} needs the model's key map (kv/calibration.py: key_map_for)")
        self.key_map = key_map if self.calibrated else None
        # who sees each layer's Q and K on their way in (kv/calibration.py measures with it)
        self.observer = None
        self.capacity = capacity
        self.type_k, self.type_v = spec_name(self.kinds_k), spec_name(self.kinds_v)  # canonical specs
        self.head_dim_k, self.head_dim_v = head_dim_k, head_dim_v
        self.backend = backend
        self.windows = list(windows) or [0] * n_layers  # 0: the layer sees the whole context
        self.n_keep = n_keep  # positions below it are pinned: a ring never overwrites them
        self.caps = [min(capacity, w + n_batch + n_keep) if w else capacity for w in self.windows]
        ring = self.backend.ring_array  # host memory the backend reads (the CUDA backend maps it)
        # the first SINKS positions' stored (mapped, rotated) K in f32, by position; None unless
        # calibrated (a mix keeps them for every layer; only its calibrated layers read them)
        self.sink_k = ring((n_layers, n_kv_heads, SINKS, head_dim_k), np.float32) if self.key_map is not None else None
        self.k = [ring((n_kv_heads, cap, kind.row_nbytes(head_dim_k)), np.uint8)
                  for cap, kind in zip(self.caps, self.kinds_k)]
        self.v = [ring((n_kv_heads, cap, kind.row_nbytes(head_dim_v)), np.uint8)
                  for cap, kind in zip(self.caps, self.kinds_v)]
        self.pos = [ring((cap,), np.int32, -1) for cap in self.caps]  # per layer (cap,)
        self._full_layers = [i for i, cap in enumerate(self.caps) if cap == capacity]
        self._ring_layers = [i for i, cap in enumerate(self.caps) if cap < capacity]
        self._full_mask = np.array([cap == capacity for cap in self.caps])
        self._addresses: np.ndarray | None = None  # ring_addresses()
        self._plain: list[bool] | None = None  # plain_f16_layers()
        self.used = np.zeros(n_layers, np.int64)  # slots ever written: attention scans [0, used)
        self.cur = np.zeros(n_layers, np.int64)  # next slot of a windowed ring
        self.n_tokens = 0
        # per layer: the Hadamard matrix a quantized type's rows are stored rotated by (None: not)
        self.rot_k = [rotation_for(kind.quant.block_size > 1, head_dim_k, largest=True) for kind in self.kinds_k]
        self.rot_v = [rotation_for(kind.quant.block_size > 1, head_dim_v, largest=False) for kind in self.kinds_v]
        # the attention each slot of the full-context layers has received (the `keep` policy's)
        self.tallies = AttentionTallies(n_layers, n_kv_heads, capacity, ring) if track_attention else None
        # during a verify pass of drafted tokens, each query's tallies apart (kv/drafts.py)
        self.staging: np.ndarray | None = None
        self.drafting = False
        # a full-context layer (all of them hold a position in the same slot), which the tallies index
        self.tally_layer = next((i for i, w in enumerate(self.windows) if w == 0), None)
        self._codecs: list[tuple[RowCodec, RowCodec]] = self._make_codecs()

    def _make_codecs(self) -> list[tuple[RowCodec, RowCodec]]:
        """Per layer, how its K and V rows are stored (remade when `load` brings another key map)."""
        codecs = []
        for layer, (kind_k, kind_v) in enumerate(zip(self.kinds_k, self.kinds_v)):
            m = self.key_map if kind_k.calibrated else None
            key_rows = {} if m is None else dict(key_mean=m.mean[layer], key_scale=m.scale[layer],
                                                 sink_k=self.sink_k[layer])
            codecs.append((RowCodec(kind_k.quant.ggml_type, self.rot_k[layer], kind_k.limit, **key_rows),
                           RowCodec(kind_v.quant.ggml_type, self.rot_v[layer], kind_v.limit)))
        return codecs

    def ring(self, layer: int) -> bool:
        """Whether the layer is a windowed ring smaller than the context."""
        return self.caps[layer] < self.capacity

    def ring_pointers(self) -> tuple[int, int]:
        """(start, cur) of the first full-context layer: the slot of the oldest position after
        the n_keep pinned ones (-1 when none) and the slot the next token takes (-1 when full)."""
        layer = next((i for i in range(len(self.pos)) if not self.ring(i)), 0)
        pos = self.pos[layer]
        movable = np.flatnonzero(pos >= self.n_keep)
        start = int(movable[np.argmin(pos[movable])]) if movable.size else -1
        free = np.flatnonzero(pos < 0)
        cur = int(self.cur[layer]) if self.ring(layer) else int(free[0]) if free.size else -1
        return start, cur

    @property
    def calibrated(self) -> bool:
        """Some layer's K type is calibrated (iq4_cal): the cache holds a key map and sink rows."""
        return any(kind.calibrated for kind in self.kinds_k)

    @property
    def kind_k(self):
        """The K type of every layer (a cache without a per-layer mix)."""
        return _uniform(self.kinds_k, self.type_k)

    @property
    def kind_v(self):
        return _uniform(self.kinds_v, self.type_v)

    @property
    def f16(self) -> bool:
        """Both K and V are f16: the path that reproduces llama.cpp's arithmetic exactly."""
        return self.type_k == "f16" and self.type_v == "f16"

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.k) + sum(a.nbytes for a in self.v)

    def bytes_per_token(self) -> tuple[int, int]:
        """(K, V) bytes one token takes over all layers."""
        return sum(a.shape[0] * a.shape[2] for a in self.k), sum(a.shape[0] * a.shape[2] for a in self.v)

    def reserve(self, n: int) -> Reservation:
        """Slots and positions for the next n tokens, visible to attention at once (a chunk
        attends to itself); `commit` makes them part of the cache, `rollback` forgets them.
        Raises ContextFullError when the full layers have no n free slots."""
        if self.n_tokens + n > self.capacity:
            raise ContextFullError(
                f"{self.n_tokens} tokens in the cache + {n} new exceed the context of {self.capacity} "
                f"tokens; use a larger n_ctx (-c), a shorter input or an overflow policy (--context-shift)",
                n_tokens=self.n_tokens + n, n_ctx=self.capacity,
            )
        positions = np.arange(self.n_tokens, self.n_tokens + n, dtype=np.int32)
        res = Reservation(positions, [None] * len(self.pos), self.cur.copy())
        if self._full_layers:  # they are reserved and discarded alike: one search serves all
            slots = np.flatnonzero(self.pos[self._full_layers[0]] < 0)[:n]
            if self.tallies is not None:
                self.tallies.clear(slots)
            if n == 1:  # a decode step: scalar stores beat 30 fancy-index writes
                slot, position = int(slots[0]), int(positions[0])
                for layer in self._full_layers:
                    self.pos[layer][slot] = position
                    res.slots[layer] = slots
            else:
                for layer in self._full_layers:
                    self.pos[layer][slots] = positions
                    res.slots[layer] = slots
            np.maximum(self.used, int(slots[-1]) + 1 if slots.size else 0, out=self.used, where=self._full_mask)
        for layer in self._ring_layers:
            pos, cap = self.pos[layer], self.caps[layer]
            cur = int(self.cur[layer])
            if n == 1 and not 0 <= pos[cur] < self.n_keep:  # a decode step: the slot at cur, unless pinned
                self.cur[layer] = (cur + 1) % cap
                pos[cur] = positions[0]
                self.used[layer] = max(int(self.used[layer]), cur + 1)
                res.slots[layer] = np.array([cur])
                continue
            order = (cur + np.arange(cap)) % cap
            pinned = (pos[order] >= 0) & (pos[order] < self.n_keep)
            slots = order[~pinned][:n]
            self.cur[layer] = (slots[-1] + 1) % cap
            pos[slots] = positions
            self.used[layer] = max(int(self.used[layer]), int(slots.max()) + 1)
            res.slots[layer] = slots
        return res

    def attend(self, layer: int, res: Reservation, q: np.ndarray, k: np.ndarray, v: np.ndarray, out: np.ndarray,
               scale: float, scratch) -> None:
        """The model's one call: write a chunk's K and V (q: f32[n, n_heads, hd_k], k: f32[n,
        n_kv, hd_k], v: f32[n, n_kv, hd_v], RoPE applied) into the slots `res` reserved in layer
        `layer`, and out: f32[n, n_heads, hd_v] = attention over every slot visible to each
        query (Backend.attend). An observer (a calibration pass) sees Q and K first."""
        if self.observer is not None:
            self.observer(layer, res.positions, q, k)
        self.backend.attend(self.layer_view(layer), res.slots[layer], res.positions, q, k, v, out, scale, scratch)

    def graph_key(self) -> tuple[int, bytes] | None:
        """What a replayed decode step of this cache depends on (its identity and its rings'
        addresses), for a backend that captures steps (backends/cuda_graphs.py); None while an
        observer must see each step."""
        if self.observer is not None:
            return None
        return id(self), self.ring_addresses().tobytes()

    def layer_view(self, layer: int) -> LayerView:
        """What layer `layer` holds, for the backend's attention."""
        codec_k, codec_v = self._codecs[layer]
        mass = None
        if self.tallies is not None and self.windows[layer] == 0:
            mass = self.staging[:, layer] if self.drafting else self.tallies.mass[layer]
        return LayerView(self.k[layer], self.v[layer], self.pos[layer], int(self.used[layer]), self.windows[layer],
                         codec_k, codec_v, mass, self.ring_addresses()[layer], layer)

    def ring_addresses(self) -> np.ndarray:
        """i64[n_layers, 3]: the data addresses of each layer's k, v and pos arrays (made once;
        the arrays are only ever written in place, and `load`, which replaces them, drops it)."""
        if self._addresses is None:
            self._addresses = np.array([[a.ctypes.data for a in arrays] for arrays in zip(self.k, self.v, self.pos)],
                                       np.int64)
        return self._addresses

    def plain_f16_layers(self) -> list[bool]:
        """Per layer, whether its view is a plain f16 ring (LayerView.plain_f16): made once, as
        what it depends on (cache types, rotations, the key map of a calibrated type, the
        tallies) is chosen when the cache is made."""
        if self._plain is None:
            self._plain = [self.layer_view(layer).plain_f16 for layer in range(len(self.k))]
        return self._plain

    def write(self, layer: int, slots: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
        # k: f32[n, n_kv, hd_k], v: f32[n, n_kv, hd_v] -> rows [n_kv, slots, row_bytes]
        self.write_k(layer, slots, k)
        kind = self.kinds_v[layer]
        self.backend.store_kv(self.v[layer], kind.quant.ggml_type, slots, v, kind.limit)

    def write_k(self, layer: int, slots: np.ndarray, k: np.ndarray) -> None:
        kind = self.kinds_k[layer]
        self.backend.store_kv(self.k[layer], kind.quant.ggml_type, slots, k, kind.limit)

    def load_k(self, layer: int, slots: np.ndarray) -> np.ndarray:
        """The stored K rows of `slots` as f32[m, n_kv, head_dim] (still rotated and mapped)."""
        k = self.backend.load_kv(self.k[layer], self.kinds_k[layer].quant.ggml_type, self.head_dim_k, slots)
        return np.ascontiguousarray(k.transpose(1, 0, 2))

    def commit(self, res: Reservation) -> None:
        """Make the reserved slots part of the cache once every layer has written them."""
        self.n_tokens += res.positions.size
        if self.tallies is not None and self.tally_layer is not None:
            self.tallies.count(self.pos[self.tally_layer], res.slots[self.tally_layer])

    def rollback(self, res: Reservation) -> None:
        """Forget reserved slots after a failed or interrupted evaluation. A windowed ring
        may have lost its oldest slots to them: positions no later query can see."""
        for pos, slots in zip(self.pos, res.slots):
            pos[slots] = -1
        self.cur[:] = res.cur

    def truncate(self, n_tokens: int) -> None:
        """Keep only positions below n_tokens (prefix reuse); see `reusable_prefix`."""
        assert 0 <= n_tokens <= self.n_tokens
        for pos in self.pos:
            pos[pos >= n_tokens] = -1
        self.n_tokens = n_tokens
        if n_tokens == 0:  # an empty cache starts over, exactly like a new one
            self.used[:] = 0
            self.cur[:] = 0

    def reusable_prefix(self, n: int) -> int:
        """n if the first n positions can be kept and evaluation continue from there, else 0:
        a windowed ring that has dropped positions needs [n - window, n) still in its slots
        (otherwise those layers would attend to keys that no longer exist)."""
        n = min(n, self.n_tokens)
        for layer, pos in enumerate(self.pos):
            window = self.windows[layer]
            live = pos[pos >= self.n_keep]
            if window and live.size and n > 0:
                dropped_below = int(live.min())  # positions n_keep .. dropped_below-1 are gone
                if dropped_below > self.n_keep and n - window < dropped_below:
                    return 0
        return n

    def clear(self) -> None:
        self.truncate(0)

    def evict(self, positions: np.ndarray, shift_keys) -> None:
        """Drop `positions` (sorted, distinct, < n_tokens) from every layer and renumber the
        others so positions stay contiguous: each moves down by the number of dropped ones
        below it, its K re-rotated by RoPE by that amount (positions live in K).
        shift_keys(layer, k: f32[m, n_kv, head_dim], delta: i32[m]) rotates keys in place."""
        drop = np.asarray(positions, np.int64)
        assert drop.size and drop[0] >= 0 and drop[-1] < self.n_tokens and (np.diff(drop) > 0).all()
        for layer, pos in enumerate(self.pos):
            pos[np.isin(pos, drop)] = -1
            moved = np.flatnonzero(pos > drop[0])
            delta = -np.searchsorted(drop, pos[moved]).astype(np.int32)  # dropped positions below each
            pos[moved] += delta
            if moved.size:
                self._shift_rows(layer, moved, delta, shift_keys)
        self.n_tokens -= drop.size

    def attention_by_position(self) -> tuple[np.ndarray, np.ndarray]:
        """The `keep` tallies by position (AttentionTallies.by_position); zeros without them."""
        if self.tallies is None or self.tally_layer is None:
            n_layers, n_kv = len(self.k), self.k[0].shape[0]
            return np.zeros((n_layers, n_kv, self.n_tokens), np.float32), np.zeros(self.n_tokens, np.float32)
        return self.tallies.by_position(self.pos[self.tally_layer], self.n_tokens)

    def set_attention_by_position(self, mass: np.ndarray | None, seen: np.ndarray | None) -> None:
        """The inverse of `attention_by_position` (a restored or grown cache's; None: zeros)."""
        if self.tallies is not None and self.tally_layer is not None:
            self.tallies.set_by_position(self.pos[self.tally_layer], mass, seen)

    def _shift_rows(self, layer: int, slots: np.ndarray, delta: np.ndarray, shift_keys) -> None:
        key_map = self.key_map if self.kinds_k[layer].calibrated else None
        if key_map is None and self.backend.shift_ring(self.layer_view(layer), slots, delta, shift_keys):
            return  # re-rotated where the rows lie (the CUDA backend)
        self.backend.rings_to_host(self)
        k = self.load_k(layer, slots)  # [m, n_kv, hd]
        rot = self.rot_k[layer]
        rotate(k, rot)  # a quantized K is stored Hadamard-rotated: undo (H @ H = I)
        if key_map is not None:
            key_map.unkeys(layer, k)
        shift_keys(layer, k, delta)
        if key_map is not None:
            key_map.keys(layer, k)
        rotate(k, rot)
        self.write_k(layer, slots, k)
        self.backend.rings_from_host(self)
        if key_map is not None:
            keep_sinks(self.sink_k[layer], self.pos[layer][slots], k)

    # -- a restored snapshot (session.py; growth into a larger cache: kv/growth.py) -----------

    def load(self, k: Sequence[np.ndarray], v: Sequence[np.ndarray], pos: Sequence[np.ndarray],
             ring: np.ndarray, n_tokens: int, key_map: KeyMap | None = None, sink_k: np.ndarray | None = None) -> None:
        """Take over arrays of the same geometry (a SessionState's copies): K/V rows, slot
        positions, ring = i64[2, n_layers] (slots ever used, write pointers), n_tokens; for a
        calibrated K type also the key map its rows were stored through and the sink rows."""
        adopt = self.backend.adopt_ring
        self.k, self.v, self.pos = [adopt(a) for a in k], [adopt(a) for a in v], [adopt(a) for a in pos]
        self._addresses = None
        if self.calibrated:
            self.key_map, self.sink_k = key_map, None if sink_k is None else adopt(sink_k)
            self._codecs = self._make_codecs()
        self.used[:], self.cur[:] = ring[0], ring[1]
        self.n_tokens = n_tokens
        self.backend.rings_from_host(self)


def _uniform(kinds, spec: str):
    if any(kind.name != kinds[0].name for kind in kinds):
        raise EdgeKVError(f"the cache type {spec!r} differs between layers: read kinds_k / kinds_v[layer]")
    return kinds[0]
