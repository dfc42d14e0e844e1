"""One entry point for quantizing weight rows to any type llama-quantize writes, with or
without an importance matrix.

What lives here: `quantize_weight_rows(src, ggml_type, dst, imatrix)`, which the quantize command
and the converter call on slabs of rows; its per-row dispatch to the quantizers of each family
(the legacy and cache types in quantize.py, Q4_K/Q5_K/Q6_K in quantize_k.py, Q2_K/Q3_K/IQ4_NL/
IQ4_XS in quantize_low.py); and the legacy 32-value types with importance weights (ggml's
quantize_row_q4_0/q4_1/q5_0/q5_1_impl: each block fitted with weights qw*sqrt(sigma2 + x^2),
sigma2 the mean square of the whole row). The importance vector holds one value per column, the
same for every row; empty means none. Q8_0 and the float types ignore it, as ggml does. Rows are
independent, so any split over threads gives the same bytes.
"""

from __future__ import annotations

import numba as nb
import numpy as np
from gguf import GGMLQuantizationType as T

from .config import EXACT_FLAGS
from .fp16 import f32_to_f16
from .quantize import put_u16, quantize_row
from .quantize_k import quantize_row_q4_k, quantize_row_q5_k, quantize_row_q6_k
from .quantize_low import quantize_row_iq4, quantize_row_q2_k, quantize_row_q3_k
from .quantize_search import importance_weights, make_qkx2_quants, make_qx_quants, sum_squares

F32 = np.float32
NO_WEIGHTS = np.empty(0, np.float32)  # the importance vector of a quantization without one


@nb.njit(**EXACT_FLAGS)
def pack_nibbles_q5(L, dst, o, fifth):
    # 32 levels as q4_0's nibbles at dst[o:o+16]; fifth: their fifth bits as q5's u32 qh before them
    qh = np.uint32(0)
    for j in range(16):
        dst[o + j] = (L[j] & 0xF) | ((L[j + 16] & 0xF) << 4)
        qh |= np.uint32(((L[j] >> 4) & 1) << j) | np.uint32(((L[j + 16] >> 4) & 1) << (j + 16))
    if fifth:
        for i in range(4):
            dst[o - 4 + i] = np.uint8((qh >> (8 * i)) & 0xFF)


@nb.njit(**EXACT_FLAGS)
def quantize_row_legacy_imat(x, qw, ggml_type, dst):
    # Q4_0 / Q5_0 (symmetric, make_qx_quants) or Q4_1 / Q5_1 (scale and min, make_qkx3_quants)
    five = ggml_type == T.Q5_0 or ggml_type == T.Q5_1
    with_min = ggml_type == T.Q4_1 or ggml_type == T.Q5_1
    nbytes = (18 if ggml_type == T.Q4_0 else 20 if ggml_type == T.Q4_1 else 22 if ggml_type == T.Q5_0 else 24)
    weight = np.empty(32, np.float32)
    L = np.empty(32, np.uint8)
    laux = np.empty(32, np.uint8)
    sigma2 = sum_squares(x) / F32(x.size)
    for b in range(x.size // 32):
        xb = x[32 * b:32 * b + 32]
        importance_weights(xb, qw[32 * b:32 * b + 32], sigma2, weight)
        o = nbytes * b
        if with_min:
            d, the_min = make_qkx2_quants(xb, weight, 31 if five else 15, L, laux, F32(-0.9), F32(0.05), 36)
            put_u16(dst, o + 2, f32_to_f16(-the_min))
            q = o + 4
        else:
            d = make_qx_quants(xb, 16 if five else 8, L, weight)
            q = o + 2
        put_u16(dst, o, f32_to_f16(d))
        pack_nibbles_q5(L, dst, q + 4 if five else q, five)


@nb.njit(**EXACT_FLAGS)
def quantize_weight_row(x, ggml_type, dst, qw):
    # one row into any weight type llama-quantize writes; qw: importance weights f32[n] or empty
    if ggml_type == T.Q4_K:
        quantize_row_q4_k(x, qw, dst)
    elif ggml_type == T.Q5_K:
        quantize_row_q5_k(x, qw, dst)
    elif ggml_type == T.Q6_K:
        quantize_row_q6_k(x, qw, dst)
    elif ggml_type == T.Q2_K:
        quantize_row_q2_k(x, qw, dst)
    elif ggml_type == T.Q3_K:
        quantize_row_q3_k(x, qw, dst)
    elif ggml_type == T.IQ4_NL:  # llama-quantize's, not the KV cache's reference quantizer
        quantize_row_iq4(x, qw, dst, 32)
    elif ggml_type == T.IQ4_XS:
        quantize_row_iq4(x, qw, dst, 256)
    elif qw.size and (ggml_type == T.Q4_0 or ggml_type == T.Q4_1 or ggml_type == T.Q5_0 or ggml_type == T.Q5_1):
        quantize_row_legacy_imat(x, qw, ggml_type, dst)
    else:
        quantize_row(x, ggml_type, dst)


@nb.njit(**dict(EXACT_FLAGS, parallel=True))
def quantize_weight_rows(src, ggml_type, dst, imatrix):
    # src: f32[n_rows, n]; dst: u8[n_rows, row_nbytes]; imatrix: f32[n] (every row's importance
    # weights) or empty
    for i in nb.prange(src.shape[0]):
        quantize_weight_row(src[i], ggml_type, dst[i], imatrix)
