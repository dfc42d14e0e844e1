"""Element-wise and per-row kernels of the transformer graph: norms, RoPE, activations.

Each public kernel works in place or into a caller-owned buffer (no allocation), on
float32 rows shaped [n_tok, ...]. Numerics follow ggml where it matters for matching
llama.cpp: RMS norm sums float32 squares in float64, RoPE advances theta by repeated
float32 multiplication, SiLU and GELU use ggml's vector exp and f16 table (ggml_math.py).
These run on the calling thread: for one token a parallel launch costs more (~50 us)
than the work. Matrix products live in matvec.py, attention in attention.py.
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

from .config import EXACT_FLAGS, JIT_FLAGS
from .fp16 import f32_to_f16
from .intrinsics import HAS_FMA, fma
from .ggml_math import v_silu, v_silu_mul_rows

ROPE_NORM = 0  # rotate adjacent pairs (x[2i], x[2i+1]): llama GGUFs (Q/K permuted at conversion)
ROPE_NEOX = 2  # rotate halves (x[i], x[i + n_rot/2]): gemma, qwen2, ...



@nb.njit(**EXACT_FLAGS)
def _rms_scale(row, eps):
    # ggml_compute_forward_rms_norm_f32: squares in float32, summed in float64, then
    # mean, +eps, sqrt and reciprocal in float32 (bit-exact with llama.cpp matters: see attention.py)
    acc = 0.0
    for i in range(row.shape[0]):
        acc += np.float64(row[i] * row[i])
    mean = np.float32(acc / row.shape[0])
    return np.float32(1.0) / np.float32(math.sqrt(np.float32(mean + eps)))


@nb.njit(**JIT_FLAGS)
def rms_norm(x, weight, eps, out):
    # x: f32[n, d], weight: f32[d], out: f32[n, d] (may alias x); out = (x * scale) * weight
    n, d = x.shape
    for t in range(n):
        scale = _rms_scale(x[t], eps)
        for i in range(d):
            out[t, i] = (x[t, i] * scale) * weight[i]


@nb.njit(**JIT_FLAGS)
def rms_norm_heads(x, weight, eps):
    # x: f32[n, n_heads, head_dim] normalised per head in place, weight: f32[head_dim]
    n, n_heads, hd = x.shape
    for t in range(n):
        for h in range(n_heads):
            scale = _rms_scale(x[t, h], eps)
            for i in range(hd):
                x[t, h, i] = (x[t, h, i] * scale) * weight[i]


@nb.njit(**JIT_FLAGS)
def rope_tables(positions, n_rot, freq_base, freq_scale, ext_factor, mscale, corr_lo, corr_hi, freq_factors,
                cos_out, sin_out):
    # positions: i32[n]; freq_factors: f32[n_rot/2] (ones when the model has none)
    # cos_out, sin_out: f32[n, n_rot/2], as ggml_rope_cache_init / rope_yarn: per pair i the
    # unscaled angle pos * base^(-2i/n_rot) / factor_i, times freq_scale; with YaRN
    # (ext_factor != 0) mixed back towards the unscaled angle by a ramp between corr_lo and
    # corr_hi; cos and sin times mscale (models/rope.py RopeScaling.mscale)
    # powf(freq_base, -2.0f/n_dims): the exponent rounded to float32 first (for n_rot = 24
    # the float64 exponent gives another theta_scale), then float32 pow (libm's powf)
    theta_scale = np.float32(freq_base ** np.float32(np.float32(-2.0) / np.float32(n_rot)))
    ramp_width = max(np.float32(0.001), np.float32(corr_hi - corr_lo))
    for t in range(positions.shape[0]):
        theta = np.float32(positions[t])
        for i in range(n_rot // 2):
            extrap = np.float32(theta / freq_factors[i])
            th = np.float32(freq_scale * extrap)
            if ext_factor != 0.0:
                y = np.float32((np.float32(i) - corr_lo) / ramp_width)
                ramp = np.float32((np.float32(1.0) - min(np.float32(1.0), max(np.float32(0.0), y))) * ext_factor)
                th = np.float32(th * (np.float32(1.0) - ramp) + extrap * ramp)
            cos_out[t, i] = np.float32(math.cos(th)) * mscale
            sin_out[t, i] = np.float32(math.sin(th)) * mscale
            theta = np.float32(theta * theta_scale)


@nb.njit(**EXACT_FLAGS)
def rope_apply(x, cos_t, sin_t, mode):
    # x: f32[n, n_heads, head_dim] rotated in place on its first n_rot = 2*cos_t.shape[1] dims
    n, n_heads, _ = x.shape
    half = cos_t.shape[1]
    for t in range(n):
        for h in range(n_heads):
            for i in range(half):
                if mode == ROPE_NEOX:
                    a, b = i, i + half
                else:
                    a, b = 2 * i, 2 * i + 1
                x0 = x[t, h, a]
                x1 = x[t, h, b]
                c = cos_t[t, i]
                s = sin_t[t, i]
                # the FMAs GCC contracts ggml's `x0*cos - x1*sin`, `x0*sin + x1*cos` into
                # (the first product fused, the second rounded), written out so that no
                # compiler picks another contraction: LLVM's AArch64 backend did
                x[t, h, a] = fma(x0, c, -np.float32(x1 * s))
                x[t, h, b] = fma(x0, s, np.float32(x1 * c))


@nb.njit(**JIT_FLAGS)
def silu_mul(gate, up):
    # gate, up: f32[n, ff]; gate <- silu(gate) * up, as ggml_vec_swiglu_f32: the vector
    # SiLU (ggml_math.v_silu) on whole groups of 16, the C library's expf on the tail
    n, ff = gate.shape
    tail = ff - ff % 16
    for t in range(n):
        if HAS_FMA:  # 16 lanes at a time, the same bits (ggml_math.v_silu_mul_rows)
            v_silu_mul_rows(gate[t], up[t], tail)
        else:
            for i in range(tail):
                gate[t, i] = v_silu(gate[t, i]) * up[t, i]
        for i in range(tail, ff):
            g = gate[t, i]
            gate[t, i] = g / (np.float32(1.0) + np.float32(math.exp(-g))) * up[t, i]


@nb.njit(**JIT_FLAGS)
def gelu_mul(gate, up, table):
    # gate, up: f32[n, ff]; gate <- gelu(gate) * up via ggml's f16 GELU table
    # (ggml_vec_geglu_f32 with GGML_GELU_FP16); table: f32[65536] = gelu_f16_table()
    n, ff = gate.shape
    for t in range(n):
        for i in range(ff):
            g = gate[t, i]
            if g <= -10.0:
                gate[t, i] = 0.0
            elif g >= 10.0:
                gate[t, i] = g * up[t, i]
            else:
                gate[t, i] = table[f32_to_f16(g)] * up[t, i]


@nb.njit(**JIT_FLAGS)
def add_inplace(x, y):
    # x += y, both f32[n, d]
    n, d = x.shape
    for t in range(n):
        for i in range(d):
            x[t, i] += y[t, i]


@nb.njit(**JIT_FLAGS)
def add_rms_norm(x, y, weight, eps, out):
    # x += y, then out = rms_norm(x): a block's residual add and the next block's norm in
    # one call (decode makes ~12 small calls per layer; each costs ~2 us to dispatch)
    add_inplace(x, y)
    rms_norm(x, weight, eps, out)


@nb.njit(**JIT_FLAGS)
def rope_apply_qk(q, k, cos_t, sin_t, mode):
    # rope_apply on the queries and the keys of a chunk, in one call
    rope_apply(q, cos_t, sin_t, mode)
    rope_apply(k, cos_t, sin_t, mode)


@nb.njit(**JIT_FLAGS)
def add_bias(x, b):
    # x[t] += b, x: f32[n, d], b: f32[d]
    n, d = x.shape
    for t in range(n):
        for i in range(d):
            x[t, i] += b[i]


@nb.njit(**JIT_FLAGS)
def scale_inplace(x, s):
    n, d = x.shape
    for t in range(n):
        for i in range(d):
            x[t, i] *= s


@nb.njit(**JIT_FLAGS)
def softcap_inplace(x, cap):
    # x <- cap * tanh(x / cap)
    n, d = x.shape
    for t in range(n):
        for i in range(d):
            x[t, i] = cap * math.tanh(x[t, i] / cap)


@nb.njit(**EXACT_FLAGS)
def normalize_rows(x, n_rows, n_cols):
    # x: f32[>= n_rows, >= n_cols]: each row's first n_cols values divided by their sum, summed
    # left to right in float64, so a row's result does not change with zeros after it (a query's
    # attention tallies come out the same whether its pass scanned more, empty, slots)
    for r in range(n_rows):
        total = 0.0
        for s in range(n_cols):
            total += x[r, s]
        if total > 0.0:
            for s in range(n_cols):
                x[r, s] = np.float32(x[r, s] / total)
