"""Single machine instructions that Numba has no spelling for: fused multiply-add and
the IEEE half <-> float32 conversions, emitted as LLVM intrinsics.

Why: the exact kernels (dot_q.py, dot_k.py, attention.py, ggml_math.py) reproduce
llama.cpp's float arithmetic, which is full of FMAs and f16 conversions. Written in
plain Numba, an FMA is emulated in float64 and a half conversion is a dozen integer
operations; as `llvm.fma.f32`, `fpext half` and `fptrunc to half` they are one
instruction each (vfmadd, vcvtph2ps, vcvtps2ph) and LLVM vectorizes them like any
other arithmetic. The results are the same bits: an FMA rounds once by definition,
and the conversions are IEEE round-to-nearest-even either way.

`fma(a, b, c)` is the instruction when the CPU has one (HAS_FMA; x86 since Haswell,
always on AArch64) and a float64 emulation otherwise, so a kernel never calls a
library routine in its inner loop. `half_to_float` / `float_to_half` must only be
used where HAS_F16C: fp16.py picks them or its integer formulation.
What does not live here: loops over arrays.
"""

from __future__ import annotations

import numba as nb
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from .config import EXACT_FLAGS
from .cpu_features import host_cpu_name, host_has  # noqa: F401  (re-exported: the kernels ask here)

F32 = np.float32


HAS_FMA = host_has("fma")
HAS_F16C = host_has("f16c")


@intrinsic
def _fma_f32(typingctx, a, b, c):
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        f32 = ir.FloatType()
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f32, [f32, f32, f32]), "llvm.fma.f32")
        return builder.call(fn, args)

    return sig, codegen


@intrinsic
def _half_bits_to_f32(typingctx, h):
    sig = types.float32(types.uint16)

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return sig, codegen


@intrinsic
def _f32_to_half_bits(typingctx, x):
    sig = types.uint16(types.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))

    return sig, codegen


if HAS_FMA:
    @nb.njit(**EXACT_FLAGS)
    def fma(a, b, c):
        # float32 a * b + c rounded once (vfmadd)
        return _fma_f32(F32(a), F32(b), F32(c))
else:
    @nb.njit(**EXACT_FLAGS)
    def fma(a, b, c):
        # the product of two float32 is exact in float64, so only the sum rounds there
        # (and once more to float32: a double rounding that can differ from a true FMA
        # in the last bit, on CPUs without FMA only)
        return F32(np.float64(a) * np.float64(b) + np.float64(c))


@nb.njit(**EXACT_FLAGS)
def half_to_float(h):
    # uint16 bits of an IEEE half -> float32 (vcvtph2ps); only where HAS_F16C
    return _half_bits_to_f32(np.uint16(h))


@nb.njit(**EXACT_FLAGS)
def float_to_half(x):
    # float32 -> uint16 bits of the nearest half, ties to even (vcvtps2ph); only where HAS_F16C
    return _f32_to_half_bits(F32(x))
