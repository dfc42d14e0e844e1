"""Integer dot products of one row group of a 32-value-block weight with a q8 activation.

What lives here: `dot_q8_0`, `dot_q4_0`, `dot_q4_1`, `dot_q5_0`, `dot_q5_1` and the
integer building blocks they share. Each reads one group g of the lane layout
(repack.py) and the activation blocks (activations.py), and leaves the R dot products
of the group's rows in acc[0, 0:R].

The float arithmetic is llama.cpp's x86 vec_dot order, step for step, because these
small models turn a one-ulp difference into a different greedy token: each block's 32
products are summed as integers in 8 partial sums of 4 consecutive values (the SIMD
lanes of ggml's mul_sum_i8_pairs_float), each partial sum is accumulated across blocks
with an FMA, acc8[j] = fma(d_w * d_x, sum_j, acc8[j]) (acc[1:9]), and the 8 lanes are
added by hsum_float_8's tree at the end. Q4_1/Q5_1 add the min term m_w * s_x to a
separate float sum (acc[9]) block by block, as ggml's `summs`.

The inner sums are int32 and run over the R lanes of a group side by side, which LLVM
turns into SIMD multiply-adds. The lane count comes from the array shape at run time
on purpose: a compile-time 64 would make LLVM unroll the lane loop completely, and the
unrolled form is not vectorized (the accumulators may alias the weights).
What does not live here: the parallel loop over groups (matvec.py), K-quants (dot_k.py).
"""

from __future__ import annotations

import numba as nb
import numpy as np

from .config import EXACT_FLAGS, JIT_FLAGS
from .fp16 import f16_to_f32

F32 = np.float32
I32 = np.int32


@nb.njit(**EXACT_FLAGS)
def fma(a, b, c):
    # float32 fused multiply-add: the product of two float32 is exact in float64
    return F32(np.float64(a) * np.float64(b) + np.float64(c))


@nb.njit(**EXACT_FLAGS)
def lanes_fma(acc, d, s8):
    # acc[1 + j, r] = fma(d[r], float(s8[j, r]), acc[1 + j, r]) for the 8 SIMD lanes j
    R = acc.shape[1]
    for j in range(8):
        for r in range(R):
            acc[1 + j, r] = fma(d[r], F32(s8[j, r]), acc[1 + j, r])


@nb.njit(**EXACT_FLAGS)
def lanes_hsum(acc):
    # acc[0, r] = hsum_float_8(acc[1:9, r]): lanes i + i+4, then (0+2) + (1+3)
    for r in range(acc.shape[1]):
        a0 = F32(acc[5, r] + acc[1, r])
        a1 = F32(acc[6, r] + acc[2, r])
        a2 = F32(acc[7, r] + acc[3, r])
        a3 = F32(acc[8, r] + acc[4, r])
        acc[0, r] = F32(F32(a0 + a2) + F32(a1 + a3))


@nb.njit(**JIT_FLAGS)
def byte_lane_sums(qs, g, b, xq, s8):
    # s8[j, r] = sum over k in 4j..4j+3 of int8 code qs[g,b,k,r] * xq[b,k] (Q8_0)
    R = qs.shape[3]
    s8[0:8] = 0
    for k in range(32):
        x = I32(xq[b, k])
        q = qs[g, b, k]
        lane = s8[k >> 2]
        for r in range(R):
            lane[r] = I32(lane[r] + I32(I32(np.int8(q[r])) * x))


@nb.njit(**JIT_FLAGS)
def nibble_lane_sums(qs, qh, g, b, xq, offset, s8):
    # value k < 16 is the low nibble of qs[g,b,k,r], value 16 + k the high one; with qh
    # (Q5) bit k / 16 + k of the block's u32 is the fifth bit. s8[j, r] sums
    # (code - offset) * xq over values 4j..4j+3: lanes 0-3 from low nibbles, 4-7 from high
    R = qs.shape[3]
    has_qh = qh.shape[2] > 0
    s8[0:8] = 0
    for k in range(16):
        x0 = I32(xq[b, k])
        x1 = I32(xq[b, k + 16])
        q = qs[g, b, k]
        lo_lane, hi_lane = s8[k >> 2], s8[4 + (k >> 2)]
        m = I32(1 << (k & 7))
        for r in range(R):
            v = I32(q[r])
            lo, hi = v & 15, v >> 4
            if has_qh:
                lo |= 16 if (I32(qh[g, b, k >> 3, r]) & m) != 0 else 0
                hi |= 16 if (I32(qh[g, b, 2 + (k >> 3), r]) & m) != 0 else 0
            lo_lane[r] = I32(lo_lane[r] + I32((lo - offset) * x0))
            hi_lane[r] = I32(hi_lane[r] + I32((hi - offset) * x1))


@nb.njit(**EXACT_FLAGS)
def block_scale(d, g, b, dx, out):
    # out[r] = f16(d_w) * d_x, rounded to float32 as ggml's combined block scale
    dw = d[g, b, 0]
    for r in range(out.shape[0]):
        out[r] = F32(f16_to_f32(dw[r]) * dx)


@nb.njit(**EXACT_FLAGS)
def add_mins(d, g, b, sx, acc):
    # ggml's summs += m_w * s_x (no FMA: a separate product and sum), kept in acc[9]
    mw = d[g, b, 1]
    for r in range(acc.shape[1]):
        acc[9, r] = F32(acc[9, r] + F32(f16_to_f32(mw[r]) * sx))


@nb.njit(**JIT_FLAGS)
def dot_blocks(kind, qs, qh, d, xq, xd, g, acc, isum):
    # kind: ggml type of a 32-value block weight; acc: f32[10, R]; isum: i32[>=9, R]
    # qs: u8[G, NB, 32 or 16, R]; qh: u8[G, NB, 4 or 0, R]; d: u16[G, NB, 1 or 2, R]
    n_blocks = qs.shape[1]
    s8, scale = isum[0:8], acc[0]
    acc[:] = 0.0
    offset = 8 if kind == 2 else (16 if kind == 6 else 0)  # Q4_0 / Q5_0 codes are q - 8 / q - 16
    for b in range(n_blocks):
        if kind == 8:
            byte_lane_sums(qs, g, b, xq, s8)
        else:
            nibble_lane_sums(qs, qh, g, b, xq, offset, s8)
        block_scale(d, g, b, xd[b, 0], scale)
        lanes_fma(acc, scale, s8)
        if kind == 3 or kind == 7:
            add_mins(d, g, b, xd[b, 1], acc)
    lanes_hsum(acc)
    if kind == 3 or kind == 7:
        for r in range(acc.shape[1]):
            acc[0, r] = F32(acc[0, r] + acc[9, r])
