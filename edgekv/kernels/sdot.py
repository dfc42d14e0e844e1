"""Arm's int8 dot product for the LLVM-IR matrix kernels (dot_ir.py): `sdot` (ARMv8.2
dot-product extension, `asimddp`; Jetson Orin's Cortex-A78AE has it), 8 rows per call.

sdot multiplies signed bytes by signed bytes, 4 per 32-bit lane of a 128-bit register,
so Q8_0's codes enter as they are (no offset) and Q4/Q5 codes (0..31) are positive
signed bytes. A call's 8 rows are two registers of int32 lanes: a matvec keeps 8 lane
accumulators x 2 registers, a GEMM call 4 tokens x 2, beside the 8 code vectors x 2,
inside the 32 NEON registers (16 rows, as on x86, would need 32 for the accumulators
alone and spill).

Compiling `llvm.aarch64.neon.sdot` needs LLVM's "+dotprod" target feature: config.py
hands it to Numba when LLVM cannot read the CPU's features itself (cpu_features.py), and
HAS_SDOT is true only when Numba will compile with it, so a kernel can never reach
LLVM's instruction selection without it.
What lives here: HAS_SDOT and the `SDOT` Isa. What does not: the kernels (dot_ir.py),
their drivers (int8dot.py).
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils
from numba.core.registry import cpu_target

from .cpu_features import arm_features
from .dot_ir import Isa
from .irvec import INT32, concat, lanes, splat, vec

V4I, V16B = vec(INT32, 4), vec(ir.IntType(8), 16)


def _numba_has_dotprod() -> bool:
    # the features of the target machine Numba compiles with (created once per process,
    # possibly before edgekv was imported); "+dotprod" unless LLVM was told otherwise
    codegen = cpu_target.target_context.codegen()
    features = getattr(codegen, "_tm_features", None)  # private in Numba 0.59-0.68: absent means unknown
    return features is not None and "+dotprod" in features.split(",")


HAS_SDOT = "dotprod" in arm_features() and _numba_has_dotprod()


def sdot(builder, acc, codes, x4, signed=False):
    # (signed or not: sdot takes signed bytes, and 0..63 is the same either way)
    # acc + per 32-bit lane the sum of 4 products (signed bytes of codes) x (signed bytes of x4),
    # on the 128-bit pieces of the <8 x i32> vectors
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(V4I, [V4I, V16B, V16B]),
                                        "llvm.aarch64.neon.sdot.v4i32.v16i8")
    x = builder.bitcast(splat(builder, x4, V4I), V16B)
    width = codes.type.count
    parts = []
    for first in range(0, width, 4):
        a = lanes(builder, acc, first, 4) if acc is not None else ir.Constant(V4I, None)
        parts.append(builder.call(fn, [a, builder.bitcast(lanes(builder, codes, first, 4), V16B), x]))
    return concat(builder, parts)


def tbl(builder, idx, table):
    # per byte table[idx] (idx bytes 0..15) with tbl on the 16-byte pieces
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(V16B, [V16B, V16B]), "llvm.aarch64.neon.tbl1.v16i8")
    tab = ir.Constant(V16B, [int(t) for t in table])
    parts = [builder.bitcast(builder.call(fn, [tab, builder.bitcast(lanes(builder, idx, first, 4), V16B)]), V4I)
             for first in range(0, idx.type.count, 4)]
    return concat(builder, parts)


def sdot_scaled(builder, acc, codes, x4, scale):
    # acc + scale x (signed codes by any activation bytes): sdot as it is
    term = builder.mul(scale, sdot(builder, None, codes, x4, True))
    return term if acc is None else builder.add(acc, term)


def sdot_diff_scaled(builder, acc, low, high, x4, scale):
    # acc + scale x ((low - high) codes by the activation bytes): the signed codes, byte by byte, on sdot
    vb = vec(ir.IntType(8), 4 * low.type.count)
    codes = builder.bitcast(builder.sub(builder.bitcast(low, vb), builder.bitcast(high, vb)), low.type)
    return sdot_scaled(builder, acc, codes, x4, scale)


SDOT = Isa("sdot", width=8, gemm_tokens=4, rows_tokens=1, q8_flip=False, dot=sdot, dot_scaled=sdot_scaled,
           dot_diff_scaled=sdot_diff_scaled, lookup=tbl)
