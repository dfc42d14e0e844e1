"""The CUDA backend: a forward pass's arithmetic on an NVIDIA GPU (Jetson Orin, desktop GPUs).

What lives here: `CUDABackend`, which runs each operation of backends/base.py as a launch
of a native/ kernel (edgekv/cuda/: compiled by NVRTC at first use, launched through the
driver API), and `DeviceScratch`, a session's activations in device memory (the same names
as backends/contract.py Scratch, as `DeviceArray`s, so the architectures' graphs run unchanged).
What does not: the kernels (native/), the launch shapes (cuda_launch.py), attention over
the ring (cuda_attention.py), a step's inputs (cuda_inputs.py), CUDA graphs (cuda_graphs.py).

Where things live. Weights: `Device.weights` (mapped where they lie on an integrated GPU,
Jetson's, so RAM holds one copy; uploaded once to a discrete GPU). Activations: device
memory. The K/V rings and slot positions: page-aligned host arrays the cache allocates
through `ring_array`, registered and mapped on Jetson, so the cache's host bookkeeping
(reservations, shifts, state files, snapshots) reads and writes the same bytes the kernels
do; a discrete GPU keeps device copies (cuda_attention.py). A step's inputs (token ids,
positions, slots, RoPE tables) are written by the host into mapped memory the kernels read
(cuda_inputs.py). A device that cannot register host memory (HOST_REGISTER_SUPPORTED, asked
when the backend is made) gets them by copies instead, and runs decode without graphs; one
without read-only registration gets its weights copied. The logits come out in one copy, which also ends
the step: every forward pass ends with `project` into the host's logits (0 rows: a
synchronize), so the host never touches a ring or an input the GPU is still reading.
Decode steps are captured as CUDA graphs and replayed (cuda_graphs.py).

Operations on host arrays (a cache shift's keys, state files' rows) run on the CPU backend.
"""

from __future__ import annotations

import sys
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
from gguf import GGMLQuantizationType as T

from ..cuda.arrays import DeviceArray, is_page_aligned, page_aligned
from ..cuda.runtime import Buffer, Device
from ..errors import EdgeKVError, GpuCannotRun
from ..gguf.quants import row_nbytes
from . import cuda_launch as shape
from .base import Backend, DeviceMemory
from .contract import LayerView
from .cpu import CPUBackend
from .cuda_attention import RingAttention
from .cuda_graphs import DecodeGraphs
from .cuda_inputs import HostInputs, Recording, Step

# the weight types with a matvec kernel (native/matvec.cu), by ggml type
MATVEC = {T.Q4_0: "q4_0", T.Q4_1: "q4_1", T.Q5_0: "q5_0", T.Q5_1: "q5_1", T.Q8_0: "q8_0", T.Q2_K: "q2_K",
          T.Q3_K: "q3_K", T.Q4_K: "q4_K", T.Q5_K: "q5_K", T.Q6_K: "q6_K", T.IQ4_NL: "iq4_nl", T.IQ4_XS: "iq4_xs",
          T.F32: "f32", T.F16: "f16", T.BF16: "bf16"}
FLOAT_TYPES = (T.F32, T.F16, T.BF16)  # multiplied by float activations; the others by Q8_1
Q8_1_BYTES = 36  # ek_block_q8_1: f16 d, f16 s, 32 int8


@dataclass
class DeviceMatrix:
    """A [n_rows, n_cols] weight in its GGUF type on the device."""

    buf: Buffer
    ggml_type: int
    n_rows: int
    n_cols: int
    row_bytes: int

    @property
    def kernel(self) -> str:
        return f"ek_matvec_{MATVEC[self.ggml_type]}"

    @property
    def quantized(self) -> bool:
        return self.ggml_type not in FLOAT_TYPES


class DeviceScratch:
    """Every buffer a forward pass writes (contract.Scratch's names), in device memory."""

    def __init__(self, hp, n_batch: int, device: Device):
        q_dim, kv_dim = hp.n_heads * hp.head_dim, hp.n_kv_heads * hp.head_dim
        sizes = {"x": hp.dim, "h": hp.dim, "o": hp.dim, "q": q_dim, "k": kv_dim, "v": hp.n_kv_heads * hp.head_dim_v,
                 "att": hp.n_heads * hp.head_dim_v, "gate": hp.ff, "up": hp.ff}
        for name, cols in sizes.items():
            setattr(self, name, device.array((n_batch, cols), owner=self))  # given back with the session
        half = hp.rope_dims // 2  # the RoPE tables: made by the host each step, in mapped memory
        self.cos = {kind: device.mapped_array((n_batch, half)) for kind in ("global", "local")}
        self.sin = {kind: device.mapped_array((n_batch, half)) for kind in ("global", "local")}
        self.n_batch = n_batch


class CUDABackend(Backend):
    name = "cuda"
    n_workers = 1  # the host threads its work needs (none beyond the caller's)
    # a chunk's tokens are a grid's y or z dimension (cuda_launch.py: get_rows, rope, attention)
    max_batch = shape.MAX_GRID_YZ

    def check_model(self, hp) -> None:
        """Heads wider than the attention and shift kernels' registers (EK_MAX_HEAD_DIM) are
        refused here, not read short on the GPU."""
        widest = max(hp.head_dim, hp.head_dim_v)
        if widest > shape.MAX_HEAD_DIM:
            raise GpuCannotRun(f"this model's head size is {widest}, more than the {shape.MAX_HEAD_DIM} the CUDA "
                               "attention kernels hold per thread; run it with --backend cpu")

    def __init__(self, device: Device | None = None):
        self.device = device or Device()
        self.device.load_kernels()  # a compile error here, not mid-step (auto then takes the CPU)
        self.host = CPUBackend("cpu", use_int8dot=True)  # for operations on host arrays
        self._staging: dict[str, Buffer] = {}  # growing device buffers for a step's temporaries
        self._vectors: dict[tuple[int, int, int], tuple[weakref.ref, Buffer]] = {}  # vector(): -> (owner, copy)
        self._retired: list[Buffer] = []  # staging buffers replaced while a capture ran
        self.inputs = HostInputs(self.device)  # an eager step's inputs (a captured step has its own)
        self._eager_inputs = self.inputs
        self.recording: Recording | None = None  # while a decode step is being captured
        self.rings = RingAttention(self)
        self.graphs = DecodeGraphs(self)
        info = self.device.info
        if not info.maps_host_memory:  # everything still runs: inputs and the cache's arrays are copied
            reason = "cannot map host memory" if info.host_register else "cannot register host memory"
            print(f"edgekv: {info.name} {reason}: each step's inputs are copied to it and decode runs without "
                  "CUDA graphs", file=sys.stderr)

    # -- a step ---------------------------------------------------------------------------------

    def run(self, model, tokens, cache, res, scratch, rows, logits) -> None:
        try:
            self.graphs.run(model, tokens, cache, res, scratch, rows, logits)
        except BaseException:
            self.synchronize()  # before the session rolls its cache back: the GPU may still be writing it
            raise

    def eager(self, model, step: Step, scratch) -> None:
        model.forward(step.tokens, step.cache, step.res, scratch, step.rows, step.logits)

    def begin_recording(self, recording: Recording, inputs: HostInputs) -> None:
        self.recording, self._eager_inputs, self.inputs = recording, self.inputs, inputs

    def end_recording(self) -> None:
        self.recording, self.inputs = None, self._eager_inputs

    def synchronize(self) -> None:
        """Wait for the stream; the eager inputs may then be written over."""
        self.device.synchronize()
        self.inputs.reset()

    def input(self, values: np.ndarray, source: Callable[[Step], np.ndarray] | None) -> int:
        """values (a step's input) where the kernels read them; the device address. Under
        capture, source(step) gives the next step's values (None: they cannot be known)."""
        address, view = self.inputs.put(values)
        if self.recording is not None:
            if source is None:
                self.recording.broken = "an input that is not the step's"
            else:
                self.recording.writers.append(lambda step: view.__setitem__(..., source(step)))
        return address

    def source(self, value, of_step: Callable[[Step], Any]):
        """of_step, when value is what of_step finds in the step being captured (else None)."""
        rec = self.recording
        return of_step if rec is not None and of_step(rec.step) is value else None

    def on_host(self) -> CPUBackend:
        """The CPU backend, for an operation on host arrays (a shift's keys, gemma's softcap on
        the logits): a capture cannot replay it, so a step that does one is not captured."""
        if self.recording is not None:
            self.recording.broken = "an operation on host arrays"
        return self.host

    # -- device memory ----------------------------------------------------------------------

    def staging(self, name: str, nbytes: int) -> Buffer:
        """A device buffer of at least nbytes kept for `name` (grown when a step needs more;
        the graphs pointing at the old one are dropped, a capture under way is refused)."""
        buf = self._staging.get(name)
        if buf is None or buf.nbytes < nbytes:
            if buf is not None and self.recording is not None:
                self.recording.broken = f"staging buffer {name!r} grew"
                self._retired.append(buf)  # freed once the capture is over
            elif buf is not None:
                self.graphs.clear()
                self.device.free(buf)
                for old in self._retired:
                    self.device.free(old)
                self._retired.clear()
            buf = self._staging[name] = self.device.alloc(max(nbytes, 256), what="a staging buffer")
        return buf

    def vector(self, v: np.ndarray, owner: np.ndarray | None = None) -> Buffer:
        """A read-only f32 array (norm weight, bias, a key map's row) on the device, copied once
        and given back when `owner` goes: v itself by default (a model's vectors go with their
        model); a view handed out anew each step (cache.layer_view's key-map rows) names the
        array it views, which must not be written in place. Keyed by owner and memory."""
        owner = v if owner is None else owner
        key = (id(owner), v.ctypes.data, v.nbytes)
        hit = self._vectors.get(key)
        if hit is None or hit[0]() is not owner:
            buf = self.device.upload(np.ascontiguousarray(v, np.float32), owner=owner, what="the model's vectors")
            hit = self._vectors[key] = (weakref.ref(owner), buf)
            weakref.finalize(owner, self._vectors.pop, key, None)
        return hit[1]

    def launch(self, kernel: str, launch: shape.Launch, *args) -> None:
        self.device.launch(kernel, launch.grid, launch.block, *args)

    def ring_array(self, shape_: tuple[int, ...], dtype, fill=0) -> np.ndarray:
        """A K/V ring or slot-position array: page-aligned host memory the GPU maps (a
        discrete GPU keeps the K/V rows in device memory: cuda_attention.py)."""
        return page_aligned(shape_, dtype, fill)

    def adopt_ring(self, a: np.ndarray) -> np.ndarray:
        """An array a cache takes over (a state file's rows), as ring_array would have made it."""
        if is_page_aligned(a) and a.flags.c_contiguous:
            return a
        out = page_aligned(a.shape, a.dtype)
        out[...] = a
        return out

    def kv_memory_limit(self, weights_to_come: int = 0) -> int | None:
        """A discrete GPU: half its free memory once the weights are on it (as the host budget
        takes half the host's), since each K/V ring has a device copy; Jetson's rings are the
        host's memory."""
        if self.rings.mapped:
            return None
        return max(0, self.device.driver.memory_info()[0] - weights_to_come) // 2

    def device_memory(self) -> DeviceMemory:
        free, total = self.device.driver.memory_info()
        return DeviceMemory(self.device.info.name, self.device.info.integrated, free, total)

    def rings_to_host(self, cache) -> None:
        self.rings.to_host(cache.k + cache.v)

    def rings_from_host(self, cache) -> None:
        self.graphs.forget_cache(cache)  # its graphs may point at arrays the cache no longer holds
        self.rings.to_device(cache.k + cache.v)

    def scratch(self, hp, n_batch: int) -> DeviceScratch:
        return DeviceScratch(hp, n_batch, self.device)

    # -- weights ----------------------------------------------------------------------------

    def weight(self, raw: np.ndarray, ggml_type: int, n_rows: int, n_cols: int,
               release: Callable[[np.ndarray], None] | None = None, store=None) -> DeviceMatrix:
        if ggml_type not in MATVEC:
            raise EdgeKVError(f"the CUDA backend has no kernel for {T(int(ggml_type)).name} weights yet; "
                              f"use --backend cpu")
        buf = self.device.weights(raw, what=f"the model's weights ({T(int(ggml_type)).name} {n_rows}x{n_cols})")
        if not buf.mapped and release is not None:
            release(raw)  # uploaded: the file's pages are not needed in RAM any more
        matrix = DeviceMatrix(buf, ggml_type, n_rows, n_cols, row_nbytes(ggml_type, n_cols))
        if not buf.mapped:
            self.device.free_with(matrix, buf)  # given back when the model goes
        return matrix

    def embed(self, w: DeviceMatrix, ids: np.ndarray, out) -> None:
        if not isinstance(out, DeviceArray):
            raise EdgeKVError("the CUDA backend embeds into device arrays only (its DeviceScratch)")
        n = ids.shape[0]
        dev_ids = self.input(ids.astype(np.int32), self.source(ids, lambda st: st.tokens))
        self.launch("ek_get_rows", shape.get_rows(n, w.n_cols), w.buf, int(w.ggml_type), w.row_bytes, dev_ids, out,
                    w.n_cols)

    def project(self, w: DeviceMatrix, x, out) -> None:
        self.project_many([w], x, [out])

    def project_many(self, ws: Sequence[DeviceMatrix], x, outs: Sequence[Any]) -> None:
        n = x.shape[0]
        if n == 0:  # no rows (a chunk whose logits nobody asked for): the step still ends here
            if self.recording is None:
                self.synchronize()
            return
        q8 = None
        if any(w.quantized for w in ws):  # the activations quantized to Q8_1 once for all of them
            q8 = self.staging("q8_1", n * (x.shape[1] // 32) * Q8_1_BYTES)
            blocks = n * x.shape[1] // 32
            self.launch("ek_quantize_q8_1", shape.quantize_q8_1(blocks), x, q8, blocks)
        for w, out in zip(ws, outs):
            host = out if isinstance(out, np.ndarray) else None
            dst = self.staging("out", out.nbytes).ptr if host is not None else out.ptr
            args = (w.buf, q8 if w.quantized else x, dst, w.n_rows, w.n_cols, w.row_bytes)
            if n == 1:  # a decode step
                self.launch(w.kernel, shape.matvec(w.n_rows, 1), *args)
            else:  # each weight sub-block unpacked once for MATMUL_TOKENS tokens
                self.launch(w.kernel.replace("matvec", "matmul"), shape.matmul(w.n_rows, n), *args, n)
            if host is None:
                continue
            if self.recording is not None:  # captured: the copy out follows each replay
                if host is not self.recording.step.logits:
                    self.recording.broken = "logits into another array"
                self.recording.outputs.append((dst, host.nbytes))
                continue
            self.device.driver.to_host(host, dst, host.nbytes, self.device.stream)  # the step's one copy out
            self.synchronize()

    def take_rows(self, x, rows: np.ndarray):
        if not isinstance(x, DeviceArray):
            return x[rows]
        dim = x.shape[1]
        out = DeviceArray(self.staging("rows", max(len(rows), 1) * dim * 4).ptr, (len(rows), dim))
        if len(rows):
            ids = self.input(np.asarray(rows, np.int32), self.source(rows, lambda st: st.rows))
            self.launch("ek_get_rows", shape.get_rows(len(rows), dim), x, int(T.F32), dim * 4, ids, out, dim)
        return out

    # -- element-wise and per-row -----------------------------------------------------------

    def rms_norm(self, x, weight, eps, out) -> None:
        if not isinstance(x, DeviceArray):
            return self.on_host().rms_norm(x, weight, eps, out)
        if x.shape[0]:
            self.launch("ek_rms_norm", shape.rows(x.shape[0], x.shape[1]), x, self.vector(weight), out, x.shape[1],
                        float(eps))

    def rms_norm_heads(self, x, weight, eps) -> None:
        if not isinstance(x, DeviceArray):
            return self.on_host().rms_norm_heads(x, weight, eps)
        n, heads, hd = x.shape
        self.launch("ek_rms_norm_heads", shape.rows(n * heads, hd), x, self.vector(weight), hd, float(eps))

    def rope_tables(self, positions, n_rot, theta, scaling, freq_factors, cos, sin) -> None:
        if not isinstance(cos, DeviceArray):
            return self.host.rope_tables(positions, n_rot, theta, scaling, freq_factors, cos, sin)
        host_cos, host_sin = cos.host, sin.host  # the scratch's mapped tables

        def write(pos) -> None:
            self.host.rope_tables(pos, n_rot, theta, scaling, freq_factors, host_cos, host_sin)

        write(positions)
        self.device.push(cos.ptr, host_cos)
        self.device.push(sin.ptr, host_sin)
        if self.recording is not None:
            if self.source(positions, lambda st: st.res.positions) is None:
                self.recording.broken = "RoPE tables of other positions"
            self.recording.writers.append(lambda step: write(step.res.positions))

    def rope(self, x, cos, sin, mode) -> None:
        if not isinstance(x, DeviceArray):
            return self.on_host().rope(x, cos, sin, mode)
        n, heads, hd = x.shape
        self.launch("ek_rope", shape.rope(cos.shape[1], heads, n), x, cos, sin, heads, hd, cos.shape[1], int(mode))

    def silu_mul(self, gate, up) -> None:
        self._elementwise("ek_silu_mul", gate, up)

    def gelu_mul(self, gate, up) -> None:
        self._elementwise("ek_gelu_mul", gate, up)

    def add(self, x, y) -> None:
        self._elementwise("ek_add", x, y)

    def _elementwise(self, kernel: str, x, y) -> None:
        if not isinstance(x, DeviceArray):
            return getattr(self.on_host(), kernel[3:])(x, y)
        self.launch(kernel, shape.elementwise(x.size), x, y, x.size)

    def add_rms_norm(self, x, y, weight, eps, out) -> None:
        if not isinstance(x, DeviceArray):
            return self.on_host().add_rms_norm(x, y, weight, eps, out)
        if x.shape[0]:
            self.launch("ek_add_rms_norm", shape.rows(x.shape[0], x.shape[1]), x, y, self.vector(weight), out,
                        x.shape[1], float(eps))

    def add_bias(self, x, b) -> None:
        if not isinstance(x, DeviceArray):
            return self.on_host().add_bias(x, b)
        self.launch("ek_add_bias", shape.elementwise(x.size), x, self.vector(b), x.shape[-1], x.size)

    def scale(self, x, s) -> None:
        if not isinstance(x, DeviceArray):
            return self.on_host().scale(x, s)
        self.launch("ek_scale", shape.elementwise(x.size), x, float(s), x.size)

    def softcap(self, x, cap) -> None:
        if not isinstance(x, DeviceArray):
            return self.on_host().softcap(x, cap)
        self.launch("ek_softcap", shape.elementwise(x.size), x, float(cap), x.size)

    # -- the KV cache -------------------------------------------------------------------------

    def store_kv(self, dst, ggml_type, slots, src, limit) -> None:
        self.synchronize()  # the rings are the GPU's too: it must be done with them
        self.host.store_kv(dst, ggml_type, slots, src, limit)

    def load_kv(self, rows, ggml_type, hd, slots) -> np.ndarray:
        self.synchronize()
        return self.host.load_kv(rows, ggml_type, hd, slots)

    def shift_ring(self, layer: LayerView, slots, delta, shift) -> bool:
        self.synchronize()  # the step before must be done with the ring
        return self.rings.shift(layer, slots, delta, shift)

    def attend(self, layer: LayerView, slots, positions, q, k, v, out, scale, scratch: Any) -> None:
        if not isinstance(q, DeviceArray):
            return self.on_host().attend(layer, slots, positions, q, k, v, out, scale, scratch)
        self.rings.attend(layer, slots, positions, q, k, v, out, scale)

    def describe(self) -> dict[str, str]:
        info = self.device.info
        return {"backend": self.name,
                "cuda device": f"{info.name}, sm_{info.arch}, {'integrated: weights mapped' if info.integrated else 'discrete: weights uploaded'}"}
