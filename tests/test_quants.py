"""edgekv.gguf.quants (the format registry, dequantization) and edgekv.kv.types (the KV-cache quantizers).

The independent reference is the `gguf` package (llama.cpp's own Python port of the
formats): every type must dequantize bit for bit like `gguf.quants.dequantize`, and every
KV-cache quantizer must produce the bytes of `gguf.quants.quantize` (ggml's reference
rounding). Random blocks are random bytes with sane f16 scales, so every code and every
bit pattern of the packed fields is exercised.
"""

from __future__ import annotations

import numba as nb
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T
from gguf import quants as gq

from edgekv.gguf import quants
from edgekv.kv import types as kvt
from edgekv.errors import UnsupportedModelError
from edgekv.gguf.reader import GGUFFile
from edgekv.kernels import dequant, quantize as kq
from edgekv.kernels.fp16 import f16_to_f32, f32_to_bf16, f32_to_f16
from helpers.quant_rows import ALL_TYPES, random_rows, reference_dequantize, same_bits
from numpy_reference import quantize_iq4_nl

KV_NAMES = sorted(kvt.KV_CACHE_TYPES)


# ---- registry -----------------------------------------------------------------------

def test_registry_sizes_match_ggml():
    for t, q in quants.QUANT_TYPES.items():
        assert (q.block_size, q.type_size) == GGML_QUANT_SIZES[T(t)], q.name
        assert q.name == T(t).name and q.ggml_type == t
    assert quants.row_nbytes(int(T.Q4_K), 512) == 2 * 144
    assert quants.row_nbytes(int(T.F16), 7) == 14
    assert quants.QUANT_TYPES[int(T.Q4_0)].bits_per_weight == 4.5


def test_unknown_type_lists_supported_ones():
    with pytest.raises(UnsupportedModelError, match=r"IQ2_XXS .*supported: F32, F16, BF16, Q8_0"):
        quants.row_nbytes(int(T.IQ2_XXS), 256)
    with pytest.raises(UnsupportedModelError, match="supported"):
        quants.quant_type(9999)
    with pytest.raises(UnsupportedModelError, match="whole number of 32-value blocks"):
        quants.row_nbytes(int(T.Q8_0), 48)
    with pytest.raises(UnsupportedModelError, match="needs 68 bytes, got 34"):
        quants.dequantize(np.zeros(34, np.uint8), int(T.Q8_0), (32, 2))
    with pytest.raises(UnsupportedModelError, match="cache type 'q2_k'"):
        kvt.kv_cache_type("q2_k")


# ---- dequantization -----------------------------------------------------------------

@pytest.mark.parametrize("ggml_type", ALL_TYPES, ids=lambda t: T(t).name)
def test_dequantize_matches_gguf_bit_for_bit(ggml_type):
    rng = np.random.default_rng(ggml_type)
    n_rows, n_cols = 5, 1024
    raw = random_rows(ggml_type, n_rows, n_cols, rng)
    ours = quants.dequantize(raw, ggml_type, (n_cols, n_rows))  # ggml order in, NumPy order out
    assert ours.shape == (n_rows, n_cols) and ours.dtype == np.float32
    assert same_bits(ours, reference_dequantize(raw, ggml_type))


def test_dequantize_keeps_half_specials():
    bits = np.array([0x0000, 0x8000, 0x0001, 0x03FF, 0x0400, 0x7BFF, 0x7C00, 0xFC00], np.uint16)
    ours = quants.dequantize(bits.view(np.uint8), int(T.F16), (8,))
    assert same_bits(ours, bits.view(np.float16).astype(np.float32))
    nan = quants.dequantize(np.array([0x7E00], np.uint16).view(np.uint8), int(T.F16), (1,))
    assert np.isnan(nan[0])


# ---- KV-cache quantizers ------------------------------------------------------------

def kv_test_rows(rng: np.random.Generator, n: int = 128) -> np.ndarray:
    """Rows that probe the rounding: normal values, zeros, constants, exact ties, extremes."""
    rows = [rng.standard_normal(n), rng.standard_normal(n) * 1e-3 + 5.0, np.zeros(n), np.full(n, -2.5),
            rng.uniform(-60000, 60000, n), rng.standard_normal(n) * 1e-6]
    ties = np.tile(np.arange(-16, 16, dtype=np.float64) + 0.5, n // 32)  # x/d lands on .5 for d = 1
    ties[::32] = -127.0  # q8_0: amax 127 -> d = 1
    rows.append(ties)
    neg_max = rng.standard_normal(n)
    neg_max[::32] = -10.0  # the signed max is negative (q4_0/q5_0 flip the scale's sign)
    rows.append(neg_max)
    return np.array(rows, dtype=np.float32)


def reference_quantize(x: np.ndarray, name: str) -> np.ndarray:
    if name == "f32":
        return x.view(np.uint8)
    if name == "f16":
        return x.astype(np.float16).view(np.uint8)  # ties to even, as F16C
    if kvt.KV_CACHE_TYPES[name].quant.ggml_type == T.IQ4_NL:  # gguf.quants cannot quantize it
        return quantize_iq4_nl(x)
    return gq.quantize(x, T(kvt.KV_CACHE_TYPES[name].quant.ggml_type))


@pytest.mark.parametrize("name", KV_NAMES)
def test_kv_quantizer_matches_ggml_reference_bytes(name):
    x = kv_test_rows(np.random.default_rng(7))
    t = kvt.KV_CACHE_TYPES[name]
    ours = kvt.quantize(x, t.quant.ggml_type)
    assert ours.shape == (x.shape[0], t.row_nbytes(x.shape[1]))
    expected = reference_quantize(x, name).reshape(ours.shape)
    bad = np.nonzero((ours != expected).any(axis=1))[0]
    assert bad.size == 0, f"{name}: rows {bad.tolist()} differ from ggml's reference bytes"


# worst error of a round trip, per block, as a multiple of the block's step d (or of |x| for
# the float formats) plus the f16 rounding of d and m (2^-11 relative)
ROUND_TRIP_STEPS = {"q8_0": 0.5, "q4_1": 0.5, "q5_1": 0.5, "q4_0": 1.0, "q5_0": 1.0}  # q4_0/q5_0: top code clamps
CODES_MAX = {"q8_0": 127, "q4_0": 8, "q4_1": 15, "q5_0": 16, "q5_1": 31}
FLOAT_REL = {"f32": 0.0, "f16": 2.0**-11, "bf16": 2.0**-8}


@pytest.mark.parametrize("name", KV_NAMES)
def test_kv_round_trip_error_bound(name):
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((64, 256)) * rng.uniform(0.01, 100, (64, 1))).astype(np.float32)
    t = kvt.KV_CACHE_TYPES[name]
    back = quants.dequantize(kvt.quantize(x, t.quant.ggml_type), t.quant.ggml_type, (256, 64))
    err = np.abs(back.astype(np.float64) - x)
    if name in FLOAT_REL:
        assert np.all(err <= FLOAT_REL[name] * np.abs(x) + 2.0**-25), name  # + half of the f16 subnormal step
        return
    blocks = x.reshape(64, -1, 32).astype(np.float64)
    if t.quant.ggml_type == T.IQ4_NL:
        # half the widest gap between IQ4_NL's levels (89 -> 113) at d = amax / 127 is 0.094 amax;
        # the least-squares refit of d moves the grid a little (measured worst: 0.109 amax)
        assert np.all(err.reshape(blocks.shape) <= 0.12 * np.abs(blocks).max(-1, keepdims=True)), name
        return
    lo, hi = blocks.min(-1, keepdims=True), blocks.max(-1, keepdims=True)
    amax = np.abs(blocks).max(-1, keepdims=True)
    asym = name in ("q4_1", "q5_1")
    step = (hi - lo) / CODES_MAX[name] if asym else amax / CODES_MAX[name]
    f16_err = 2.0**-11 * (CODES_MAX[name] * step + (np.abs(lo) if asym else 0) + amax)
    bound = ROUND_TRIP_STEPS[name] * step * (1 + 1e-6) + f16_err
    assert np.all(err.reshape(blocks.shape) <= bound), name


@nb.njit
def _write_and_read_cache(k_rows, cache, quantize_row, dequantize_row, out):
    # what a KV-cache kernel does: quantize rows into slots of a [n_slots, row_nbytes] ring
    for s in range(k_rows.shape[0]):
        quantize_row(k_rows[s], cache[s])
    for s in range(k_rows.shape[0]):
        dequantize_row(cache[s], out[s])


@pytest.mark.parametrize("name", ["q8_0", "q4_1", "f16"])
def test_kv_row_kernels_are_callable_from_njit(name):
    t = kvt.kv_cache_type(name.upper())  # names are case-insensitive
    x = np.random.default_rng(3).standard_normal((4, 64)).astype(np.float32)
    cache = np.zeros((4, t.row_nbytes(64)), np.uint8)
    out = np.zeros_like(x)
    _write_and_read_cache(x, cache, t.quantize_row, t.dequantize_row, out)
    assert np.array_equal(cache, kvt.quantize(x, t.quant.ggml_type))
    assert same_bits(out, quants.dequantize(cache, t.quant.ggml_type, (64, 4)))


@nb.njit
def _halves_to_f32(h, out):
    for i in range(h.size):
        out[i] = f16_to_f32(h[i])


@nb.njit
def _f32_to_halves(x, f16, bf16):
    for i in range(x.size):
        f16[i] = f32_to_f16(x[i])
        bf16[i] = f32_to_bf16(x[i])


def test_half_conversions_are_exact():
    h = np.arange(65536, dtype=np.uint16)
    back = np.zeros(65536, np.float32)
    _halves_to_f32(h, back)
    finite = ~np.isnan(h.view(np.float16))
    assert same_bits(back[finite], h.view(np.float16)[finite].astype(np.float32))  # incl. subnormals, inf
    assert np.isnan(back[~finite]).all()
    # float32 -> half / bfloat16 over 64 binades (subnormal halves to overflow) and exact ties
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(65536) * 2.0 ** np.linspace(-30, 34, 65536)).astype(np.float32)
    x[:6] = [1 + 2.0**-11, 1 + 3 * 2.0**-11, 65520.0, 65519.0, 2.0**-25, 3 * 2.0**-26]  # half ties
    x[6:8] = [1 + 2.0**-8, 1 + 3 * 2.0**-8]  # bfloat16 ties
    f16, bf16 = np.zeros(x.size, np.uint16), np.zeros(x.size, np.uint16)
    _f32_to_halves(x, f16, bf16)
    with np.errstate(over="ignore"):
        assert np.array_equal(f16, x.astype(np.float16).view(np.uint16))
    assert np.array_equal(bf16.view(np.uint8), gq.quantize(x, T.BF16).reshape(-1))


# ---- real models ----------------------------------------------------------------------

def _sample_rows(info, n: int, rng) -> tuple[np.ndarray, np.ndarray]:
    raw = np.asarray(info.data).reshape(info.n_rows, -1)
    ids = np.sort(rng.choice(info.n_rows, size=min(n, info.n_rows), replace=False))
    return ids, np.ascontiguousarray(raw[ids])


@pytest.mark.slow
@pytest.mark.parametrize("model, names", [
    ("smollm2", ["blk.0.attn_q.weight", "token_embd.weight", "blk.0.attn_norm.weight"]),
    ("gemma3", ["blk.0.ffn_gate.weight", "blk.0.attn_output.weight", "blk.0.ffn_down.weight",
                "blk.3.ffn_down.weight", "token_embd.weight"]),
])
def test_real_tensors_dequantize_like_gguf(model, names, request):
    f = GGUFFile(request.getfixturevalue(f"{model}_path"))
    rng = np.random.default_rng(0)
    seen = set()
    for name in names:
        info = f.tensor(name)
        seen.add(T(info.ggml_type).name)
        ids, raw = _sample_rows(info, 96, rng)  # a sample of rows keeps the reference fast
        ours = quants.dequantize(raw, info.ggml_type, (info.row_length, ids.size))
        assert same_bits(ours, reference_dequantize(raw, info.ggml_type)), name
    expected = {"smollm2": {"Q4_1", "Q8_0", "F32"}, "gemma3": {"Q5_0", "Q4_K", "Q6_K", "Q8_0"}}[model]
    assert seen == expected


def test_dequant_row_dispatch_covers_the_registry():
    # every registered type has a row kernel: dequantize_rows must not silently skip one
    for t in ALL_TYPES:
        q = quants.QUANT_TYPES[t]
        raw = random_rows(t, 1, 256, np.random.default_rng(t))
        out = np.full((1, 256), np.nan, np.float32)
        dequant.dequantize_rows(raw, t, out)
        assert np.isfinite(out).all(), q.name
    for name in KV_NAMES:
        t = kvt.KV_CACHE_TYPES[name].quant.ggml_type
        dst = np.full((1, quants.row_nbytes(t, 64)), 0xAB, np.uint8)
        kq.quantize_rows(np.ones((1, 64), np.float32), t, dst)
        assert not np.all(dst == 0xAB), name
