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

The inner sums are int32 and run over the R lanes of a group side by side; each ggml
lane's four values come from one uint32 word of the layout (repack.py), which LLVM
turns into 16-bit SIMD multiply-adds (vpmaddwd, vpdpwssd with VNNI). The lane count comes from the array shape at run time
on purpose: a compile-time 64 would make LLVM unroll the lane loop completely, and the
unrolled form is not vectorized (the accumulators may alias the weights).
What does not live here: the parallel loop over groups (matvec_drivers.py), K-quants (dot_k.py).
"""

from __future__ import annotations

import numba as nb
import numpy as np
from gguf import GGMLQuantizationType as T

from .config import EXACT_FLAGS, JIT_FLAGS
from .fp16 import f16_to_f32
from .intrinsics import fma

F32 = np.float32
I32 = np.int32


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
    # Q8_0: word j of a block holds the signed codes of values 4j..4j+3, so
    # s8[j, r] = sum over k < 4 of byte k of qs[g,b,j,r] * xq[b, 4j + k]. A signed byte
    # is (its bits ^ 128) - 128: the unsigned part keeps LLVM on 16-bit multiply-adds,
    # the -128 comes out of the loop as -128 * sum(xq).
    R = qs.shape[3]
    flip = I32(-0x7F7F7F80)  # 0x80808080
    for j in range(8):
        x0, x1, x2, x3 = I32(xq[b, 4 * j]), I32(xq[b, 4 * j + 1]), I32(xq[b, 4 * j + 2]), I32(xq[b, 4 * j + 3])
        off = I32(128 * (x0 + x1 + x2 + x3))
        words, lane = qs[g, b, j], s8[j]
        for r in range(R):
            v = I32(I32(words[r]) ^ flip)
            lane[r] = I32(I32(byte(v, 0) * x0) + I32(byte(v, 8) * x1) + I32(byte(v, 16) * x2)
                          + I32(byte(v, 24) * x3) - off)


@nb.njit(**JIT_FLAGS)
def byte(v, shift):
    # the 8 bits of int32 v at shift, unsigned (see nib for the casts)
    return I32(I32(v >> shift) & 255)


@nb.njit(**JIT_FLAGS)
def nib(v, shift):
    # the 4 bits of int32 v at shift. Every step is cast back to int32: Numba widens
    # integer arithmetic to 64 bits, and only explicit narrowing lets LLVM vectorize
    # the callers' lane loops in 32-bit lanes.
    return I32(I32(v >> shift) & 15)


@nb.njit(**JIT_FLAGS)
def bit16(h, k):
    # bit k of int32 h, as 16 (a fifth code bit) or 0
    return I32(I32(I32(h >> k) & 1) << 4)


@nb.njit(**JIT_FLAGS)
def nibble_lane_sums(qs, qh, g, b, xq, offset, s8):
    # Q4_0/Q4_1/Q5_0/Q5_1: word w holds bytes 4w..4w+3; their low nibbles are values
    # 4w..4w+3 (lane w), their high nibbles values 16+4w.. (lane 4+w); for Q5 bit k of
    # the block's qh word is the fifth bit of value k. s8[j, r] sums (code - offset) * xq
    # over the lane's four values; the offset term comes out of the loop as offset * sum(xq).
    R = qs.shape[3]
    has_qh = qh.shape[2] > 0
    for w in range(4):
        a0, a1, a2, a3 = I32(xq[b, 4 * w]), I32(xq[b, 4 * w + 1]), I32(xq[b, 4 * w + 2]), I32(xq[b, 4 * w + 3])
        c0, c1, c2, c3 = I32(xq[b, 16 + 4 * w]), I32(xq[b, 17 + 4 * w]), I32(xq[b, 18 + 4 * w]), I32(xq[b, 19 + 4 * w])
        lo_off, hi_off = I32(offset * (a0 + a1 + a2 + a3)), I32(offset * (c0 + c1 + c2 + c3))
        words, lo, hi = qs[g, b, w], s8[w], s8[4 + w]
        if has_qh:
            bits = qh[g, b, 0]
            k = 4 * w
            for r in range(R):
                v, h = I32(words[r]), I32(bits[r])
                lo[r] = I32(I32((nib(v, 0) | bit16(h, k)) * a0) + I32((nib(v, 8) | bit16(h, k + 1)) * a1)
                            + I32((nib(v, 16) | bit16(h, k + 2)) * a2) + I32((nib(v, 24) | bit16(h, k + 3)) * a3)
                            - lo_off)
                hi[r] = I32(I32((nib(v, 4) | bit16(h, k + 16)) * c0) + I32((nib(v, 12) | bit16(h, k + 17)) * c1)
                            + I32((nib(v, 20) | bit16(h, k + 18)) * c2) + I32((nib(v, 28) | bit16(h, k + 19)) * c3)
                            - hi_off)
        else:
            for r in range(R):
                v = I32(words[r])
                lo[r] = I32(I32(nib(v, 0) * a0) + I32(nib(v, 8) * a1) + I32(nib(v, 16) * a2)
                            + I32(nib(v, 24) * a3) - lo_off)
                hi[r] = I32(I32(nib(v, 4) * c0) + I32(nib(v, 12) * c1) + I32(nib(v, 20) * c2)
                            + I32(nib(v, 28) * c3) - hi_off)


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
    # qs: u32[G, NB, 8 or 4, R]; qh: u32[G, NB, 1 or 0, R]; d: u16[G, NB, 1 or 2, R]
    n_blocks = qs.shape[1]
    s8, scale = isum[0:8], acc[0]
    acc[:] = 0.0
    offset = 8 if kind == T.Q4_0 else (16 if kind == T.Q5_0 else 0)  # Q4_0 / Q5_0 codes are q - 8 / q - 16
    for b in range(n_blocks):
        if kind == T.Q8_0:
            byte_lane_sums(qs, g, b, xq, s8)
        else:
            nibble_lane_sums(qs, qh, g, b, xq, offset, s8)
        block_scale(d, g, b, xd[b, 0], scale)
        lanes_fma(acc, scale, s8)
        if kind == T.Q4_1 or kind == T.Q5_1:
            add_mins(d, g, b, xd[b, 1], acc)
    lanes_hsum(acc)
    if kind == T.Q4_1 or kind == T.Q5_1:
        for r in range(acc.shape[1]):
            acc[0, r] = F32(acc[0, r] + acc[9, r])
