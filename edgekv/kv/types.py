"""The KV cache's types: the ggml block formats a K or V row can be stored in, by llama.cpp's name.

What lives here: `KVCacheType` (a name, its block format, the @njit row quantizer and
dequantizer, the largest value it stores finite, whether K goes through a calibrated key
map), `KV_CACHE_TYPES` (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, iq4_cal),
`kv_cache_type` (by name, case-insensitive) and `quantize` (many rows at once, from Python).
A new cache type is one entry here, its kernels (kernels/quantize.py, dequant.py and the
attention kernels) and a test; kv/layer_types.py reads specs of them, kv/cache.py stores them.
What does not: the block formats' records and sizes (gguf/quants.py), the kernels.

From @njit code, call the row kernels as module globals, e.g.
`kernels.quantize.quantize_row(x, ggml_type, dst)` and
`kernels.dequant.dequant_row(src, ggml_type, dst)`, which dispatch on the type id.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import numpy as np
from gguf import GGMLQuantizationType as T

from ..errors import UnsupportedModelError
from ..gguf.quants import IQ4_NL_FORMAT, QUANT_TYPES, QuantType
from ..kernels import dequant, quantize as kq

F16_MAX = 65504.0  # the largest finite half
BF16_MAX = 3.3895313892515355e38  # the largest finite bfloat16 (0x7F7F)


@dataclass(frozen=True)
class KVCacheType:
    """A KV-cache storage format: rows of head_dim values stored as ggml blocks."""

    name: str  # llama.cpp's -ctk/-ctv name
    quant: QuantType
    quantize_row: Callable  # @njit (x: f32[n], dst: u8[row_nbytes]) -> None
    dequantize_row: Callable  # @njit (src: u8[row_nbytes], dst: f32[n]) -> None
    # the largest |value| the format stores finite; the cache saturates beyond it (a block's
    # scale is an f16: d = amax / 127 for q8_0, max / -8 for q4_0, max / -16 for q5_0; the
    # _1 types also store the minimum itself as an f16). llama.cpp stores inf there instead.
    limit: float
    # K stored through the model's calibrated key map (kv/key_map.KeyMap): centred and scaled per
    # channel before the rotation; V rows of such a type are stored as the plain format's
    calibrated: bool = False

    def row_nbytes(self, n: int) -> int:
        q = self.quant
        if n % q.block_size:
            raise UnsupportedModelError(f"a {self.name} row of {n} values is not a whole number of "
                                        f"{q.block_size}-value blocks")
        return n // q.block_size * q.type_size


KV_CACHE_TYPES: dict[str, KVCacheType] = {
    name: KVCacheType(name, QUANT_TYPES[int(t)], qfn, dfn, limit)
    for name, t, qfn, dfn, limit in (
        ("f32", T.F32, kq.quantize_row_f32, dequant.dequant_row_f32, float("inf")),
        ("f16", T.F16, kq.quantize_row_f16, dequant.dequant_row_f16, F16_MAX),
        ("bf16", T.BF16, kq.quantize_row_bf16, dequant.dequant_row_bf16, BF16_MAX),
        ("q8_0", T.Q8_0, kq.quantize_row_q8_0, dequant.dequant_row_q8_0, 127 * F16_MAX),
        ("q4_0", T.Q4_0, kq.quantize_row_q4_0, dequant.dequant_row_q4_0, 8 * F16_MAX),
        ("q4_1", T.Q4_1, kq.quantize_row_q4_1, dequant.dequant_row_q4_1, F16_MAX),
        ("q5_0", T.Q5_0, kq.quantize_row_q5_0, dequant.dequant_row_q5_0, 16 * F16_MAX),
        ("q5_1", T.Q5_1, kq.quantize_row_q5_1, dequant.dequant_row_q5_1, F16_MAX),
    )
}
# d = max / -127, then refitted by least squares (a little larger at most): saturate below
KV_CACHE_TYPES["iq4_nl"] = KVCacheType("iq4_nl", IQ4_NL_FORMAT, kq.quantize_row_iq4_nl, dequant.dequant_row_iq4_nl,
                                       100 * F16_MAX)
KV_CACHE_TYPES["iq4_cal"] = dataclasses.replace(KV_CACHE_TYPES["iq4_nl"], name="iq4_cal", calibrated=True)


def kv_cache_type(name: str) -> KVCacheType:
    """The KV-cache format called `name` (e.g. "q8_0"); UnsupportedModelError if unknown."""
    t = KV_CACHE_TYPES.get(str(name).lower())
    if t is None:
        raise UnsupportedModelError(f"cache type {name!r} is not supported (supported: {', '.join(KV_CACHE_TYPES)})")
    return t


def quantize(x: np.ndarray, ggml_type: int) -> np.ndarray:
    """float32 rows -> uint8 blocks for a KV-cache type; x: [..., n] -> [..., row_nbytes(n)]."""
    kind = next((t for t in KV_CACHE_TYPES.values() if t.quant.ggml_type == int(ggml_type)), None)
    if kind is None:
        raise UnsupportedModelError(
            f"quantizing to ggml type {ggml_type} is not supported (supported: {', '.join(KV_CACHE_TYPES)})")
    x = np.ascontiguousarray(x, dtype=np.float32)
    n = x.shape[-1] if x.ndim else 1
    rows = x.reshape(-1, n)
    out = np.empty((rows.shape[0], kind.row_nbytes(n)), np.uint8)
    kq.quantize_rows(rows, kind.quant.ggml_type, out)
    return out.reshape(x.shape[:-1] + (out.shape[1],))
