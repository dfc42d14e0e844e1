"""Element-wise and per-row kernels of the transformer graph: norms, RoPE, activations.

Each public kernel works in place or into a caller-owned buffer (no allocation), on
float32 rows shaped [n_tok, ...]. Numerics follow ggml where it matters for matching
llama.cpp: RMS norm sums squares in float64, RoPE advances theta by repeated float32
multiplication, GELU is the tanh approximation. Matrix products live in matvec.py,
attention in attention.py.
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

from .config import JIT_FLAGS, PARALLEL_FLAGS

ROPE_NORM = 0  # rotate adjacent pairs (x[2i], x[2i+1]): llama GGUFs (Q/K permuted at conversion)
ROPE_NEOX = 2  # rotate halves (x[i], x[i + n_rot/2]): gemma, qwen2, ...

_GELU_COEF_A = np.float32(0.044715)
_SQRT_2_OVER_PI = np.float32(0.79788456080286535587989211986876)


@nb.njit(**PARALLEL_FLAGS)
def rms_norm(x, weight, eps, out):
    # x: f32[n, d], weight: f32[d], out: f32[n, d] (may alias x)
    n, d = x.shape
    for t in nb.prange(n):
        acc = 0.0  # float64, as ggml_float
        for i in range(d):
            acc += np.float64(x[t, i]) * np.float64(x[t, i])
        scale = np.float32(1.0 / math.sqrt(acc / d + eps))
        for i in range(d):
            out[t, i] = x[t, i] * scale * weight[i]


@nb.njit(**PARALLEL_FLAGS)
def rms_norm_heads(x, weight, eps):
    # x: f32[n, n_heads, head_dim] normalised per head in place, weight: f32[head_dim]
    n, n_heads, hd = x.shape
    for t in nb.prange(n):
        for h in range(n_heads):
            acc = 0.0
            for i in range(hd):
                acc += np.float64(x[t, h, i]) * np.float64(x[t, h, i])
            scale = np.float32(1.0 / math.sqrt(acc / hd + eps))
            for i in range(hd):
                x[t, h, i] = x[t, h, i] * scale * weight[i]


@nb.njit(**JIT_FLAGS)
def rope_tables(positions, n_rot, freq_base, freq_scale, freq_factors, cos_out, sin_out):
    # positions: i32[n]; freq_factors: f32[n_rot/2] (ones when the model has none)
    # cos_out, sin_out: f32[n, n_rot/2]; theta_i = pos * base^(-2i/n_rot) * scale / factor_i
    theta_scale = np.float32(freq_base ** (-2.0 / n_rot))
    for t in range(positions.shape[0]):
        theta = np.float32(positions[t])
        for i in range(n_rot // 2):
            th = np.float32(freq_scale) * theta / freq_factors[i]
            cos_out[t, i] = math.cos(th)
            sin_out[t, i] = math.sin(th)
            theta = np.float32(theta * theta_scale)


@nb.njit(**PARALLEL_FLAGS)
def rope_apply(x, cos_t, sin_t, mode):
    # x: f32[n, n_heads, head_dim] rotated in place on its first n_rot = 2*cos_t.shape[1] dims
    n, n_heads, _ = x.shape
    half = cos_t.shape[1]
    for t in nb.prange(n):
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
                x[t, h, a] = x0 * c - x1 * s
                x[t, h, b] = x0 * s + x1 * c


@nb.njit(**PARALLEL_FLAGS)
def silu_mul(gate, up):
    # gate, up: f32[n, ff]; gate <- silu(gate) * up
    n, ff = gate.shape
    for t in nb.prange(n):
        for i in range(ff):
            g = gate[t, i]
            gate[t, i] = g / (np.float32(1.0) + math.exp(-g)) * up[t, i]


@nb.njit(**PARALLEL_FLAGS)
def gelu_mul(gate, up):
    # gate, up: f32[n, ff]; gate <- gelu_tanh(gate) * up
    n, ff = gate.shape
    for t in nb.prange(n):
        for i in range(ff):
            g = gate[t, i]
            inner = _SQRT_2_OVER_PI * g * (np.float32(1.0) + _GELU_COEF_A * g * g)
            gate[t, i] = np.float32(0.5) * g * (np.float32(1.0) + math.tanh(inner)) * up[t, i]


@nb.njit(**JIT_FLAGS)
def add_inplace(x, y):
    # x += y, both f32[n, d]
    n, d = x.shape
    for t in range(n):
        for i in range(d):
            x[t, i] += y[t, i]


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
