"""Inputs and float64 references for native/'s kernels, shared by the tests that build them
for this CPU (test_cuda_host.py), run them on a GPU or the emulated driver
(test_cuda_device.py) and compile them (test_cuda.py).

    QUANTIZED            the weight types with a quantized matvec kernel
    weights(kind, ...)   rows of a weight type as GGUF stores them
    CACHE_TYPES          each KV cache type's GGUF type; FLOAT_CACHE_TYPES the unrotated ones
    cache_rows(x, t)     K/V rows in a cache type as gguf.quants (or ggml's reference) writes them
    reference_attention  one query head's attention over a ring of slots, in float64
"""

from __future__ import annotations

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import quantize

QUANTIZED = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS"]
# offsets of the f16 scales in a block of the types gguf.quants cannot quantize (random codes)
K_QUANTS = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "Q2_K": (80, 82), "Q3_K": (108,), "IQ4_NL": (0,),
            "IQ4_XS": (0,)}


def weights(kind: str, n_rows: int, n_cols: int, rng) -> np.ndarray:
    """Rows of `kind` as GGUF stores them: quantized from floats, or (K-quants, which
    gguf.quants cannot quantize) random codes with finite f16 scales."""
    t = T[kind]
    if kind not in K_QUANTS:
        return quantize(rng.standard_normal((n_rows, n_cols)).astype(np.float32), t)
    block, size = gguf.GGML_QUANT_SIZES[t]
    raw = rng.integers(0, 256, (n_rows, n_cols // block, size), dtype=np.uint8)
    for at in K_QUANTS[kind]:
        raw[..., at: at + 2] = (rng.uniform(0.001, 0.05, raw.shape[:2]).astype(np.float16)
                                .view(np.uint8).reshape(*raw.shape[:2], 2))
    return raw.reshape(n_rows, -1)


CACHE_TYPES = {"f32": T.F32, "f16": T.F16, "bf16": T.BF16, "q8_0": T.Q8_0, "q4_0": T.Q4_0, "q4_1": T.Q4_1,
               "q5_0": T.Q5_0, "q5_1": T.Q5_1, "iq4_nl": T.IQ4_NL}
FLOAT_CACHE_TYPES = ("f32", "f16", "bf16")  # the others are blocks, stored Hadamard-rotated


def cache_rows(x: np.ndarray, t) -> np.ndarray:
    """x [..., n] in cache type t as gguf.quants writes it (IQ4_NL, which it cannot write:
    numpy_reference.quantize_iq4_nl, ggml's reference quantizer in NumPy)."""
    if t == T.IQ4_NL:
        from numpy_reference import quantize_iq4_nl

        return quantize_iq4_nl(x.reshape(-1, x.shape[-1])).reshape(*x.shape[:-1], -1)
    return quantize(x, t)


def reference_attention(q, k, v, slot_pos, qp, window, scale):
    visible = (slot_pos >= 0) & (slot_pos <= qp) & ((window == 0) | (qp - slot_pos < window))
    scores = (k[visible].astype(np.float64) @ q.astype(np.float64)) * scale
    p = np.exp(scores - scores.max())
    return (p / p.sum()) @ v[visible].astype(np.float64)
