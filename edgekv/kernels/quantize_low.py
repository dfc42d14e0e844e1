"""Quantizers for the low-bit weight types: one row of float32 -> Q2_K, Q3_K, IQ4_NL or IQ4_XS
blocks, bit-exact with what llama-quantize writes.

What lives here: `quantize_row_q2_k/q3_k(x, qw, dst)` (without importance weights, qw empty,
ggml's quantize_row_q2_K_ref and quantize_row_q3_K_ref; with them its quantize_row_q*_K_impl,
which fit the sub-block scales to the weights), and `quantize_row_iq4(x, qw, dst, super_block)`: ggml's
quantize_row_iq4_nl_impl with the 15 extra scale tries llama-quantize always asks for (ntry 7;
the KV cache's IQ4_NL is the reference quantizer without them, kernels/quantize.py), for
IQ4_NL (32-value blocks) and IQ4_XS (256-value super-blocks of eight 6-bit sub-scales), with or
without importance weights. The float32 discipline is quantize_k.py's: ggml-quants.c step by
step, no fast-math, no FMA, every constant a float32. What does not live here: the block
layouts (gguf/quants.py), the dequantizers (dequant.py), the per-tensor type rules
(quantize/plan.py).
"""

from __future__ import annotations

import numba as nb
import numpy as np

from .config import EXACT_FLAGS
from .fp16 import f16_to_f32, f32_to_f16, nearest_int
from .quantize import IQ4_NL_LEVELS, nearest_level, put_u16
from .quantize_search import (GROUP_MAX_EPS, importance_weights, make_q3_quants, make_qkx2_quants, make_qp_quants,
                              make_qx_quants, sum_squares)

QK_K = 256

F32 = np.float32
Q2_K_BYTES = 84  # scales[16] (scale | min << 4), qs[64], d, dmin
Q3_K_BYTES = 110  # hmask[32], qs[64], scales[12] (6-bit, offset 32), d
IQ4_XS_BYTES = 136  # d, scales_h (u16), scales_l[4], qs[128]


@nb.njit(**EXACT_FLAGS)
def pack_2bit(L, dst, o):
    # the low 2 bits of 256 levels: byte j/4 + l holds L[j+l], L[j+l+32], L[j+l+64], L[j+l+96]
    for j in range(0, QK_K, 128):
        for i in range(32):
            dst[o + j // 4 + i] = ((L[j + i] & 3) | ((L[j + i + 32] & 3) << 2)
                                   | ((L[j + i + 64] & 3) << 4) | ((L[j + i + 96] & 3) << 6))


@nb.njit(**EXACT_FLAGS)
def q2_k_block(xb, blk, L):
    # one super-block: 16 groups of 16, each levels 0..3 of x ~ d*sc*L - dmin*m by a
    # mean-absolute-error search weighted by |x|; 4-bit scales and mins under two f16 steps
    weights = np.empty(16, np.float32)
    laux = np.empty(16, np.uint8)
    scales = np.empty(16, np.float32)
    mins = np.empty(16, np.float32)
    max_scale = F32(0.0)
    max_min = F32(0.0)
    for j in range(16):
        g = xb[16 * j:16 * j + 16]
        for i in range(16):
            weights[i] = abs(g[i])
        scales[j], mins[j] = make_qkx2_quants(g, weights, 3, L[16 * j:16 * j + 16], laux,
                                              F32(-0.5), F32(0.1), 15, True)
        if scales[j] > max_scale:
            max_scale = scales[j]
        if mins[j] > max_min:
            max_min = mins[j]
    hd = np.uint16(0)
    for j in range(16):
        blk[j] = 0
    if max_scale > 0:
        iscale = F32(15.0) / max_scale
        for j in range(16):
            blk[j] = np.uint8(nearest_int(iscale * scales[j]) & 0xFF)
        hd = f32_to_f16(max_scale / F32(15.0))
    hm = np.uint16(0)
    if max_min > 0:
        iscale = F32(15.0) / max_min
        for j in range(16):
            blk[j] |= np.uint8((nearest_int(iscale * mins[j]) << 4) & 0xFF)
        hm = f32_to_f16(max_min / F32(15.0))
    put_u16(blk, 80, hd)
    put_u16(blk, 82, hm)
    requantize_q2(xb, blk, f16_to_f32(hd), f16_to_f32(hm), L)
    pack_2bit(L, blk, 16)


@nb.njit(**EXACT_FLAGS)
def requantize_q2(xb, blk, d, dmin, L):
    # levels against the stored 4-bit scales and mins; a group of scale 0 keeps its search's
    for j in range(16):
        dj = d * F32(blk[j] & 0xF)
        if dj == 0:
            continue
        dm = dmin * F32(blk[j] >> 4)
        for i in range(16):
            L[16 * j + i] = max(0, min(3, nearest_int((xb[16 * j + i] + dm) / dj)))


@nb.njit(**EXACT_FLAGS)
def q2_k_block_imat(xb, qw, blk, L):
    # one super-block with importance weights: groups fitted with weights qw*sqrt(sigma2 + x^2),
    # sigma2 = mean(x^2); the 4-bit scales and mins by make_qp_quants against the group weights
    weight = np.empty(16, np.float32)
    laux = np.empty(16, np.uint8)
    scales = np.empty(16, np.float32)
    mins = np.empty(16, np.float32)
    sw = np.empty(16, np.float32)
    ls = np.empty(16, np.uint8)
    lm = np.empty(16, np.uint8)
    sigma2 = sum_squares(xb) / F32(QK_K)
    for j in range(16):
        g = xb[16 * j:16 * j + 16]
        sw[j] = importance_weights(g, qw[16 * j:16 * j + 16], sigma2, weight)
        scales[j], mins[j] = make_qkx2_quants(g, weight, 3, L[16 * j:16 * j + 16], laux,
                                              F32(-0.9), F32(0.05), 36)
    hd = f32_to_f16(make_qp_quants(scales, 15, ls, sw))
    hm = f32_to_f16(make_qp_quants(mins, 15, lm, sw))
    put_u16(blk, 80, hd)
    put_u16(blk, 82, hm)
    for j in range(16):
        blk[j] = ls[j] | ((lm[j] << 4) & 0xFF)
    requantize_q2(xb, blk, f16_to_f32(hd), f16_to_f32(hm), L)
    pack_2bit(L, blk, 16)


@nb.njit(**EXACT_FLAGS)
def quantize_row_q2_k(x, qw, dst):
    # x: f32[n], n % 256 == 0 -> dst: u8[n/256 * 84]; qw: importance weights f32[n], or empty
    L = np.empty(QK_K, np.uint8)
    for b in range(x.size // QK_K):
        blk = dst[Q2_K_BYTES * b:Q2_K_BYTES * (b + 1)]
        if qw.size:
            q2_k_block_imat(x[QK_K * b:QK_K * (b + 1)], qw[QK_K * b:QK_K * (b + 1)], blk, L)
        else:
            q2_k_block(x[QK_K * b:QK_K * (b + 1)], blk, L)


@nb.njit(**EXACT_FLAGS)
def put_scales_q3(sc, j, l):
    # group j's 6-bit scale code l (0..63) into a Q3_K block's 12 scale bytes
    if j < 8:
        sc[j] = l & 0xF
    else:
        sc[j - 8] |= (l & 0xF) << 4
    sc[j % 4 + 8] |= (l >> 4) << (2 * (j // 4))


@nb.njit(**EXACT_FLAGS)
def scale_q3(sc, j):
    # group j's signed scale (-32..31) from a Q3_K block's 12 scale bytes
    low = np.int32(sc[j]) & 0xF if j < 8 else np.int32(sc[j - 8]) >> 4
    return (low | (((np.int32(sc[8 + j % 4]) >> (2 * (j // 4))) & 3) << 4)) - 32


@nb.njit(**EXACT_FLAGS)
def finish_q3_k(xb, blk, L):
    # given the scales and d in blk: the levels against them (a group of scale 0 keeps its
    # search's), the high bits into hmask and the low two into qs
    sc = blk[96:108]
    d = f16_to_f32(np.uint16(blk[108]) | (np.uint16(blk[109]) << 8))
    for j in range(16):
        dj = d * F32(scale_q3(sc, j))
        if dj == 0:
            continue
        for i in range(16):
            L[16 * j + i] = max(-4, min(3, nearest_int(xb[16 * j + i] / dj))) + 4
    for m in range(32):
        blk[m] = 0
    for j in range(QK_K):
        if L[j] > 3:
            blk[j % 32] |= 1 << (j // 32)
            L[j] -= 4
    pack_2bit(L, blk, 32)


@nb.njit(**EXACT_FLAGS)
def q3_k_block(xb, blk, L):
    # one super-block: 16 groups of 16, each 3-bit levels of x ~ d*sc*(L - 4), the signed
    # group scales as 6-bit codes of -32/max_scale
    scales = np.empty(16, np.float32)
    max_scale = F32(0.0)
    amax = F32(0.0)
    for j in range(16):
        scales[j] = make_q3_quants(xb[16 * j:16 * j + 16], 4, L[16 * j:16 * j + 16])
        if abs(scales[j]) > amax:
            amax = abs(scales[j])
            max_scale = scales[j]
    sc = blk[96:108]
    sc[:] = 0
    hd = np.uint16(0)
    if max_scale != 0:
        iscale = F32(-32.0) / max_scale
        for j in range(16):
            put_scales_q3(sc, j, max(-32, min(31, nearest_int(iscale * scales[j]))) + 32)
        hd = f32_to_f16(F32(1.0) / iscale)
    put_u16(blk, 108, hd)
    finish_q3_k(xb, blk, L)


@nb.njit(**EXACT_FLAGS)
def q3_k_block_imat(xb, qw, blk, L):
    # one super-block with importance weights: each group by make_qx_quants weighted by
    # qw*sqrt(sigma2 + x^2), sigma2 = 2*mean(x^2); the 6-bit scales fitted to the group scales
    # the same way, weighted by the groups' weights
    weight = np.empty(16, np.float32)
    scales = np.empty(16, np.float32)
    sw = np.empty(16, np.float32)
    ls = np.empty(16, np.int8)
    sigma2 = F32(2.0) * sum_squares(xb) / F32(QK_K)
    for j in range(16):
        g = xb[16 * j:16 * j + 16]
        sw[j] = importance_weights(g, qw[16 * j:16 * j + 16], sigma2, weight)
        scales[j] = make_qx_quants(g, 4, L[16 * j:16 * j + 16], weight)
    sc = blk[96:108]
    sc[:] = 0
    d_block = make_qx_quants(scales, 32, ls, sw)
    for j in range(16):
        put_scales_q3(sc, j, np.int32(ls[j]))
    put_u16(blk, 108, f32_to_f16(d_block))
    finish_q3_k(xb, blk, L)


@nb.njit(**EXACT_FLAGS)
def quantize_row_q3_k(x, qw, dst):
    # x: f32[n], n % 256 == 0 -> dst: u8[n/256 * 110]; qw: importance weights f32[n], or empty
    L = np.empty(QK_K, np.int8)
    for b in range(x.size // QK_K):
        blk = dst[Q3_K_BYTES * b:Q3_K_BYTES * (b + 1)]
        if qw.size:
            q3_k_block_imat(x[QK_K * b:QK_K * (b + 1)], qw[QK_K * b:QK_K * (b + 1)], blk, L)
        else:
            q3_k_block(x[QK_K * b:QK_K * (b + 1)], blk, L)


@nb.njit(**EXACT_FLAGS)
def iq4_all_sums(xb, weight, inv, sumqx, sumq2):
    # for each inverse scale inv[t]: sum w*q*x and sum w*q*q over the levels q nearest
    # inv[t]*x, each sum in the order of x as ggml adds it; the tries side by side, so the
    # float additions of one try do not wait on each other's latency
    sumqx[:] = 0
    sumq2[:] = 0
    for j in range(xb.size):
        x, w = xb[j], weight[j]
        for t in range(inv.size):
            q = F32(IQ4_NL_LEVELS[nearest_level(IQ4_NL_LEVELS, inv[t] * x)])
            sumqx[t] += w * q * x
            sumq2[t] += w * q * q


@nb.njit(**EXACT_FLAGS)
def iq4_scale(xb, weight, inv, sumqx, sumq2):
    # the scale of one 32-value block: the least-squares d for the levels nearest x/(max/-127),
    # then for 15 inverse scales (v0 + t)/max, t = -7..7, kept when the weighted fit improves
    # (inv, sumqx, sumq2: f32[16] scratch)
    amax = F32(0.0)
    mx = F32(0.0)
    for j in range(xb.size):
        if abs(xb[j]) > amax:
            amax = abs(xb[j])
            mx = xb[j]
    if amax < GROUP_MAX_EPS:
        return F32(0.0)
    v0 = F32(IQ4_NL_LEVELS[0])
    inv[0] = F32(1.0) / (-mx / v0)
    for t in range(-7, 8):
        inv[t + 8] = F32(t + IQ4_NL_LEVELS[0]) / mx
    iq4_all_sums(xb, weight, inv, sumqx, sumq2)
    d = sumqx[0] / sumq2[0] if sumq2[0] > 0 else F32(0.0)
    best = d * sumqx[0]
    for t in range(1, 16):
        if sumq2[t] > 0 and sumqx[t] * sumqx[t] > best * sumq2[t]:
            d = sumqx[t] / sumq2[t]
            best = d * sumqx[t]
    return d


@nb.njit(**EXACT_FLAGS)
def iq4_weights(xb, qw, sigma2, weight):
    # x^2, or with importance weights qw: qw * sqrt(sigma2 + x^2)
    if qw.size:
        importance_weights(xb, qw, sigma2, weight)
        return
    for j in range(xb.size):
        weight[j] = xb[j] * xb[j]


@nb.njit(**EXACT_FLAGS)
def iq4_codes(xb, inv, L, o):
    for j in range(xb.size):
        L[o + j] = nearest_level(IQ4_NL_LEVELS, inv * xb[j])


@nb.njit(**EXACT_FLAGS)
def iq4_super_block(xs, qw, blk, L, scales, weight):
    # ggml's quantize_row_iq4_nl_impl with ntry 7 over xs (32 values: IQ4_NL; 256: IQ4_XS)
    n_sub = xs.size // 32
    inv = np.empty(16, np.float32)
    sumqx = np.empty(16, np.float32)
    sumq2 = np.empty(16, np.float32)
    sigma2 = sum_squares(xs) * (F32(2.0) / F32(xs.size))
    max_scale = F32(0.0)
    amax_scale = F32(0.0)
    for ib in range(n_sub):
        xb = xs[32 * ib:32 * ib + 32]
        iq4_weights(xb, qw[32 * ib:32 * ib + 32] if qw.size else qw, sigma2, weight)
        scales[ib] = iq4_scale(xb, weight, inv, sumqx, sumq2)
        if abs(scales[ib]) > amax_scale:
            amax_scale = abs(scales[ib])
            max_scale = scales[ib]
    if n_sub == 1:
        put_u16(blk, 0, f32_to_f16(scales[0]))
        iq4_codes(xs, F32(1.0) / scales[0] if scales[0] != 0 else F32(0.0), L, 0)
        q = 2
    else:
        d = -max_scale / F32(32.0)
        put_u16(blk, 0, f32_to_f16(d))
        inv = F32(1.0) / d if d != 0 else F32(0.0)
        scales_h = 0
        for ib in range(n_sub):
            lv = max(-32, min(31, nearest_int(inv * scales[ib])))
            dl = d * F32(lv)
            iq4_codes(xs[32 * ib:32 * ib + 32], F32(1.0) / dl if dl != 0 else F32(0.0), L, 32 * ib)
            lv += 32
            if ib % 2 == 0:
                blk[4 + ib // 2] = lv & 0xF
            else:
                blk[4 + ib // 2] |= (lv & 0xF) << 4
            scales_h |= (lv >> 4) << (2 * ib)
        put_u16(blk, 2, scales_h)
        q = 8
    for i in range(n_sub):
        for j in range(16):
            blk[q + 16 * i + j] = L[32 * i + j] | (L[32 * i + 16 + j] << 4)


@nb.njit(**EXACT_FLAGS)
def quantize_row_iq4(x, qw, dst, super_block):
    # x: f32[n] -> IQ4_NL (super_block 32: 18-byte blocks) or IQ4_XS (256: 136 bytes);
    # qw: importance weights f32[n], or empty for none
    nbytes = 18 if super_block == 32 else IQ4_XS_BYTES
    L = np.empty(super_block, np.uint8)
    scales = np.empty(super_block // 32, np.float32)
    weight = np.empty(32, np.float32)
    for b in range(x.size // super_block):
        w = qw[super_block * b:super_block * (b + 1)] if qw.size else qw
        iq4_super_block(x[super_block * b:super_block * (b + 1)], w, dst[nbytes * b:nbytes * (b + 1)],
                        L, scales, weight)
