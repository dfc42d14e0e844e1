"""Quantizers for the KV-cache types: one row of float32 -> ggml blocks, bit-exact with ggml.

What lives here: `quantize_row_<type>(x, dst)` for f32, f16, bf16, q8_0, q4_0, q4_1,
q5_0, q5_1 and iq4_nl. Each writes the blocks of one row (e.g. one head's head_dim values) into
a preallocated uint8 buffer of quants.row_nbytes(type, n) bytes, allocates nothing, and
is plain @njit so the KV-cache kernels can call it. The arithmetic is ggml's
quantize_row_*_ref step by step in float32, compiled without fast-math, so the bytes
equal those of ggml's reference (and of `gguf.quants.quantize`). What does not live
here: the matching dequantizers (dequant.py), the block layouts (gguf/quants.py), and the
activation quantizers of the matvec kernels (activations.py).
"""

from __future__ import annotations

import numba as nb
import numpy as np
from gguf import GGMLQuantizationType as T

from .config import EXACT_FLAGS
from .fp16 import f32_to_bf16, f32_to_f16, roundf

F32 = np.float32
I32 = np.int32
FLT_MAX = np.float32(np.finfo(np.float32).max)


@nb.njit(**EXACT_FLAGS)
def put_u16(dst, o, h):
    # little-endian uint16 h -> dst[o:o+2]
    dst[o] = np.uint8(h & 0xFF)
    dst[o + 1] = np.uint8((h >> 8) & 0xFF)


@nb.njit(**EXACT_FLAGS)
def quantize_row_f32(x, dst):
    # x: f32[n] -> dst: u8[4n] (the float32 bytes)
    v = dst.view(np.float32)
    for i in range(x.size):
        v[i] = x[i]


@nb.njit(**EXACT_FLAGS)
def quantize_row_f16(x, dst):
    # x: f32[n] -> dst: u8[2n] IEEE halves (round to nearest even)
    for i in range(x.size):
        put_u16(dst, 2 * i, f32_to_f16(x[i]))


@nb.njit(**EXACT_FLAGS)
def quantize_row_bf16(x, dst):
    # x: f32[n] -> dst: u8[2n] bfloat16 (round to nearest even)
    for i in range(x.size):
        put_u16(dst, 2 * i, f32_to_bf16(x[i]))


@nb.njit(**EXACT_FLAGS)
def quantize_row_q8_0(x, dst):
    # x: f32[n] -> dst: u8[n/32 * 34]; d = amax/127, q = roundf(x/d)
    for b in range(x.size // 32):
        o = 34 * b
        amax = F32(0.0)
        for j in range(32):
            amax = max(amax, abs(x[32 * b + j]))
        d = amax / F32(127.0)
        inv = F32(1.0) / d if d != 0 else F32(0.0)
        put_u16(dst, o, f32_to_f16(d))
        for j in range(32):
            dst[o + 2 + j] = np.uint8(I32(roundf(x[32 * b + j] * inv)) & 0xFF)


@nb.njit(**EXACT_FLAGS)
def signed_absmax(x, start):
    # the value of largest magnitude in x[start:start+32] (first one on ties), sign kept
    amax = F32(0.0)
    vmax = F32(0.0)
    for j in range(32):
        v = x[start + j]
        if amax < abs(v):
            amax = abs(v)
            vmax = v
    return vmax


@nb.njit(**EXACT_FLAGS)
def min_max(x, start):
    # (min, max) of x[start:start+32]
    lo = FLT_MAX
    hi = -FLT_MAX
    for j in range(32):
        v = x[start + j]
        if v < lo:
            lo = v
        if v > hi:
            hi = v
    return lo, hi


@nb.njit(**EXACT_FLAGS)
def quantize_row_q4_0(x, dst):
    # x: f32[n] -> dst: u8[n/32 * 18]; d = max/-8 (max signed), q = min(15, trunc(x/d + 8.5))
    for b in range(x.size // 32):
        o = 18 * b
        d = signed_absmax(x, 32 * b) / F32(-8.0)
        inv = F32(1.0) / d if d != 0 else F32(0.0)
        put_u16(dst, o, f32_to_f16(d))
        for j in range(16):
            q0 = min(15, I32(x[32 * b + j] * inv + F32(8.5)))
            q1 = min(15, I32(x[32 * b + 16 + j] * inv + F32(8.5)))
            dst[o + 2 + j] = np.uint8(q0 | (q1 << 4))


@nb.njit(**EXACT_FLAGS)
def quantize_row_q4_1(x, dst):
    # x: f32[n] -> dst: u8[n/32 * 20]; d = (max-min)/15, m = min, q = min(15, trunc((x-m)/d + 0.5))
    for b in range(x.size // 32):
        o = 20 * b
        lo, hi = min_max(x, 32 * b)
        d = (hi - lo) / F32(15.0)
        inv = F32(1.0) / d if d != 0 else F32(0.0)
        put_u16(dst, o, f32_to_f16(d))
        put_u16(dst, o + 2, f32_to_f16(lo))
        for j in range(16):
            q0 = min(15, I32((x[32 * b + j] - lo) * inv + F32(0.5)))
            q1 = min(15, I32((x[32 * b + 16 + j] - lo) * inv + F32(0.5)))
            dst[o + 4 + j] = np.uint8(q0 | (q1 << 4))


@nb.njit(**EXACT_FLAGS)
def put_q5(dst, o, x, start, lo, inv, offset):
    # 32 five-bit codes q = min(31, trunc((x - lo)*inv + offset)) of x[start:start+32]
    # -> u32 qh (bit j = fifth bit of code j) at dst[o:o+4], nibbles at dst[o+4:o+20]
    qh = np.uint32(0)
    for j in range(16):
        q0 = min(31, I32((x[start + j] - lo) * inv + offset))
        q1 = min(31, I32((x[start + 16 + j] - lo) * inv + offset))
        dst[o + 4 + j] = np.uint8((q0 & 15) | ((q1 & 15) << 4))
        qh |= np.uint32(((q0 >> 4) & 1) << j) | np.uint32(((q1 >> 4) & 1) << (j + 16))
    for i in range(4):
        dst[o + i] = np.uint8((qh >> (8 * i)) & 0xFF)


@nb.njit(**EXACT_FLAGS)
def quantize_row_q5_0(x, dst):
    # x: f32[n] -> dst: u8[n/32 * 22]; d = max/-16, q = min(31, trunc(x/d + 16.5))
    for b in range(x.size // 32):
        o = 22 * b
        d = signed_absmax(x, 32 * b) / F32(-16.0)
        inv = F32(1.0) / d if d != 0 else F32(0.0)
        put_u16(dst, o, f32_to_f16(d))
        put_q5(dst, o + 2, x, 32 * b, F32(0.0), inv, F32(16.5))  # x - 0 == x exactly


@nb.njit(**EXACT_FLAGS)
def quantize_row_q5_1(x, dst):
    # x: f32[n] -> dst: u8[n/32 * 24]; d = (max-min)/31, m = min, q = trunc((x-m)/d + 0.5)
    for b in range(x.size // 32):
        o = 24 * b
        lo, hi = min_max(x, 32 * b)
        d = (hi - lo) / F32(31.0)
        inv = F32(1.0) / d if d != 0 else F32(0.0)
        put_u16(dst, o, f32_to_f16(d))
        put_u16(dst, o + 2, f32_to_f16(lo))
        put_q5(dst, o + 4, x, 32 * b, lo, inv, F32(0.5))


IQ4_NL_LEVELS = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8)


@nb.njit(**EXACT_FLAGS)
def nearest_level(levels, x):
    # ggml's best_index_int8: the index of the level nearest x (ties to the upper one). Its
    # binary search ends at the first level above x; counting the levels at or below x finds
    # the same one without branches (NaN, which the search takes to the top, apart)
    n = levels.size
    hi = 1
    for k in range(1, n - 1):
        hi += x >= levels[k]
    i = hi - 1 if x - levels[hi - 1] < levels[hi] - x else hi  # below levels[0]: 0, above the top: n - 1
    return n - 1 if x != x else i


@nb.njit(**EXACT_FLAGS)
def quantize_row_iq4_nl(x, dst):
    # x: f32[n] -> dst: u8[n/32 * 18] blocks {f16 d; u8 qs[16]}, x = d * levels[q]; ggml's
    # quantize_row_iq4_nl_ref (what llama.cpp's CPU cache stores): each value to the level
    # nearest x / (max / -127), then d = the least-squares scale for those levels, weighted
    # by x^2 (codes 0..15 laid out as q4_0's: value j low nibble, value j + 16 high)
    codes = np.empty(32, np.uint8)
    for b in range(x.size // 32):
        o = 18 * b
        mx = signed_absmax(x, 32 * b)
        d = F32(0.0)
        codes[:] = 0
        if abs(mx) >= F32(1e-15):
            inv = F32(1.0) / (mx / F32(-127.0))
            sumqx, sumq2 = F32(0.0), F32(0.0)
            for j in range(32):
                v = x[32 * b + j]
                codes[j] = nearest_level(IQ4_NL_LEVELS, inv * v)
                q, w = F32(IQ4_NL_LEVELS[codes[j]]), v * v
                sumqx += w * q * v
                sumq2 += w * q * q
            d = sumqx / sumq2 if sumq2 > 0 else F32(0.0)
        put_u16(dst, o, f32_to_f16(d))
        for j in range(16):
            dst[o + 2 + j] = np.uint8(codes[j] | (codes[j + 16] << 4))


@nb.njit(**EXACT_FLAGS)
def quantize_row(x, ggml_type, dst):
    # one row into any KV-cache type (ggml type ids); unknown ids are rejected by gguf/quants.py
    if ggml_type == T.F32:
        quantize_row_f32(x, dst)
    elif ggml_type == T.F16:
        quantize_row_f16(x, dst)
    elif ggml_type == T.BF16:
        quantize_row_bf16(x, dst)
    elif ggml_type == T.Q8_0:
        quantize_row_q8_0(x, dst)
    elif ggml_type == T.Q4_0:
        quantize_row_q4_0(x, dst)
    elif ggml_type == T.Q4_1:
        quantize_row_q4_1(x, dst)
    elif ggml_type == T.Q5_0:
        quantize_row_q5_0(x, dst)
    elif ggml_type == T.Q5_1:
        quantize_row_q5_1(x, dst)
    elif ggml_type == T.IQ4_NL:
        quantize_row_iq4_nl(x, dst)


@nb.njit(**dict(EXACT_FLAGS, parallel=True))
def quantize_rows(src, ggml_type, dst):
    # src: f32[n_rows, n]; dst: u8[n_rows, row_nbytes]
    for i in nb.prange(src.shape[0]):
        quantize_row(src[i], ggml_type, dst[i])


@nb.njit(**EXACT_FLAGS)
def store_rows(src, ggml_type, slots, dst, limit, scratch):
    # the K or V rows of a chunk into their cache slots: src f32[n, n_kv, hd] ->
    # dst[h, slots[t]] (u8 rows of the cache type), each value first clamped to
    # [-limit, limit] (f16 saturation; limit = inf for none); scratch: f32[hd]
    n, n_kv, hd = src.shape
    for t in range(n):
        for h in range(n_kv):
            x = src[t, h]
            for i in range(hd):
                scratch[i] = min(max(x[i], -limit), limit)
            quantize_row(scratch, ggml_type, dst[h, slots[t]])


@nb.njit(**EXACT_FLAGS)
def store_rows_kv(k, v, type_k, type_v, slots, k_dst, v_dst, limit_k, limit_v, scratch):
    # store_rows for a chunk's K rows and its V rows, in one call (scratch: f32[>= both head sizes])
    store_rows(k, type_k, slots, k_dst, limit_k, scratch[: k.shape[2]])
    store_rows(v, type_v, slots, v_dst, limit_v, scratch[: v.shape[2]])
