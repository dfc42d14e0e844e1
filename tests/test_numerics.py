"""Numerics under hostile values (issue 16, item 6): weights holding NaN or inf, block scales
of 0, K and V values beyond what each cache type stores. The allowed outcomes: NumericalError
naming the bad tensors, with the session as it was, or saturation as kv/cache.py documents
(never an inf or NaN stored, never silent garbage). Oracles: the `gguf` package's
dequantization for which blocks are bad; the float32 values for what saturation keeps."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize

from edgekv import NumericalError, load
from edgekv.backends import get_backend
from edgekv.kv.cache import CACHE_TYPES, KeyMap, KVCache
from edgekv.gguf.quants import QUANT_TYPES, count_non_finite
from edgekv.kv.types import KV_CACHE_TYPES
from helpers.hostile_gguf import poisoned


def set_f16(raw: bytearray, at: int, value: float) -> bytearray:
    raw[at : at + 2] = np.array([value], np.float16).tobytes()
    return raw


@pytest.mark.parametrize("name", [q.name for q in QUANT_TYPES.values()])
def test_non_finite_values_and_scales_are_counted_like_gguf_dequantizes_them(name):
    q = QUANT_TYPES[int(T[name])]
    rng = np.random.default_rng(5)
    if q.scales:  # random codes under finite scales (gguf cannot quantize every type)
        blocks = rng.integers(0, 256, size=(4 * 2048 // q.block_size, q.type_size), dtype=np.uint8)
        for o in q.scales:
            blocks[:, o : o + 2] = rng.uniform(0.01, 1, (blocks.shape[0], 1)).astype(np.float16).view(np.uint8)
        raw = blocks.reshape(-1)
    else:
        raw = gguf_quantize(rng.normal(size=(4, 2048)).astype(np.float32), T[name]).view(np.uint8).reshape(-1).copy()
    clean = raw.copy()
    bad = [3, 17, 30] if q.scales else [5, 600, 1999]  # blocks, or values of a float type
    for i, b in enumerate(bad):
        value = [np.inf, -np.inf, np.nan][i]
        if q.scales:
            at = b * q.type_size + q.scales[i % len(q.scales)]
            raw[at : at + 2] = np.frombuffer(np.array([value], np.float16).tobytes(), np.uint8)
        else:
            dtype = {"F32": np.float32, "F16": np.float16, "BF16": np.float32}[name]
            as_bytes = np.frombuffer(np.array([value], dtype).tobytes(), np.uint8)
            size = q.type_size
            raw[b * size : (b + 1) * size] = as_bytes[-size:]  # bf16: the upper half of the float32
    with np.errstate(invalid="ignore", over="ignore"):
        values = gguf_dequantize(raw.reshape(4, -1), T[name]).reshape(-1)
    per_block = (~np.isfinite(values)).reshape(-1, q.block_size).any(axis=1)
    assert count_non_finite(raw, int(T[name])) == int(per_block.sum()) == len(bad)
    assert count_non_finite(clean, int(T[name])) == 0
    assert np.isfinite(gguf_dequantize(clean.reshape(4, -1), T[name])).all()


@pytest.mark.parametrize("cache_type", CACHE_TYPES)
def test_values_beyond_a_cache_type_are_stored_saturated(cache_type):
    limit = KV_CACHE_TYPES[cache_type].limit
    cache = KVCache(n_layers=1, n_kv_heads=1, head_dim_k=32, head_dim_v=32, capacity=4, backend=get_backend("cpu"),
                    type_k=cache_type, type_v=cache_type, key_map=KeyMap.identity(1, 1, 32))
    k = np.linspace(-1, 1, 32, dtype=np.float32) * np.float32(3e38)
    k[3], k[30] = -np.inf, np.inf
    res = cache.reserve(1)
    cache.write(0, res.slots[0], k[None, None], k[None, None].copy())
    stored = cache.backend.load_kv(cache.k[0], cache.kind_k.quant.ggml_type, 32, res.slots[0])[0, 0]
    if cache_type == "f32":  # every finite float32 fits; inf is kept as inf (then NumericalError)
        assert np.isinf(stored[[3, 30]]).all() and np.isfinite(np.delete(stored, [3, 30])).all()
        return
    assert np.isfinite(stored).all()
    # q4_1: the f16 step rounds d * 15 + m a little up; IQ4_NL's levels run from -127 to 113, and
    # a block of +-max values gets its least-squares scale up to max / 113: 127/113 of max stored
    overshoot = 127 / 113 if KV_CACHE_TYPES[cache_type].quant.ggml_type == 20 else 1.0
    assert np.abs(stored).max() <= limit * 1.001 * overshoot
    assert (np.sign(stored[[0, 3]]) == -1).all() and (np.sign(stored[[30, 31]]) == 1).all()
    # within the range a saturated cache stores what an unsaturated one would
    small = np.linspace(-1, 1, 32, dtype=np.float32)
    res = cache.reserve(1)
    cache.write(0, res.slots[0], small[None, None], small[None, None].copy())
    kept = cache.backend.load_kv(cache.k[0], cache.kind_k.quant.ggml_type, 32, res.slots[0])[0, 0]
    np.testing.assert_allclose(kept, small, atol=0.15)


@pytest.fixture(scope="module")
def huge_k_model(tiny_model, tmp_path_factory):
    """A tiny llama whose layer-0 K projection is scaled by 1e9: every K value is far beyond
    f16 (and beyond what the quantized cache types' f16 block scales reach)."""
    src = tiny_model("llama", head_dim=32, dim=64, n_heads=2, n_kv_heads=1)

    def scale(raw: bytearray) -> bytearray:
        w = np.frombuffer(bytes(raw), np.float32) * np.float32(1e9)
        return bytearray(w.tobytes())

    return poisoned(src, tmp_path_factory.mktemp("num") / "huge-k.gguf", "blk.0.attn_k.weight", scale)


@pytest.mark.parametrize("cache_type", CACHE_TYPES + ("q4_0:1+f16", "f16:1+iq4_cal"))  # and per-layer mixes
def test_k_beyond_every_cache_type_gives_finite_logits(huge_k_model, cache_type):
    model = load(huge_k_model)
    s = model.session(n_ctx=32, cache_type_k=cache_type, cache_type_v=cache_type)
    logits = s.eval(list(range(1, 20)), all_logits=True)
    assert np.isfinite(logits).all() and s.n_tokens == 19
    s.eval([7])
    assert np.isfinite(s.logits).all()


@pytest.mark.parametrize("weight_type, tensor, value", [("F32", "blk.0.ffn_up.weight", np.nan),
                                                        ("F16", "blk.1.attn_q.weight", np.inf),
                                                        ("Q8_0", "blk.0.attn_output.weight", np.inf)])
def test_nan_or_inf_weights_raise_numerical_error_naming_the_tensor(tiny_model, tmp_path, weight_type, tensor, value):
    src = tiny_model("llama", weight_type=weight_type, head_dim=32, dim=64, n_heads=2, n_kv_heads=1)

    def poison(raw: bytearray) -> bytearray:
        if weight_type == "F32":
            raw[40:44] = np.array([value], np.float32).tobytes()
            return raw
        return set_f16(raw, 34 * 2 if weight_type == "Q8_0" else 20, value)  # a block scale, or one value

    model = load(poisoned(src, tmp_path / "bad.gguf", tensor, poison))
    s = model.session(n_ctx=32)
    with pytest.raises(NumericalError, match=rf"NaN or inf in {tensor} \(1\).*download or convert it again"):
        s.eval([1, 2, 3])
    assert s.n_tokens == s.cache.n_tokens == 0
    assert model.network.non_finite_weights() == {tensor: 1}


def test_an_activation_overflow_with_finite_weights_is_explained(tiny_model, tmp_path):
    src = tiny_model("llama")

    def huge(raw: bytearray) -> bytearray:  # finite, but the normed state times it exceeds float32
        return bytearray(np.full(len(raw) // 4, 3e38, np.float32).tobytes())

    model = load(poisoned(src, tmp_path / "overflow.gguf", "output_norm.weight", huge))
    s = model.session(n_ctx=32)
    with pytest.raises(NumericalError, match="every weight is finite, so an activation overflowed"):
        s.eval([1, 2, 3])
    assert s.n_tokens == 0


def test_block_scales_of_zero_are_zero_weights(tiny_model, tmp_path):
    """A Q8_0 tensor whose every block scale is 0 dequantizes to zeros (as gguf's does): the
    model runs and its logits equal those of the same model with that tensor's values 0."""
    src = tiny_model("llama", weight_type="Q8_0", head_dim=32, dim=64, n_heads=2, n_kv_heads=1)

    def zero_scales(raw: bytearray) -> bytearray:
        blocks = np.frombuffer(bytes(raw), np.uint8).reshape(-1, 34).copy()
        blocks[:, :2] = 0
        return bytearray(blocks.tobytes())

    def zero_all(raw: bytearray) -> bytearray:
        blocks = np.frombuffer(bytes(raw), np.uint8).reshape(-1, 34).copy()
        blocks[:, :2] = np.frombuffer(np.float16(1).tobytes(), np.uint8)  # scale 1, codes 0: zeros too
        blocks[:, 2:] = 0
        return bytearray(blocks.tobytes())

    tensor = "blk.0.ffn_gate.weight"
    a = load(poisoned(src, tmp_path / "zero-scales.gguf", tensor, zero_scales)).session(n_ctx=16)
    b = load(poisoned(src, tmp_path / "zero-codes.gguf", tensor, zero_all)).session(n_ctx=16)
    la, lb = a.eval([1, 2, 3, 4], all_logits=True), b.eval([1, 2, 3, 4], all_logits=True)
    assert np.isfinite(la).all()
    np.testing.assert_array_equal(la, lb)
