"""Integer dot products of one row group of a K-quant weight (Q4_K, Q5_K, Q6_K) with q8_K.

What lives here: `dot_q4_k`, `dot_q5_k`, `dot_q6_k`. Same contract as dot_q.py: read
group g of the lane layout (repack.py), leave the group's R dot products in acc[0:R].
Per super-block b (256 values) and lane r, with sub-block sums S_i = sum code_w * code_x:

    Q4_K/Q5_K: T = sum_i sc_i * S_i, M = sum_i mn_i * X_i (int32), and over super-blocks
               acc = fma(T, d_w * d_x, acc), acc_min = fma(M, dmin_w * d_x, acc_min);
               the result is acc - acc_min (llama.cpp's x86 gemv on its repacked Q4_K;
               its gemm, for groups of 4 tokens, does the two FMAs per 64 values instead)
    Q6_K:      8 int32 lanes, as llama.cpp's AVX2 vec_dot_q6_K_q8_K: lane j holds the
               values whose index within their 32-value run is 4j..4j+3, times their
               sub-block scale, minus 32 * (X_2j sc_2j + X_2j+1 sc_2j+1); per super-block
               acc8[j] = fma(d_x * d_w, lane_j, acc8[j]), then hsum_float_8; in a batch
               of 8 or more (ORDER_TILED): acc = fma(T * d_w, d_x, acc) per super-block

where X_i is the sum of the activation codes under sub-block i (from q8_K's sums of 16),
so the mins and the -32 offset never touch the inner loop. Results land in acc[0]; the
float steps follow llama.cpp exactly (see dot_q.py for why). With the INT8DOT flag the
integer sums k4_chunk_sums / q6_quarter_sums come from dot_k_ir.py instead (the same
integers on the CPU's int8 dot instruction). What does not live here: the parallel loop
(matvec_drivers.py).
"""

from __future__ import annotations

import numba as nb
import numpy as np

from .config import EXACT_FLAGS, JIT_FLAGS
from .dot_q import bit16, lanes_fma, lanes_hsum, nib
from .fp16 import f16_to_f32
from .int8dot import HAS_INT8DOT, k4_sums, q6_runs
from .intrinsics import fma

F32 = np.float32
I32 = np.int32

# Which llama.cpp kernel's float order to follow (bit flags, see the module docstring)
ORDER_GEMV = 0  # one token: vec_dot (Q6_K) or the repacked-Q4_K gemv
ORDER_GEMM = 1  # a token in a whole group of 4 of a batch: the repacked-Q4_K gemm
ORDER_TILED = 2  # a batch of 8 or more tokens: the tiled K-quant matmul (Q6_K, Q5_K)
# Not an order: the integer sums come from the int8 dot-product instructions (dot_k_ir.py),
# the same integers, so the same bits. Set only where int8dot.HAS_INT8DOT.
INT8DOT = 4


@nb.njit(**JIT_FLAGS)
def k4_chunk_sums(qs, qh, g, b, c, xq, lo, hi):
    # 64 values of chunk c (sub-blocks 2c, 2c+1) of a Q4_K/Q5_K super-block:
    # lo[r] = sum_l code(low nibble of byte 32c+l of row r) * xq[b,64c+l], hi[r] likewise
    # with the high nibbles and xq[b,64c+32+l]. Byte 32c+l is byte l%4 of word 8c+l//4.
    # qh has 0 words for Q4_K; for Q5_K bit 2c / 2c+1 of qh byte l is the
    # fifth bit, and qh byte l sits in word l//4 beside the qs byte it belongs to.
    R = qs.shape[3]
    has_qh = qh.shape[2] > 0
    lo[:] = 0
    hi[:] = 0
    for u in range(8):
        o = 64 * c + 4 * u
        xa0, xa1, xa2, xa3 = I32(xq[b, o]), I32(xq[b, o + 1]), I32(xq[b, o + 2]), I32(xq[b, o + 3])
        ya0, ya1, ya2, ya3 = I32(xq[b, o + 32]), I32(xq[b, o + 33]), I32(xq[b, o + 34]), I32(xq[b, o + 35])
        words = qs[g, b, 8 * c + u]
        if has_qh:
            bits = qh[g, b, u]
            for r in range(R):
                v, e = I32(words[r]), I32(bits[r])
                lo[r] = I32(lo[r] + I32((nib(v, 0) | bit16(e, 2 * c)) * xa0)
                            + I32((nib(v, 8) | bit16(e, 8 + 2 * c)) * xa1)
                            + I32((nib(v, 16) | bit16(e, 16 + 2 * c)) * xa2)
                            + I32((nib(v, 24) | bit16(e, 24 + 2 * c)) * xa3))
                hi[r] = I32(hi[r] + I32((nib(v, 4) | bit16(e, 2 * c + 1)) * ya0)
                            + I32((nib(v, 12) | bit16(e, 9 + 2 * c)) * ya1)
                            + I32((nib(v, 20) | bit16(e, 17 + 2 * c)) * ya2)
                            + I32((nib(v, 28) | bit16(e, 25 + 2 * c)) * ya3))
        else:
            for r in range(R):
                v = I32(words[r])
                lo[r] = I32(lo[r] + I32(nib(v, 0) * xa0) + I32(nib(v, 8) * xa1)
                            + I32(nib(v, 16) * xa2) + I32(nib(v, 24) * xa3))
                hi[r] = I32(hi[r] + I32(nib(v, 4) * ya0) + I32(nib(v, 12) * ya1)
                            + I32(nib(v, 20) * ya2) + I32(nib(v, 28) * ya3))


@nb.njit(**JIT_FLAGS)
def dot_q4_k(qs, qh, sc, d, xq, xd, xsum, g, acc, isum, order):
    # qs: u32[G, NSB, 32, R]; qh: u32[G, NSB, 8 or 0, R] (Q5_K / Q4_K);
    # sc: u8[G, NSB, 16, R] (8 scales, 8 mins); d: u16[G, NSB, 2, R] (d, dmin)
    # xq: i8[NSB, 256]; xd[:, 0]: f32 d; xsum: i32[NSB, 16]; acc: f32[R]; isum: i32[>=4, R]
    n_sb, R = qs.shape[1], qs.shape[3]
    lo, hi, tot, mins = isum[0], isum[1], isum[2], isum[3]
    acc[:] = 0.0  # acc[1]: sum of T terms, acc[2]: sum of M terms
    for b in range(n_sb):
        tot[:] = 0
        mins[:] = 0
        for c in range(4):
            if (order & INT8DOT) != 0:
                _k4_fast(qs, qh, g, b, c, xq.view(np.int32), lo, hi)
            else:
                k4_chunk_sums(qs, qh, g, b, c, xq, lo, hi)
            s0, s1 = sc[g, b, 2 * c], sc[g, b, 2 * c + 1]
            m0, m1 = sc[g, b, 8 + 2 * c], sc[g, b, 9 + 2 * c]
            x0 = xsum[b, 4 * c] + xsum[b, 4 * c + 1]
            x1 = xsum[b, 4 * c + 2] + xsum[b, 4 * c + 3]
            for r in range(R):
                tot[r] = I32(tot[r] + I32(s0[r]) * lo[r] + I32(s1[r]) * hi[r])
                mins[r] = I32(mins[r] + I32(m0[r]) * x0 + I32(m1[r]) * x1)
            if (order & ORDER_GEMM) != 0 or c == 3:
                k4_accumulate(d, g, b, xd[b, 0], tot, mins, acc)
                tot[:] = 0
                mins[:] = 0
    for r in range(R):
        acc[0, r] = F32(acc[1, r] - acc[2, r])


@nb.njit(**JIT_FLAGS)
def k4_accumulate(d, g, b, dx, tot, mins, acc):
    # acc[1] = fma(T, d_w * d_x, acc[1]); acc[2] = fma(M, dmin_w * d_x, acc[2])
    dw, dm = d[g, b, 0], d[g, b, 1]
    for r in range(acc.shape[1]):
        acc[1, r] = fma(F32(tot[r]), F32(f16_to_f32(dw[r]) * dx), acc[1, r])
        acc[2, r] = fma(F32(mins[r]), F32(f16_to_f32(dm[r]) * dx), acc[2, r])


@nb.njit(**JIT_FLAGS)
def q6(low_word, high_word, lo_shift, hi_shift):
    # a Q6_K code: 4 bits of low_word at lo_shift, 2 bits of high_word at hi_shift. Every
    # step is cast back to int32: Numba widens integer arithmetic to 64 bits, and only
    # explicit narrowing lets LLVM vectorize the callers' lane loops in 32-bit lanes.
    return I32(I32(I32(low_word >> lo_shift) & 15) | I32(I32(I32(high_word >> hi_shift) & 3) << 4))


@nb.njit(**JIT_FLAGS)
def q6_quarter_sums(qs, qh, g, b, h, half, xq, s):
    # the four 16-value sub-blocks 8h + 2k + half (k = 0..3) of a Q6_K super-block, which
    # share their ql/qh bytes, summed in runs of 4 values: s[4k + jj, r] = sum over
    # l in 16 half + 4jj .. +3 of code_k(l, r) * xq[b, 128h + 32k + l] (raw codes 0..63).
    # A run's four values sit in one word each of ql (quarters 0/2: low/high nibbles of
    # bytes 64h + l; quarters 1/3: of bytes 64h + 32 + l) and qh (bytes 32h + l, 2 bits
    # per quarter).
    R = qs.shape[3]
    for jj in range(4):
        o = 128 * h + 16 * half + 4 * jj
        x0a, x0b, x0c, x0d = I32(xq[b, o]), I32(xq[b, o + 1]), I32(xq[b, o + 2]), I32(xq[b, o + 3])
        x1a, x1b, x1c, x1d = I32(xq[b, o + 32]), I32(xq[b, o + 33]), I32(xq[b, o + 34]), I32(xq[b, o + 35])
        x2a, x2b, x2c, x2d = I32(xq[b, o + 64]), I32(xq[b, o + 65]), I32(xq[b, o + 66]), I32(xq[b, o + 67])
        x3a, x3b, x3c, x3d = I32(xq[b, o + 96]), I32(xq[b, o + 97]), I32(xq[b, o + 98]), I32(xq[b, o + 99])
        w = 16 * h + 4 * half + jj
        lo_words, hi_words, bit_words = qs[g, b, w], qs[g, b, w + 8], qh[g, b, 8 * h + 4 * half + jj]
        s0, s1, s2, s3 = s[jj], s[4 + jj], s[8 + jj], s[12 + jj]
        for r in range(R):
            p, q, e = I32(lo_words[r]), I32(hi_words[r]), I32(bit_words[r])
            s0[r] = I32(I32(q6(p, e, 0, 0) * x0a) + I32(q6(p, e, 8, 8) * x0b)
                        + I32(q6(p, e, 16, 16) * x0c) + I32(q6(p, e, 24, 24) * x0d))
            s1[r] = I32(I32(q6(q, e, 0, 2) * x1a) + I32(q6(q, e, 8, 10) * x1b)
                        + I32(q6(q, e, 16, 18) * x1c) + I32(q6(q, e, 24, 26) * x1d))
            s2[r] = I32(I32(q6(p, e, 4, 4) * x2a) + I32(q6(p, e, 12, 12) * x2b)
                        + I32(q6(p, e, 20, 20) * x2c) + I32(q6(p, e, 28, 28) * x2d))
            s3[r] = I32(I32(q6(q, e, 4, 6) * x3a) + I32(q6(q, e, 12, 14) * x3b)
                        + I32(q6(q, e, 20, 22) * x3c) + I32(q6(q, e, 28, 30) * x3d))


@nb.njit(**JIT_FLAGS)
def dot_q6_k(qs, qh, sc, d, xq, xd, xsum, g, acc, isum, order):
    # qs: u32[G, NSB, 32, R] (ql); qh: u32[G, NSB, 16, R]; sc: u8[G, NSB, 16, R] (int8 bits);
    # d: u16[G, NSB, 1, R]; xq: i8[NSB, 256]; xd[:, 0]: f32 d; xsum: i32[NSB, 16]
    # acc: f32[10, R]; isum: i32[>=25, R]: 16 run sums, the 8 lanes, their total
    n_sb = qs.shape[1]
    runs, lanes, tot = isum[0:16], isum[16:24], isum[24]
    scale = acc[9]
    acc[:] = 0.0
    for b in range(n_sb):
        q6_lane_sums(qs, qh, sc, xq, xsum, g, b, runs, lanes, (order & INT8DOT) != 0)
        superblock_lanes(lanes, d[g, b, 0], xd[b, 0], (order & ORDER_TILED) != 0, tot, scale, acc)
    if (order & ORDER_TILED) == 0:
        lanes_hsum(acc)


@nb.njit(**JIT_FLAGS)
def q6_lane_sums(qs, qh, sc, xq, xsum, g, b, runs, lanes, fast):
    # the 8 int32 lanes of super-block b (see the module docstring), -32 offset included
    R = qs.shape[3]
    lanes[:] = 0
    for h in range(2):
        for half in range(2):
            if fast:
                _q6_fast(qs, qh, g, b, h, half, xq.view(np.int32), runs)
            else:
                q6_quarter_sums(qs, qh, g, b, h, half, xq, runs)
            for k in range(4):
                sub = sc[g, b, 8 * h + 2 * k + half]
                for jj in range(4):
                    lane, run = lanes[4 * half + jj], runs[4 * k + jj]
                    for r in range(R):
                        lane[r] = I32(lane[r] + I32(np.int8(sub[r])) * run[r])
    for j in range(8):  # the -32 offset, by pairs of sub-blocks as ggml's q8sclsub
        x0, x1 = xsum[b, 2 * j], xsum[b, 2 * j + 1]
        s0, s1 = sc[g, b, 2 * j], sc[g, b, 2 * j + 1]
        for r in range(R):
            lanes[j, r] = I32(lanes[j, r] - 32 * (x0 * I32(np.int8(s0[r])) + x1 * I32(np.int8(s1[r]))))


@nb.njit(**EXACT_FLAGS)
def lane_total(lanes, tot):
    # tot[r] = the sum of the 8 lanes lanes[:, r]: a block's integer sum (the lanes partition it)
    tot[:] = 0
    for j in range(8):
        for r in range(tot.shape[0]):
            tot[r] = I32(tot[r] + lanes[j, r])


@nb.njit(**EXACT_FLAGS)
def superblock_lanes(lanes, dw, dx, tiled, tot, scale, acc):
    # a super-block's 8 integer lanes into acc in the order of llama.cpp's kernel: the tiled
    # matmul's (their total T: acc[0] = fma(T * d_w, d_x, acc[0])) or vec_dot's (acc[1 + j] =
    # fma(d_x * d_w, lane_j, acc[1 + j]), hsum_float_8'd by the caller at the end).
    # dw: u16[R] the weight rows' f16 scales; tot: i32[R], scale: f32[R] scratch
    if tiled:
        lane_total(lanes, tot)
        tiled_accumulate(dw, dx, tot, acc)
    else:
        for r in range(scale.shape[0]):
            scale[r] = F32(dx * f16_to_f32(dw[r]))
        lanes_fma(acc, scale, lanes)


@nb.njit(**EXACT_FLAGS)
def tiled_accumulate(dw, dx, tot, acc):
    # acc[0] = fma(T * d_w, d_x, acc[0]): GCC contracts the tiled kernel's separate
    # multiply and add intrinsics into an FMA
    for r in range(acc.shape[1]):
        acc[0, r] = fma(F32(F32(tot[r]) * f16_to_f32(dw[r])), dx, acc[0, r])


if HAS_INT8DOT:
    _k4_fast, _q6_fast = k4_sums, q6_runs
else:  # never called (no INT8DOT flag here): the portable sums, so that nothing compiles IR this CPU lacks
    @nb.njit(**JIT_FLAGS)
    def _k4_fast(qs, qh, g, b, c, xq4, lo, hi):
        k4_chunk_sums(qs, qh, g, b, c, xq4.view(np.int8), lo, hi)

    @nb.njit(**JIT_FLAGS)
    def _q6_fast(qs, qh, g, b, h, half, xq4, s):
        q6_quarter_sums(qs, qh, g, b, h, half, xq4.view(np.int8), s)
