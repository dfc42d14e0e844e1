"""Integer dot products of one row group of an IQ4_NL or IQ4_XS weight with a q8 activation.

What lives here: `dot_iq4_nl` (32-value blocks, q8_0 activations) and `dot_iq4_xs`
(256-value super-blocks of eight such blocks under 6-bit scales, q8_K activations). Same
contract as dot_q.py / dot_k.py: read group g of the lane layout (repack.py), leave the
group's R dot products in acc[0]. The codes index IQ4_NL's 16 levels (-127 .. 113,
`LEVELS`); a block's 32 products are summed as integers in 8 lanes of 4 consecutive
values (lanes 0-3 the low nibbles, values 0..15; lanes 4-7 the high nibbles, 16..31).

The float steps are those of the kernel llama.cpp's x86 build (AVX2/AVX-512) runs:

    IQ4_NL repacked (the weight's rows a multiple of 8: llama.cpp's iq4_nl_8x8 gemv and gemm,
           one order for every token of any batch): acc = fma(float(S_b), d_w * d_x, acc)
           block after block, S_b the block's integer sum; no horizontal sum
    IQ4_NL in file layout (rows not a multiple of 8), one token: vec_dot_iq4_nl_q8_0, two
           8-lane accumulators (even and odd blocks), added lane-wise and hsum_float_8'd,
           then an odd last block as sumf = fma(d_w * d_x, float(S_b), sumf)
    IQ4_NL in file layout, a token of a chunk of 2 or more (ORDER_CHUNK): llamafile's
           tinyBLAS, one 8-lane accumulator over all blocks, then hsum_float_8
    IQ4_XS, one token or a batch under 8: vec_dot_iq4_xs_q8_K, lane j holds
           sum_ib (ls_ib - 32) * (values 32 ib + 4j .. + 3), acc8[j] = fma(d_w * d_x,
           float(lane_j), acc8[j]) per super-block, then hsum_float_8
    IQ4_XS, a batch of 8 or more (ORDER_TILED): the tiled matmul, per super-block
           acc = fma(float(T) * d_w, d_x, acc) with T the super-block's whole integer
           sum (its float conversion may round: |T| can pass 2^24)

What does not live here: the parallel loop (matvec_drivers.py), the flags' meaning for
other types (dot_k.py).
"""

from __future__ import annotations

import numba as nb
import numpy as np

from .config import EXACT_FLAGS, JIT_FLAGS
from .dot_k import ORDER_TILED, lane_total, superblock_lanes
from .dot_q import lanes_fma, lanes_hsum, nib
from .fp16 import f16_to_f32
from .intrinsics import fma
from .quantize import IQ4_NL_LEVELS

F32 = np.float32
I32 = np.int32

LEVELS = IQ4_NL_LEVELS.astype(np.int32)

# Flags of the `order` argument beside dot_k.py's (bits 0-2): which llama.cpp kernel serves
ORDER_CHUNK = 8  # a token of a chunk of 2 or more (IQ4_NL in file layout: tinyBLAS)
FILE_LAYOUT = 16  # llama.cpp does not repack this IQ4_NL weight (its rows are not a multiple of 8)


@nb.njit(**JIT_FLAGS)
def level(v, shift):
    # the IQ4_NL level of the nibble of int32 v at shift
    return LEVELS[nib(v, shift)]


@nb.njit(**JIT_FLAGS)
def iq4_lane_sums(qs, g, b, w0, xq, x0, s8):
    # the 8 lanes of one 32-value block whose codes are words w0..w0+3 of qs[g, b] and whose
    # activations are xq[x0 .. x0 + 31]: s8[j, r] = sum over the lane's four values of
    # level * x (lane j < 4: low nibbles of word w0 + j; lane 4 + j: its high nibbles)
    R = qs.shape[3]
    for w in range(4):
        o = x0 + 4 * w
        a0, a1, a2, a3 = I32(xq[o]), I32(xq[o + 1]), I32(xq[o + 2]), I32(xq[o + 3])
        c0, c1, c2, c3 = I32(xq[o + 16]), I32(xq[o + 17]), I32(xq[o + 18]), I32(xq[o + 19])
        words, lo, hi = qs[g, b, w0 + w], s8[w], s8[4 + w]
        for r in range(R):
            v = I32(words[r])
            lo[r] = I32(I32(level(v, 0) * a0) + I32(level(v, 8) * a1) + I32(level(v, 16) * a2)
                        + I32(level(v, 24) * a3))
            hi[r] = I32(I32(level(v, 4) * c0) + I32(level(v, 12) * c1) + I32(level(v, 20) * c2)
                        + I32(level(v, 28) * c3))


@nb.njit(**EXACT_FLAGS)  # the float steps in llama.cpp's order: no fast-math
def dot_iq4_nl(qs, d, xq, xd, g, acc, isum, order):
    # qs: u32[G, NB, 4, R]; d: u16[G, NB, 1, R]; xq: i8[NB, 32]; xd[:, 0]: the f16-rounded d
    # of q8_0; acc: f32[N_ACC, R] (0: the result, 1-8 and 10-17: two sets of 8 lanes,
    # 18: a block's d_w * d_x); isum: i32[>=9, R]
    n_blocks, R = qs.shape[1], qs.shape[3]
    s8, tot, scale = isum[0:8], isum[8], acc[18]
    acc[:] = 0.0
    file_layout = (order & FILE_LAYOUT) != 0
    two = file_layout and (order & ORDER_CHUNK) == 0  # vec_dot: even and odd blocks apart
    paired = n_blocks - n_blocks % 2 if two else n_blocks
    for b in range(paired):
        iq4_lane_sums(qs, g, b, 0, xq[b], 0, s8)
        dw = d[g, b, 0]
        for r in range(R):
            scale[r] = F32(f16_to_f32(dw[r]) * xd[b, 0])
        if not file_layout:  # the repacked gemv/gemm: one FMA per block, no lanes
            lane_total(s8, tot)
            for r in range(R):
                acc[0, r] = fma(F32(tot[r]), scale[r], acc[0, r])
        elif two and b % 2 == 1:
            lanes_fma(acc[9:], scale, s8)  # rows 10-17
        else:
            lanes_fma(acc, scale, s8)  # rows 1-8
    if not file_layout:
        return
    if two:
        for j in range(8):  # accum1 + accum2, lane by lane
            for r in range(R):
                acc[1 + j, r] = F32(acc[1 + j, r] + acc[10 + j, r])
    lanes_hsum(acc)
    if paired < n_blocks:  # vec_dot's scalar tail: an odd last block
        b = n_blocks - 1
        iq4_lane_sums(qs, g, b, 0, xq[b], 0, s8)
        lane_total(s8, tot)
        dw = d[g, b, 0]
        for r in range(R):
            acc[0, r] = fma(F32(f16_to_f32(dw[r]) * xd[b, 0]), F32(tot[r]), acc[0, r])


@nb.njit(**EXACT_FLAGS)  # the float steps in llama.cpp's order: no fast-math
def dot_iq4_xs(qs, sc, d, xq, xd, g, acc, isum, order):
    # qs: u32[G, NSB, 32, R]; sc: u8[G, NSB, 8, R] (the 6-bit ls, unbiased); d: u16[G, NSB, 1, R]
    # xq: i8[NSB, 256]; xd[:, 0]: f32 d of q8_K; acc: f32[10, R]; isum: i32[>=25, R]
    n_sb, R = qs.shape[1], qs.shape[3]
    s8, lanes, tot = isum[0:8], isum[16:24], isum[24]
    scale = acc[18]
    acc[:] = 0.0
    tiled = (order & ORDER_TILED) != 0
    for b in range(n_sb):
        lanes[:] = 0
        for ib in range(8):
            iq4_lane_sums(qs, g, b, 4 * ib, xq[b], 32 * ib, s8)
            ls = sc[g, b, ib]
            for j in range(8):
                for r in range(R):
                    lanes[j, r] = I32(lanes[j, r] + I32(I32(ls[r]) - 32) * s8[j, r])
        superblock_lanes(lanes, d[g, b, 0], xd[b, 0], tiled, tot, scale, acc)
    if not tiled:
        lanes_hsum(acc)
