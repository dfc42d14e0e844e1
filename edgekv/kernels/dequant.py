"""Dequantization of ggml blocks in their file layout: one row of bytes -> float32.

What lives here: one `dequant_row_<type>(src, dst)` per supported ggml type, reading the
exact bytes a GGUF file (or a quantized KV-cache row) holds, and `dequantize_rows`, a
parallel driver over many rows. The row functions are plain @njit, so other kernels
(the KV cache, attention) can call them. What does not: the block layouts themselves
(drawn in edgekv/gguf/quants.py), quantizers (quantize.py) and the repacked layout the matvec
kernels read (repack.py).

Every row function evaluates the same float32 expression, in the same order, as ggml's
dequantize_row_* and the `gguf` package, so results are bit-identical to both.
"""

from __future__ import annotations

import numba as nb
import numpy as np
from gguf import GGMLQuantizationType as T

from .config import EXACT_FLAGS
from .fp16 import bf16_to_f32, f16_to_f32
from .quantize import IQ4_NL_LEVELS as IQ4_NL_CODES

F32 = np.float32
I32 = np.int32


@nb.njit(**EXACT_FLAGS)
def half_at(src, o):
    # src: u8[...]; o: byte offset of a little-endian uint16 -> its float32 value as a half
    return f16_to_f32(np.uint16(src[o]) | np.uint16(np.uint16(src[o + 1]) << 8))


@nb.njit(**EXACT_FLAGS)
def scale_min_k4(s, o, j):
    # 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes at s[o:o+12]
    if j < 4:
        return I32(s[o + j] & 63), I32(s[o + j + 4] & 63)
    sc = (s[o + j + 4] & 0xF) | ((s[o + j - 4] >> 6) << 4)
    mn = (s[o + j + 4] >> 4) | ((s[o + j] >> 6) << 4)
    return I32(sc), I32(mn)


@nb.njit(**EXACT_FLAGS)
def dequant_row_f32(src, dst):
    # src: u8[4n] little-endian float32; dst: f32[n]
    v = src.view(np.float32)
    for i in range(dst.size):
        dst[i] = v[i]


@nb.njit(**EXACT_FLAGS)
def dequant_row_f16(src, dst):
    # src: u8[2n] IEEE halves; dst: f32[n]
    for i in range(dst.size):
        dst[i] = half_at(src, 2 * i)


@nb.njit(**EXACT_FLAGS)
def dequant_row_bf16(src, dst):
    # src: u8[2n] bfloat16; dst: f32[n]
    for i in range(dst.size):
        dst[i] = bf16_to_f32(np.uint16(src[2 * i]) | np.uint16(np.uint16(src[2 * i + 1]) << 8))


@nb.njit(**EXACT_FLAGS)
def dequant_row_q8_0(src, dst):
    # src: u8[n/32 * 34] blocks {f16 d; i8 qs[32]}; dst: f32[n]
    for b in range(dst.size // 32):
        o = 34 * b
        d = half_at(src, o)
        for j in range(32):
            dst[32 * b + j] = F32(np.int8(src[o + 2 + j])) * d


@nb.njit(**EXACT_FLAGS)
def dequant_nibble_row(src, dst, levels):
    # src: u8[n/32 * 18] blocks {f16 d; u8 qs[16]}; x = d * levels[code], code j in the low
    # nibble of byte j, code j + 16 in its high nibble (Q4_0's and IQ4_NL's layout)
    for b in range(dst.size // 32):
        o = 18 * b
        d = half_at(src, o)
        for j in range(16):
            q = src[o + 2 + j]
            dst[32 * b + j] = d * levels[q & 15]
            dst[32 * b + j + 16] = d * levels[q >> 4]


Q4_0_LEVELS = np.arange(-8, 8, dtype=np.float32)  # q - 8, exact in float32
IQ4_NL_LEVELS = IQ4_NL_CODES.astype(np.float32)


@nb.njit(**EXACT_FLAGS)
def dequant_row_q4_0(src, dst):
    # x = d * (q - 8)
    dequant_nibble_row(src, dst, Q4_0_LEVELS)


@nb.njit(**EXACT_FLAGS)
def dequant_row_iq4_nl(src, dst):
    # x = d * levels[q] (IQ4_NL's 16 levels)
    dequant_nibble_row(src, dst, IQ4_NL_LEVELS)


@nb.njit(**EXACT_FLAGS)
def iq4_xs_scale(src, o, ib):
    # sub-block ib's 6-bit scale of the IQ4_XS block at o, minus 32: 4 low bits from
    # scales_l (nibble ib % 2 of byte ib / 2), 2 high bits from the u16 scales_h (bits 2ib..)
    lo = I32(I32(src[o + 4 + ib // 2]) >> (4 * (ib % 2))) & 15
    hi = I32(I32(src[o + 2 + ib // 4]) >> (2 * (ib % 4))) & 3
    return I32(lo | I32(hi << 4)) - 32


@nb.njit(**EXACT_FLAGS)
def dequant_row_iq4_xs(src, dst):
    # src: u8[n/256 * 136] {f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128]}; sub-block ib
    # (values 32ib..) has bytes qs[16ib..16ib+15] as IQ4_NL's: x = (d * (ls - 32)) * levels[q]
    for b in range(dst.size // 256):
        o = 136 * b
        d = half_at(src, o)
        for ib in range(8):
            dl = F32(d * F32(iq4_xs_scale(src, o, ib)))
            for j in range(16):
                q = src[o + 8 + 16 * ib + j]
                dst[256 * b + 32 * ib + j] = dl * IQ4_NL_LEVELS[q & 15]
                dst[256 * b + 32 * ib + j + 16] = dl * IQ4_NL_LEVELS[q >> 4]


@nb.njit(**EXACT_FLAGS)
def dequant_row_q4_1(src, dst):
    # src: u8[n/32 * 20] blocks {f16 d; f16 m; u8 qs[16]}; x = d * q + m
    for b in range(dst.size // 32):
        o = 20 * b
        d = half_at(src, o)
        m = half_at(src, o + 2)
        for j in range(16):
            q = src[o + 4 + j]
            dst[32 * b + j] = d * F32(q & 15) + m
            dst[32 * b + j + 16] = d * F32(q >> 4) + m


@nb.njit(**EXACT_FLAGS)
def q5_high_bits(src, o):
    # the 32 fifth bits of a Q5 block, stored as a little-endian uint32 at src[o:o+4]
    return (np.uint32(src[o]) | (np.uint32(src[o + 1]) << 8)
            | (np.uint32(src[o + 2]) << 16) | (np.uint32(src[o + 3]) << 24))


@nb.njit(**EXACT_FLAGS)
def dequant_row_q5_0(src, dst):
    # src: u8[n/32 * 22] blocks {f16 d; u32 qh; u8 qs[16]}; x = d * (q - 16)
    for b in range(dst.size // 32):
        o = 22 * b
        d = half_at(src, o)
        qh = q5_high_bits(src, o + 2)
        for j in range(16):
            q = src[o + 6 + j]
            lo = I32(q & 15) | I32(((qh >> j) & 1) << 4)
            hi = I32(q >> 4) | I32(((qh >> (j + 16)) & 1) << 4)
            dst[32 * b + j] = d * F32(lo - 16)
            dst[32 * b + j + 16] = d * F32(hi - 16)


@nb.njit(**EXACT_FLAGS)
def dequant_row_q5_1(src, dst):
    # src: u8[n/32 * 24] blocks {f16 d; f16 m; u32 qh; u8 qs[16]}; x = d * q + m
    for b in range(dst.size // 32):
        o = 24 * b
        d = half_at(src, o)
        m = half_at(src, o + 2)
        qh = q5_high_bits(src, o + 4)
        for j in range(16):
            q = src[o + 8 + j]
            lo = I32(q & 15) | I32(((qh >> j) & 1) << 4)
            hi = I32(q >> 4) | I32(((qh >> (j + 16)) & 1) << 4)
            dst[32 * b + j] = d * F32(lo) + m
            dst[32 * b + j + 16] = d * F32(hi) + m


@nb.njit(**EXACT_FLAGS)
def dequant_row_q4_k(src, dst):
    # src: u8[n/256 * 144] {f16 d, dmin; u8 scales[12]; u8 qs[128]}; x = (d*sc)*q - dmin*m
    for b in range(dst.size // 256):
        o = 144 * b
        d = half_at(src, o)
        dmin = half_at(src, o + 2)
        for j in range(4):
            sc0, m0 = scale_min_k4(src, o + 4, 2 * j)
            sc1, m1 = scale_min_k4(src, o + 4, 2 * j + 1)
            d0, d1 = d * F32(sc0), d * F32(sc1)
            mm0, mm1 = dmin * F32(m0), dmin * F32(m1)
            for l in range(32):
                q = src[o + 16 + 32 * j + l]
                dst[256 * b + 64 * j + l] = d0 * F32(q & 15) - mm0
                dst[256 * b + 64 * j + 32 + l] = d1 * F32(q >> 4) - mm1


@nb.njit(**EXACT_FLAGS)
def dequant_row_q5_k(src, dst):
    # src: u8[n/256 * 176] {f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}
    for b in range(dst.size // 256):
        o = 176 * b
        d = half_at(src, o)
        dmin = half_at(src, o + 2)
        for j in range(4):
            sc0, m0 = scale_min_k4(src, o + 4, 2 * j)
            sc1, m1 = scale_min_k4(src, o + 4, 2 * j + 1)
            d0, d1 = d * F32(sc0), d * F32(sc1)
            mm0, mm1 = dmin * F32(m0), dmin * F32(m1)
            for l in range(32):
                q = src[o + 48 + 32 * j + l]
                h = src[o + 16 + l]
                lo = I32(q & 15) | I32(((h >> (2 * j)) & 1) << 4)
                hi = I32(q >> 4) | I32(((h >> (2 * j + 1)) & 1) << 4)
                dst[256 * b + 64 * j + l] = d0 * F32(lo) - mm0
                dst[256 * b + 64 * j + 32 + l] = d1 * F32(hi) - mm1


@nb.njit(**EXACT_FLAGS)
def dequant_row_q6_k(src, dst):
    # src: u8[n/256 * 210] {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}; x = (d*sc)*(q - 32)
    for b in range(dst.size // 256):
        o = 210 * b
        d = half_at(src, o + 208)
        for h in range(2):
            for l in range(32):
                a = I32(src[o + 64 * h + l])
                c = I32(src[o + 64 * h + 32 + l])
                e = I32(src[o + 128 + 32 * h + l])
                q = (a & 15) | ((e & 3) << 4), (c & 15) | (((e >> 2) & 3) << 4), \
                    (a >> 4) | (((e >> 4) & 3) << 4), (c >> 4) | (((e >> 6) & 3) << 4)
                for k in range(4):
                    sc = F32(np.int8(src[o + 192 + 8 * h + 2 * k + l // 16]))
                    dst[256 * b + 128 * h + 32 * k + l] = (d * sc) * F32(q[k] - 32)


@nb.njit(**EXACT_FLAGS)
def q3_k_scale(src, o, s):
    # the 6-bit scale of sub-block s of the Q3_K block at o (its 12 scale bytes at o + 96),
    # minus 32: nibble s // 8 of byte s % 8, high bits 2 (s // 4).. of byte 8 + s % 4
    low = I32(I32(src[o + 96 + s % 8]) >> (4 * (s // 8))) & 15
    high = I32(I32(src[o + 104 + s % 4]) >> (2 * (s // 4))) & 3
    return I32(low | I32(high << 4)) - 32


@nb.njit(**EXACT_FLAGS)
def dequant_row_q2_k(src, dst):
    # src: u8[n/256 * 84] {u8 scales[16]; u8 qs[64]; f16 d; f16 dmin}; value 128n + 32j + l
    # has code (qs[32n + l] >> 2j) & 3 in sub-block s = 8n + 2j + l // 16:
    # x = (d * (scales[s] & 15)) * code - dmin * (scales[s] >> 4)
    for b in range(dst.size // 256):
        o = 84 * b
        d, dmin = half_at(src, o + 80), half_at(src, o + 82)
        for n in range(2):
            for j in range(4):
                for l in range(32):
                    sc = I32(src[o + 8 * n + 2 * j + l // 16])
                    code = I32(I32(src[o + 16 + 32 * n + l]) >> (2 * j)) & 3
                    dst[256 * b + 128 * n + 32 * j + l] = F32(d * F32(sc & 15)) * F32(code) - F32(dmin * F32(sc >> 4))


@nb.njit(**EXACT_FLAGS)
def dequant_row_q3_k(src, dst):
    # src: u8[n/256 * 110] {u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d}; value 128n + 32j + l:
    # low bits (qs[32n + l] >> 2j) & 3, minus 4 unless bit 4n + j of hmask[l] is set;
    # x = (d * (sc6[s] - 32)) * code, s = 8n + 2j + l // 16
    for b in range(dst.size // 256):
        o = 110 * b
        d = half_at(src, o + 108)
        for n in range(2):
            for j in range(4):
                for l in range(32):
                    code = I32(I32(src[o + 32 + 32 * n + l]) >> (2 * j)) & 3
                    if (I32(src[o + l]) >> (4 * n + j)) & 1 == 0:
                        code -= 4
                    dl = F32(d * F32(q3_k_scale(src, o, 8 * n + 2 * j + l // 16)))
                    dst[256 * b + 128 * n + 32 * j + l] = dl * F32(code)


@nb.njit(**EXACT_FLAGS)
def dequant_row(src, ggml_type, dst):
    # one row of any supported type (ggml type ids); unknown ids are rejected by gguf/quants.py
    if ggml_type == T.F32:
        dequant_row_f32(src, dst)
    elif ggml_type == T.F16:
        dequant_row_f16(src, dst)
    elif ggml_type == T.Q4_0:
        dequant_row_q4_0(src, dst)
    elif ggml_type == T.Q4_1:
        dequant_row_q4_1(src, dst)
    elif ggml_type == T.Q5_0:
        dequant_row_q5_0(src, dst)
    elif ggml_type == T.Q5_1:
        dequant_row_q5_1(src, dst)
    elif ggml_type == T.Q8_0:
        dequant_row_q8_0(src, dst)
    elif ggml_type == T.Q4_K:
        dequant_row_q4_k(src, dst)
    elif ggml_type == T.Q5_K:
        dequant_row_q5_k(src, dst)
    elif ggml_type == T.Q6_K:
        dequant_row_q6_k(src, dst)
    elif ggml_type == T.BF16:
        dequant_row_bf16(src, dst)
    elif ggml_type == T.IQ4_NL:
        dequant_row_iq4_nl(src, dst)
    elif ggml_type == T.IQ4_XS:
        dequant_row_iq4_xs(src, dst)
    elif ggml_type == T.Q2_K:
        dequant_row_q2_k(src, dst)
    elif ggml_type == T.Q3_K:
        dequant_row_q3_k(src, dst)


@nb.njit(**dict(EXACT_FLAGS, parallel=True))
def dequantize_rows(src, ggml_type, dst):
    # src: u8[n_rows, row_nbytes] rows of ggml blocks; dst: f32[n_rows, n]
    for i in nb.prange(src.shape[0]):
        dequant_row(src[i], ggml_type, dst[i])
