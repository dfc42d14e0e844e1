"""Attention over a layer's ring on the GPU: a chunk's K/V written into its slots in the
cache's type (ek_kv_write), then every query head over the visible slots (ek_attention; for
a decode step over a long ring, ek_attention_split's ranges of slots and ek_attention_merge:
cuda_launch.attention_splits).

Where the rows lie: on an integrated GPU (Jetson) the K/V rings are the cache's own host
arrays, registered and mapped: one copy, in the memory CPU and GPU share. On a discrete GPU
(or one that cannot map host memory) each ring array has a copy in device memory (made on
its first use, given back with the array), which the kernels read and write; the host array
is brought up to date only when the host reads it (KVCache: snapshots, growth), and copied
back in when the host wrote it (restores): reading the ring over PCIe at every step would
cost the depth in bandwidth. The cache's smaller arrays the kernels use (slot positions,
the `keep` tallies, sink rows) are mapped on Jetson too; elsewhere each also has a device
copy, refreshed by one copy per step before the kernels that read it and, for those the
kernels write (tallies, sink rows), copied back after them (`host_array`, `written`): a
kernel reading them through the mapping would cross PCIe once per warp and slot. Those
copies are queued on the stream from registered (pinned) host memory, so a captured step
holds them and each replay makes them again. A wrapped ring,
a shift's re-rotated keys or a restored state need nothing else: the slot positions decide
what each query sees, as on the CPU. A quantized cache stores K and V
Hadamard-rotated (kv/key_map.py): queries and keys are rotated on the way in and the
output on the way out (ek_rotate), as CPUBackend.attend does.

The `keep` policy's tallies (heavy_hitters.AttentionTallies, page-aligned host memory, as
the slot positions): after a full-context layer's attention, each (query,
head)'s softmax {m, l} (ek_attention_stats), then each slot's weight summed over the queries
and its KV head's query heads, added by the one warp that owns the slot (ek_attention_tally).

A calibrated K type (iq4_cal): keys and queries through the layer's key map before the
rotation (ek_key_map; the map's rows copied to the device once: CUDABackend.vector), and the stored K of the
first positions also in f32 rows (cache.SINKS; host memory, as the tallies), which
attention reads instead of their quantized rows (ek_keep_sinks, the attention kernels' sink).
"""

from __future__ import annotations

import weakref

import numpy as np
from gguf import GGMLQuantizationType as T

from ..cuda.arrays import DeviceArray, viewed_array
from ..cuda.runtime import Buffer
from ..errors import EdgeKVError
from ..gguf.quants import row_nbytes
from . import cuda_launch as shape
from .contract import LayerView

QUANTIZED_BLOCK_BYTES = {8: 34, 2: 18, 3: 20, 6: 22, 7: 24, 20: 18}  # cache types stored in 32-value blocks
CACHE_TYPES = {int(T.F32), int(T.F16), int(T.BF16), *QUANTIZED_BLOCK_BYTES}  # what native/ek_kv.cuh reads and writes


class RingAttention:
    def __init__(self, backend):  # the CUDABackend (cuda.py) it serves
        self.backend = backend
        info = backend.device.info
        self.mapped = info.integrated and info.maps_host_memory  # the cache's arrays are the GPU's
        # id(host array) -> (a weak reference to it, its device address): a ring that goes is
        # unregistered (runtime.Device.host_pointer), not kept alive here
        self._pointers: dict[int, tuple[weakref.ref, int]] = {}
        # (id of the array a host array views, its address, bytes) -> (a weak reference to that
        # array, the device copy): views made anew each step (one layer's tallies) share one
        self._resident: dict[tuple[int, int, int], tuple[weakref.ref, Buffer]] = {}

    def pointer(self, a: np.ndarray) -> int:
        """The device address of a mapped host array (registered on first sight; writable: the
        driver's read-only registration is for read-only mappings such as a GGUF file's)."""
        hit = self._pointers.get(id(a))
        if hit is None or hit[0]() is not a:
            hit = self._pointers[id(a)] = (weakref.ref(a), self.backend.device.host_pointer(a, read_only=False,
                                                                                          what="the KV cache"))
        return hit[1]

    def rows(self, a: np.ndarray) -> int:
        """The device address of a K/V ring's rows: its mapped host array on an integrated
        GPU, else its copy in device memory, uploaded on first use."""
        if self.mapped:
            return self.pointer(a)
        return self._copy(a, upload=True)

    def host_array(self, a: np.ndarray) -> int:
        """The device address of a host array the kernels read (slot positions, tallies, sink
        rows): mapped, or its device copy brought up to date by a copy queued now."""
        if self.mapped:
            return self.pointer(a)
        ptr = self._copy(a, upload=False)
        if ptr:
            self.backend.device.copy_in(ptr, a)
        return ptr

    def written(self, a: np.ndarray) -> None:
        """The kernels just queued wrote host array a (through host_array): its device copy
        back into it, queued after them (a mapped array is already the host's)."""
        if not self.mapped:
            hit = self._resident.get(self._key(a))
            if hit is not None:
                self.backend.device.copy_out(a, hit[1].ptr)

    @staticmethod
    def _key(a: np.ndarray) -> tuple[int, int, int]:
        return id(viewed_array(a)), a.ctypes.data, a.nbytes

    def _copy(self, a: np.ndarray, upload: bool) -> int:
        """a's copy in device memory (made on first use, with a's bytes if `upload`; given back
        when the array it views goes)."""
        key, root = self._key(a), viewed_array(a)
        hit = self._resident.get(key)
        if hit is None or hit[0]() is not root:
            if self.backend.recording is not None:  # no allocation while a step is captured
                self.backend.recording.broken = "a host array without its device copy yet"
                return 0
            device = self.backend.device
            buf = (device.upload(a, owner=root, what="the KV cache") if upload
                   else device.alloc(a.nbytes, owner=root, what="the KV cache"))
            hit = self._resident[key] = (weakref.ref(root), buf)
            weakref.finalize(root, self._resident.pop, key, None)
        return hit[1].ptr

    def _copies(self, arrays):
        for a in arrays:
            hit = self._resident.get(self._key(a))
            if hit is not None and hit[0]() is viewed_array(a):
                yield a, hit[1]

    def to_host(self, arrays) -> None:
        """The device copies of these ring arrays (those that have one) into the host arrays."""
        for a, buf in self._copies(arrays):
            self.backend.device.download(buf, a)

    def to_device(self, arrays) -> None:
        """The host arrays into their device copies (those that have one)."""
        device = self.backend.device
        for a, buf in self._copies(arrays):
            device.driver.to_device(buf.ptr, a, a.nbytes, device.stream)
        device.synchronize()

    def slot_count(self, layer: LayerView):
        """How a replay finds the layer's slot count: its cache's `used` (what layer_view reads)."""
        rec, i = self.backend.recording, layer.index
        if rec is None or not 0 <= i < len(rec.step.cache.k) or rec.step.cache.k[i] is not layer.k:
            return None
        return lambda step: np.int32(step.cache.used[i])

    def rotate(self, x: DeviceArray, h: np.ndarray | None) -> None:
        if h is not None:
            r = h.shape[0]
            self.backend.launch("ek_rotate", shape.rotate(x.size, r), x, self.backend.vector(h), r)

    def attend(self, layer: LayerView, slots: np.ndarray, positions: np.ndarray, q: DeviceArray, k: DeviceArray,
               v: DeviceArray, out: DeviceArray, scale: float) -> None:
        ck, cv = layer.codec_k, layer.codec_v
        for t in (ck.ggml_type, cv.ggml_type):
            if t not in CACHE_TYPES:  # the kernels would read and write nothing: never silently
                raise EdgeKVError(f"cache type {T(t).name.lower()} is not on the CUDA backend: use another cache "
                                  "type, or --backend cpu")
        be = self.backend
        n, n_heads, hd_k = q.shape
        n_kv, hd_v = k.shape[1], v.shape[2]
        if ck.key_scale is not None:  # a calibrated K type: its map, before the rotation (as the CPU's)
            self.map_keys(layer, q, k)
        self.rotate(q, ck.rotation)
        self.rotate(k, ck.rotation)
        self.rotate(v, cv.rotation)
        # a replayed step's slots, positions and slot count come from its reservation and cache
        q_pos = be.input(np.asarray(positions, np.int32), be.source(positions, lambda st: st.res.positions))
        k_ring, v_ring = self.write(layer, slots, k, v)
        sink, n_sinks = 0, 0
        if ck.sink_k is not None:  # the stored K of the first positions, kept in f32 and read from there
            sink, n_sinks = self.host_array(ck.sink_k), ck.sink_k.shape[1]
            be.launch("ek_keep_sinks", shape.elementwise(k.size), k, q_pos, sink, k.size, n_kv, hd_k, n_sinks)
            self.written(ck.sink_k)
        n_slots = be.input(np.array([layer.n_slots], np.int32), self.slot_count(layer))
        cap = layer.slot_pos.shape[0]
        ring = (q, q_pos, k_ring, v_ring, self.host_array(layer.slot_pos), n_slots, int(layer.window), float(scale),
                int(ck.ggml_type), int(cv.ggml_type), n_heads, n_kv, hd_k, hd_v, cap, layer.k.shape[2],
                layer.v.shape[2], sink, n_sinks)
        n_splits, chunk = shape.attention_splits(cap, n)
        if n_splits == 1:
            be.launch("ek_attention", shape.attention(n_heads, n), *ring, out)
        else:  # at depth: a warp per range of slots, then the ranges merged
            parts = be.staging("attention_parts", n * n_heads * n_splits * (2 + hd_v) * 4)
            be.launch("ek_attention_split", shape.attention_split(n_heads, n, n_splits), *ring, chunk, parts)
            be.launch("ek_attention_merge", shape.attention(n_heads, n), parts, n_splits, n_heads, hd_v, out)
        if layer.attn_mass is not None:  # `keep`: each slot's softmax weight, added to the layer's tallies
            stats = be.staging("attention_stats", n * n_heads * 2 * 4)
            be.launch("ek_attention_stats", shape.attention(n_heads, n), *ring, stats)
            be.launch("ek_attention_tally", shape.attention_tally(cap, n_kv), *ring, stats,
                      self.host_array(layer.attn_mass), n)
            self.written(layer.attn_mass)
        self.rotate(out, cv.rotation)

    def write(self, layer: LayerView, slots: np.ndarray, k: DeviceArray, v: DeviceArray) -> tuple[int, int]:
        """A chunk's K and V rows into their slots of the ring, in its types; the rings' addresses."""
        be = self.backend
        n, n_kv, hd_k = k.shape
        i = layer.index
        dev_slots = be.input(np.asarray(slots, np.int32), be.source(slots, lambda st: st.res.slots[i]))
        k_ring, v_ring = self.rows(layer.k), self.rows(layer.v)
        cap = layer.slot_pos.shape[0]
        ck, cv = layer.codec_k, layer.codec_v
        for src, ring, host, ggml_type, hd, limit in ((k, k_ring, layer.k, ck.ggml_type, hd_k, ck.limit),
                                                      (v, v_ring, layer.v, cv.ggml_type, v.shape[2], cv.limit)):
            per_row = hd // 32 if ggml_type in QUANTIZED_BLOCK_BYTES else hd
            be.launch("ek_kv_write", shape.kv_write(n * n_kv * per_row), src, dev_slots, ring, int(ggml_type),
                      float(limit), n, n_kv, hd, cap, host.shape[2])
        return k_ring, v_ring

    def map_keys(self, layer: LayerView, q: DeviceArray, k: DeviceArray) -> None:
        """A calibrated K type's map (kv/key_map.KeyMap): keys (k - mean) * scale, queries
        q / scale, per KV head and dim."""
        ck = layer.codec_k
        mean, scale = (self.backend.vector(row, owner=viewed_array(row)) for row in (ck.key_mean, ck.key_scale))
        n_kv, hd = k.shape[1], k.shape[2]
        self.backend.launch("ek_key_map", shape.elementwise(k.size), k, mean, scale, k.size, n_kv, 1, hd, 0)
        self.backend.launch("ek_key_map", shape.elementwise(q.size), q, mean, scale, q.size, n_kv,
                            q.shape[1] // n_kv, hd, 1)

    def shift(self, layer: LayerView, slots: np.ndarray, delta: np.ndarray, shift) -> bool:
        """A context shift's K rows re-rotated in the ring by ek_kv_shift (CUDABackend.shift_ring)."""
        tables = getattr(shift, "tables", None)
        if tables is None or layer.codec_k.key_scale is not None:
            return False
        be = self.backend
        cos, sin = tables(layer.index, delta)
        m, half = cos.shape
        n_kv, cap, row_bytes = layer.k.shape
        rot, ck = layer.codec_k.rotation, layer.codec_k
        be.launch("ek_kv_shift", shape.kv_write(m * n_kv), self.rows(layer.k),
                  be.input(np.asarray(slots, np.int32), None), be.input(cos, None), be.input(sin, None),
                  0 if rot is None else be.vector(rot), 0 if rot is None else rot.shape[0], int(ck.ggml_type),
                  float(ck.limit), m, n_kv, self.head_dim(layer), cap, row_bytes, half, int(shift.mode))
        be.synchronize()  # the host may read the ring next
        return True

    @staticmethod
    def head_dim(layer: LayerView) -> int:
        """The K head size of a ring, from its row bytes in the cache type (32 values a block)."""
        return layer.k.shape[2] * 32 // row_nbytes(layer.codec_k.ggml_type, 32)
