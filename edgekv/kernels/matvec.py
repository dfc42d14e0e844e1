"""Weight matrices of the forward pass: `QuantMatrix` and its parallel drivers.

What lives here: QuantMatrix, built once per GGUF weight at model load (repacked into
the lane layout, repack.py), with `matvec` (decode: one token), `matmul` (prefill: many
tokens) and `rows` (embedding lookup); plus the @njit drivers that run the per-group
kernels over all row groups in parallel. What does not: the per-type arithmetic
(dot_q.py, dot_k.py, unpack.py), block formats (quants.py).

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
from typing import TYPE_CHECKING

import numba as nb
import numpy as np
from gguf import GGMLQuantizationType as T

from ..errors import UnsupportedModelError
from ..quants import quant_type, row_nbytes
from . import activations as act
from . import config
from .config import EXACT_FLAGS, JIT_FLAGS, LANES, PARALLEL_FLAGS, max_threads
from .dot_k import INT8DOT, ORDER_GEMM, ORDER_GEMV, ORDER_TILED, dot_q4_k, dot_q6_k
from .dot_q import dot_blocks
from .fp16 import bf16_to_f32, f16_to_f32
from .repack import repack
from .activations import quantize_acts, quantize_acts_k
from .int8dot import (CHUNK, HAS_INT8DOT, K_TYPES, TYPES as INT8DOT_TYPES, gemm_chunks, k_gemm_chunks, matvec_chunks,
                      matvec_chunks_rows)
from .unpack import unpack_group

if TYPE_CHECKING:
    from .row_stack import RowStack

TILE_BYTES = 4 << 20  # float32 tile handed to BLAS per step of matmul
N_ISUM = 25  # int32 lane scratch rows the dot kernels need (dot_q6_k: 16 runs, 8 lanes, a total)
N_ACC = 10  # float32 scratch rows: the result, 8 SIMD-lane accumulators, one more sum


@nb.njit(**JIT_FLAGS)
def dot_float(kind, w, d, x, g, acc2):
    # F32: w f32[G, n, R]; F16 (kind 1) / BF16: d u16[G, n, 1, R]; x: f32[n]; result in acc2[0]: f32[R]
    acc = acc2[0]
    acc[:] = 0.0
    R = acc.shape[0]
    for c in range(x.size):
        xv = x[c]
        if kind == T.F32:
            row = w[g, c]
            for r in range(R):
                acc[r] += row[r] * xv
        elif kind == T.F16:
            bits = d[g, c, 0]
            for r in range(R):
                acc[r] += f16_to_f32(bits[r]) * xv
        else:
            bits = d[g, c, 0]
            for r in range(R):
                acc[r] += bf16_to_f32(bits[r]) * xv


@nb.njit(**EXACT_FLAGS)
def prepare_x(kind, act_kind, x, xq, xd, xsum, xf):
    # x: f32[n] -> the activation format of the weight (see activations.py)
    if act_kind == 1:
        act.quantize_act_q8(x, xq, xd, xsum)
    elif act_kind == 2:
        act.quantize_act_q8_k(x, xq, xd, xsum)
    elif kind == T.F16:
        act.round_act_f16(x, xf)
    elif kind == T.BF16:
        act.round_act_bf16(x, xf)
    else:
        xf[:] = x


@nb.njit(**JIT_FLAGS)
def matvec_group(kind, qs, qh, sc, d, w, xq, xd, xsum, xf, acc, isum, out, order, g):
    # rows g*R .. g*R + R - 1 of out, with one thread's scratch acc: f32[N_ACC, R], isum: i32[N_ISUM, R]
    R = acc.shape[1]
    if kind == T.Q8_0 or kind == T.Q4_0 or kind == T.Q4_1 or kind == T.Q5_0 or kind == T.Q5_1:
        dot_blocks(kind, qs, qh, d, xq, xd, g, acc, isum)
    elif kind == T.Q4_K or kind == T.Q5_K:
        dot_q4_k(qs, qh, sc, d, xq, xd, xsum, g, acc, isum, order)
    elif kind == T.Q6_K:
        dot_q6_k(qs, qh, sc, d, xq, xd, xsum, g, acc, isum, order)
    else:
        dot_float(kind, w, d, xf, g, acc)
    for r in range(min(R, out.shape[0] - g * R)):
        out[g * R + r] = acc[0, r]


@nb.njit(**PARALLEL_FLAGS)
def matvec_lanes(kind, act_kind, x, qs, qh, sc, d, w, xq, xd, xsum, xf, acc, isum, out, order):
    # x: f32[n_cols] -> out: f32[n_rows]; weight in lane layout (repack.py), R = acc.shape[2]
    # acc: f32[threads, N_ACC, R], isum: i32[threads, N_ISUM, R] per-thread scratch
    prepare_x(kind, act_kind, x, xq, xd, xsum, xf)
    for g in nb.prange(d.shape[0]):
        t = nb.get_thread_id()
        matvec_group(kind, qs, qh, sc, d, w, xq, xd, xsum, xf, acc[t], isum[t], out, order, g)


@nb.njit(**JIT_FLAGS)
def matvec_serial(kind, act_kind, x, qs, qh, sc, d, w, xq, xd, xsum, xf, acc, isum, out, order):
    # matvec_lanes on the calling thread only (products too small to be worth a wake-up)
    prepare_x(kind, act_kind, x, xq, xd, xsum, xf)
    for g in range(d.shape[0]):
        matvec_group(kind, qs, qh, sc, d, w, xq, xd, xsum, xf, acc[0], isum[0], out, order, g)


@nb.njit(**PARALLEL_FLAGS)
def matvec_lanes_rows(kind, act_kind, x, qs, qh, sc, d, w, xq, xd, xsum, xf, acc, isum, out, order):
    # matvec_lanes for every row of x: f32[n_tok, n_cols] -> out: f32[n_tok, n_rows], the rows
    # being separate sequences' tokens; each group of weight rows is read once for all of them
    # (xq, xd, xsum, xf: one activation buffer per row)
    for t in range(x.shape[0]):
        prepare_x(kind, act_kind, x[t], xq[t], xd[t], xsum[t], xf[t])
    for g in nb.prange(d.shape[0]):
        th = nb.get_thread_id()
        for t in range(x.shape[0]):
            matvec_group(kind, qs, qh, sc, d, w, xq[t], xd[t], xsum[t], xf[t], acc[th], isum[th], out[t], order, g)


@nb.njit(**JIT_FLAGS)
def matvec_int8dot(kind, x, qs, qh, d, xq, xd, xsum, out_pad, out):
    # 32-value block types through the int8 dot kernels (int8dot.py): same bits as matvec_lanes;
    # out_pad: f32[G * R] when the last group has padding rows, else empty (out is written)
    act.quantize_act_q8(x, xq, xd, xsum)
    if out_pad.size == 0:
        matvec_chunks(kind, qs, qh, d, xq.view(np.int32), xsum, xd, out)
        return
    matvec_chunks(kind, qs, qh, d, xq.view(np.int32), xsum, xd, out_pad)
    out[:] = out_pad[:out.shape[0]]


@nb.njit(**JIT_FLAGS)
def matvec_int8dot_rows(kind, x, qs, qh, d, xq, xd, xsum, out):
    # matvec_int8dot for every row of x: f32[T, n_cols] (separate sequences' tokens) with
    # one activation buffer per row (xq i8[T, NB, 32], xd, xsum); out f32[T, G * R]: each
    # row's bits are matvec_int8dot's, and the weight is read from memory once for all rows
    for t in range(x.shape[0]):
        act.quantize_act_q8(x[t], xq[t], xd[t], xsum[t])
    matvec_chunks_rows(kind, qs, qh, d, xq.view(np.int32), xsum, xd, out)


@nb.njit(**EXACT_FLAGS)
def matvec_k_int8dot(kind, x, qs, qh, sc, d, xq, xd, xsum, out_pad, out):
    # a K-quant weight, one token, through the IR kernels (int8dot.k_gemm_chunks): the bits
    # of matvec_lanes in ORDER_GEMV; out_pad as in matvec_int8dot
    act.quantize_act_q8_k(x, xq, xd, xsum)
    n_sb = xq.shape[0]
    xq4, xs, xd1 = xq.view(np.int32).reshape(1, n_sb, 64), xsum.reshape(1, n_sb, 16), xd.reshape(1, n_sb, 2)
    if out_pad.size == 0:
        k_gemm_chunks(kind, qs, qh, sc, d, xq4, xs, xd1, False, out.reshape(1, out.size))
        return
    k_gemm_chunks(kind, qs, qh, sc, d, xq4, xs, xd1, False, out_pad.reshape(1, out_pad.size))
    out[:] = out_pad[:out.shape[0]]


@nb.njit(**dict(EXACT_FLAGS, parallel=True))
def unpack_tile(kind, qs, qh, sc, d, w, g0, g1, tile):
    # groups g0..g1-1 -> tile: f32[n_cols, >= (g1-g0)*R], row g*R + r in column (g-g0)*R + r
    R = d.shape[3]
    for i in nb.prange(g1 - g0):
        # np.int64(0), not 0: a literal 0 would compile a second copy of unpack_group
        unpack_group(kind, qs, qh, sc, d, w, g0 + i, np.int64(0), R, tile, i * R)


@nb.njit(**dict(EXACT_FLAGS, parallel=True))
def unpack_rows(kind, qs, qh, sc, d, w, ids, out):
    # ids: i64[n] row indices -> out: f32[n, n_cols]
    R = d.shape[3]
    for i in nb.prange(ids.size):
        g, r = ids[i] // R, ids[i] % R
        # out[i] seen as a one-column tile [n_cols, 1]: the same array type as matmul's tiles
        unpack_group(kind, qs, qh, sc, d, w, g, r, r + 1, out[i].reshape(out.shape[1], 1), np.int64(0))


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
                 use_int8dot: bool = True, release=None):
        q = quant_type(ggml_type)  # UnsupportedModelError for an unknown type
        on_int8dot = HAS_INT8DOT and use_int8dot
        int8dot = on_int8dot and q.ggml_type in INT8DOT_TYPES
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
        self._p = repack(raw, q.ggml_type, self.n_rows, self.n_cols, q.type_size, lanes, release)
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
        # K-quants on the int8 dot instructions: CHUNK-row groups (in-model decode 2x faster
        # than 64-row groups read in strided 32-byte pieces) on the whole-tile IR kernels
        # (gemm_k_ir.py); explicit orders on dot_k.py with the integer sums on them
        # (dot_k_ir.py): the INT8DOT flag
        k_int8dot = on_int8dot and q.ggml_type in K_TYPES and lanes % CHUNK == 0
        self._k_flags = INT8DOT if k_int8dot else 0
        padded = (self._int8dot or k_int8dot) and self.n_rows != self._p.n_groups * lanes
        self._out_pad = np.zeros(self._p.n_groups * lanes if padded else 0, np.float32)
        self._tile_cols = max(lanes, min(self._p.n_groups * lanes, TILE_BYTES // (4 * self.n_cols) // lanes * lanes))
        self.stack: RowStack | None = None  # set by the backend's share_input (row_stack.py)

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
            self._xq, self._xd, self._xsum, self._xf, self._acc, self._isum, out, order | self._k_flags)

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
        matvec_lanes_rows(self.ggml_type, self._act_kind, x, p.qs, p.qh, p.sc, p.d, p.w, xq, xd, xsum, xf,
                          self._acc, self._isum, out, ORDER_GEMV | self._k_flags)

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
        if self._int8dot:  # one order for every token: matvec's, with the weight read once
            self.matvec_rows(x, out)
            return
        n_gemm = n_tok - n_tok % 4
        tiled = ORDER_TILED if n_tok >= 8 else 0
        for t in range(n_tok):
            self.matvec(x[t], out[t], (ORDER_GEMM if t < n_gemm else ORDER_GEMV) | tiled)

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
        """This thread's activation buffers (xq, xd, xsum) for n_tok separate tokens."""
        xq = thread_scratch("rows_xq", n_tok * self._xq.size, np.int8).reshape((n_tok,) + self._xq.shape)
        xd = thread_scratch("rows_xd", n_tok * self._xd.size).reshape((n_tok,) + self._xd.shape)
        xsum = thread_scratch("rows_xsum", n_tok * self._xsum.size, np.int32).reshape((n_tok,) + self._xsum.shape)
        return xq, xd, xsum

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

