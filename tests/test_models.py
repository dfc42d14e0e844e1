"""Every architecture end to end on tiny random models, against the float64 NumPy reference."""

from __future__ import annotations

import numpy as np
import pytest

from edgekv.loader import load
from numpy_reference import ReferenceModel

TOKENS = [5, 17, 42, 3, 99, 7, 64, 12, 8, 30, 2, 77, 51, 9, 14, 33, 21, 60, 11, 4]
# f32 weights, f16 cache: the only rounding is K/V to half precision
LOGIT_TOL = 2e-2  # relative to the logit scale (max |logit|)


def _rel_err(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_prefill_matches_numpy_reference(tiny_model, arch):
    path = tiny_model(arch)
    s = load(path).session(n_ctx=64, n_batch=64)
    ours = s.eval(TOKENS, all_logits=True)
    ref = ReferenceModel(path).logits(TOKENS)
    assert _rel_err(ours, ref) < LOGIT_TOL
    assert (ours.argmax(1) == ref.argmax(1)).mean() >= 0.9


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("n_batch", [1, 3, 7])
@pytest.mark.parametrize("cache_type", ["f32", "f16"])
def test_chunk_size_does_not_change_logits(tiny_model, arch, n_batch, cache_type):
    # chunk sizes change the order slots are summed in (and a sliding-window layer's ring
    # size, window + n_batch). Where the arithmetic rounds to f16 on purpose, as ggml does
    # (softmax weights of an f16 cache; gemma3's GELU table), that last-bit difference
    # can reach ~1e-3 of the logit scale; otherwise it stays at float32 noise.
    rel_tol = 1e-5 if cache_type == "f32" and arch == "llama" else 2e-3
    model = load(tiny_model(arch))
    whole = model.session(n_ctx=64, n_batch=64, cache_type_k=cache_type, cache_type_v=cache_type)
    chunked = model.session(n_ctx=64, n_batch=n_batch, cache_type_k=cache_type, cache_type_v=cache_type)
    a, b = whole.eval(TOKENS, all_logits=True), chunked.eval(TOKENS, all_logits=True)
    np.testing.assert_allclose(b, a, rtol=0, atol=rel_tol * np.abs(a).max())


def test_gemma3_sliding_window_layers_see_only_their_window(tiny_model):
    # window 8 in the tiny model: with 20 tokens the local layers must mask old positions,
    # so a model that ignored the window would disagree with the reference at the end.
    path = tiny_model("gemma3")
    model = load(path)
    assert model.hp.window == 8 and model.hp.local_layers[:6] == (True,) * 5 + (False,)
    ours = model.session(n_ctx=64).eval(TOKENS, all_logits=True)
    ref = ReferenceModel(path).logits(TOKENS)
    assert _rel_err(ours[-4:], ref[-4:]) < LOGIT_TOL


@pytest.mark.parametrize("weight_type", ["F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"])
def test_quantized_weights_run_close_to_reference(tiny_model, weight_type):
    # activations are quantized to 8 bits for integer dot products, as in llama.cpp
    path = tiny_model("llama", weight_type)
    ours = load(path).session(n_ctx=64).eval(TOKENS, all_logits=True)
    ref = ReferenceModel(path).logits(TOKENS)
    assert _rel_err(ours, ref) < 0.05


@pytest.mark.parametrize("weight_type", ["Q4_K", "Q5_K", "Q6_K"])
def test_k_quants_run_close_to_reference(tiny_model, weight_type):
    path = tiny_model("gemma3", weight_type, dim=256, n_heads=4, n_kv_heads=2, head_dim=64, ff=512)
    ours = load(path).session(n_ctx=64).eval(TOKENS, all_logits=True)
    ref = ReferenceModel(path).logits(TOKENS)
    assert _rel_err(ours, ref) < 0.05


def test_context_full_leaves_session_usable(tiny_model):
    from edgekv.errors import ContextFullError

    model = load(tiny_model("llama"))
    s = model.session(n_ctx=16, n_batch=4)
    s.eval(TOKENS[:10])
    before = s.logits.copy()
    with pytest.raises(ContextFullError):
        s.eval(TOKENS[10:])
    assert s.n_tokens == s.cache.n_tokens == 10
    np.testing.assert_array_equal(s.logits, before)  # the refused input changed nothing
    s.eval(TOKENS[10:14])
    assert s.n_tokens == s.cache.n_tokens == 14
    fresh = model.session(n_ctx=16, n_batch=4)  # the same chunks, never refused: the same bits
    fresh.eval(TOKENS[:10])
    fresh.eval(TOKENS[10:14])
    np.testing.assert_array_equal(s.logits, fresh.logits)
