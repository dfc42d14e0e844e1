"""Scalar conversions between float32 and the 16-bit formats, and ggml's rounding helpers.

Numba has no float16 type, so halves travel as their uint16 bit patterns. f16_to_f32
and f32_to_f16 are the CPU's conversion instructions where it has them (intrinsics.py)
and otherwise integer arithmetic, branch-light so that LLVM vectorizes it inside the
kernels' lane loops. What does not live here: any
loop over arrays (see dequant.py, quantize.py, matvec.py).

Rounding, as ggml does it on CPUs:
- float32 -> f16: round to nearest even (F16C `vcvtps2ph`, numpy's astype(float16));
- float32 -> bf16: round to nearest even, NaN forced quiet (ggml_compute_fp32_to_bf16);
- roundf: half away from zero (C `roundf`, the reference q8_0 quantizer);
- nearest_int: half to even (ggml's `nearest_int` magic-number trick, and the SIMD
  `_mm256_round_ps(_, _MM_ROUND_NEAREST)` that quantizes activations).
"""

from __future__ import annotations

import numba as nb
import numpy as np

from .config import EXACT_FLAGS
from .intrinsics import HAS_F16C, float_to_half, half_to_float

U32 = np.uint32
_TWO_POW_112 = np.float32(2.0**112)
_TWO_POW_24 = np.float32(2.0**24)


def all_halves() -> np.ndarray:
    """Every f16 value as float32, indexed by its 16 bits (f32[65536]).

    The NaN patterns convert quietly: on AArch64 the hardware conversion of a
    signalling NaN raises the 'invalid' flag, which NumPy would print as a warning
    on every import."""
    with np.errstate(invalid="ignore"):
        return np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)


@nb.njit(**EXACT_FLAGS)
def f16_to_f32_soft(h):
    # h: uint16 bits of an IEEE half -> float32 (exact, subnormals and inf/NaN included)
    # Every step is wrapped in uint32: Numba widens integer arithmetic to 64 bits, and
    # the explicit casts let LLVM keep 32-bit lanes when it vectorizes a caller's loop.
    em = U32(U32(h) & U32(0x7FFF))
    # shifting exponent+mantissa into float32 position and scaling by 2^112 re-biases the
    # exponent (15 -> 127) and normalizes half subnormals in one exact multiply
    mag = np.float32(U32(em << U32(13)).view(np.float32) * _TWO_POW_112)
    bits = U32(np.float32(mag).view(np.uint32))
    if em >= U32(0x7C00):  # inf / NaN keep their payload
        bits = U32(U32(0x7F800000) | U32(em << U32(13)))
    return U32(bits | U32(U32(U32(h) & U32(0x8000)) << U32(16))).view(np.float32)


@nb.njit(**EXACT_FLAGS)
def f32_to_f16_soft(x):
    # x: float32 -> uint16 bits of the nearest half (ties to even), like F16C and numpy
    b = np.float32(x).view(np.uint32)
    sign = np.uint32((b >> 16) & 0x8000)
    a = b & np.uint32(0x7FFFFFFF)
    if a > 0x7F800000:  # NaN: keep it a quiet NaN
        return np.uint16(sign | 0x7E00 | ((a >> 13) & 0x3FF))
    if a >= 0x477FF000:  # rounds to >= 65520: overflow to inf
        return np.uint16(sign | 0x7C00)
    if a < 0x38800000:  # below 2^-14: a half subnormal (or zero); steps of 2^-24
        q = np.rint(np.uint32(a).view(np.float32) * _TWO_POW_24)
        return np.uint16(sign | np.uint32(q))
    # normal: round the 13 dropped mantissa bits to even, then re-bias 127 -> 15
    r = a + np.uint32(0xFFF) + ((a >> 13) & np.uint32(1))
    return np.uint16(sign | ((r - np.uint32(112 << 23)) >> 13))


# One instruction each where the CPU converts halves (F16C, AArch64); the integer
# formulations above elsewhere. Both give the same bits (NaNs aside: the instruction
# quiets a signalling NaN).
f16_to_f32 = half_to_float if HAS_F16C else f16_to_f32_soft
f32_to_f16 = float_to_half if HAS_F16C else f32_to_f16_soft


@nb.njit(**EXACT_FLAGS)
def bf16_to_f32(h):
    # h: uint16 bits of a bfloat16 -> float32 (exact: bf16 is the top half of a float32)
    return U32(U32(h) << U32(16)).view(np.float32)


@nb.njit(**EXACT_FLAGS)
def f32_to_bf16(x):
    # x: float32 -> uint16 bits of the nearest bfloat16 (ties to even; NaN made quiet)
    b = np.float32(x).view(np.uint32)
    if (b & 0x7FFFFFFF) > 0x7F800000:
        return np.uint16(((b & np.uint32(0xFFFF0000)) | np.uint32(0x00400000)) >> 16)
    return np.uint16((np.uint64(b) + np.uint64(0x7FFF) + np.uint64((b >> 16) & 1)) >> 16)


@nb.njit(**EXACT_FLAGS)
def round_f16(x):
    # x: float32 -> the float32 value of its nearest half (what an f16 round trip keeps)
    return f16_to_f32(f32_to_f16(x))


@nb.njit(**EXACT_FLAGS)
def roundf(x):
    # C roundf: nearest integer, halfway cases away from zero; x - trunc(x) is exact
    t = np.trunc(x)
    if abs(x - t) >= 0.5:
        t += np.copysign(np.float32(1.0), x)
    return t


@nb.njit(**EXACT_FLAGS)
def nearest_int(x):
    # nearest integer, halfway cases to even (ggml's nearest_int for |x| < 2^22)
    return np.int32(np.rint(x))
