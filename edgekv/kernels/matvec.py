"""Weight matrices of the forward pass: `QuantMatrix`.

What lives here: QuantMatrix, built once per GGUF weight at model load (repacked into
the lane layout, repack.py), with `matvec` (decode: one token), `matmul` (prefill: many
tokens) and `rows` (embedding lookup), and the per-thread scratch of shared callers. What
does not: the @njit drivers that run the per-group kernels over all row groups in
parallel (matvec_drivers.py), the per-type arithmetic (dot_q.py, dot_k.py, unpack.py),
block formats (gguf/quants.py).

How each product is computed, and why:
- matvec: like llama.cpp, x is quantized once per call to the weight's activation
  format (activations.py) and every block is an int32 dot product (dot_q.py, dot_k.py;
  on a CPU with an int8 dot instruction, AVX512-VNNI or Arm sdot, the 32-value block
  types run on dot_ir.py's kernels and the K-quants' integer sums on dot_k_ir.py's, with
  the same bits); F32/F16/BF16 weights use float dots (x rounded to f16/bf16 first, as ggml does).
  The result differs from the float64 product by the 8-bit rounding of x only.
  One call into Numba, no allocation: scratch lives on the QuantMatrix.
- matmul_exact (a short chunk): one matvec per token in llama.cpp's summation orders,
  bit-identical to it; on the int8 dot kernels all tokens in one call that reads each
  weight chunk from memory once (`matvec_rows`, also what separate sequences' decode
  steps batched together take).
- matmul_batch (a long chunk): the integer GEMM on q8 activations (dot_ir.py) where
  the weight takes the int8 dot-product kernels (AVX512-VNNI, AVX2 or Arm sdot); for the
  K-quants on those CPUs the whole-tile IR kernels (gemm_k_ir.py) in llama.cpp's batch
  orders, bit-exact; else tiles of rows dequantized to float32 (unpack.py) and
  multiplied by BLAS. Each reads the weight once, not n times.
  Dequantizing a tile costs about as much as 4-6 matvecs. Which of the two a chunk
  takes is the backend's choice (backends/kernel_map.py).
- rows: one lane unpacked per requested row, bit-identical to quants.dequantize.
"""

from __future__ import annotations

import threading

import numpy as np
from gguf import GGMLQuantizationType as T

from ..errors import UnsupportedModelError
from ..gguf.quants import quant_type, row_nbytes
from . import config
from .config import LANES, max_threads
from .dot_iq import FILE_LAYOUT, ORDER_CHUNK
from .dot_k import INT8DOT, ORDER_GEMM, ORDER_GEMV, ORDER_TILED
from .repack import repack
from .activations import quantize_acts, quantize_acts_k
from .int8dot import CHUNK, HAS_INT8DOT, K_TYPES, TYPES as INT8DOT_TYPES, gemm_chunks, k_gemm_chunks
from .float_ir import WIDTH as FLOAT_WIDTH
from .matvec_drivers import (N_ACC, N_ISUM, matvec_float_rows, matvec_int8dot, matvec_int8dot_rows, matvec_k_int8dot, matvec_lanes,
                             matvec_lanes_rows, matvec_serial, unpack_rows, unpack_tile)


TILE_BYTES = 4 << 20  # float32 tile handed to BLAS per step of matmul
# types llama.cpp's x86 (AVX-512) build repacks only when the rows are a multiple of 8 (and
# not for a tied output), summing the others in other orders. Q4_K is such a type too, but
# its file-layout orders (vec_dot_q4_K, tiled) are not followed here yet: a tied Q4_K output
# or Q4_K rows not a multiple of 8 sum as the repacked gemv does (no published file seen)
_REPACKED_BY_LLAMA = (int(T.IQ4_NL), int(T.Q2_K))


_scratch = threading.local()


def thread_scratch(name: str, n: int, dtype=np.float32) -> np.ndarray:
    """A buffer of n values named `name`, reused by every call of this thread (grown when
    needed): scratch for kernels that objects shared between threads call."""
    buf = getattr(_scratch, name, None)
    if buf is None or buf.size < n or buf.dtype != dtype:
        buf = np.empty(max(n, 1), dtype)
        setattr(_scratch, name, buf)
    return buf[:n]


def _check(name: str, a: np.ndarray, shape: tuple[int, ...]) -> None:
    if a.shape != shape or a.dtype != np.float32 or not a.flags.c_contiguous:
        raise ValueError(f"{name}: expected a C-contiguous float32 array of shape {shape}, "
                         f"got {a.dtype} {a.shape}{'' if a.flags.c_contiguous else ' (not contiguous)'}")


def quantize_chunk(x: np.ndarray, block: int = 32) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A chunk's activations x: f32[n_tok, n_cols] as q8 blocks (block 32, for
    QuantMatrix.matmul_batch(acts=...)) or q8_K blocks (block 256, the K-quant GEMM):
    (xq, xd, xsum) in this thread's scratch, valid until the next call of the same block."""
    n_tok, nb_ = x.shape[0], x.shape[1] // block
    name = "q8" if block == 32 else "q8_k"
    xq = thread_scratch(f"{name}_xq", n_tok * nb_ * block, np.int8).reshape(n_tok, nb_, block)
    xd = thread_scratch(f"{name}_xd", n_tok * nb_ * 2).reshape(n_tok, nb_, 2)
    xsum = thread_scratch(f"{name}_xsum", n_tok * nb_ * 16, np.int32).reshape(n_tok, nb_, 16)
    (quantize_acts if block == 32 else quantize_acts_k)(x, xq, xd, xsum)
    return xq, xd, xsum


class QuantMatrix:
    """A [n_rows, n_cols] weight (ggml ne0 = n_cols, the contiguous row length).

    `raw` is the tensor's exact file bytes (e.g. TensorInfo.data); they are copied into
    the lane layout, so the file mapping may be closed afterwards. Attributes: n_rows,
    n_cols, ggml_type, quant (the QuantType), nbytes (memory held). The scratch buffers
    live on the instance: one instance must not be used by two threads at once.
    """

    def __init__(self, raw: np.ndarray, ggml_type: int, n_rows: int, n_cols: int, lanes: int | None = None,
                 use_int8dot: bool = True, release=None, store=None):
        q = quant_type(ggml_type)  # UnsupportedModelError for an unknown type
        on_int8dot = HAS_INT8DOT and use_int8dot
        # llama.cpp repacks an IQ4_NL or Q2_K weight whose rows are a multiple of 8 and keeps
        # the others in file layout, where it sums in other orders (dot_iq.py, dot_k_low.py:
        # the IR kernels have only the repacked ones)
        layout = FILE_LAYOUT if q.ggml_type in _REPACKED_BY_LLAMA and int(n_rows) % 8 else 0
        int8dot = on_int8dot and q.ggml_type in INT8DOT_TYPES and not layout
        if lanes is None:  # the int8 dot kernels (K-quants' too) read CHUNK-row groups: each one contiguous stream
            lanes = CHUNK if on_int8dot and q.ggml_type in INT8DOT_TYPES + K_TYPES else LANES
        expected = int(n_rows) * row_nbytes(ggml_type, int(n_cols))
        raw = np.asarray(raw)
        if raw.dtype != np.uint8 or raw.size != expected:
            raise UnsupportedModelError(f"{q.name} weight [{n_rows} x {n_cols}] needs {expected} uint8 bytes, "
                                        f"got {raw.size} of {raw.dtype}")
        self.quant = q
        self.ggml_type = q.ggml_type
        self.n_rows, self.n_cols = int(n_rows), int(n_cols)
        # store (backends/pack_store.PackStore): the layout an earlier load of this file kept on disk
        pack = repack if store is None else store.packed
        self._p = pack(raw, q.ggml_type, self.n_rows, self.n_cols, q.type_size, lanes, release)
        self.lanes = lanes
        self.nbytes = self._p.nbytes
        self._act_kind = {"q8_0": 1, "q8_1": 1, "q8_K": 2}.get(q.act, 0)
        bs = 256 if q.act == "q8_K" else 32
        n_blocks = self.n_cols // bs if self._act_kind else 0
        self._xq = np.zeros((n_blocks, bs), np.int8)
        self._xd = np.zeros((n_blocks, 2), np.float32)
        self._xsum = np.zeros((n_blocks, 16), np.int32)
        self._xf = np.zeros(0 if self._act_kind else self.n_cols, np.float32)
        self._acc = np.zeros((max_threads(), N_ACC, lanes), np.float32)
        self._isum = np.zeros((max_threads(), N_ISUM, lanes), np.int32)
        # the int8 dot-product kernels (int8dot.py) where the CPU has them and the type is theirs
        self._int8dot = int8dot and lanes % CHUNK == 0
        # float weights: several tokens per weight load on the IR kernel (float_ir.py), each with dot_float's bits
        self._float_rows = q.ggml_type in (T.F32, T.F16, T.BF16) and lanes % FLOAT_WIDTH == 0
        # K-quants on the int8 dot instructions: CHUNK-row groups (in-model decode 2x faster
        # than 64-row groups read in strided 32-byte pieces) on the whole-tile IR kernels
        # (gemm_k_ir.py); explicit orders on dot_k.py with the integer sums on them
        # (dot_k_ir.py): the INT8DOT flag
        self._layout = layout
        k_int8dot = on_int8dot and q.ggml_type in K_TYPES and lanes % CHUNK == 0 and not layout
        self._k_flags = INT8DOT if k_int8dot else 0
        padded = (self._int8dot or k_int8dot) and self.n_rows != self._p.n_groups * lanes
        self._out_pad = np.zeros(self._p.n_groups * lanes if padded else 0, np.float32)
        self._tile_cols = max(lanes, min(self._p.n_groups * lanes, TILE_BYTES // (4 * self.n_cols) // lanes * lanes))
        self.stack = None  # its row_stack.RowStack or KStack, set by the backend's share_input

    def keep_file_order(self) -> None:
        """Sum as llama.cpp does a weight it keeps in file layout, not repacked (a tied
        output projection, which embedding lookups also read): for IQ4_NL and Q2_K vec_dot's
        orders, not the repacked gemv's (dot_iq.py, dot_k_low.py). Other types sum alike."""
        if self.ggml_type in _REPACKED_BY_LLAMA:
            self._layout = FILE_LAYOUT
            self._k_flags = 0  # the IR kernels follow the repacked orders only
            self._int8dot = False

    @property
    def sums_on_int8dot(self) -> bool:
        """Whether this K-quant weight's integer sums run on the int8 dot instructions (dot_k_ir.py)."""
        return self._k_flags != 0

    @property
    def uses_int8dot(self) -> bool:
        """Whether this weight runs on the int8 dot-product kernels (int8dot.py: AVX512-VNNI, AVX2 or sdot)."""
        return self._int8dot

    def __repr__(self) -> str:
        return f"QuantMatrix({self.quant.name}, {self.n_rows} x {self.n_cols}, {self.nbytes} bytes)"

    def matvec(self, x: np.ndarray, out: np.ndarray, order: int = ORDER_GEMV) -> None:
        """out[n_rows] = W @ x[n_cols] (one token). order: which of llama.cpp's kernels to
        follow in summing K-quant products (dot_k.py): ORDER_GEMV for one token, ORDER_GEMM
        for a token in a group of 4 of a batch, ORDER_TILED in a batch of 8 or more."""
        _check("x", x, (self.n_cols,))
        _check("out", out, (self.n_rows,))
        p = self._p
        if self._int8dot:
            matvec_int8dot(self.ggml_type, x, p.qs, p.qh, p.d, self._xq, self._xd, self._xsum, self._out_pad, out)
            return
        if self._k_flags and order == ORDER_GEMV:  # one token wholly in IR (gemm_k_ir.py)
            matvec_k_int8dot(self.ggml_type, x, p.qs, p.qh, p.sc, p.d, self._xq, self._xd, self._xsum,
                             self._out_pad, out)
            return
        run = matvec_lanes if self.n_rows * self.n_cols >= config.PARALLEL_MIN_WEIGHTS else matvec_serial
        run(self.ggml_type, self._act_kind, x, p.qs, p.qh, p.sc, p.d, p.w,
            self._xq, self._xd, self._xsum, self._xf, self._acc, self._isum, out, order | self._k_flags | self._layout)

    def matvec_rows(self, x: np.ndarray, out: np.ndarray) -> None:
        """out[t] = W @ x[t] for rows that are separate sequences' tokens, each exactly as
        `matvec` computes a single token."""
        n_tok = x.shape[0] if x.ndim == 2 else -1
        _check("x", x, (n_tok, self.n_cols))
        _check("out", out, (n_tok, self.n_rows))
        p = self._p
        if self._k_flags:
            self._k_gemm(x, out, False)
            return
        xq, xd, xsum = self.row_acts(n_tok)
        if self._int8dot:
            self._into(out, lambda dst: matvec_int8dot_rows(self.ggml_type, x, p.qs, p.qh, p.d, xq, xd, xsum, dst))
            return
        xf = thread_scratch("rows_xf", n_tok * self._xf.size).reshape((n_tok,) + self._xf.shape)
        if self._float_rows:
            self._into(out, lambda dst: matvec_float_rows(self.ggml_type, self._act_kind, x, p.d, p.w, xq, xd, xsum,
                                                          xf, dst))
            return
        matvec_lanes_rows(self.ggml_type, self._act_kind, x, p.qs, p.qh, p.sc, p.d, p.w, xq, xd, xsum, xf,
                          self._acc, self._isum, out, ORDER_GEMV | self._k_flags | self._layout)

    def matmul_exact(self, x: np.ndarray, out: np.ndarray) -> None:
        """out[n_tok, n_rows] = x[n_tok, n_cols] @ W^T as llama.cpp computes a small batch,
        bit for bit: one matvec per token, in the summation order its kernels use."""
        n_tok = x.shape[0] if x.ndim == 2 else -1
        _check("x", x, (n_tok, self.n_cols))
        _check("out", out, (n_tok, self.n_rows))
        # llama.cpp runs a batch's whole groups of 4 tokens through its (repacked Q4_K)
        # gemm and the rest through gemv, and from 8 tokens on its tiled K-quant matmul;
        # each sums K-quant products in its own order
        if self._k_flags:
            self._k_gemm(x, out, True)  # the same orders in the whole-tile IR kernels
            return
        if self._int8dot or self._float_rows:  # one order for every token: matvec's, the weight read once
            self.matvec_rows(x, out)
            return
        n_gemm = n_tok - n_tok % 4
        batch = (ORDER_TILED if n_tok >= 8 else 0) | (ORDER_CHUNK if n_tok >= 2 else 0)
        for t in range(n_tok):
            self.matvec(x[t], out[t], (ORDER_GEMM if t < n_gemm else ORDER_GEMV) | batch)

    def matmul_batch(self, x: np.ndarray, out: np.ndarray, acts: tuple | None = None) -> None:
        """out[n_tok, n_rows] = x[n_tok, n_cols] @ W^T for a long chunk, reading the weight
        once: the integer GEMM on q8 activations (uses_int8dot), else dequantized tiles through
        BLAS. acts: x already quantized by quantize_chunk(x), for weights that share an
        input (uses_int8dot only)."""
        n_tok = x.shape[0] if x.ndim == 2 else -1
        _check("x", x, (n_tok, self.n_cols))
        _check("out", out, (n_tok, self.n_rows))
        p, R = self._p, self.lanes
        if self._k_flags:  # K-quants: llama.cpp's integer products and orders (gemm_k_ir.py)
            self._k_gemm(x, out, True)
            return
        if self._int8dot:  # integer GEMM on q8 activations (dot_ir.py)
            xq, xd, xsum = acts if acts is not None else quantize_chunk(x)
            self._into(out, lambda dst: gemm_chunks(self.ggml_type, p.qs, p.qh, p.d, xq.view(np.int32), xsum, xd, dst))
            return
        per_tile = self._tile_cols // R
        tile = thread_scratch("tile", self.n_cols * self._tile_cols).reshape(self.n_cols, self._tile_cols)
        for g0 in range(0, p.n_groups, per_tile):
            g1 = min(p.n_groups, g0 + per_tile)
            r0, r1 = g0 * R, min(self.n_rows, g1 * R)
            unpack_tile(self.ggml_type, p.qs, p.qh, p.sc, p.d, p.w, g0, g1, tile)
            if r1 - r0 == self.n_rows:  # one tile holds the whole weight
                np.dot(x, tile[:, :r1], out=out)
            else:
                prod = thread_scratch("prod", n_tok * (r1 - r0)).reshape(n_tok, r1 - r0)
                np.dot(x, tile[:, :r1 - r0], out=prod)
                out[:, r0:r1] = prod

    def row_acts(self, n_tok: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """This thread's activation buffers (xq, xd, xsum) for n_tok separate tokens: one set
        per thread, token count and activation geometry, kept (a batched decode step asks
        for them ~120 times, and the lookups were ~2 us each)."""
        key = (n_tok, self._xq.shape, self._xd.shape, self._xsum.shape)
        memo = getattr(_scratch, "row_acts", None)
        if memo is None:
            memo = _scratch.row_acts = {}
        acts = memo.get(key)
        if acts is None:
            acts = memo[key] = (np.empty((n_tok,) + self._xq.shape, np.int8),
                                np.empty((n_tok,) + self._xd.shape, np.float32),
                                np.empty((n_tok,) + self._xsum.shape, np.int32))
        return acts

    def _k_gemm(self, x: np.ndarray, out: np.ndarray, batch: bool) -> None:
        # out = x @ W^T for a K-quant weight on the int8 dot kernels (gemm_k_ir.py), bit for
        # bit as per-token matvecs in llama.cpp's orders for one chunk (batch) or for
        # separate decode steps (not batch)
        p = self._p
        xq, xd, xsum = quantize_chunk(x, 256)
        self._into(out, lambda dst: k_gemm_chunks(self.ggml_type, p.qs, p.qh, p.sc, p.d, xq.view(np.int32), xsum, xd,
                                                  batch, dst))

    def _into(self, out: np.ndarray, run) -> None:
        # run(dst) writes the [n_tok, G * R] products of a GEMM kernel: straight into out,
        # or, when the last row group has padding rows, into a scratch then out
        padded = self._p.n_groups * self.lanes
        if self.n_rows == padded:
            run(out)
            return
        pad = thread_scratch("gemm", out.shape[0] * padded).reshape(out.shape[0], padded)
        run(pad)
        out[:] = pad[:, :self.n_rows]

    def rows(self, ids: np.ndarray, out: np.ndarray) -> None:
        """out[i] = row ids[i] of W, dequantized (embedding lookup)."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        _check("out", out, (ids.size, self.n_cols))
        if ids.size and (ids.min() < 0 or ids.max() >= self.n_rows):
            bad = ids[(ids < 0) | (ids >= self.n_rows)][0]
            raise IndexError(f"row {bad} is out of range for a weight of {self.n_rows} rows")
        p = self._p
        unpack_rows(self.ggml_type, p.qs, p.qh, p.sc, p.d, p.w, ids, out)

