"""The parallel drivers of QuantMatrix (matvec.py): Numba functions that run the per-group
kernels over all row groups of a weight in the lane layout (repack.py).

What lives here: one token (`matvec_lanes`, `matvec_serial`, and on the int8 dot CPUs
`matvec_int8dot`, `matvec_k_int8dot`, `matvec_k_many`: several K-quant weights at once), separate sequences' tokens (`matvec_lanes_rows`,
`matvec_int8dot_rows`, `matvec_float_rows`), float tiles and rows for BLAS and embedding lookups
(`unpack_tile`, `unpack_rows`), and the activation preparation they share. What does not:
the per-type arithmetic (dot_q.py, dot_k.py, dot_k_low.py, dot_iq.py, int8dot.py, unpack.py), choosing among them
(QuantMatrix), the scratch they are handed (QuantMatrix, thread_scratch).
"""

from __future__ import annotations

import numba as nb
import numpy as np
from gguf import GGMLQuantizationType as T

from . import activations as act
from .config import EXACT_FLAGS, JIT_FLAGS, PARALLEL_FLAGS
from .dot_iq import dot_iq4_nl, dot_iq4_xs
from .dot_k import dot_q4_k, dot_q6_k
from .dot_k_low import dot_q2_k, dot_q3_k
from .dot_q import dot_blocks
from .float_ir import TOKENS as FLOAT_TOKENS, WIDTH as FLOAT_WIDTH, rows_intrinsic
from .fp16 import bf16_to_f32, f16_to_f32
from .int8dot import k_gemm_chunks, k_gemv_many, matvec_chunks, matvec_chunks_rows
from .unpack import unpack_group

N_ISUM = 25  # int32 lane scratch rows the dot kernels need (dot_q6_k: 16 runs, 8 lanes, a total)
N_ACC = 19  # float32 scratch rows: the result, two sets of 8 SIMD-lane accumulators, more sums (dot_iq.py)


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
    elif kind == T.IQ4_NL:
        dot_iq4_nl(qs, d, xq, xd, g, acc, isum, order)
    elif kind == T.IQ4_XS:
        dot_iq4_xs(qs, sc, d, xq, xd, g, acc, isum, order)
    elif kind == T.Q3_K:
        dot_q3_k(qs, qh, sc, d, xq, xd, g, acc, isum, order)
    elif kind == T.Q2_K:
        dot_q2_k(qs, qh, sc, d, xq, xd, xsum, g, acc, isum, order)
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


_F32_ROWS, _F16_ROWS, _BF16_ROWS = (rows_intrinsic(kind) for kind in (T.F32, T.F16, T.BF16))


@nb.njit(**PARALLEL_FLAGS)
def matvec_float_rows(kind, act_kind, x, d, w, xq, xd, xsum, xf, out):
    # matvec_lanes_rows for F32/F16/BF16 weights (float_ir.py): each row of out: f32[T, G * R]
    # has dot_float's bits; up to FLOAT_TOKENS tokens share each weight load (xf: f32[T, n])
    n_tok = x.shape[0]
    for t in range(n_tok):
        prepare_x(kind, act_kind, x[t], xq[t], xd[t], xsum[t], xf[t])
    n_calls = -(-n_tok // FLOAT_TOKENS)
    per_call = -(-n_tok // n_calls)  # 7 tokens: 4 + 3, not 6 + 1
    per_group = d.shape[-1] // FLOAT_WIDTH
    for job in nb.prange(d.shape[0] * per_group):
        g, c = job // per_group, job % per_group
        for t0 in range(0, n_tok, per_call):
            n = min(per_call, n_tok - t0)
            if kind == T.F32:
                _F32_ROWS(w, xf, g, c, t0, n, out)
            elif kind == T.F16:
                _F16_ROWS(d, xf, g, c, t0, n, out)
            else:
                _BF16_ROWS(d, xf, g, c, t0, n, out)


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


@nb.njit(**EXACT_FLAGS)
def matvec_k_many(x, kinds, starts, qss, qhs, scs, ds, xq, xd, xsum, outs):
    # one token through several K-quant weights of one row length at once (row_stack.KStack):
    # x quantized once, then int8dot.k_gemv_many; outs[m] f32[1, rows of member m], each row
    # with matvec_k_int8dot's bits
    act.quantize_act_q8_k(x, xq, xd, xsum)
    n_sb = xq.shape[0]
    k_gemv_many(kinds, starts, qss, qhs, scs, ds, xq.view(np.int32).reshape(1, n_sb, 64), xsum.reshape(1, n_sb, 16),
                xd.reshape(1, n_sb, 2), outs)


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
