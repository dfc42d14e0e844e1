"""Integer dot products of one row group of a Q2_K or Q3_K weight with q8_K.

What lives here: `dot_q2_k`, `dot_q3_k`. Same contract as dot_k.py: read group g of the
lane layout (repack.py), leave the group's R dot products in acc[0].

Both types hold 16 sub-blocks of 16 values per 256-value super-block. Value
128n + 32j + l (n < 2, j < 4, l < 32) has its 2 low bits at bits 2j.. of qs byte 32n + l
(word 8n + l / 4 of the layout) and belongs to sub-block s = 8n + 2j + (l >= 16); Q3_K's
third bit is bit 4n + j of hmask byte l (word l / 4), and a value whose bit is clear is
4 less (codes -4 .. 3). Q2_K: code 0..3, scale = the low nibble of scales[s], min its
high nibble, x = d * scale * code - dmin * min. Q3_K: x = d * (sc6[s] - 32) * code.

A 32-value group (n, j) sums in 8 lanes of 4 consecutive values (lane k: values 4k..4k+3,
all four bytes of one layout word), lanes 0-3 under sub-block 8n + 2j's scale, lanes 4-7
under the next one's. The float steps are those of llama.cpp's x86 build:

    Q3_K, under 8 tokens: vec_dot_q3_K_q8_K, acc8[k] = fma(d_x * d_w, float(lane_k), acc8[k])
          per super-block, then hsum_float_8
    Q3_K, a batch of 8 or more (ORDER_TILED): the tiled matmul, per super-block
          acc = fma(float(T) * d_w, d_x, acc) with T the super-block's integer sum
    Q2_K repacked (rows a multiple of 8, as llama.cpp's AVX-512 build repacks it), one
          token or the n % 4 last tokens of a batch (its gemv): per super-block
          A = fma(float(I), d_w * d_x, A), B = fma(float(M), dmin_w * d_x, B); A - B at the end
          (I = sum_s scale_s * S_s, M = sum_s min_s * X_s, X_s the activations' sum over s)
    Q2_K repacked, a token of a whole group of 4 of a batch (ORDER_GEMM: its gemm): the
          same two FMAs per 128-value half instead of per super-block
    Q2_K in file layout (FILE_LAYOUT: rows not a multiple of 8, or a tied output), under 8
          tokens: vec_dot_q2_K_q8_K, per super-block acc8[k] = fma(-(d_x * dmin_w),
          float(mins_k), acc8[k]) (mins_k = min_2k X_2k + min_2k+1 X_2k+1), then
          acc8[k] = fma(d_x * d_w, float(lane_k), acc8[k]); hsum_float_8
    Q2_K in file layout, 8 or more tokens (ORDER_TILED): per super-block
          r = fma(-dmin_w, float(M), float(I) * d_w), acc = fma(r, d_x, acc)

What does not live here: the parallel loop (matvec_drivers.py), Q4_K-Q6_K (dot_k.py).
"""

from __future__ import annotations

import numba as nb
import numpy as np

from .config import EXACT_FLAGS, JIT_FLAGS
from .dot_iq import FILE_LAYOUT
from .dot_k import ORDER_GEMM, ORDER_TILED, lane_total, superblock_lanes
from .dot_q import lanes_hsum
from .fp16 import f16_to_f32
from .intrinsics import fma

F32 = np.float32
I32 = np.int32


@nb.njit(**JIT_FLAGS)
def crumb(v, shift):
    # the 2 bits of int32 v at shift (int32 throughout: see dot_q.nib)
    return I32(I32(v >> shift) & 3)


@nb.njit(**JIT_FLAGS)
def q3(v, h, shift, bit):
    # a Q3_K code: 2 bits of v at shift, minus 4 unless bit `bit` of h is set
    return I32(crumb(v, shift) - I32(I32(I32(I32(h >> bit) & 1) ^ 1) << 2))


@nb.njit(**JIT_FLAGS)
def group_lanes(qs, qh, g, b, n, j, xq, s8):
    # the 8 lanes of the 32-value group (n, j) of super-block b: s8[k, r] = sum over
    # t < 4 of code(value 4k + t) * xq[b, 128n + 32j + 4k + t]; Q3_K when qh has words
    R = qs.shape[3]
    has_qh = qh.shape[2] > 0
    for k in range(8):
        o = 128 * n + 32 * j + 4 * k
        x0, x1, x2, x3 = I32(xq[b, o]), I32(xq[b, o + 1]), I32(xq[b, o + 2]), I32(xq[b, o + 3])
        words, lane = qs[g, b, 8 * n + k], s8[k]
        if has_qh:
            bits, t = qh[g, b, k], 4 * n + j
            for r in range(R):
                v, h = I32(words[r]), I32(bits[r])
                lane[r] = I32(I32(q3(v, h, 2 * j, t) * x0) + I32(q3(v, h, 8 + 2 * j, 8 + t) * x1)
                              + I32(q3(v, h, 16 + 2 * j, 16 + t) * x2) + I32(q3(v, h, 24 + 2 * j, 24 + t) * x3))
        else:
            for r in range(R):
                v = I32(words[r])
                lane[r] = I32(I32(crumb(v, 2 * j) * x0) + I32(crumb(v, 8 + 2 * j) * x1)
                              + I32(crumb(v, 16 + 2 * j) * x2) + I32(crumb(v, 24 + 2 * j) * x3))


@nb.njit(**JIT_FLAGS)
def scale_lanes(sc, g, b, n, j, s8, lanes, q2):
    # lanes[k] += scale(sub-block 8n + 2j + (k >= 4)) * s8[k]; Q2_K's scale is the low nibble
    # of its byte, Q3_K's the 6-bit value minus 32
    R = s8.shape[1]
    for half in range(2):
        s = sc[g, b, 8 * n + 2 * j + half]
        for k in range(4 * half, 4 * half + 4):
            for r in range(R):
                scale = I32(I32(s[r]) & 15) if q2 else I32(I32(s[r]) - 32)
                lanes[k, r] = I32(lanes[k, r] + scale * s8[k, r])


@nb.njit(**EXACT_FLAGS)  # the float steps in llama.cpp's order: no fast-math
def dot_q3_k(qs, qh, sc, d, xq, xd, g, acc, isum, order):
    # qs: u32[G, NSB, 16, R]; qh: u32[G, NSB, 8, R] (hmask); sc: u8[G, NSB, 16, R] (6-bit,
    # value - 32); d: u16[G, NSB, 1, R]; xq: i8[NSB, 256]; xd[:, 0]: f32 d; acc: f32[N_ACC, R]
    n_sb = qs.shape[1]
    s8, lanes, tot, scale = isum[0:8], isum[16:24], isum[24], acc[18]
    acc[:] = 0.0
    tiled = (order & ORDER_TILED) != 0
    for b in range(n_sb):
        lanes[:] = 0
        for n in range(2):
            for j in range(4):
                group_lanes(qs, qh, g, b, n, j, xq, s8)
                scale_lanes(sc, g, b, n, j, s8, lanes, False)
        superblock_lanes(lanes, d[g, b, 0], xd[b, 0], tiled, tot, scale, acc)
    if not tiled:
        lanes_hsum(acc)


@nb.njit(**JIT_FLAGS)
def q2_mins(sc, g, b, s0, s1, xsum, mins):
    # mins[r] = sum over sub-blocks s0..s1-1 of min_s * X_s (the high nibbles of the scales)
    R = mins.shape[0]
    mins[:] = 0
    for s in range(s0, s1):
        m, x = sc[g, b, s], I32(xsum[b, s])
        for r in range(R):
            mins[r] = I32(mins[r] + I32(I32(m[r]) >> 4) * x)


@nb.njit(**EXACT_FLAGS)  # the float steps in llama.cpp's order: no fast-math
def dot_q2_k(qs, qh, sc, d, xq, xd, xsum, g, acc, isum, order):
    # qs: u32[G, NSB, 16, R]; qh: u32[G, NSB, 0, R]; sc: u8[G, NSB, 16, R] (scale | min << 4); d: u16[G, NSB, 2, R]
    # (d, dmin); xq: i8[NSB, 256]; xd[:, 0]: f32 d; xsum: i32[NSB, 16] (sums of 16 codes)
    n_sb, R = qs.shape[1], qs.shape[3]
    s8, lanes, tot, mins = isum[0:8], isum[16:24], isum[24], isum[8]
    acc[:] = 0.0  # 1-8: the 8 lanes (file layout); 10, 11: the scale and min sums (repacked)
    file_layout = (order & FILE_LAYOUT) != 0
    tiled = file_layout and (order & ORDER_TILED) != 0
    per_half = not file_layout and (order & ORDER_GEMM) != 0
    for b in range(n_sb):
        dx, dw, dm = xd[b, 0], d[g, b, 0], d[g, b, 1]
        lanes[:] = 0
        for n in range(2):
            for j in range(4):
                group_lanes(qs, qh, g, b, n, j, xq, s8)
                scale_lanes(sc, g, b, n, j, s8, lanes, True)
            if per_half:  # the repacked gemm: two FMAs per 128-value half
                lane_total(lanes, tot)
                q2_mins(sc, g, b, 8 * n, 8 * n + 8, xsum, mins)
                _repacked_fmas(dw, dm, dx, tot, mins, acc)
                lanes[:] = 0
        if per_half:
            continue
        if not file_layout:  # the repacked gemv: two FMAs per super-block
            lane_total(lanes, tot)
            q2_mins(sc, g, b, 0, 16, xsum, mins)
            _repacked_fmas(dw, dm, dx, tot, mins, acc)
        elif tiled:
            lane_total(lanes, tot)
            q2_mins(sc, g, b, 0, 16, xsum, mins)
            for r in range(R):
                part = fma(-f16_to_f32(dm[r]), F32(mins[r]), F32(F32(tot[r]) * f16_to_f32(dw[r])))
                acc[0, r] = fma(part, dx, acc[0, r])
        else:  # vec_dot: the mins' lanes first, then the scales'
            for k in range(8):
                m0, m1, x0, x1 = sc[g, b, 2 * k], sc[g, b, 2 * k + 1], I32(xsum[b, 2 * k]), I32(xsum[b, 2 * k + 1])
                for r in range(R):
                    mn = I32(I32(I32(m0[r]) >> 4) * x0 + I32(I32(m1[r]) >> 4) * x1)
                    acc[1 + k, r] = fma(-F32(dx * f16_to_f32(dm[r])), F32(mn), acc[1 + k, r])
            superblock_lanes(lanes, dw, dx, False, tot, acc[18], acc)
    if file_layout and not tiled:
        lanes_hsum(acc)
    elif not file_layout:
        for r in range(R):
            acc[0, r] = F32(acc[10, r] - acc[11, r])


@nb.njit(**EXACT_FLAGS)  # the float steps in llama.cpp's order: no fast-math
def _repacked_fmas(dw, dm, dx, tot, mins, acc):
    # acc[10] = fma(I, d_w * d_x, acc[10]); acc[11] = fma(M, dmin_w * d_x, acc[11])
    for r in range(tot.shape[0]):
        acc[10, r] = fma(F32(tot[r]), F32(f16_to_f32(dw[r]) * dx), acc[10, r])
        acc[11, r] = fma(F32(mins[r]), F32(f16_to_f32(dm[r]) * dx), acc[11, r])
