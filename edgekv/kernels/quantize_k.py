"""Quantizers for the K-quant weight types: one row of float32 -> Q4_K, Q5_K or Q6_K blocks,
bit-exact with ggml's reference quantizers (what llama-quantize runs without an imatrix).

What lives here: `quantize_row_q4_k/q5_k/q6_k(x, dst)` and the two scale searches they use,
`make_qkx2_quants` (scale and min of a 32-value group, Q4_K/Q5_K) and `make_qx_quants`
(symmetric scale of a 16-value group, Q6_K). The arithmetic is ggml-quants.c's step by step in
float32, compiled without fast-math: ggml builds that file in its base library with no
architecture flags, so on x86-64 nothing is contracted into an FMA, and neither is anything
here. Every constant is a float32 (`F32(...)`): in Numba a float32 times a Python number is a
float64, which would round differently. What does not live here: the legacy types
(quantize.py), the dequantizers (dequant.py), the block layouts (gguf/quants.py).
"""

from __future__ import annotations

import numba as nb
import numpy as np
from gguf import GGMLQuantizationType as T

from .config import EXACT_FLAGS
from .fp16 import f16_to_f32, f32_to_f16, nearest_int
from .quantize import put_u16, quantize_row

F32 = np.float32
QK_K = 256
GROUP_MAX_EPS = np.float32(1e-15)


@nb.njit(**EXACT_FLAGS)
def make_qkx2_quants(x, weights, nmax, L, Laux, rmin, rdelta, nstep):
    # ggml's make_qkx2_quants (use_mad = false): levels L in [0, nmax] of x ~ scale*L - min,
    # searching nstep+1 inverse scales for the least weighted squared error; -> (scale, min)
    n = x.size
    mn = x[0]
    mx = x[0]
    sum_w = weights[0]
    sum_x = sum_w * x[0]
    for i in range(1, n):
        if x[i] < mn:
            mn = x[i]
        if x[i] > mx:
            mx = x[i]
        w = weights[i]
        sum_w += w
        sum_x += w * x[i]
    if mn > 0:
        mn = F32(0.0)
    if mx == mn:
        for i in range(n):
            L[i] = 0
        return F32(0.0), -mn
    iscale = F32(nmax) / (mx - mn)
    scale = F32(1.0) / iscale
    best_error = F32(0.0)
    for i in range(n):
        L[i] = max(0, min(nmax, nearest_int(iscale * (x[i] - mn))))
        diff = scale * F32(L[i]) + mn - x[i]
        best_error += weights[i] * (diff * diff)
    for step in range(nstep + 1):
        iscale = (rmin + rdelta * F32(step) + F32(nmax)) / (mx - mn)
        sum_l = F32(0.0)
        sum_l2 = F32(0.0)
        sum_xl = F32(0.0)
        for i in range(n):
            lv = max(0, min(nmax, nearest_int(iscale * (x[i] - mn))))
            Laux[i] = lv
            w = weights[i]
            lf = F32(lv)
            sum_l += w * lf
            sum_l2 += w * lf * lf
            sum_xl += w * lf * x[i]
        D = sum_w * sum_l2 - sum_l * sum_l
        if D > 0:
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
            if this_min > 0:
                this_min = F32(0.0)
                this_scale = sum_xl / sum_l2
            cur_error = F32(0.0)
            for i in range(n):
                diff = this_scale * F32(Laux[i]) + this_min - x[i]
                cur_error += weights[i] * (diff * diff)
            if cur_error < best_error:
                for i in range(n):
                    L[i] = Laux[i]
                best_error = cur_error
                scale = this_scale
                mn = this_min
    return scale, -mn


@nb.njit(**EXACT_FLAGS)
def qx_sums(x, nmax, iscale):
    # sum w*x*l and sum w*l*l over the levels l of x at iscale, w = x*x (rmse_type 1)
    sumlx = F32(0.0)
    suml2 = F32(0.0)
    for i in range(x.size):
        lf = F32(max(-nmax, min(nmax - 1, nearest_int(iscale * x[i]))))
        w = x[i] * x[i]
        sumlx += w * x[i] * lf
        suml2 += w * lf * lf
    return sumlx, suml2


@nb.njit(**EXACT_FLAGS)
def qx_levels(x, nmax, iscale, L):
    for i in range(x.size):
        L[i] = nmax + max(-nmax, min(nmax - 1, nearest_int(iscale * x[i])))


@nb.njit(**EXACT_FLAGS)
def make_qx_quants(x, nmax, L):
    # ggml's make_qx_quants with rmse_type 1 and no weights: levels L in [0, 2*nmax) of
    # x ~ scale*(L - nmax), trying 18 inverse scales around -nmax/max; -> scale
    mx = F32(0.0)
    amax = F32(0.0)
    for i in range(x.size):
        ax = abs(x[i])
        if ax > amax:
            amax = ax
            mx = x[i]
    if amax < GROUP_MAX_EPS:
        for i in range(x.size):
            L[i] = 0
        return F32(0.0)
    iscale = F32(-nmax) / mx
    qx_levels(x, nmax, iscale, L)
    sumlx, suml2 = qx_sums(x, nmax, iscale)
    scale = sumlx / suml2 if suml2 != 0 else F32(0.0)
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        iscale = -(F32(nmax) + F32(0.1) * F32(step)) / mx
        sumlx, suml2 = qx_sums(x, nmax, iscale)
        if suml2 > 0 and sumlx * sumlx > best * suml2:
            qx_levels(x, nmax, iscale, L)
            scale = sumlx / suml2
            best = scale * sumlx
    return scale


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
def k4_block(xb, dst, o, nmax, rmin, nstep, L, scales, mins):
    # one Q4_K/Q5_K super-block's scales into dst[o:o+16] and its levels into L
    max_scale, max_min = group_scales(xb, nmax, rmin, nstep, L, scales, mins)
    d, dmin = put_scales_k4(dst, o, max_scale, max_min, scales, mins)
    requantize_groups(xb, dst, o, d, dmin, nmax, L)


@nb.njit(**EXACT_FLAGS)
def quantize_row_q4_k(x, dst):
    # x: f32[n], n % 256 == 0 -> dst: u8[n/256 * 144] (d, dmin, scales[12], qs[128])
    L = np.empty(QK_K, np.uint8)
    scales = np.empty(8, np.float32)
    mins = np.empty(8, np.float32)
    for b in range(x.size // QK_K):
        xb = x[QK_K * b:QK_K * (b + 1)]
        o = 144 * b
        k4_block(xb, dst, o, 15, F32(-1.0), 20, L, scales, mins)
        for j in range(0, QK_K, 64):
            for i in range(32):
                dst[o + 16 + j // 2 + i] = L[j + i] | (L[j + i + 32] << 4)


@nb.njit(**EXACT_FLAGS)
def quantize_row_q5_k(x, dst):
    # x: f32[n], n % 256 == 0 -> dst: u8[n/256 * 176] (d, dmin, scales[12], qh[32], qs[128])
    L = np.empty(QK_K, np.uint8)
    scales = np.empty(8, np.float32)
    mins = np.empty(8, np.float32)
    for b in range(x.size // QK_K):
        xb = x[QK_K * b:QK_K * (b + 1)]
        o = 176 * b
        k4_block(xb, dst, o, 31, F32(-0.5), 15, L, scales, mins)
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
def quantize_row_q6_k(x, dst):
    # x: f32[n], n % 256 == 0 -> dst: u8[n/256 * 210] (ql[128], qh[64], scales[16] i8, d)
    L = np.empty(QK_K, np.uint8)
    scales = np.empty(16, np.float32)
    for b in range(x.size // QK_K):
        xb = x[QK_K * b:QK_K * (b + 1)]
        blk = dst[210 * b:210 * (b + 1)]
        max_scale = F32(0.0)
        max_abs_scale = F32(0.0)
        for g in range(16):
            scales[g] = make_qx_quants(xb[16 * g:16 * g + 16], 32, L[16 * g:16 * g + 16])
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


@nb.njit(**EXACT_FLAGS)
def quantize_weight_row(x, ggml_type, dst):
    # one row into any weight type llama-quantize writes without an imatrix
    if ggml_type == T.Q4_K:
        quantize_row_q4_k(x, dst)
    elif ggml_type == T.Q5_K:
        quantize_row_q5_k(x, dst)
    elif ggml_type == T.Q6_K:
        quantize_row_q6_k(x, dst)
    else:
        quantize_row(x, ggml_type, dst)


@nb.njit(**dict(EXACT_FLAGS, parallel=True))
def quantize_weight_rows(src, ggml_type, dst):
    # src: f32[n_rows, n]; dst: u8[n_rows, row_nbytes]; rows are independent, so any split
    # over threads gives the same bytes
    for i in nb.prange(src.shape[0]):
        quantize_weight_row(src[i], ggml_type, dst[i])
