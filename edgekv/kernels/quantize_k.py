"""Quantizers for the K-quant weight types: one row of float32 -> Q4_K, Q5_K or Q6_K blocks,
bit-exact with what llama-quantize writes, with or without an importance matrix.

What lives here: `quantize_row_q4_k/q5_k/q6_k(x, qw, dst)`: without importance weights (qw
empty) ggml's reference quantizers; with them its quantize_row_q*_K_impl, whose sub-block
scales and mins are fitted by make_qp_quants instead of rescaled to 63/max. The scale
searches are in quantize_search.py. The arithmetic is ggml-quants.c's step by step in
float32, compiled without fast-math: ggml builds that file in its base library with no
architecture flags, so on x86-64 nothing is contracted into an FMA, and neither is anything
here. Every constant is a float32 (`F32(...)`): in Numba a float32 times a Python number is a
float64, which would round differently. What does not live here: the legacy types
(quantize.py), the dequantizers (dequant.py), the block layouts (gguf/quants.py).
"""

from __future__ import annotations

import numba as nb
import numpy as np

from .config import EXACT_FLAGS
from .fp16 import f16_to_f32, f32_to_f16, nearest_int
from .quantize import put_u16
from .quantize_search import (GROUP_MAX_EPS, importance_weights, make_qkx2_quants, make_qp_quants, make_qx_quants,
                              sum_squares)

F32 = np.float32
QK_K = 256


@nb.njit(**EXACT_FLAGS)
def group_scales(x, nmax, rmin, nstep, L, scales, mins):
    # the 8 groups of 32 of one super-block x[256]: scales, mins and levels by make_qkx2_quants,
    # each group weighted by w = rms(group) + |x|; -> (max scale, max min)
    weights = np.empty(32, np.float32)
    laux = np.empty(32, np.uint8)
    max_scale = F32(0.0)
    max_min = F32(0.0)
    for j in range(QK_K // 32):
        g = x[32 * j:32 * j + 32]
        sum_x2 = F32(0.0)
        for i in range(32):
            sum_x2 += g[i] * g[i]
        av_x = np.sqrt(sum_x2 / F32(32.0))
        for i in range(32):
            weights[i] = av_x + abs(g[i])
        scales[j], mins[j] = make_qkx2_quants(g, weights, nmax, L[32 * j:32 * j + 32], laux,
                                              rmin, F32(0.1), nstep)
        if scales[j] > max_scale:
            max_scale = scales[j]
        if mins[j] > max_min:
            max_min = mins[j]
    return max_scale, max_min


@nb.njit(**EXACT_FLAGS)
def put_scales_k4(dst, o, max_scale, max_min, scales, mins):
    # d, dmin (f16) and the 12 bytes of 6-bit group scales and mins of a Q4_K/Q5_K block at
    # dst[o]; returns the f32 values of d and dmin as stored
    inv_scale = F32(63.0) / max_scale if max_scale > 0 else F32(0.0)
    inv_min = F32(63.0) / max_min if max_min > 0 else F32(0.0)
    sc = dst[o + 4:o + 16]
    for j in range(8):
        ls = min(63, nearest_int(inv_scale * scales[j]) & 0xFF)
        lm = min(63, nearest_int(inv_min * mins[j]) & 0xFF)
        if j < 4:
            sc[j] = ls
            sc[j + 4] = lm
        else:
            sc[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4)
            sc[j - 4] |= (ls >> 4) << 6
            sc[j] |= (lm >> 4) << 6
    hd = f32_to_f16(max_scale / F32(63.0))
    hm = f32_to_f16(max_min / F32(63.0))
    put_u16(dst, o, hd)
    put_u16(dst, o + 2, hm)
    return f16_to_f32(hd), f16_to_f32(hm)


@nb.njit(**EXACT_FLAGS)
def scale_min_k4(j, sc):
    # group j's 6-bit scale and min from a Q4_K/Q5_K block's 12 scale bytes
    if j < 4:
        return sc[j] & 63, sc[j + 4] & 63
    return (sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4), (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4)


@nb.njit(**EXACT_FLAGS)
def requantize_groups(x, dst, o, d, dmin, nmax, L):
    # levels of x[256] against the stored (6-bit) group scales; a group whose scale is 0
    # keeps the levels its search found
    for j in range(8):
        s, m = scale_min_k4(j, dst[o + 4:o + 16])
        dj = d * F32(s)
        if dj == 0:
            continue
        dm = dmin * F32(m)
        for i in range(32):
            L[32 * j + i] = max(0, min(nmax, nearest_int((x[32 * j + i] + dm) / dj)))


@nb.njit(**EXACT_FLAGS)
def group_scales_imat(x, qw, nmax, L, scales, mins, sw):
    # the 8 groups of 32 of x[256] with importance weights qw[256]: each value weighted by
    # qw*sqrt(sigma2 + x^2), sigma2 = 2*mean(x^2) of the super-block; sw: each group's weight
    weights = np.empty(32, np.float32)
    laux = np.empty(32, np.uint8)
    sigma2 = F32(2.0) * sum_squares(x) / F32(QK_K)
    for j in range(QK_K // 32):
        g = x[32 * j:32 * j + 32]
        sw[j] = importance_weights(g, qw[32 * j:32 * j + 32], sigma2, weights)
        scales[j], mins[j] = make_qkx2_quants(g, weights, nmax, L[32 * j:32 * j + 32], laux,
                                              F32(-0.9), F32(0.05), 36)


@nb.njit(**EXACT_FLAGS)
def put_scales_k4_imat(dst, o, scales, mins, sw, cap):
    # the 6-bit scales and mins as make_qp_quants fits them against the group weights sw;
    # cap: clamp the codes to 63 as Q5_K does (Q4_K stores them as they come)
    ls = np.empty(8, np.uint8)
    lm = np.empty(8, np.uint8)
    hd = f32_to_f16(make_qp_quants(scales, 63, ls, sw))
    hm = f32_to_f16(make_qp_quants(mins, 63, lm, sw))
    if cap:
        for j in range(8):
            ls[j] = min(63, ls[j])
            lm[j] = min(63, lm[j])
    sc = dst[o + 4:o + 16]
    for j in range(8):
        if j < 4:
            sc[j] = ls[j]
            sc[j + 4] = lm[j]
        else:
            sc[j + 4] = (ls[j] & 0xF) | ((lm[j] & 0xF) << 4)
            sc[j - 4] |= (ls[j] >> 4) << 6
            sc[j] |= (lm[j] >> 4) << 6
    put_u16(dst, o, hd)
    put_u16(dst, o + 2, hm)
    return f16_to_f32(hd), f16_to_f32(hm)


@nb.njit(**EXACT_FLAGS)
def k4_block(xb, qw, dst, o, nmax, rmin, nstep, L, scales, mins):
    # one Q4_K/Q5_K super-block's scales into dst[o:o+16] and its levels into L
    if qw.size:
        sw = np.empty(8, np.float32)
        group_scales_imat(xb, qw, nmax, L, scales, mins, sw)
        d, dmin = put_scales_k4_imat(dst, o, scales, mins, sw, nmax == 31)
    else:
        max_scale, max_min = group_scales(xb, nmax, rmin, nstep, L, scales, mins)
        d, dmin = put_scales_k4(dst, o, max_scale, max_min, scales, mins)
    requantize_groups(xb, dst, o, d, dmin, nmax, L)


@nb.njit(**EXACT_FLAGS)
def quantize_row_q4_k(x, qw, dst):
    # x: f32[n], n % 256 == 0 -> dst: u8[n/256 * 144] (d, dmin, scales[12], qs[128]);
    # qw: importance weights f32[n], or empty
    L = np.empty(QK_K, np.uint8)
    scales = np.empty(8, np.float32)
    mins = np.empty(8, np.float32)
    for b in range(x.size // QK_K):
        xb = x[QK_K * b:QK_K * (b + 1)]
        o = 144 * b
        k4_block(xb, qw[QK_K * b:QK_K * (b + 1)], dst, o, 15, F32(-1.0), 20, L, scales, mins)
        for j in range(0, QK_K, 64):
            for i in range(32):
                dst[o + 16 + j // 2 + i] = L[j + i] | (L[j + i + 32] << 4)


@nb.njit(**EXACT_FLAGS)
def quantize_row_q5_k(x, qw, dst):
    # x: f32[n], n % 256 == 0 -> dst: u8[n/256 * 176] (d, dmin, scales[12], qh[32], qs[128])
    L = np.empty(QK_K, np.uint8)
    scales = np.empty(8, np.float32)
    mins = np.empty(8, np.float32)
    for b in range(x.size // QK_K):
        xb = x[QK_K * b:QK_K * (b + 1)]
        o = 176 * b
        k4_block(xb, qw[QK_K * b:QK_K * (b + 1)], dst, o, 31, F32(-0.5), 15, L, scales, mins)
        qh = dst[o + 16:o + 48]
        qh[:] = 0
        for k in range(4):
            for i in range(32):
                l1 = L[64 * k + i]
                l2 = L[64 * k + i + 32]
                if l1 > 15:
                    l1 -= 16
                    qh[i] |= 1 << (2 * k)
                if l2 > 15:
                    l2 -= 16
                    qh[i] |= 2 << (2 * k)
                dst[o + 48 + 32 * k + i] = l1 | (l2 << 4)


@nb.njit(**EXACT_FLAGS)
def quantize_row_q6_k(x, qw, dst):
    # x: f32[n], n % 256 == 0 -> dst: u8[n/256 * 210] (ql[128], qh[64], scales[16] i8, d);
    # qw: importance weights f32[n] (each group's fit weighted by them as they are), or empty
    L = np.empty(QK_K, np.uint8)
    scales = np.empty(16, np.float32)
    for b in range(x.size // QK_K):
        xb = x[QK_K * b:QK_K * (b + 1)]
        blk = dst[210 * b:210 * (b + 1)]
        max_scale = F32(0.0)
        max_abs_scale = F32(0.0)
        for g in range(16):
            w = qw[QK_K * b + 16 * g:QK_K * b + 16 * g + 16]
            scales[g] = make_qx_quants(xb[16 * g:16 * g + 16], 32, L[16 * g:16 * g + 16], w)
            if abs(scales[g]) > max_abs_scale:
                max_abs_scale = abs(scales[g])
                max_scale = scales[g]
        blk[:] = 0
        if max_abs_scale < GROUP_MAX_EPS:
            continue
        iscale = F32(-128.0) / max_scale
        hd = f32_to_f16(F32(1.0) / iscale)
        put_u16(blk, 208, hd)
        d = f16_to_f32(hd)
        for g in range(16):
            q = min(127, nearest_int(iscale * scales[g]))
            blk[192 + g] = np.uint8(q & 0xFF)
            dg = d * F32(q)
            if dg == 0:
                continue
            for i in range(16):
                L[16 * g + i] = max(-32, min(31, nearest_int(xb[16 * g + i] / dg))) + 32
        for h in range(2):
            for i in range(32):
                a = L[128 * h + i]
                c = L[128 * h + i + 32]
                e = L[128 * h + i + 64]
                f = L[128 * h + i + 96]
                blk[64 * h + i] = (a & 0xF) | ((e & 0xF) << 4)
                blk[64 * h + i + 32] = (c & 0xF) | ((f & 0xF) << 4)
                blk[128 + 32 * h + i] = (a >> 4) | ((c >> 4) << 2) | ((e >> 4) << 4) | ((f >> 4) << 6)
