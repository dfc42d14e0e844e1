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
float steps follow llama.cpp exactly (see dot_q.py for why). What does not live here:
the parallel loop (matvec.py).
"""

from __future__ import annotations

import numba as nb
import numpy as np

from .config import EXACT_FLAGS, JIT_FLAGS
from .dot_q import fma, lanes_fma, lanes_hsum
from .fp16 import f16_to_f32

F32 = np.float32
I32 = np.int32

# Which llama.cpp kernel's float order to follow (bit flags, see the module docstring)
ORDER_GEMV = 0  # one token: vec_dot (Q6_K) or the repacked-Q4_K gemv
ORDER_GEMM = 1  # a token in a whole group of 4 of a batch: the repacked-Q4_K gemm
ORDER_TILED = 2  # a batch of 8 or more tokens: the tiled K-quant matmul (Q6_K, Q5_K)


@nb.njit(**JIT_FLAGS)
def k4_chunk_sums(qs, qh, g, b, c, xq, lo, hi):
    # 64 values of chunk c (sub-blocks 2c, 2c+1) of a Q4_K/Q5_K super-block:
    # lo[r] = sum_l code(low nibble of qs[g,b,32c+l,r]) * xq[b,64c+l], hi[r] likewise for +32.
    # qh has 0 bytes for Q4_K; for Q5_K bit 2c / 2c+1 of qh[g,b,l,r] is the fifth bit.
    # Values go in pairs (l, l+1): LLVM maps a*x + b*y to 16-bit multiply-adds.
    R = qs.shape[3]
    m0, m1 = I32(1 << (2 * c)), I32(2 << (2 * c))
    has_qh = qh.shape[2] > 0
    lo[:] = 0
    hi[:] = 0
    for l in range(0, 32, 2):
        xa, xb = I32(xq[b, 64 * c + l]), I32(xq[b, 64 * c + l + 1])
        ya, yb = I32(xq[b, 64 * c + 32 + l]), I32(xq[b, 64 * c + 33 + l])
        qa, qb = qs[g, b, 32 * c + l], qs[g, b, 32 * c + l + 1]
        if has_qh:
            ha, hb = qh[g, b, l], qh[g, b, l + 1]
            for r in range(R):
                va, vb, ea, eb = I32(qa[r]), I32(qb[r]), I32(ha[r]), I32(hb[r])
                la = (va & 15) | (16 if (ea & m0) != 0 else 0)
                lb = (vb & 15) | (16 if (eb & m0) != 0 else 0)
                ua = (va >> 4) | (16 if (ea & m1) != 0 else 0)
                ub = (vb >> 4) | (16 if (eb & m1) != 0 else 0)
                lo[r] = I32(lo[r] + I32(la * xa) + I32(lb * xb))
                hi[r] = I32(hi[r] + I32(ua * ya) + I32(ub * yb))
        else:
            for r in range(R):
                va, vb = I32(qa[r]), I32(qb[r])
                lo[r] = I32(lo[r] + I32((va & 15) * xa) + I32((vb & 15) * xb))
                hi[r] = I32(hi[r] + I32((va >> 4) * ya) + I32((vb >> 4) * yb))


@nb.njit(**JIT_FLAGS)
def dot_q4_k(qs, qh, sc, d, xq, xd, xsum, g, acc, isum, order):
    # qs: u8[G, NSB, 128, R]; qh: u8[G, NSB, 32 or 0, R] (Q5_K / Q4_K);
    # sc: u8[G, NSB, 16, R] (8 scales, 8 mins); d: u16[G, NSB, 2, R] (d, dmin)
    # xq: i8[NSB, 256]; xd[:, 0]: f32 d; xsum: i32[NSB, 16]; acc: f32[R]; isum: i32[>=4, R]
    n_sb, R = qs.shape[1], qs.shape[3]
    lo, hi, tot, mins = isum[0], isum[1], isum[2], isum[3]
    acc[:] = 0.0  # acc[1]: sum of T terms, acc[2]: sum of M terms
    for b in range(n_sb):
        tot[:] = 0
        mins[:] = 0
        for c in range(4):
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
def code6(low4, high2):
    # Q6_K code from its low nibble and (the low 2 bits of) high2. Every step is cast
    # back to int32: Numba widens integer arithmetic to 64 bits, and only explicit
    # narrowing lets LLVM vectorize the callers' lane loops in 32-bit lanes.
    return I32(I32(low4) | I32(I32(I32(high2) & 3) << 4))


@nb.njit(**JIT_FLAGS)
def q6_quarter_sums(qs, qh, g, b, h, half, xq, s):
    # the four 16-value sub-blocks 8h + 2k + half (k = 0..3) of a Q6_K super-block, which
    # share their ql/qh bytes, summed in runs of 4 values: s[4k + jj, r] = sum over
    # l in 16 half + 4jj .. +3 of code_k(l, r) * xq[b, 128h + 32k + l] (raw codes 0..63).
    # Values go in pairs (l, l+1): LLVM maps a*x + b*y to 16-bit multiply-adds.
    R = qs.shape[3]
    s[0:16] = 0
    for l in range(16 * half, 16 * half + 16, 2):
        o = 128 * h + l
        jj = (l - 16 * half) >> 2
        x0a, x0b, x1a, x1b = I32(xq[b, o]), I32(xq[b, o + 1]), I32(xq[b, o + 32]), I32(xq[b, o + 33])
        x2a, x2b, x3a, x3b = I32(xq[b, o + 64]), I32(xq[b, o + 65]), I32(xq[b, o + 96]), I32(xq[b, o + 97])
        pa, pb = qs[g, b, 64 * h + l], qs[g, b, 64 * h + l + 1]  # quarters 0 (low), 2 (high)
        ra, rb = qs[g, b, 64 * h + 32 + l], qs[g, b, 64 * h + 33 + l]  # quarters 1, 3
        ea, eb = qh[g, b, 32 * h + l], qh[g, b, 32 * h + l + 1]  # 2 bits per quarter
        s0, s1, s2, s3 = s[jj], s[4 + jj], s[8 + jj], s[12 + jj]
        for r in range(R):
            a0, b0, a1, b1 = I32(pa[r]), I32(pb[r]), I32(ra[r]), I32(rb[r])
            ha, hb = I32(ea[r]), I32(eb[r])
            s0[r] = I32(s0[r] + I32(code6(a0 & 15, ha) * x0a) + I32(code6(b0 & 15, hb) * x0b))
            s1[r] = I32(s1[r] + I32(code6(a1 & 15, ha >> 2) * x1a) + I32(code6(b1 & 15, hb >> 2) * x1b))
            s2[r] = I32(s2[r] + I32(code6(a0 >> 4, ha >> 4) * x2a) + I32(code6(b0 >> 4, hb >> 4) * x2b))
            s3[r] = I32(s3[r] + I32(code6(a1 >> 4, ha >> 6) * x3a) + I32(code6(b1 >> 4, hb >> 6) * x3b))


@nb.njit(**JIT_FLAGS)
def dot_q6_k(qs, qh, sc, d, xq, xd, xsum, g, acc, isum, order):
    # qs: u8[G, NSB, 128, R] (ql); qh: u8[G, NSB, 64, R]; sc: u8[G, NSB, 16, R] (int8 bits);
    # d: u16[G, NSB, 1, R]; xq: i8[NSB, 256]; xd[:, 0]: f32 d; xsum: i32[NSB, 16]
    # acc: f32[10, R]; isum: i32[>=25, R]: 16 run sums, the 8 lanes, their total
    n_sb, R = qs.shape[1], qs.shape[3]
    runs, lanes, tot = isum[0:16], isum[16:24], isum[24]
    scale = acc[9]
    acc[:] = 0.0
    for b in range(n_sb):
        q6_lane_sums(qs, qh, sc, xq, xsum, g, b, runs, lanes)
        dx, dw = xd[b, 0], d[g, b, 0]
        if (order & ORDER_TILED) != 0:
            # the lanes partition the super-block's integer sum T exactly
            tot[:] = 0
            for j in range(8):
                for r in range(R):
                    tot[r] = I32(tot[r] + lanes[j, r])
            tiled_accumulate(dw, dx, tot, acc)
        else:
            for r in range(R):
                scale[r] = F32(dx * f16_to_f32(dw[r]))
            lanes_fma(acc, scale, lanes)
    if (order & ORDER_TILED) == 0:
        lanes_hsum(acc)


@nb.njit(**JIT_FLAGS)
def q6_lane_sums(qs, qh, sc, xq, xsum, g, b, runs, lanes):
    # the 8 int32 lanes of super-block b (see the module docstring), -32 offset included
    R = qs.shape[3]
    lanes[:] = 0
    for h in range(2):
        for half in range(2):
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
def tiled_accumulate(dw, dx, tot, acc):
    # acc[0] = fma(T * d_w, d_x, acc[0]): GCC contracts the tiled kernel's separate
    # multiply and add intrinsics into an FMA
    for r in range(acc.shape[1]):
        acc[0, r] = fma(F32(F32(tot[r]) * f16_to_f32(dw[r])), dx, acc[0, r])
