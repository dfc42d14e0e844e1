"""Integer dot products of one row group of a 32-value-block weight with a q8 activation.

What lives here: `dot_q8_0`, `dot_q4_0`, `dot_q4_1`, `dot_q5_0`, `dot_q5_1` and the
integer building blocks they share. Each reads one group g of the lane layout
(repack.py) and the activation blocks (activations.py), and leaves the R dot products
of the group's rows in acc[0:R]. Per block b and lane r:

    acc[r] += d_w[r] * d_x[b] * sum_j code_w[j, r] * code_x[b, j]   (+ m_w[r] * s_x[b])

The inner sums are int32 and run over the R lanes of a group side by side, which LLVM
turns into SIMD multiply-adds. The lane count comes from the array shape at run time
on purpose: a compile-time 64 would make LLVM unroll the lane loop completely, and the
unrolled form is not vectorized (the accumulators may alias the weights).
What does not live here: the parallel loop over groups (matvec.py), K-quants (dot_k.py).
"""

from __future__ import annotations

import numba as nb
import numpy as np

from .config import JIT_FLAGS
from .fp16 import f16_to_f32

F32 = np.float32
I32 = np.int32


@nb.njit(**JIT_FLAGS)
def nibble_sums(qs, g, b, xq, s):
    # s[r] = sum_k (low nibble of qs[g,b,k,r]) * xq[b,k] + (high nibble) * xq[b,k+16]
    R = qs.shape[3]
    s[:] = 0
    for k in range(16):
        x0 = I32(xq[b, k])
        x1 = I32(xq[b, k + 16])
        q = qs[g, b, k]
        for r in range(R):
            v = I32(q[r])
            s[r] = I32(s[r] + I32((v & 15) * x0) + I32((v >> 4) * x1))


@nb.njit(**JIT_FLAGS)
def five_bit_sums(qs, qh, g, b, xq, s):
    # as nibble_sums, with the fifth bit of value j (bit j of the block's u32 qh, i.e. of
    # byte qh[g,b,j>>3,r]) added to each code: a masked OR, which vectorizes better than a
    # per-value shift by a loop-dependent amount
    R = qs.shape[3]
    s[:] = 0
    for k in range(16):
        x0 = I32(xq[b, k])
        x1 = I32(xq[b, k + 16])
        q, h0, h1 = qs[g, b, k], qh[g, b, k >> 3], qh[g, b, 2 + (k >> 3)]
        m = I32(1 << (k & 7))
        for r in range(R):
            v = I32(q[r])
            lo = (v & 15) | (16 if (I32(h0[r]) & m) != 0 else 0)
            hi = (v >> 4) | (16 if (I32(h1[r]) & m) != 0 else 0)
            s[r] = I32(s[r] + I32(lo * x0) + I32(hi * x1))


@nb.njit(**JIT_FLAGS)
def dot_q8_0(qs, d, xq, xd, g, acc, isum):
    # qs: u8[G, NB, 32, R] (int8 codes); d: u16[G, NB, 1, R]; xq: i8[NB, 32]; xd: f32[NB, 2]
    # acc: f32[R] out; isum: i32[>=1, R] scratch
    n_blocks, R = qs.shape[1], qs.shape[3]
    s = isum[0]
    acc[:] = 0.0
    for b in range(n_blocks):
        s[:] = 0
        for j in range(0, 32, 2):  # pairs of values: LLVM maps a*x + b*y to 16-bit multiply-adds
            x0 = I32(xq[b, j])
            x1 = I32(xq[b, j + 1])
            q0, q1 = qs[g, b, j], qs[g, b, j + 1]
            for r in range(R):
                s[r] = I32(s[r] + I32(I32(np.int8(q0[r])) * x0) + I32(I32(np.int8(q1[r])) * x1))
        dx = xd[b, 0]
        dw = d[g, b, 0]
        for r in range(R):
            acc[r] += f16_to_f32(dw[r]) * dx * F32(s[r])


@nb.njit(**JIT_FLAGS)
def dot_q4_0(qs, d, xq, xd, xsum, g, acc, isum):
    # qs: u8[G, NB, 16, R]; d: u16[G, NB, 1, R]; codes are q - 8: sum (q-8)x = sum qx - 8 sum x
    n_blocks, R = qs.shape[1], qs.shape[3]
    s = isum[0]
    acc[:] = 0.0
    for b in range(n_blocks):
        nibble_sums(qs, g, b, xq, s)
        dx = xd[b, 0]
        off = 8 * xsum[b, 0]
        dw = d[g, b, 0]
        for r in range(R):
            acc[r] += f16_to_f32(dw[r]) * dx * F32(s[r] - off)


@nb.njit(**JIT_FLAGS)
def dot_q4_1(qs, d, xq, xd, g, acc, isum):
    # qs: u8[G, NB, 16, R]; d: u16[G, NB, 2, R] (d, m); xd: f32[NB, 2] (d, s)
    n_blocks, R = qs.shape[1], qs.shape[3]
    s = isum[0]
    acc[:] = 0.0
    for b in range(n_blocks):
        nibble_sums(qs, g, b, xq, s)
        dx, sx = xd[b, 0], xd[b, 1]
        dw, mw = d[g, b, 0], d[g, b, 1]
        for r in range(R):
            acc[r] += f16_to_f32(dw[r]) * dx * F32(s[r]) + f16_to_f32(mw[r]) * sx


@nb.njit(**JIT_FLAGS)
def dot_q5_0(qs, qh, d, xq, xd, xsum, g, acc, isum):
    # qs: u8[G, NB, 16, R]; qh: u8[G, NB, 4, R]; d: u16[G, NB, 1, R]; codes are q - 16
    n_blocks, R = qs.shape[1], qs.shape[3]
    s = isum[0]
    acc[:] = 0.0
    for b in range(n_blocks):
        five_bit_sums(qs, qh, g, b, xq, s)
        dx = xd[b, 0]
        off = 16 * xsum[b, 0]
        dw = d[g, b, 0]
        for r in range(R):
            acc[r] += f16_to_f32(dw[r]) * dx * F32(s[r] - off)


@nb.njit(**JIT_FLAGS)
def dot_q5_1(qs, qh, d, xq, xd, g, acc, isum):
    # qs: u8[G, NB, 16, R]; qh: u8[G, NB, 4, R]; d: u16[G, NB, 2, R] (d, m); xd: (d, s)
    n_blocks, R = qs.shape[1], qs.shape[3]
    s = isum[0]
    acc[:] = 0.0
    for b in range(n_blocks):
        five_bit_sums(qs, qh, g, b, xq, s)
        dx, sx = xd[b, 0], xd[b, 1]
        dw, mw = d[g, b, 0], d[g, b, 1]
        for r in range(R):
            acc[r] += f16_to_f32(dw[r]) * dx * F32(s[r]) + f16_to_f32(mw[r]) * sx
