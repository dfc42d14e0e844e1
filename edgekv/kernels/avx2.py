"""x86's int8 dot product without VNNI, for the LLVM-IR matrix kernels (dot_ir.py): AVX2's
`vpmaddubsw` + `vpmaddwd`, 8 rows per call in one ymm register of float32.

Most x86 CPUs in the field have AVX2 and FMA but not AVX512-VNNI (every AMD before Zen 4,
Intel's client cores before Alder Lake's AVX-VNNI); llama.cpp's AVX2 build runs its
integer dot products this way. Per 32-bit lane: vpmaddubsw multiplies unsigned bytes by
signed bytes and adds adjacent pairs into int16 lanes (saturating), vpmaddwd against ones
adds adjacent int16 pairs into the int32 lane: the lane's sum of 4 products, as one
vpdpbusd gives. The pair sums never saturate here, so every lane is exact and the bits
are VNNI's and the portable kernels': Q4/Q5/K-quant codes are 0..63 and activation codes
-127..127 (a pair at most 2 x 63 x 127 = 16002); Q8_0's signed codes enter by ggml's
sign trick (`signed`): |code| (0..128, unsigned) times the activation carrying the code's
sign (vpsignb), a pair at most 2 x 128 x 127 = 32512 < 32767. Flipping them to code + 128
as on VNNI would saturate (2 x 255 x 127).

A matvec call's 8 lane accumulators and 8 code vectors fill the 16 ymm registers, so a
GEMM call takes 4 tokens (as sdot's 8-row calls do).
What lives here: HAS_AVX2 and the `AVX2` Isa. What does not: the kernels (dot_ir.py),
their drivers (int8dot.py).
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils

from .dot_ir import Isa
from .intrinsics import host_has
from .irvec import INT16, INT32, concat, lanes as lanes_of, splat, vec

HAS_AVX2 = host_has("avx2") and host_has("fma") and host_has("f16c")

V8I, V32B, V16W = vec(INT32, 8), vec(ir.IntType(8), 32), vec(INT16, 16)


def _call(builder, name, ret, args):
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, [a.type for a in args]), name)
    return builder.call(fn, args)


def maddubs(builder, acc, codes, x4, signed=False):
    # acc + per 32-bit lane the sum of 4 products (bytes of codes) x (signed bytes of x4):
    # codes non-negative (unsigned operand as they are), or signed (ggml's sign trick)
    u = builder.bitcast(codes, V32B)
    x = builder.bitcast(splat(builder, x4, V8I), V32B)
    if signed:
        x = _call(builder, "llvm.x86.avx2.psign.b", V32B, [x, u])
        u = _call(builder, "llvm.abs.v32i8", V32B, [u, ir.Constant(ir.IntType(1), 0)])
    return _pair_sums(builder, acc, u, x)


def _pair_sums(builder, acc, u, x):
    # acc + per 32-bit lane the 4 products of the unsigned bytes u by the signed bytes x (V32B)
    pairs = _call(builder, "llvm.x86.avx2.pmadd.ub.sw", V16W, [u, x])
    lanes = _call(builder, "llvm.x86.avx2.pmadd.wd", V8I, [pairs, ir.Constant(V16W, [1] * 16)])
    return lanes if acc is None else builder.add(acc, lanes)


def maddubs_scaled(builder, acc, codes, x4, scale):
    # acc + scale x (signed codes (-127..127) by any activation bytes), as llama.cpp's AVX2
    # K-quant kernels: |x| (vpsignb x by x: -128 stays 0x80, 128 unsigned) by the codes
    # carrying x's sign (vpsignb), a pair at most 2 x 128 x 127 = 32512; then vpmaddwd
    # against the scale in both int16 halves of each lane instead of ones
    x = builder.bitcast(splat(builder, x4, V8I), V32B)
    c = builder.bitcast(codes, V32B)
    u = _call(builder, "llvm.x86.avx2.psign.b", V32B, [x, x])
    s = _call(builder, "llvm.x86.avx2.psign.b", V32B, [c, x])
    return _scaled_pairs(builder, acc, _call(builder, "llvm.x86.avx2.pmadd.ub.sw", V16W, [u, s]), scale)


def _scaled_pairs(builder, acc, pairs, scale):
    # acc + vpmaddwd(pairs, the i32 scale in both int16 halves of each lane)
    low = builder.and_(scale, ir.Constant(V8I, [0xFFFF] * 8))
    scale16 = builder.bitcast(builder.or_(low, builder.shl(scale, ir.Constant(V8I, [16] * 8))), V16W)
    lanes = _call(builder, "llvm.x86.avx2.pmadd.wd", V8I, [pairs, scale16])
    return lanes if acc is None else builder.add(acc, lanes)


def maddubs_diff_scaled(builder, acc, low, high, x4, scale):
    # acc + scale x ((low - high) codes by the activation bytes), low and high 0..7 unsigned:
    # two vpmaddubsw (pairs at most 2 x 7 x 128) subtracted as int16, as llama.cpp's AVX2
    # Q3_K kernel does with its 2-bit codes and inverted high bits
    x = builder.bitcast(splat(builder, x4, V8I), V32B)
    lo = _call(builder, "llvm.x86.avx2.pmadd.ub.sw", V16W, [builder.bitcast(low, V32B), x])
    hi = _call(builder, "llvm.x86.avx2.pmadd.ub.sw", V16W, [builder.bitcast(high, V32B), x])
    return _scaled_pairs(builder, acc, builder.sub(lo, hi), scale)


def pshufb(builder, idx, table):
    # per byte table[idx] (idx bytes 0..15) with vpshufb on 32-byte pieces (any width of i32 lanes)
    tab = ir.Constant(V32B, [int(t) for t in table] * 2)
    parts = [builder.bitcast(_call(builder, "llvm.x86.avx2.pshuf.b", V32B,
                                   [tab, builder.bitcast(lanes_of(builder, idx, first, 8), V32B)]), V8I)
             for first in range(0, idx.type.count, 8)]
    return concat(builder, parts)


AVX2 = Isa("avx2", width=8, gemm_tokens=4, rows_tokens=4, q8_flip=False, dot=maddubs,
           dot_scaled=maddubs_scaled,
           dot_diff_scaled=maddubs_diff_scaled, lookup=pshufb)
