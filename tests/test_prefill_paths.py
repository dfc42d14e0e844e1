"""The long-chunk prefill paths inside a whole model, against the float64 NumPy reference.

Chunks of kernel_map.BATCH_MIN_TOKENS (64) tokens or more leave the bit-exact per-token path:
weights go through the integer GEMM (dot_ir.py, 32-value block types on AVX512-VNNI or sdot
CPUs) or dequantized tiles + BLAS (every other type, and every type on the portable
kernels), and attention goes through `attention_chunk_blas` over the cache's rows
(`cache.dequantized` for a quantized cache). The real-model perplexity runs reach these
paths too, but only these tests pin them to an independent reference on every
combination: both architectures, Q8_0 / Q4_0 / Q4_K weights, f16 / q8_0 / q4_0 caches,
chunks of 64, 65 and 200 tokens, on the int8 dot-product kernels where the CPU has them and
always on the portable ones (what an aarch64 machine runs).
"""

from __future__ import annotations

import numpy as np
import pytest

from edgekv.backends import kernel_map
from edgekv.loader import load
from numpy_reference import ReferenceModel, ReferenceSession

CHUNKS = (64, 65, 200)
# dims that give every matrix whole 256-value blocks, so Q4_K is Q4_K in every weight
DIMS = dict(dim=256, n_heads=4, n_kv_heads=2, head_dim=64, ff=512, n_ctx=1024)
# Error of the logits relative to their scale (max |logit|), against float64. The reference
# dequantizes the same weights and rounds K/V as the cache type does (numpy_reference.
# cache_round), so what is left is float32 arithmetic and, on the integer GEMM, the 8-bit
# activations: a q8 rounding that flips between two runs moves a row by 1/127 of its block,
# and the layers carry that on (this noise floor is the same whether or not a reference
# rounds its activations the same way). Worst cases measured over every combination here,
# with about 2x margin; a wrong sign or scale anywhere in a path gives errors of order 1.
TOL = {
    "portable": {"f16": 0.002, "q8_0": 0.008, "q4_0": 0.07},  # measured 5.3e-4, 3.5e-3, 0.031
    "int8dot": {"f16": 0.04, "q8_0": 0.04, "q4_0": 0.12},  # measured 0.021, 0.018, 0.060
}

# the `cpu` backend takes the int8 dot kernels (VNNI, sdot) where the CPU has them; `cpu-portable` never does
KERNEL_PATHS = ["int8dot", "portable"] if kernel_map.int8dot_available() else ["portable"]
BACKEND = {"int8dot": "cpu", "portable": "cpu-portable"}


@pytest.fixture(params=KERNEL_PATHS)
def kernel_path(request):
    return request.param


_references: dict = {}


def _reference_logits(path, cache, tokens) -> np.ndarray:
    key = (str(path), cache, tuple(tokens))
    if key not in _references:
        _references[key] = ReferenceModel(path, cache, cache).logits(tokens)
    return _references[key]


def _rel_err(a, b) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("cache", ["f16", "q8_0", "q4_0"])
@pytest.mark.parametrize("weight_type", ["Q8_0", "Q4_0", "Q4_K"])
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_long_chunks_match_reference(tiny_model, kernel_path, arch, weight_type, cache):
    path = tiny_model(arch, weight_type, **DIMS)
    model = load(path, BACKEND[kernel_path])
    integer_gemm = kernel_path == "int8dot" and weight_type != "Q4_K"
    assert {layer.wq.uses_int8dot for layer in model.network.layers} == {integer_gemm}
    tokens = [int(t) for t in np.random.default_rng(11).integers(0, model.hp.n_vocab, sum(CHUNKS))]
    s = model.session(n_ctx=512, n_batch=max(CHUNKS), cache_type_k=cache, cache_type_v=cache)
    ours, at = [], 0
    for n in CHUNKS:  # one eval per chunk: each runs as one chunk of n tokens
        assert kernel_map.batched(n)
        ours.append(s.eval(tokens[at : at + n], all_logits=True))
        at += n
    ours = np.concatenate(ours)
    ref = _reference_logits(path, cache, tokens)
    err = _rel_err(ours, ref)
    assert err < TOL[kernel_path][cache], f"logits differ from the float64 reference by {err:.4f} of their scale"
    assert (ours.argmax(1) == ref.argmax(1)).mean() >= 0.9
    if arch == "gemma3":  # local layers keep window + n_batch slots: 329 tokens wrapped them
        local = model.hp.local_layers.index(True)
        assert s.cache.caps[local] < len(tokens)


@pytest.mark.parametrize("cache", ["f16", "q8_0", "q4_0"])
@pytest.mark.parametrize("arch", ["llama", pytest.param("gemma3", marks=pytest.mark.long)])  # gemma3: ~80% of the time
def test_long_chunks_through_a_wrapping_ring(tiny_model, kernel_path, arch, cache):
    """A context of 256 under the shift policy fed 65 + 200 + 64 + 200 tokens: the ring of
    every layer wraps (shift discards, then writes over the freed slots) while chunks take
    the long path; the reference applies the same discards to its own cache."""
    path = tiny_model(arch, "Q8_0", **DIMS)
    model = load(path, BACKEND[kernel_path])
    keep = 4
    s = model.session(n_ctx=256, n_batch=200, cache_type_k=cache, cache_type_v=cache, context_shift="shift",
                      n_keep=keep)
    ref = ReferenceSession(ReferenceModel(path, cache, cache))
    rng = np.random.default_rng(12)
    errs, wrapped = [], False
    for n in (65, 200, 64, 200):
        chunk = [int(t) for t in rng.integers(0, model.hp.n_vocab, n)]
        before = s.n_tokens
        ours = s.eval(chunk, all_logits=True)
        dropped = before + n - s.n_tokens
        if dropped:
            ref.discard(keep, dropped)
            wrapped = True
        want = np.stack([ref.step(t) for t in chunk])
        errs.append(_rel_err(ours, want))
        assert s.n_tokens == s.cache.n_tokens == len(ref.pos)
    pos = s.cache.pos[0][s.cache.pos[0] >= 0]
    assert wrapped and (np.diff(pos) < 0).any(), "the ring was meant to wrap: slots out of position order"
    assert max(errs) < TOL[kernel_path][cache], f"chunk errors {np.round(errs, 4)}"
