"""ggml's vectorised float32 transcendental functions, reproduced bit for bit.

Why: these small models are sensitive enough that one-ulp differences in exp, flipping
an 8-bit activation rounding somewhere, change greedy tokens. llama.cpp's CPU build
(AVX-512) computes the exp of softmax and SiLU with `ggml_v_expf`, a polynomial with FMA
steps (an ARM optimized-routines port), not the C library's expf, and GELU through a
65,536-entry table indexed by the f16 bits of x (GGML_GELU_FP16). The FMAs are the
CPU's (intrinsics.fma). What does not live here: loops over tensors (ops.py, attention.py).
"""

from __future__ import annotations

import functools
import math

import numba as nb
import numpy as np

from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from .config import EXACT_FLAGS
from .fp16 import all_halves
from .intrinsics import fma
from .irvec import FLOAT, V16F, arrays, fma16, i64_args, splat, vec

_f32 = np.float32
_SHIFT = _f32(float.fromhex("0x1.8p23"))  # adding it rounds to an integer
_LOG2E = _f32(float.fromhex("0x1.715476p+0"))
_LN2_HI = _f32(float.fromhex("0x1.62e4p-1"))
_LN2_LO = _f32(float.fromhex("0x1.7f7d1cp-20"))
_C0 = _f32(float.fromhex("0x1.0e4020p-7"))
_C1 = _f32(float.fromhex("0x1.573e2ep-5"))
_C2 = _f32(float.fromhex("0x1.555e66p-3"))
_C3 = _f32(float.fromhex("0x1.fffdb6p-2"))
_C4 = _f32(float.fromhex("0x1.ffffecp-1"))


@nb.njit(**EXACT_FLAGS)
def v_expf(x):
    # ggml_v_expf (AVX-512): exp(x) = 2^n * p(b), n = round(x / ln 2), b = x - n ln 2
    x = _f32(x)
    z = fma(x, _LOG2E, _SHIFT)
    n = _f32(z - _SHIFT)
    b = fma(-n, _LN2_LO, fma(-n, _LN2_HI, x))
    u = _f32(b * b)
    j = fma(fma(fma(_C0, b, _C1), u, fma(_C2, b, _C3)), u, fma(_C4, b, _f32(1.0)))
    # j * 2^n, rounded once: exact in float64 for |n| <= 192, then one rounding to float32
    # (as _mm512_scalef_ps); 2^n is built from its bits so the loop calling this vectorizes
    scaled = _f32(np.float64(j) * np.int64((np.int64(n) + 1023) << 52).view(np.float64))
    if abs(n) > 192.0 or n != n:
        return _f32(0.0) if n <= 0 else _f32(np.inf)
    return scaled


def v_expf_ir(builder, x):
    """v_expf on every lane of a float32 vector `x` (LLVM IR, for the kernels written in
    it): the same steps as v_expf above, one lane each, so the same bits where the CPU has
    FMA (llvm.fma is always fused; v_expf's fallback without FMA rounds twice)."""
    t, n_lanes = x.type, x.type.count
    i64s, f64s = vec(ir.IntType(64), n_lanes), vec(ir.DoubleType(), n_lanes)

    def c(value, vtype=t, element=FLOAT):
        return splat(builder, ir.Constant(element, value), vtype)

    z = fma16(builder, x, c(float(_LOG2E)), c(float(_SHIFT)))
    n = builder.fsub(z, c(float(_SHIFT)))
    neg = builder.fneg(n)
    b = fma16(builder, neg, c(float(_LN2_LO)), fma16(builder, neg, c(float(_LN2_HI)), x))
    u = builder.fmul(b, b)
    inner = fma16(builder, fma16(builder, c(float(_C0)), b, c(float(_C1))), u,
                  fma16(builder, c(float(_C2)), b, c(float(_C3))))
    j = fma16(builder, inner, u, fma16(builder, c(float(_C4)), b, c(1.0)))
    exponent = builder.shl(builder.add(builder.fptosi(n, i64s), c(1023, i64s, ir.IntType(64))),
                           c(52, i64s, ir.IntType(64)))
    scaled = builder.fptrunc(builder.fmul(builder.fpext(j, f64s), builder.bitcast(exponent, f64s)), t)
    fabs = cgutils.get_or_insert_function(builder.module, ir.FunctionType(t, [t]), f"llvm.fabs.v{n_lanes}f32")
    out_of_range = builder.fcmp_unordered(">", builder.call(fabs, [n]), c(192.0))  # or NaN
    special = builder.select(builder.fcmp_ordered("<=", n, c(0.0)), c(0.0), c(float("inf")))
    return builder.select(out_of_range, special, scaled)


@nb.njit(**EXACT_FLAGS)
def v_silu(x):
    # ggml_v_silu: x / (1 + v_expf(-x)), every step rounded to float32
    return _f32(x / _f32(_f32(1.0) + v_expf(-x)))


@intrinsic
def _silu_mul16(typingctx, gate, up, i0):
    # gate[i0:i0 + 16] <- v_silu(gate) * up on 16 lanes at once: v_silu's steps per lane
    def codegen(context, builder, sig, args):
        ga, ua = arrays(context, builder, sig, args, 0, 1)
        (first,) = i64_args(builder, [args[2]])
        g_ptr = builder.bitcast(builder.gep(ga.data, [first]), V16F.as_pointer())
        u_ptr = builder.bitcast(builder.gep(ua.data, [first]), V16F.as_pointer())
        x = builder.load(g_ptr, align=4)
        e = v_expf_ir(builder, builder.fneg(x))
        silu = builder.fdiv(x, builder.fadd(splat(builder, ir.Constant(FLOAT, 1.0)), e))
        builder.store(builder.fmul(silu, builder.load(u_ptr, align=4)), g_ptr, align=4)
        return context.get_dummy_value()

    return types.none(gate, up, i0), codegen


@nb.njit(**EXACT_FLAGS)  # exact: an intrinsic's IR takes its caller's fast-math flags
def v_silu_mul_rows(gate, up, end):
    # gate[:end] <- v_silu(gate) * up, 16 values at a time (end a multiple of 16): the
    # same bits as v_silu value by value where the CPU has FMA (v_expf_ir), ~10x faster
    for i in range(0, end, 16):
        _silu_mul16(gate, up, i)


@nb.njit(**EXACT_FLAGS)
def _gelu_f32(x16, out):
    # ggml_gelu_f32 on every f16 value, in float32 with the C library's tanhf (NumPy's
    # float32 tanh differs from glibc's in the last bit for some inputs) and the FMA that
    # GCC contracts `1.0f + GELU_COEF_A*x*x` into (it decides the table entry of x = -1.999)
    for i in range(x16.size):
        x = x16[i]
        inner = _f32(0.79788456080286535587989211986876) * x * fma(_f32(0.044715) * x, x, _f32(1.0))
        out[i] = _f32(0.5) * x * (_f32(1.0) + math.tanh(inner))


@functools.cache
def gelu_f16_table() -> np.ndarray:
    """f16 GELU(x) for every f16 x, as float32 (ggml_table_gelu_f16).

    Built on first use, not at import: only GELU models need it, and building it loads a
    compiled function (Numba's first load costs ~0.2 s of start-up)."""
    x = all_halves()
    gelu = np.empty_like(x)
    with np.errstate(all="ignore"):
        _gelu_f32(x, gelu)
    return gelu.astype(np.float16).astype(np.float32)
