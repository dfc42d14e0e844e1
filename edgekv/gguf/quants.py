"""ggml block formats: a registry of small per-type records, sizes, and (de)quantization.

What lives here: `QUANT_TYPES` (one `QuantType` per supported ggml type, keyed by its
ggml type id), `row_nbytes`, `dequantize` (any supported type, file layout -> float32),
`count_non_finite` (NaN/inf in a tensor's values or block scales) and `non_finite_tensors`
(the same over a whole file). What does not: the KV-cache types built on these formats
(kv/types.py), the kernels themselves
(kernels/dequant.py, kernels/quantize.py), the repacked layout the matrix kernels read
(kernels/repack.py) and the matrix products (kernels/matvec.py).

From @njit code, call the row kernels as module globals, e.g.
`kernels.quantize.quantize_row(x, ggml_type, dst)` and
`kernels.dequant.dequant_row(src, ggml_type, dst)`, which dispatch on the type id (or
the per-type `quantize_row_q8_0`, ...). Passing them as function arguments also works,
but Numba then cannot cache the caller on disk.

Bit layouts, as stored in a GGUF file (little-endian; "code" is the stored integer):

  F32   4 bytes per value                      IEEE float32
  F16   2 bytes per value   s|eeeee|mmmmmmmmmm  IEEE half
  BF16  2 bytes per value   s|eeeeeeee|mmmmmmm  the upper 16 bits of a float32

  Blocks of 32 values. qs byte j carries value j in its low nibble and value j+16
  in its high nibble; qh bit j is the fifth bit of value j.
  Q8_0  34 B  [ d:f16 | qs:i8 x32 ]                    x = d * qs[j]
  Q4_0  18 B  [ d:f16 | qs:u8 x16 ]                    x = d * (code - 8)
  Q4_1  20 B  [ d:f16 | m:f16 | qs:u8 x16 ]            x = d * code + m
  Q5_0  22 B  [ d:f16 | qh:u32 | qs:u8 x16 ]           x = d * (code - 16)
  Q5_1  24 B  [ d:f16 | m:f16 | qh:u32 | qs:u8 x16 ]   x = d * code + m
  IQ4_NL 18 B [ d:f16 | qs:u8 x16 ]                    x = d * levels[code], 16 levels
        {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113}

  Super-blocks of 256 values ("K-quants"), sub-blocks with their own small scales.
  Q4_K 144 B  [ d:f16 | dmin:f16 | scales:u8 x12 | qs:u8 x128 ]
        8 sub-blocks of 32, x = (d * sc[i]) * code - dmin * mn[i].
        qs[32c + l]: low nibble -> sub-block 2c value l, high nibble -> 2c+1 value l.
        The 8 six-bit scales sc[] and mins mn[] share the 12 bytes:
          byte 0..3   [ hi2(sc[4+k]) | sc[k] ]            k = byte
          byte 4..7   [ hi2(mn[4+k]) | mn[k] ]            k = byte - 4
          byte 8..11  [ lo4(mn[4+k]) | lo4(sc[4+k]) ]     k = byte - 8
  Q5_K 176 B  [ d:f16 | dmin:f16 | scales:u8 x12 | qh:u8 x32 | qs:u8 x128 ]
        as Q4_K, plus a fifth bit: bit i of qh[l] belongs to sub-block i, value l.
  Q6_K 210 B  [ ql:u8 x128 | qh:u8 x64 | scales:i8 x16 | d:f16 ]
        16 sub-blocks of 16, x = (d * scales[i]) * (code - 32), code = 6 bits.
        value 128h + 32k + l (h in 0..1, k in 0..3, l in 0..31):
          low 4 bits  = nibble (low if k < 2, else high) of ql[64h + 32(k % 2) + l]
          high 2 bits = bits 2k..2k+1 of qh[32h + l]
          scale index = 8h + 2k + l // 16
  Q2_K  84 B  [ scales:u8 x16 | qs:u8 x64 | d:f16 | dmin:f16 ]
  Q3_K 110 B  [ hmask:u8 x32 | qs:u8 x64 | scales:u8 x12 | d:f16 ]
        16 sub-blocks of 16. Value 128n + 32j + l (n < 2, j < 4, l < 32): code bits 2j..2j+1
        of qs[32n + l], sub-block s = 8n + 2j + l // 16. Q2_K: x = (d * (scales[s] & 15)) *
        code - dmin * (scales[s] >> 4). Q3_K: code - 4 unless bit 4n + j of hmask[l] is set,
        x = (d * (sc6[s] - 32)) * code; sc6[s] = nibble s // 8 of scales[s % 8] | bits
        2 (s // 4).. of scales[8 + s % 4] << 4.
  IQ4_XS 136 B [ d:f16 | scales_h:u16 | scales_l:u8 x4 | qs:u8 x128 ]
        8 sub-blocks of 32, each an IQ4_NL block's codes (qs[16ib .. 16ib + 15]) under
        x = (d * (ls[ib] - 32)) * levels[code]; the 6-bit ls[ib] = nibble ib % 2 of
        scales_l[ib / 2] | bits 2ib..2ib+1 of scales_h << 4.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from gguf import GGMLQuantizationType as T

from ..errors import UnsupportedModelError
from ..kernels import dequant

if TYPE_CHECKING:
    from .reader import GGUFFile


@dataclass(frozen=True)
class QuantType:
    """One ggml storage format."""

    name: str  # ggml's name (GGMLQuantizationType member)
    ggml_type: int
    block_size: int  # values per block
    type_size: int  # bytes per block
    act: str  # what the matvec kernels turn the activation vector into for this weight
    scales: tuple[int, ...] = ()  # byte offsets of a block's f16 fields (d, m or dmin)

    @property
    def bits_per_weight(self) -> float:
        return 8.0 * self.type_size / self.block_size


def _record(t: T, block_size: int, type_size: int, act: str, scales: tuple[int, ...] = ()) -> QuantType:
    return QuantType(t.name, int(t), block_size, type_size, act, scales)


# activation formats follow llama.cpp's vec_dot_type for each weight type
QUANT_TYPES: dict[int, QuantType] = {
    q.ggml_type: q
    for q in (
        _record(T.F32, 1, 4, "f32"),
        _record(T.F16, 1, 2, "f16"),
        _record(T.BF16, 1, 2, "bf16"),
        _record(T.Q8_0, 32, 34, "q8_0", (0,)),
        _record(T.Q4_0, 32, 18, "q8_0", (0,)),
        _record(T.Q4_1, 32, 20, "q8_1", (0, 2)),
        _record(T.Q5_0, 32, 22, "q8_0", (0,)),
        _record(T.Q5_1, 32, 24, "q8_1", (0, 2)),
        _record(T.Q4_K, 256, 144, "q8_K", (0, 2)),
        _record(T.Q5_K, 256, 176, "q8_K", (0, 2)),
        _record(T.Q6_K, 256, 210, "q8_K", (208,)),
        _record(T.Q2_K, 256, 84, "q8_K", (80, 82)),
        _record(T.Q3_K, 256, 110, "q8_K", (108,)),
        _record(T.IQ4_NL, 32, 18, "q8_0", (0,)),
        _record(T.IQ4_XS, 256, 136, "q8_K", (0,)),
    )
}


def quant_type(ggml_type: int) -> QuantType:
    """The record of a ggml type id; UnsupportedModelError (listing the supported ones) if unknown."""
    q = QUANT_TYPES.get(int(ggml_type))
    if q is None:
        try:
            label = f"{T(int(ggml_type)).name} ({int(ggml_type)})"
        except ValueError:
            label = str(ggml_type)
        supported = ", ".join(t.name for t in QUANT_TYPES.values())
        raise UnsupportedModelError(f"ggml type {label} is not supported (supported: {supported})")
    return q


def row_nbytes(ggml_type: int, n: int) -> int:
    """Bytes of one row of n values (a weight type's or a cache format's); n must be a whole
    number of blocks."""
    q = quant_type(ggml_type)
    if n % q.block_size:
        raise UnsupportedModelError(
            f"a {q.name} row of {n} values is not a whole number of {q.block_size}-value blocks")
    return n // q.block_size * q.type_size


_NUMPY_FLOATS = {int(T.F32): np.float32, int(T.F16): np.float16}


def dequantize(raw: np.ndarray, ggml_type: int, shape: tuple[int, ...]) -> np.ndarray:
    """Raw tensor bytes -> float32, by the fast kernels.

    `shape` is in ggml order (ne0 first, as TensorInfo.shape); the result has the
    NumPy order, i.e. shape reversed, so its last axis is the contiguous ne0.
    """
    shape = tuple(int(s) for s in shape)
    n = shape[0] if shape else 1
    n_rows = int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1
    nbytes = row_nbytes(ggml_type, n)
    raw = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)
    if raw.size != n_rows * nbytes:
        raise UnsupportedModelError(
            f"{T(int(ggml_type)).name} tensor of shape {shape} needs {n_rows * nbytes} bytes, got {raw.size}")
    float_type = _NUMPY_FLOATS.get(int(ggml_type))
    if float_type is not None:  # NumPy converts these exactly, with no compiled kernel to load
        out = raw.view(float_type).astype(np.float32)
    else:
        out = np.empty((n_rows, n), np.float32)
        dequant.dequantize_rows(raw.reshape(n_rows, nbytes), int(ggml_type), out)
    return out.reshape(tuple(reversed(shape)) if shape else ())


def count_non_finite(raw: np.ndarray, ggml_type: int) -> int:
    """How many NaN or inf a tensor's raw bytes hold: values of a float type, the f16
    scales of a block type (a block with such a scale dequantizes to NaN or inf; llama.cpp's
    --check-tensors looks at the same fields)."""
    q = quant_type(ggml_type)
    raw = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)
    if q.name == "F32":
        return int(np.count_nonzero(~np.isfinite(raw.view(np.float32))))
    if q.name in ("F16", "BF16"):  # all exponent bits set: inf or NaN
        exp = np.uint16(0x7C00 if q.name == "F16" else 0x7F80)
        return int(np.count_nonzero((raw.view(np.uint16) & exp) == exp))
    blocks = raw[: raw.size - raw.size % q.type_size].reshape(-1, q.type_size)
    return sum(int(np.count_nonzero(~np.isfinite(blocks[:, o : o + 2].copy().view(np.float16)))) for o in q.scales)


def non_finite_tensors(g: GGUFFile) -> dict[str, int]:
    """Tensors of an open GGUF holding NaN or inf (count_non_finite) -> how many; tensors of
    types edgekv does not know are skipped. Reads every tensor once, then drops the file's
    pages from this process again (GGUFFile.release_pages)."""
    found = {name: count_non_finite(t.data, t.ggml_type) for name, t in g.tensors.items()
             if int(t.ggml_type) in QUANT_TYPES}
    g.release_pages()
    return {name: n for name, n in found.items() if n}


# IQ4_NL (llama.cpp's 4-bit non-linear blocks: 16 levels, one f16 scale) is a weight type
# and a KV-cache format (kv/types.py)
IQ4_NL_FORMAT = QUANT_TYPES[int(T.IQ4_NL)]
