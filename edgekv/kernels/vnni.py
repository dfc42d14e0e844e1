"""x86's int8 dot product for the LLVM-IR matrix kernels (dot_ir.py): `vpdpbusd`
(AVX512-VNNI), 16 rows per call in one zmm register of float32.

vpdpbusd multiplies unsigned bytes by signed bytes, so Q8_0's signed codes enter as
code + 128 (`q8_flip`) and 128 times the activation sum comes back off (dot_ir.py).
The 8 lane accumulators of a 16-row matvec and the 8 tokens x 16 rows of a GEMM call
fit in the 32 zmm registers with the block's code vectors.
What lives here: HAS_VNNI and the `VNNI` Isa. What does not: the kernels (dot_ir.py),
their drivers (int8dot.py).
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils

from .avx2 import pshufb
from .dot_ir import Isa
from .intrinsics import host_has
from .irvec import V16I, sign_trick, splat

HAS_VNNI = host_has("avx512vnni") and host_has("avx512f") and host_has("f16c")


def dpbusd(builder, acc, codes, x4, signed=False):
    # (signed never: Q8_0's codes enter flipped, q8_flip)
    # acc + per 32-bit lane the sum of 4 products (unsigned bytes of codes) x (signed bytes of x4)
    return _vpdpbusd(builder, acc, codes, splat(builder, x4, V16I))


def _vpdpbusd(builder, acc, u, s):
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(V16I, [V16I, V16I, V16I]),
                                        "llvm.x86.avx512.vpdpbusd.512")
    return builder.call(fn, [acc if acc is not None else ir.Constant(V16I, None), u, s])


def dpbusd_scaled(builder, acc, codes, x4, scale):
    # acc + scale x (signed codes (-127..127) by any activation bytes): |x| (unsigned) by
    # the codes carrying x's sign (irvec.sign_trick), then one multiply
    u, s = sign_trick(builder, codes, x4)
    term = builder.mul(scale, _vpdpbusd(builder, None, u, s))
    return term if acc is None else builder.add(acc, term)


def dpbusd_diff_scaled(builder, acc, low, high, x4, scale):
    # acc + scale x ((low - high) codes by the activation bytes), low and high unsigned
    x = splat(builder, x4, V16I)
    term = builder.mul(scale, builder.sub(_vpdpbusd(builder, None, low, x), _vpdpbusd(builder, None, high, x)))
    return term if acc is None else builder.add(acc, term)


# the byte shuffle: AVX2's vpshufb on 32-byte pieces (LLVM joins them where AVX512BW has the
# 64-byte form)
VNNI = Isa("avx512-vnni", width=16, gemm_tokens=8, rows_tokens=4, q8_flip=True, dot=dpbusd,
           dot_scaled=dpbusd_scaled,
           dot_diff_scaled=dpbusd_diff_scaled, lookup=pshufb)
