"""Dequantization from the lane layout: rows of a group -> columns of a float32 tile.

What lives here: `unpack_group(kind, qs, qh, sc, d, w, g, r0, r1, tile, c0)`, which writes
rows g*R + r0 .. g*R + r1 - 1 of the weight as columns c0 .. of tile[n_cols, :], and the
per-type pieces it dispatches to. The matmul path fills a tile of many groups and hands
it to BLAS (out = x @ tile); the embedding lookup unpacks one lane into one row.
Writing rows as tile columns keeps the lane loop contiguous on both sides, so it
vectorizes. Values are bit-identical to dequant.py (same float32 expression and order,
no fast-math). What does not live here: the lane layout itself (repack.py).
"""

from __future__ import annotations

import numba as nb
import numpy as np
from gguf import GGMLQuantizationType as T

from .config import EXACT_FLAGS
from .fp16 import bf16_to_f32, f16_to_f32
from .quantize import IQ4_NL_LEVELS

F32 = np.float32
I32 = np.int32
LEVELS = IQ4_NL_LEVELS.astype(np.int32)


# Each kernel writes lanes r0..r1-1 of group g; lane r0 + i goes to column c0 + i. The
# lane loops index sliced views with i in range(n) so LLVM can prove the indices are
# non-negative, drop Numba's negative-index wraparound, and vectorize.


@nb.njit(**EXACT_FLAGS)
def unpack_q8_0(qs, d, g, r0, r1, tile, c0):
    # Q8_0: tile[32b + j, c0 + i] = code * d of lane r0 + i
    n = r1 - r0
    for b in range(qs.shape[1]):
        dw = d[g, b, 0, r0:r1]
        for j in range(32):
            out, q, sh = tile[32 * b + j, c0:c0 + n], qs[g, b, j >> 2, r0:r1], 8 * (j & 3)
            for i in range(n):
                out[i] = F32(np.int8(I32(q[i]) >> sh)) * f16_to_f32(dw[i])


@nb.njit(**EXACT_FLAGS)
def unpack_q4_q5(kind, qs, qh, d, g, r0, r1, tile, c0):
    # Q4_0 (kind 2), Q4_1 (3), Q5_0 (6), Q5_1 (7): tile[32b + j, c0 + i]
    # value j is the low (j < 16) or high nibble of byte j % 16 (byte j % 4 of word j % 16 / 4),
    # its fifth bit is bit j of the qh word
    n = r1 - r0
    for b in range(qs.shape[1]):
        dw, mw = d[g, b, 0, r0:r1], d[g, b, d.shape[2] - 1, r0:r1]  # (d, m) or (d,)
        for j in range(32):
            out, q, sh = tile[32 * b + j, c0:c0 + n], qs[g, b, (j & 15) >> 2, r0:r1], 8 * (j & 3) + 4 * (j >> 4)
            if kind == T.Q4_0:
                for i in range(n):
                    out[i] = f16_to_f32(dw[i]) * F32(I32(I32(I32(q[i]) >> sh) & 15) - 8)
            elif kind == T.Q4_1:
                for i in range(n):
                    out[i] = f16_to_f32(dw[i]) * F32(I32(I32(q[i]) >> sh) & 15) + f16_to_f32(mw[i])
            else:
                h, bit = qh[g, b, 0, r0:r1], I32(1 << j)
                if kind == T.Q5_0:
                    for i in range(n):
                        code = I32(I32(I32(q[i]) >> sh) & 15) | (16 if (I32(h[i]) & bit) != 0 else 0)
                        out[i] = f16_to_f32(dw[i]) * F32(code - 16)
                else:
                    for i in range(n):
                        code = I32(I32(I32(q[i]) >> sh) & 15) | (16 if (I32(h[i]) & bit) != 0 else 0)
                        out[i] = f16_to_f32(dw[i]) * F32(code) + f16_to_f32(mw[i])


@nb.njit(**EXACT_FLAGS)
def unpack_q4_k(qs, qh, sc, d, g, r0, r1, tile, c0):
    # Q4_K / Q5_K (qh has 0 or 32 bytes): tile[256b + 32i + l, c0 + lane]
    n = r1 - r0
    has_qh = qh.shape[2] > 0
    for b in range(qs.shape[1]):
        dw, dm = d[g, b, 0, r0:r1], d[g, b, 1, r0:r1]
        for s in range(8):  # sub-block s: nibble s % 2 of qs byte 32 (s // 2) + l, fifth bit s of qh byte l
            bit = I32(1 << s)
            scale, mins = sc[g, b, s, r0:r1], sc[g, b, 8 + s, r0:r1]
            for l in range(32):
                out, q = tile[256 * b + 32 * s + l, c0:c0 + n], qs[g, b, 8 * (s >> 1) + (l >> 2), r0:r1]
                h = qh[g, b, l >> 2, r0:r1] if has_qh else q
                sh, hsh = 8 * (l & 3) + 4 * (s & 1), 8 * (l & 3)
                for i in range(n):
                    code = I32(I32(I32(q[i]) >> sh) & 15)
                    if has_qh:
                        code |= 16 if (I32(I32(h[i]) >> hsh) & bit) != 0 else 0
                    out[i] = (f16_to_f32(dw[i]) * F32(scale[i])) * F32(code) - f16_to_f32(dm[i]) * F32(mins[i])


@nb.njit(**EXACT_FLAGS)
def unpack_q6_k(qs, qh, sc, d, g, r0, r1, tile, c0):
    # Q6_K: tile[256b + 128h + 32k + l, c0 + lane]
    n = r1 - r0
    for b in range(qs.shape[1]):
        dw = d[g, b, 0, r0:r1]
        for h in range(2):
            for k in range(4):
                for l in range(32):
                    sh_lo, sh_hi = 8 * (l & 3) + 4 * (k >> 1), 8 * (l & 3) + 2 * k
                    out = tile[256 * b + 128 * h + 32 * k + l, c0:c0 + n]
                    lo, hi = qs[g, b, 16 * h + 8 * (k & 1) + (l >> 2), r0:r1], qh[g, b, 8 * h + (l >> 2), r0:r1]
                    scale = sc[g, b, 8 * h + 2 * k + l // 16, r0:r1]
                    for i in range(n):
                        code = I32(I32(I32(lo[i]) >> sh_lo) & 15) | I32(I32(I32(I32(hi[i]) >> sh_hi) & 3) << 4)
                        out[i] = (f16_to_f32(dw[i]) * F32(np.int8(scale[i]))) * F32(code - 32)


@nb.njit(**EXACT_FLAGS)
def unpack_q2_q3(qs, qh, sc, d, g, r0, r1, tile, c0):
    # Q2_K (qh empty) and Q3_K: tile[256b + 128n + 32j + l, c0 + lane]; the code's 2 bits
    # at 2j of byte l % 4 of word 8n + l / 4, Q3_K's third bit 4n + j of that byte of hmask word l / 4
    n_lanes = r1 - r0
    q3 = qh.shape[2] > 0
    for b in range(qs.shape[1]):
        dw, dm = d[g, b, 0, r0:r1], d[g, b, d.shape[2] - 1, r0:r1]
        for n in range(2):
            for j in range(4):
                for l in range(32):
                    out, q = tile[256 * b + 128 * n + 32 * j + l, c0:c0 + n_lanes], qs[g, b, 8 * n + l // 4, r0:r1]
                    s = sc[g, b, 8 * n + 2 * j + l // 16, r0:r1]
                    sh = 8 * (l & 3) + 2 * j
                    if q3:
                        h, bit = qh[g, b, l // 4, r0:r1], 8 * (l & 3) + 4 * n + j
                        for i in range(n_lanes):
                            code = I32(I32(I32(q[i]) >> sh) & 3) - (0 if (I32(I32(h[i]) >> bit) & 1) != 0 else 4)
                            out[i] = F32(f16_to_f32(dw[i]) * F32(I32(s[i]) - 32)) * F32(code)
                    else:
                        for i in range(n_lanes):
                            code = I32(I32(I32(q[i]) >> sh) & 3)
                            out[i] = (F32(f16_to_f32(dw[i]) * F32(I32(s[i]) & 15)) * F32(code)
                                      - F32(f16_to_f32(dm[i]) * F32(I32(s[i]) >> 4)))


@nb.njit(**EXACT_FLAGS)
def unpack_iq4(qs, sc, d, g, r0, r1, tile, c0):
    # IQ4_NL (sc empty: blocks of 32, x = d * level) and IQ4_XS (sc: the 8 ls of a
    # super-block, x = (d * (ls - 32)) * level): tile[32 sb + j, c0 + lane] for 32-value
    # sub-block sb, whose codes are words 4 sb .. 4 sb + 3 of its (super-)block
    n = r1 - r0
    xs = sc.shape[2] > 0
    per = 8 if xs else 1  # 32-value sub-blocks per block
    dl = np.empty(n, np.float32)
    for b in range(qs.shape[1]):
        dw = d[g, b, 0, r0:r1]
        for ib in range(per):
            if xs:
                ls = sc[g, b, ib, r0:r1]
                for i in range(n):
                    dl[i] = F32(f16_to_f32(dw[i]) * F32(I32(ls[i]) - 32))
            else:
                for i in range(n):
                    dl[i] = f16_to_f32(dw[i])
            for j in range(32):
                out, q = tile[32 * (per * b + ib) + j, c0:c0 + n], qs[g, b, 4 * ib + ((j & 15) >> 2), r0:r1]
                sh = 8 * (j & 3) + 4 * (j >> 4)
                for i in range(n):
                    out[i] = dl[i] * F32(LEVELS[I32(I32(q[i]) >> sh) & 15])


@nb.njit(**EXACT_FLAGS)
def unpack_float(kind, w, d, g, r0, r1, tile, c0):
    # F32 (w: f32[G, n, R]) or F16/BF16 (d: u16[G, n, 1, R], the bits): tile[j, c0 + lane]
    n = r1 - r0
    for j in range(tile.shape[0]):
        out = tile[j, c0:c0 + n]
        if kind == T.F32:
            src = w[g, j, r0:r1]
            for i in range(n):
                out[i] = src[i]
        else:
            bits = d[g, j, 0, r0:r1]
            for i in range(n):
                out[i] = f16_to_f32(bits[i]) if kind == T.F16 else bf16_to_f32(bits[i])


@nb.njit(**EXACT_FLAGS)
def unpack_group(kind, qs, qh, sc, d, w, g, r0, r1, tile, c0):
    # any type (kind = ggml type id); F16/BF16 bits travel in d as u16[G, n, 1, R]
    if kind == T.Q4_K or kind == T.Q5_K:
        unpack_q4_k(qs, qh, sc, d, g, r0, r1, tile, c0)
    elif kind == T.Q6_K:
        unpack_q6_k(qs, qh, sc, d, g, r0, r1, tile, c0)
    elif kind == T.F32 or kind == T.F16 or kind == T.BF16:
        unpack_float(kind, w, d, g, r0, r1, tile, c0)
    elif kind == T.Q8_0:
        unpack_q8_0(qs, d, g, r0, r1, tile, c0)
    elif kind == T.IQ4_NL or kind == T.IQ4_XS:
        unpack_iq4(qs, sc, d, g, r0, r1, tile, c0)
    elif kind == T.Q2_K or kind == T.Q3_K:
        unpack_q2_q3(qs, qh, sc, d, g, r0, r1, tile, c0)
    else:
        unpack_q4_q5(kind, qs, qh, d, g, r0, r1, tile, c0)
