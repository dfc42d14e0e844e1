"""Random weight rows of every GGUF type edgekv reads, and gguf's reading of them: the inputs
and the independent reference of the dequantization and matvec tests (test_quants.py,
test_matvec.py, test_fast_kernels.py).

Random blocks are random bytes with sane f16 scales, so every code and every bit pattern of
the packed fields is exercised; the reference is the `gguf` package (llama.cpp's own Python
port of the formats).
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants as gq

from edgekv.gguf import quants

# byte offsets of the f16 scales inside one block of each quantized type
SCALE_OFFSETS = {"Q8_0": (0,), "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2),
                 "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "Q2_K": (80, 82), "Q3_K": (108,),
                 "IQ4_NL": (0,), "IQ4_XS": (0,)}
ALL_TYPES = sorted(quants.QUANT_TYPES)


def random_rows(ggml_type: int, n_rows: int, n_cols: int, rng: np.random.Generator) -> np.ndarray:
    """Raw bytes u8[n_rows, row_nbytes] of a valid random weight: random codes, scales in [-0.1, 0.1]."""
    q = quants.QUANT_TYPES[ggml_type]
    if q.name == "F32":
        return rng.uniform(-1, 1, (n_rows, n_cols)).astype(np.float32).view(np.uint8)
    if q.name == "F16":
        return rng.uniform(-1, 1, (n_rows, n_cols)).astype(np.float16).view(np.uint8)
    if q.name == "BF16":
        bits = rng.uniform(-1, 1, (n_rows, n_cols)).astype(np.float32).view(np.uint32) >> 16
        return bits.astype(np.uint16).view(np.uint8)
    blocks = rng.integers(0, 256, (n_rows, n_cols // q.block_size, q.type_size), dtype=np.uint8)
    for o in SCALE_OFFSETS[q.name]:
        scales = rng.uniform(-0.1, 0.1, blocks.shape[:2]).astype(np.float16)
        blocks[..., o:o + 2] = scales.view(np.uint8).reshape(*blocks.shape[:2], 2)
    return blocks.reshape(n_rows, -1)


def reference_dequantize(raw: np.ndarray, ggml_type: int) -> np.ndarray:
    """gguf's dequantization of u8[n_rows, row_nbytes] -> f32[n_rows, n]."""
    if ggml_type == int(T.F32):
        return raw.view(np.float32).copy()
    return np.asarray(gq.dequantize(raw, T(ggml_type)), np.float32)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))
