"""Element-wise kernels and attention against straightforward NumPy versions."""

from __future__ import annotations

import numpy as np
import pytest

from edgekv.kernels import ops
from edgekv.kernels.config import max_threads
from edgekv.kernels.ggml_math import gelu_f16_table
from edgekv.kernels.attention import attention_chunk_blas, attention_f16
from helpers.f16_attention import F16_ATTENTION_ATOL, reference_attention

RTOL = 2e-5  # float32 kernels vs float64 NumPy
rng = np.random.default_rng(0)


def test_rms_norm():
    x = rng.normal(size=(5, 64)).astype(np.float32)
    w = rng.normal(size=64).astype(np.float32)
    out = np.empty_like(x)
    ops.rms_norm(x, w, np.float32(1e-5), out)
    x64 = x.astype(np.float64)
    ref = x64 / np.sqrt((x64**2).mean(1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(out, ref, rtol=RTOL, atol=1e-6)


def test_rms_norm_heads_in_place():
    x = rng.normal(size=(3, 4, 16)).astype(np.float32)
    w = rng.normal(size=16).astype(np.float32)
    ref = x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6) * w
    ops.rms_norm_heads(x, w, np.float32(1e-6))
    np.testing.assert_allclose(x, ref, rtol=RTOL, atol=1e-6)


@pytest.mark.parametrize("mode", [ops.ROPE_NORM, ops.ROPE_NEOX])
def test_rope_matches_rotation_of_pairs(mode):
    n, heads, hd, base = 6, 3, 16, 10000.0
    pos = np.array([0, 1, 2, 7, 100, 4095], np.int32)
    x = rng.normal(size=(n, heads, hd)).astype(np.float32)
    cos = np.empty((n, hd // 2), np.float32)
    sin = np.empty_like(cos)
    ops.rope_tables(pos, hd, np.float32(base), np.float32(1.0), np.float32(0.0), np.float32(1.0), np.float32(0.0),
                    np.float32(0.0), np.ones(hd // 2, np.float32), cos, sin)
    y = x.copy()
    ops.rope_apply(y, cos, sin, mode)
    ang = pos[:, None, None] * base ** (-np.arange(hd // 2) * 2.0 / hd)
    if mode == ops.ROPE_NEOX:
        a, b, ia, ib = x[..., : hd // 2], x[..., hd // 2 :], slice(0, hd // 2), slice(hd // 2, hd)
    else:
        a, b, ia, ib = x[..., 0::2], x[..., 1::2], slice(0, hd, 2), slice(1, hd, 2)
    np.testing.assert_allclose(y[..., ia], a * np.cos(ang) - b * np.sin(ang), atol=2e-4)
    np.testing.assert_allclose(y[..., ib], a * np.sin(ang) + b * np.cos(ang), atol=2e-4)


def test_activations():
    g = rng.normal(size=(4, 32)).astype(np.float32) * 3
    u = rng.normal(size=(4, 32)).astype(np.float32)
    s, e = g.copy(), g.copy()
    ops.silu_mul(s, u)
    ops.gelu_mul(e, u, gelu_f16_table())
    g64 = g.astype(np.float64)
    np.testing.assert_allclose(s, g64 / (1 + np.exp(-g64)) * u, rtol=1e-5, atol=1e-6)
    # ggml's GELU reads a table at the f16 value of x and stores the result in f16
    g16 = g.astype(np.float16).astype(np.float64)
    gelu = 0.5 * g16 * (1 + np.tanh(np.sqrt(2 / np.pi) * (g16 + 0.044715 * g16**3)))
    expected = np.where(g <= -10, 0.0, np.where(g >= 10, g64, gelu.astype(np.float16))) * u
    np.testing.assert_allclose(e, expected, rtol=2e-3, atol=1e-6)
    exact = 0.5 * g64 * (1 + np.tanh(np.sqrt(2 / np.pi) * (g64 + 0.044715 * g64**3)))
    np.testing.assert_allclose(e, exact * u, rtol=0, atol=0.01 * np.abs(u).max() * np.abs(g).max())


def test_vector_silu_has_the_scalar_silus_bits():
    # silu_mul takes whole groups of 16 through the 16-lane kernel (ggml_math.v_silu_mul_rows);
    # every value must come out as the scalar v_silu (llama.cpp's per-lane steps) makes it,
    # across exp's whole range, its overflow and underflow edges and the special values
    from edgekv.kernels.ggml_math import v_silu

    g = np.concatenate([rng.normal(size=4000) * s for s in (0.01, 1, 5, 30, 120)])
    g = np.concatenate([g, [0.0, -0.0, 88.7, -88.7, 89, -89, 104, -104, 200, -200, np.inf, -np.inf, np.nan, 1e-40]])
    g = np.resize(g, (g.size // 96 + 1) * 96).astype(np.float32).reshape(-1, 96)
    u = rng.normal(size=g.shape).astype(np.float32)
    got = g.copy()
    ops.silu_mul(got, u)
    want = np.array([[np.float32(v_silu(a)) * b for a, b in zip(gr, ur)] for gr, ur in zip(g, u)], np.float32)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_v_expf_is_within_its_documented_error():
    from edgekv.kernels.ggml_math import v_expf

    x = rng.uniform(-80, 80, 2000).astype(np.float32)
    got = np.array([v_expf(v) for v in x], np.float32)
    want = np.exp(x.astype(np.float64))
    # ggml documents 1.45 ulp + 0.5 for rounding; measured against the exact value
    assert np.all(np.abs(got - want) <= 2.5 * np.spacing(want.astype(np.float32)))
    assert v_expf(np.float32(-np.inf)) == 0.0 and v_expf(np.float32(-200.0)) == 0.0


@pytest.mark.parametrize("kernel", ["numba", "blas"])
@pytest.mark.parametrize("window", [0, 5])
def test_attention_gqa_masks_and_scattered_slots(kernel, window):
    n_kv, heads, hd, cap = 2, 6, 16, 24
    k = rng.normal(size=(n_kv, cap, hd)).astype(np.float16)
    v = rng.normal(size=(n_kv, cap, hd)).astype(np.float16)
    slot_pos = np.full(cap, -1, np.int32)
    slot_pos[:20] = rng.permutation(20)  # live slots in any order, as in a wrapped ring
    q_pos = np.array([12, 15, 19], np.int32)
    q = rng.normal(size=(3, heads, hd)).astype(np.float32)
    out = np.zeros((3, heads, hd), np.float32)
    ku, vu = k.view(np.uint16), v.view(np.uint16)
    if kernel == "numba":
        scores = np.zeros((3 * heads, cap), np.float32)
        pv = np.zeros((max_threads(), 4, 16, max(hd, 64)), np.float32)
        attention_f16(q.copy(), q_pos, ku, vu, slot_pos, cap, window, np.float32(0.25), scores, pv, out)
    else:
        attention_chunk_blas(q, q_pos, k.astype(np.float32), v.astype(np.float32), slot_pos, cap, window, 0.25, out, True)
    ref = reference_attention(q, q_pos, k.astype(np.float32), v.astype(np.float32), slot_pos, window, 0.25)
    # Q and the softmax probabilities are rounded to f16 as llama.cpp does: ~1e-3 relative
    np.testing.assert_allclose(out, ref, rtol=0, atol=F16_ATTENTION_ATOL)
