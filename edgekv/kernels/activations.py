"""Activation quantizers: the vector a matvec multiplies, turned into 8-bit blocks once per call.

Like llama.cpp, a quantized weight is not dequantized for a dot product; instead the
activation vector x is quantized to 8-bit blocks and the products are summed as
integers per block. Which format follows the weight (llama.cpp's vec_dot_type):

  q8_0 / q8_1 (for Q8_0, Q4_0, Q5_0 / Q4_1, Q5_1), blocks of 32, as llama.cpp's x86
  SIMD path computes them: d = amax/127 kept as f16, codes = round-half-even(x * 127/amax);
  q8_1 also keeps s = f16(d * sum(codes)) for the weights' min term.
  q8_K (for the K-quants), blocks of 256, ggml's reference: d = max/-127 in float32
  (max = the signed value of largest magnitude), codes = nearest_int(x * -127/max)
  clamped to 127, plus the sum of every 16 codes.

Outputs (preallocated by the caller, no allocation here):
  xq: i8[NB, BS] codes; xd: f32[NB, 2] (d, s); xsum: i32[NB, 16] (q8_0/q8_1: sum of
  the 32 codes in column 0, sums of each 4 consecutive codes in columns 8..15;
  q8_K: the 16 sums of 16). A block holding inf or NaN gets the scale NaN, so the NaN
  reaches the logits (and the session's NumericalError) as float arithmetic would carry it.
Also the float "quantizers" of F16/BF16 weights (ggml rounds x to f16/bf16 for them).
What does not live here: KV-cache quantizers (quantize.py), the dot products (dot_*.py).
"""

from __future__ import annotations

import numba as nb
import numpy as np

from .config import EXACT_FLAGS
from .fp16 import bf16_to_f32, f32_to_bf16, nearest_int, round_f16

F32 = np.float32
I32 = np.int32
F32_MAX = np.finfo(np.float32).max


@nb.njit(**EXACT_FLAGS)
def poison(xq, xd, xsum):
    # a block holding inf or NaN: scale NaN, so every dot product with it is NaN (as the
    # float arithmetic would give) instead of the finite garbage of codes made from NaN
    xq[:] = 0
    xd[:] = np.nan
    xsum[:] = 0


@nb.njit(**EXACT_FLAGS)
def quantize_act_q8(x, xq, xd, xsum):
    # x: f32[NB*32] -> xq: i8[NB, 32], xd: f32[NB, 2] (f16-rounded d and s), xsum: i32[NB, 16]
    for b in range(xq.shape[0]):
        amax = F32(0.0)
        finite = True
        for j in range(32):
            a = abs(x[32 * b + j])
            amax = max(amax, a)
            finite &= a <= F32_MAX  # False for inf and NaN (which max() would skip)
        if not finite:
            poison(xq[b], xd[b], xsum[b])
            continue
        d = amax / F32(127.0)
        inv = F32(127.0) / amax if amax != 0 else F32(0.0)
        total = 0
        for j in range(32):
            q = nearest_int(x[32 * b + j] * inv)
            xq[b, j] = np.int8(q)
            total += q
        xd[b, 0] = round_f16(d)
        xd[b, 1] = round_f16(d * F32(total))
        xsum[b, 0] = total
        for j in range(8):  # per SIMD lane of four codes, for the VNNI kernels' offsets
            xsum[b, 8 + j] = I32(xq[b, 4 * j]) + I32(xq[b, 4 * j + 1]) + I32(xq[b, 4 * j + 2]) + I32(xq[b, 4 * j + 3])


@nb.njit(**EXACT_FLAGS)
def quantize_act_q8_k(x, xq, xd, xsum):
    # x: f32[NB*256] -> xq: i8[NB, 256], xd[:, 0]: f32 d, xsum: i32[NB, 16] sums of 16 codes
    for b in range(xq.shape[0]):
        amax = F32(0.0)
        vmax = F32(0.0)
        finite = True
        for j in range(256):
            v = x[256 * b + j]
            if abs(v) > amax:
                amax = abs(v)
                vmax = v
            finite &= abs(v) <= F32_MAX
        if not finite:
            poison(xq[b], xd[b], xsum[b])
            continue
        if amax == 0:
            xq[b, :] = 0
            xd[b, 0] = 0.0
            xsum[b, :] = 0
            continue
        iscale = F32(-127.0) / vmax
        for i in range(16):
            total = 0
            for j in range(16 * i, 16 * i + 16):
                q = min(127, nearest_int(iscale * x[256 * b + j]))
                xq[b, j] = np.int8(q)
                total += q
            xsum[b, i] = total
        xd[b, 0] = F32(1.0) / iscale
        xd[b, 1] = 0.0


@nb.njit(**EXACT_FLAGS)
def round_act_f16(x, out):
    # x: f32[n] -> out: f32[n] rounded to the nearest half (what ggml feeds an F16 dot)
    for i in range(x.size):
        out[i] = round_f16(x[i])


@nb.njit(**EXACT_FLAGS)
def round_act_bf16(x, out):
    # x: f32[n] -> out: f32[n] rounded to the nearest bfloat16
    for i in range(x.size):
        out[i] = bf16_to_f32(f32_to_bf16(x[i]))


@nb.njit(**dict(EXACT_FLAGS, parallel=True))
def quantize_acts(x, xq, xd, xsum):
    # every token's activations to q8 blocks: x f32[n, n_cols] -> xq i8[n, NB, 32], xd, xsum
    for t in nb.prange(x.shape[0]):
        quantize_act_q8(x[t], xq[t], xd[t], xsum[t])


@nb.njit(**dict(EXACT_FLAGS, parallel=True))
def quantize_acts_k(x, xq, xd, xsum):
    # every token's activations to q8_K blocks: x f32[n, n_cols] -> xq i8[n, NB, 256], xd, xsum
    for t in nb.prange(x.shape[0]):
        quantize_act_q8_k(x[t], xq[t], xd[t], xsum[t])
