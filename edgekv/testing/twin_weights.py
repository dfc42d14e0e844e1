"""Random weights in a GGUF header's types, for a model's twin (tools/model_twin.py: a real
model's header; testing/twins.py: the header of a real model's shapes).

    fill_weights(header, out)   header's bytes, then random weights where its directory says
    random_weights(type, n, ndim, rng)   one tensor's bytes

The weights: float matrices N(0, 0.02), float vectors (norms) 1; quantized blocks random
codes with their f16 scales set so that values stay within about +-0.1 and centred (a
block's scale fields are edgekv.gguf.quants' `scales` offsets). Finite everywhere
(edgekv.gguf.quants.non_finite_tensors finds nothing), so a forward pass stays finite. Written
a tensor at a time into the file's mapping: a twin of several GiB needs one tensor in memory.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader

from ..gguf.quants import quant_type

SPREAD = 0.1  # the largest |value| a quantized twin weight takes, about
# per type, the f16 scale fields (in quant_type().scales order) for codes of the given range:
# d = SPREAD / (largest code x largest sub-scale); the second field (m, dmin) centres the values
SCALES = {
    T.Q8_0: lambda: (SPREAD / 128,),
    T.Q4_0: lambda: (SPREAD / 8,),
    T.Q5_0: lambda: (SPREAD / 16,),
    T.Q4_1: lambda: (SPREAD / 8, -SPREAD),  # x = d q + m, q in 0..15
    T.Q5_1: lambda: (SPREAD / 16, -SPREAD),  # q in 0..31
    T.Q4_K: lambda: (SPREAD / (63 * 15), 7.5 * SPREAD / (63 * 15)),  # x = d sc q - dmin mn; sc, mn in 0..63
    T.Q5_K: lambda: (SPREAD / (63 * 31), 15.5 * SPREAD / (63 * 31)),
    T.Q6_K: lambda: (SPREAD / (127 * 32),),  # x = d sc (q - 32); sc an int8
    T.Q2_K: lambda: (SPREAD / 45, 1.5 * SPREAD / 45),  # x = d sc q - dmin mn; sc, mn in 0..15, q in 0..3
    T.Q3_K: lambda: (SPREAD / (32 * 4),),  # x = d (sc - 32) q; sc in 0..63, q in -4..3
    T.IQ4_NL: lambda: (SPREAD / 127,),  # x = d level; levels -127..113
    T.IQ4_XS: lambda: (SPREAD / (32 * 127),),  # x = d (ls - 32) level; ls in 0..63
}
FLOATS = {T.F32: np.float32, T.F16: np.float16}
BIG = 1 << 36  # a sparse length past any header's tensor data, to read the directory from


def fill_weights(header: Path, dst: Path, seed: int = 0) -> int:
    """header's bytes, then random weights where its directory says; returns the file's size."""
    shutil.copyfile(header, dst)
    with open(dst, "r+b") as f:
        f.truncate(BIG)  # the directory is read from the header alone (the holes cost nothing)
    tensors = GGUFReader(dst).tensors
    end = max(int(t.data_offset) + int(t.n_bytes) for t in tensors)
    with open(dst, "r+b") as f:
        f.truncate(end)
    data = np.memmap(dst, np.uint8, "r+")
    rng = np.random.default_rng(seed)
    for t in tensors:
        at, n = int(t.data_offset), int(t.n_bytes)
        data[at: at + n] = random_weights(T(int(t.tensor_type)), int(np.prod(t.shape)), len(t.shape), rng)
    data.flush()
    return end


def random_weights(ggml_type: T, n_values: int, n_dims: int, rng: np.random.Generator) -> np.ndarray:
    """n_values of a tensor in ggml_type, as bytes."""
    if ggml_type in FLOATS or ggml_type == T.BF16:
        x = np.ones(n_values, np.float32) if n_dims == 1 else (0.02 * rng.standard_normal(n_values)).astype(np.float32)
        if ggml_type == T.BF16:
            return (x.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
        return x.astype(FLOATS[ggml_type]).view(np.uint8)
    if ggml_type not in SCALES:
        raise ValueError(f"no random weights for {ggml_type.name} tensors (types: "
                         f"{', '.join(t.name for t in (*FLOATS, T.BF16, *SCALES))})")
    q = quant_type(ggml_type)
    blocks = rng.integers(0, 256, (n_values // q.block_size, q.type_size), dtype=np.uint8)
    for offset, value in zip(q.scales, SCALES[ggml_type]()):
        blocks[:, offset: offset + 2] = np.frombuffer(np.float16(value).tobytes(), np.uint8)
    return blocks.reshape(-1)
