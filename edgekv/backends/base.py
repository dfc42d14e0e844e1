"""The backend interface: every operation a forward pass needs, with its shapes.

What lives here: `Backend`, the abstract class the architectures and the KV cache call
(models/*.py never import a kernel), and `DeviceMemory`. What does not: the records a
backend is handed (`LayerView`, `Scratch`, ...: backends/contract.py), any arithmetic
(backends/cpu.py, cuda.py), which kernel serves which weight type (backends/kernel_map.py),
the cache's bookkeeping (kv/cache.py). A backend imports neither kv/ nor models/: what it
needs of a cache or a model comes in those records or as duck-typed arguments.

Conventions: activations are float32 NumPy arrays [n_tok, ...] owned by the caller
(the session's contract.Scratch); operations write into `out` or in place and allocate nothing
per token. A weight is whatever `weight()` returned (`QuantMatrix` on the CPU); the
model keeps it and hands it back. A chunk of n_tok tokens is always one call.
"""

from __future__ import annotations

import contextlib
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from ..kernels.ops import ROPE_NEOX, ROPE_NORM  # noqa: F401  (the two modes `rope` takes)
from .contract import LayerView, Scratch


@dataclass(frozen=True)
class DeviceMemory:
    """A backend's device and its memory (bytes), as `edgekv mem` reports it."""

    name: str
    integrated: bool  # shares the host's memory (Jetson): what is mapped is counted once, as the host's
    free: int
    total: int


class Backend(ABC):
    """Where a model's arithmetic runs. `name` is what EDGEKV_BACKEND / backend= select."""

    name: str
    n_workers: int  # threads its kernels may run on: the per-thread scratch rows a session makes
    max_batch: int | None = None  # the most tokens one call may carry (None: no limit of its own)
    # under independent_rows a chunk of one sequence comes out as its decode steps, bit for bit,
    # and a `keep` cache's per-query tallies go to a staging array (kv/drafts.py): the CPU backends
    exact_verify = False
    _mode = threading.local()  # per thread: whether the rows of a call are independent sequences

    # -- a batch of sequences -----------------------------------------------------------------

    @contextlib.contextmanager
    def independent_rows(self) -> Iterator[None]:
        """Within the block (on this thread), the rows of a call are the single tokens of
        separate sequences decoded together (kv/batch.py): each row must come out as a one-token
        pass computes it, bit for bit, so that a batched stream equals its solo run."""
        before = getattr(self._mode, "independent", False)
        self._mode.independent = True
        try:
            yield
        finally:
            self._mode.independent = before

    @property
    def rows_independent(self) -> bool:
        return getattr(self._mode, "independent", False)

    # -- a forward pass ----------------------------------------------------------------------

    def check_model(self, hp) -> None:
        """Raise errors.GpuCannotRun (or UnsupportedModelError) where this backend's kernels
        cannot run a model of these hyperparameters (models/base.py HParams), before any
        weight is read. Every model the architectures read runs here."""

    def run(self, model, tokens: np.ndarray, cache, res, scratch, rows: np.ndarray, logits: np.ndarray) -> None:
        """model.forward(tokens, cache, res, scratch, rows, logits): how a session runs a chunk
        (a backend may replay a captured decode step instead: backends/cuda_graphs.py)."""
        model.forward(tokens, cache, res, scratch, rows, logits)

    # -- memory ------------------------------------------------------------------------------

    def scratch(self, hp, n_batch: int):
        """The buffers a session's forward passes write (contract.Scratch), for n_batch tokens."""
        return Scratch(hp, n_batch, self.n_workers)

    def ring_array(self, shape: tuple[int, ...], dtype, fill=0) -> np.ndarray:
        """A host array of the KV cache (rings, slot positions): where the backend can read it."""
        return np.full(shape, fill, dtype)

    def adopt_ring(self, a: np.ndarray) -> np.ndarray:
        """An array a cache takes over (a state's copy), as ring_array would have placed it."""
        return a

    def kv_memory_limit(self, weights_to_come: int = 0) -> int | None:
        """Bytes a new KV cache may take beyond what host memory allows (the default budget
        of an n_ctx="auto" context), where the backend keeps the rings in memory of its own:
        None here, where the host arrays are the rings. weights_to_come: bytes of weights
        not yet loaded that will take the same memory (`edgekv mem` plans before loading)."""
        return None

    def device_memory(self) -> DeviceMemory | None:
        """The memory of the device the backend computes on, where that is not the host's
        alone (a GPU); None for the CPU backends."""
        return None

    def rings_to_host(self, cache) -> None:
        """Before the host reads a cache's K/V rows (a snapshot, a copy into a larger cache, a
        host-side key shift): bring its host arrays up to date. Nothing to do where they are
        what the kernels read (the CPU; the CUDA backend on an integrated GPU)."""

    def rings_from_host(self, cache) -> None:
        """After the host wrote a cache's K/V rows or gave it new arrays (a restore, a copy, a
        host-side key shift): make what the kernels read the same, and drop what was derived
        from the old arrays."""

    def take_rows(self, x: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """The rows `rows` of x f32[n, dim], as a new array the caller may overwrite."""
        return x[rows]

    # -- weights ----------------------------------------------------------------------------

    @abstractmethod
    def weight(self, raw: np.ndarray, ggml_type: int, n_rows: int, n_cols: int,
               release: Callable[[np.ndarray], None] | None = None, store: Any = None) -> Any:
        """A [n_rows, n_cols] weight from its GGUF bytes raw: u8[n_rows * row_bytes] in
        ggml_type (any of quants.QUANT_TYPES); release(raw) may drop file pages once copied;
        store: where a CPU layout made by an earlier load may be found (backends/pack_store.py)."""

    @abstractmethod
    def embed(self, w: Any, ids: np.ndarray, out: np.ndarray) -> None:
        """out: f32[n, n_cols] = rows ids: i32[n] of w, dequantized (embedding lookup)."""

    @abstractmethod
    def project(self, w: Any, x: np.ndarray, out: np.ndarray) -> None:
        """out: f32[n_tok, n_rows] = x: f32[n_tok, n_cols] @ W^T."""

    def tied_output(self, w: Any) -> None:
        """Told at load time that the token embedding w is also the output projection (no
        `output.weight`). llama.cpp then keeps it in file layout (embedding lookups read it),
        which for some types (IQ4_NL, Q2_K) is another summation order. Nothing by default."""

    def named(self, w: Any, name: str) -> None:
        """Told at load time each weight's GGUF tensor name (the pieces of a fused tensor share
        it). The CPU backend keeps them for an activation observer (`edgekv imatrix`).
        Nothing by default."""

    def share_input(self, ws: Sequence[Any]) -> None:
        """Told at load time that the weights ws multiply the same input (q/k/v, gate/up)
        in `project_many`: a backend may store them together. Nothing by default."""

    def project_many(self, ws: Sequence[Any], x: np.ndarray, outs: Sequence[np.ndarray]) -> None:
        """outs[i] = x @ ws[i]^T for weights that share their input (q/k/v, gate/up)."""
        for w, out in zip(ws, outs):
            self.project(w, x, out)

    # -- element-wise and per-row -----------------------------------------------------------

    @abstractmethod
    def rms_norm(self, x: np.ndarray, weight: np.ndarray, eps: float, out: np.ndarray) -> None:
        """out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * weight; x, out: f32[n, dim] (may alias)."""

    @abstractmethod
    def rms_norm_heads(self, x: np.ndarray, weight: np.ndarray, eps: float) -> None:
        """RMS norm of every head in place: x f32[n, n_heads, head_dim], weight f32[head_dim]."""

    @abstractmethod
    def rope_tables(self, positions: np.ndarray, n_rot: int, theta: float, scaling: Any,
                    freq_factors: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> None:
        """cos, sin: f32[n, n_rot / 2] for positions i32[n] (base theta, the model's RoPE
        scaling (models/rope.py RopeScaling), per-dimension divisors freq_factors f32[n_rot / 2])."""

    @abstractmethod
    def rope(self, x: np.ndarray, cos: np.ndarray, sin: np.ndarray, mode: int) -> None:
        """Rotate x f32[n, n_heads, head_dim] in place (mode: ops.ROPE_NORM pairs, ROPE_NEOX halves)."""

    @abstractmethod
    def silu_mul(self, gate: np.ndarray, up: np.ndarray) -> None:
        """gate = silu(gate) * up, f32[n, ff], in place."""

    @abstractmethod
    def gelu_mul(self, gate: np.ndarray, up: np.ndarray) -> None:
        """gate = gelu_tanh(gate) * up, f32[n, ff], in place (ggml's f16 table)."""

    @abstractmethod
    def add(self, x: np.ndarray, y: np.ndarray) -> None:
        """x += y, f32[n, dim]."""

    def add_rms_norm(self, x: np.ndarray, y: np.ndarray, weight: np.ndarray, eps: float, out: np.ndarray) -> None:
        """x += y, then out = rms_norm(x) (a residual add and the next norm: one step
        where the backend fuses them, as decode pays per step)."""
        self.add(x, y)
        self.rms_norm(x, weight, eps, out)

    def rope_qk(self, q: np.ndarray, k: np.ndarray, cos: np.ndarray, sin: np.ndarray, mode: int) -> None:
        """rope() on a chunk's queries and keys (one step where the backend fuses them)."""
        self.rope(q, cos, sin, mode)
        self.rope(k, cos, sin, mode)

    @abstractmethod
    def add_bias(self, x: np.ndarray, b: np.ndarray) -> None:
        """x[t] += b for every row t: x f32[n, d], b f32[d] (a projection's bias)."""

    @abstractmethod
    def scale(self, x: np.ndarray, s: float) -> None:
        """x *= s in place."""

    @abstractmethod
    def softcap(self, x: np.ndarray, cap: float) -> None:
        """x = cap * tanh(x / cap) in place."""

    # -- the KV cache -------------------------------------------------------------------------

    @abstractmethod
    def store_kv(self, dst: np.ndarray, ggml_type: int, slots: np.ndarray, src: np.ndarray, limit: float) -> None:
        """Quantize on write: src f32[n, n_kv, hd] -> dst[h, slots[t]] rows of ggml_type
        (u8[n_kv, cap, row_bytes]), values clamped to [-limit, limit] first."""

    @abstractmethod
    def load_kv(self, rows: np.ndarray, ggml_type: int, hd: int, slots: slice | np.ndarray) -> np.ndarray:
        """The slots `slots` (a slice or indices) of a layer's K or V rows u8[n_kv, cap,
        row_bytes] of ggml_type, dequantized: a new f32[n_kv, len(slots), hd]."""

    def shift_ring(self, layer: LayerView, slots: np.ndarray, delta: np.ndarray, shift) -> bool:
        """A context shift's keys re-rotated in the ring itself: the K rows in `slots` moved by
        delta (i32[m]) positions, shift a models.base.KeyShift (its tables and layout). False:
        not done here, the cache reads the keys out, shifts and writes them back (the default)."""
        return False

    @abstractmethod
    def attend(self, layer: LayerView, slots: np.ndarray, positions: np.ndarray, q: np.ndarray, k: np.ndarray,
               v: np.ndarray, out: np.ndarray, scale: float, scratch: Any) -> None:
        """Write a chunk's K and V into its slots, then attend over every visible slot.

        q: f32[n, n_heads, hd_k], k: f32[n, n_kv, hd_k], v: f32[n, n_kv, hd_v] (RoPE
        applied; q and k may be overwritten); slots: i64[n] this chunk's slots in the
        layer; positions: i32[n]. Slot s is visible to query t when 0 <= slot_pos[s] <=
        positions[t] and, in a windowed layer, positions[t] - slot_pos[s] < window.
        out: f32[n, n_heads, hd_v] = softmax(q . k * scale) @ v per head (GQA)."""

    def attend_sessions(self, layers: Sequence[LayerView], slots: Sequence[np.ndarray], positions: np.ndarray,
                        q: np.ndarray, k: np.ndarray, v: np.ndarray, out: np.ndarray, scale: float,
                        scratch: Any) -> None:
        """One decode step of several sessions (kv/batch.py): row i of q, k, v, out (shaped as
        in `attend`) is session i's one token at positions[i], written into slots[i] of
        its own layer layers[i] and attending to it alone. Here: `attend` row by row; a
        backend may do them in one call, with each row's bits."""
        for i in range(len(layers)):
            self.attend_row(i, layers, slots, positions, q, k, v, out, scale, scratch)

    def attend_batch(self, batch, res, layer: int, q: np.ndarray, k: np.ndarray,
                     v: np.ndarray, out: np.ndarray, scale: float, scratch: Any) -> None:
        """`attend_sessions` for layer `layer` of a batched step (kv/batch.py): batch holds the
        sessions' caches, res their reservations. Here: each cache's view of the layer; a
        backend may read batch.rings(res), the step's table of every layer's rings, instead."""
        self.attend_sessions([one.layer_view(layer) for one in batch.caches], [r.slots[layer] for r in res.parts],
                             res.positions, q, k, v, out, scale, scratch)

    def attend_row(self, i: int, layers, slots, positions, q, k, v, out, scale, scratch) -> None:
        """Row i of an attend_sessions call through `attend`, alone."""
        self.attend(layers[i], slots[i], positions[i : i + 1], q[i : i + 1], k[i : i + 1], v[i : i + 1],
                    out[i : i + 1], scale, scratch)

    def describe(self) -> dict[str, str]:
        """Facts for `edgekv info` (name -> value)."""
        return {"backend": self.name}
