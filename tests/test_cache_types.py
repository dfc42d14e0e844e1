"""Cache types: K and V stored as f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl or
iq4_cal, chosen separately, quantized on write, read block by block by attention."""

from __future__ import annotations

import numpy as np
import pytest

from edgekv.backends import get_backend
from edgekv.kv.cache import CACHE_TYPES, KVCache
from edgekv.errors import EdgeKVError
from edgekv.loader import load

CPU = get_backend("cpu")  # the backend a cache is handed

TOKENS = [5, 17, 42, 3, 99, 7, 64, 12, 8, 30, 2, 77, 51, 9, 14, 33, 21, 60, 11, 4]
QUANTIZED_DIMS = dict(dim=128, n_heads=4, n_kv_heads=2, head_dim=32, ff=256)  # head rows of one block
# logits vs an f32 cache, relative to the logit scale: the cache type's rounding only
REL_TOL = {"f32": 1e-6, "f16": 2e-3, "bf16": 2e-2, "q8_0": 1e-2, "q5_0": 5e-2, "q5_1": 5e-2,
           "q4_0": 1e-1, "q4_1": 1e-1, "iq4_nl": 1e-1, "iq4_cal": 1e-1}


# gemma3's GELU reads ggml's f16 table, which turns last-bit differences (slot order in a
# sliding-window ring) into up to ~1e-3 of the logit scale: a floor for its tolerances
ARCH_FLOOR = {"llama": 0.0, "gemma3": 2e-3}


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def model(request, tiny_model):
    return load(tiny_model(request.param, **QUANTIZED_DIMS))


def _logits(model, type_k, type_v, n_batch):
    s = model.session(n_ctx=32, n_batch=n_batch, cache_type_k=type_k, cache_type_v=type_v)
    return s.eval(TOKENS, all_logits=True)


@pytest.mark.parametrize("cache_type", CACHE_TYPES)
def test_each_type_close_to_an_f32_cache(model, cache_type):
    ref = _logits(model, "f32", "f32", 1)
    for type_k, type_v in ((cache_type, "f32"), ("f32", cache_type), (cache_type, cache_type)):
        for n_batch in (1, 64):  # the per-query kernel and the BLAS prefill path
            got = _logits(model, type_k, type_v, n_batch)
            err = np.abs(got - ref).max() / np.abs(ref).max()
            assert err < max(2 * REL_TOL[cache_type], ARCH_FLOOR[model.hp.arch]), (type_k, type_v, n_batch, err)


def test_quantized_cache_is_not_dequantized_f32_in_disguise(model):
    # a q4_0 cache must actually lose information: its logits differ from f32's
    assert not np.allclose(_logits(model, "q4_0", "q4_0", 1), _logits(model, "f32", "f32", 1), atol=1e-4)


def test_bytes_per_token_of_smollm2_geometry():
    # 30 layers, 3 KV heads of 64 values, K and V
    expected = {"f16": 23_040, "q8_0": 12_240, "q4_0": 6_480, "iq4_nl": 6_480}
    for name, total in expected.items():
        cache = KVCache(n_layers=30, n_kv_heads=3, head_dim_k=64, head_dim_v=64, capacity=4, backend=CPU, type_k=name,
                        type_v=name)
        assert sum(cache.bytes_per_token()) == total
        assert cache.nbytes == 4 * total


def test_impossible_combination_is_refused_with_the_reason(tiny_model):
    model = load(tiny_model("llama"))  # head_dim 16: not a whole q8_0 block
    with pytest.raises(EdgeKVError, match=r"cache_type_k='q8_0'.*head size is 16.*multiple of 32"):
        model.session(n_ctx=16, cache_type_k="q8_0")
    with pytest.raises(EdgeKVError, match=r"cache_type_v='q9_9'.*supported: f32, f16"):
        model.session(n_ctx=16, cache_type_v="q9_9")
    assert model.session(n_ctx=16, cache_type_k="bf16", cache_type_v="f32").eval([1, 2], all_logits=True).shape[0] == 2


def test_hadamard_rotation_is_orthonormal_and_undone():
    from edgekv.kernels.rows import hadamard, rotate

    h = hadamard(64)
    np.testing.assert_allclose(h @ h, np.eye(64), atol=1e-6)
    x = np.random.default_rng(0).normal(size=(3, 2, 128)).astype(np.float32)
    y = x.copy()
    rotate(y, h)
    assert not np.allclose(x, y)
    rotate(y, h)
    np.testing.assert_allclose(y, x, atol=1e-5)


def test_quantized_caches_rotate_like_llama_cpp(tiny_model):
    # head size 128: K rotated in runs of 128, V in runs of 64; q4_0 gets closer to f32
    model = load(tiny_model("llama", dim=256, n_heads=2, n_kv_heads=1, head_dim=128, ff=256))
    s = model.session(n_ctx=32, cache_type_k="q4_0", cache_type_v="q4_0")
    assert s.cache.rot_k[0].shape == (128, 128) and s.cache.rot_v[0].shape == (64, 64)
    assert model.session(n_ctx=32).cache.rot_k == [None] * model.hp.n_layers  # f16: nothing to rotate
    ref = _logits(model, "f32", "f32", 1)
    rotated = _logits(model, "q4_0", "q4_0", 1)
    err = np.abs(rotated - ref).max() / np.abs(ref).max()
    assert err < REL_TOL["q4_0"]


def test_f16_cache_saturates_values_beyond_its_range():
    cache = KVCache(n_layers=1, n_kv_heads=1, head_dim_k=32, head_dim_v=32, capacity=4, backend=CPU)
    k = np.full((1, 1, 32), 1e6, np.float32)
    k[0, 0, 1] = -1e9
    res = cache.reserve(1)
    cache.write(0, res.slots[0], k, k.copy())
    stored = cache.k[0][0, 0].view(np.float16).astype(np.float32)
    assert stored[0] == 65504.0 and stored[1] == -65504.0 and np.isfinite(stored).all()


def test_nan_logits_raise_and_leave_the_session_unchanged(tiny_model):
    from edgekv.errors import EdgeKVError

    model = load(tiny_model("llama"))
    s = model.session(n_ctx=16)
    s.eval([1, 2, 3])
    before = s.logits.copy()
    saved = model.network.output_norm.copy()
    model.network.output_norm[:] = np.nan
    try:
        with pytest.raises(EdgeKVError, match="NaN or infinite logits"):
            s.eval([4])
    finally:
        model.network.output_norm[:] = saved
    assert s.n_tokens == s.cache.n_tokens == 3
    np.testing.assert_array_equal(s.logits, before)  # the failed call's logits were not kept
    s.eval([4])
    assert np.isfinite(s.logits).all() and not np.array_equal(s.logits, before)


def test_iq4_nl_rows_are_read_in_place_as_they_dequantize():
    # attention reads IQ4_NL rows through a 16-byte table lookup (pshufb on x86, tbl on Arm;
    # tests/aarch64 runs this too): its scores and sums must be those of gguf's dequantization
    from gguf import GGMLQuantizationType as T
    from gguf.quants import dequantize

    from edgekv.kernels.attention_q import IQ4_NL_IN_PLACE, attention_rows
    from edgekv.kernels.config import max_threads
    from edgekv.kv.types import quantize

    assert IQ4_NL_IN_PLACE
    rng = np.random.default_rng(3)
    cap, hd, n_heads = 20, 64, 2
    k, v = (rng.standard_normal((cap, hd)).astype(np.float32) * 3 for _ in range(2))
    kq, vq = (quantize(x, T.IQ4_NL).reshape(1, cap, -1) for x in (k, v))
    q = rng.standard_normal((2, n_heads, hd)).astype(np.float32)
    q_pos = np.array([cap - 2, cap - 1], np.int32)
    out = np.zeros((2, n_heads, hd), np.float32)
    attention_rows(q, q_pos, kq, vq, int(T.IQ4_NL), int(T.IQ4_NL), np.arange(cap, dtype=np.int32), cap, 0,
                   np.float32(0.125), np.zeros((2 * n_heads, cap), np.float32),
                   np.zeros((max_threads(), 2, hd), np.float32), out, np.zeros((1, 0, 1), np.float32))
    kd, vd = (dequantize(x.reshape(cap, -1), T.IQ4_NL).astype(np.float64) for x in (kq, vq))
    for t in range(2):
        for h in range(n_heads):
            s = kd[: q_pos[t] + 1] @ q[t, h] * 0.125
            p = np.exp(s - s.max())
            want = p @ vd[: q_pos[t] + 1] / p.sum()
            np.testing.assert_allclose(out[t, h], want, rtol=0, atol=1e-5 * np.abs(want).max())
