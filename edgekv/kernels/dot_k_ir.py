"""The integer inner sums of the K-quant dot products (dot_k.py) on an int8 dot-product
instruction (sdot on Arm, vpdpbusd on x86: int8dot.py's ISA), in LLVM IR.

Why: dot_k.py's integer sums are most of a K-quant matvec's instructions (per row and 4
values: 4 nibble extractions, 4 multiplies, 4 adds); each of these sums of 4 products
is one lane of one dot-product instruction. They replace two portable helpers with the
same contract, over all R rows of a group, `width` rows per step:

- k4_sums (Q4_K, Q5_K: dot_k.k4_chunk_sums): lo[r], hi[r] of 64-value chunk c: the low
  (high) nibbles of words 8c..8c+7, plus Q5_K's fifth bits (bit 2c / 2c+1 of each qh
  byte), times the activation words 16c+u (16c+8+u);
- q6_runs (Q6_K: dot_k.q6_quarter_sums): the 16 runs of 4 values of quarter-pair
  (h, half), codes of 4 ql bits and 2 qh bits, one instruction lane each.

Codes are 0..63 here, so they enter both instructions as they are (a non-negative byte
is the same signed or unsigned). Integer sums are exact: the float steps stay in
dot_k.py, and the bits are the portable kernels' (tests/test_fast_kernels.py).
Operands: qs, qh as repack.py lays them out; xq4 i32[NSB, 64] (the q8_K codes, 4 per
word); the outputs i32 rows of length R (a multiple of the ISA's width).
What does not live here: the float steps (dot_k.py), the instructions (vnni.py, sdot.py).
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from .irvec import INT32, arrays, i64_args, load16, load_at, splat, vec


def _word_at(builder, shape, g, b, w, row):
    # element index of [g, b, w, row] in a C-contiguous [G, NSB, NW, R] array (i64 values)
    _, n_sb, n_w, R = shape
    return builder.add(builder.mul(builder.add(builder.mul(builder.add(builder.mul(g, n_sb), b), n_w), w), R), row)


def _bits(builder, words, shift, mask, vi):
    # per byte: (words >> shift) & mask, shift a Python int or an i32 value
    amount = splat(builder, shift, vi) if isinstance(shift, ir.Value) else ir.Constant(vi, [shift] * vi.count)
    return builder.and_(builder.lshr(words, amount), ir.Constant(vi, [mask] * vi.count))


def _k4_codegen(isa, fifth):
    """(qs, qh, g, b, c, xq4, lo, hi): k4_sums for Q4_K (fifth False) or Q5_K."""
    vi = vec(INT32, isa.width)
    four = ir.Constant(vi, [4] * isa.width)

    def codegen(context, builder, sig, args):
        qs, qh, x4, lo, hi = arrays(context, builder, sig, args, 0, 1, 5, 6, 7)
        i64 = ir.IntType(64)
        g, b, c = i64_args(builder, args[2:5])
        qs_shape, qh_shape = cgutils.unpack_tuple(builder, qs.shape, 4), cgutils.unpack_tuple(builder, qh.shape, 4)
        shift_lo = builder.trunc(builder.mul(c, ir.Constant(i64, 2)), INT32)  # Q5_K: bit 2c of each qh byte
        shift_hi = builder.add(shift_lo, ir.Constant(INT32, 1))
        with cgutils.for_range(builder, builder.udiv(qs_shape[3], ir.Constant(i64, isa.width))) as loop:
            row = builder.mul(loop.index, ir.Constant(i64, isa.width))
            lo_acc = hi_acc = None
            for u in range(8):
                w = builder.add(builder.mul(c, ir.Constant(i64, 8)), ir.Constant(i64, u))
                words = load16(builder, qs.data, _word_at(builder, qs_shape, g, b, w, row), vi)
                lo_codes, hi_codes = _bits(builder, words, 0, 0x0F0F0F0F, vi), _bits(builder, words, 4, 0x0F0F0F0F, vi)
                if fifth:
                    e = load16(builder, qh.data, _word_at(builder, qh_shape, g, b, ir.Constant(i64, u), row), vi)
                    lo_codes = builder.or_(lo_codes, builder.shl(_bits(builder, e, shift_lo, 0x01010101, vi), four))
                    hi_codes = builder.or_(hi_codes, builder.shl(_bits(builder, e, shift_hi, 0x01010101, vi), four))
                word = builder.add(builder.mul(c, ir.Constant(i64, 16)), ir.Constant(i64, u))
                lo_acc = isa.dot(builder, lo_acc, lo_codes, load_at(builder, x4.data, b, 64, word))
                hi_acc = isa.dot(builder, hi_acc, hi_codes, load_at(builder, x4.data, b, 64, builder.add(word, ir.Constant(i64, 8))))
            for out, acc in ((lo, lo_acc), (hi, hi_acc)):
                builder.store(acc, builder.bitcast(builder.gep(out.data, [row]), vi.as_pointer()), align=4)
        return context.get_dummy_value()

    return codegen


def _q6_codegen(isa):
    """(qs, qh, g, b, h, half, xq4, s): q6_runs, s i32[16, R] (row 4k + jj: quarter k, run jj)."""
    vi = vec(INT32, isa.width)
    four = ir.Constant(vi, [4] * isa.width)

    def codegen(context, builder, sig, args):
        qs, qh, x4, s = arrays(context, builder, sig, args, 0, 1, 6, 7)
        i64 = ir.IntType(64)
        g, b, h, half = i64_args(builder, args[2:6])
        qs_shape, qh_shape = cgutils.unpack_tuple(builder, qs.shape, 4), cgutils.unpack_tuple(builder, qh.shape, 4)
        R = qs_shape[3]
        with cgutils.for_range(builder, builder.udiv(R, ir.Constant(i64, isa.width))) as loop:
            row = builder.mul(loop.index, ir.Constant(i64, isa.width))
            for jj in range(4):
                base = builder.add(builder.mul(h, ir.Constant(i64, 16)), builder.mul(half, ir.Constant(i64, 4)))
                w = builder.add(base, ir.Constant(i64, jj))  # ql word of quarters 0/2; w + 8 of quarters 1/3
                p = load16(builder, qs.data, _word_at(builder, qs_shape, g, b, w, row), vi)
                q = load16(builder, qs.data, _word_at(builder, qs_shape, g, b, builder.add(w, ir.Constant(i64, 8)), row), vi)
                hw = builder.add(builder.add(builder.mul(h, ir.Constant(i64, 8)), builder.mul(half, ir.Constant(i64, 4))),
                                 ir.Constant(i64, jj))
                e = load16(builder, qh.data, _word_at(builder, qh_shape, g, b, hw, row), vi)
                # activation word of run jj of quarter 0: (128h + 16 half + 4jj) / 4; quarter k: + 8k
                x_word = builder.add(builder.add(builder.mul(h, ir.Constant(i64, 32)), builder.mul(half, ir.Constant(i64, 4))),
                                     ir.Constant(i64, jj))
                for k, (low, low_shift) in enumerate(((p, 0), (q, 0), (p, 4), (q, 4))):
                    codes = builder.or_(_bits(builder, low, low_shift, 0x0F0F0F0F, vi),
                                        builder.shl(_bits(builder, e, 2 * k, 0x03030303, vi), four))
                    total = isa.dot(builder, None, codes, load_at(builder, x4.data, b, 64, builder.add(x_word, ir.Constant(i64, 8 * k))))
                    at = builder.add(builder.mul(ir.Constant(i64, 4 * k + jj), R), row)
                    builder.store(total, builder.bitcast(builder.gep(s.data, [at]), vi.as_pointer()), align=4)
        return context.get_dummy_value()

    return codegen


def k_intrinsics(isa):
    """(k4_sums for Q4_K, k4_sums for Q5_K, q6_runs) as Numba intrinsics for one ISA."""

    def k4(fifth):
        @intrinsic
        def k4_sums(typingctx, qs, qh, g, b, c, xq4, lo, hi):
            return types.void(qs, qh, g, b, c, xq4, lo, hi), _k4_codegen(isa, fifth)

        return k4_sums

    @intrinsic
    def q6_runs(typingctx, qs, qh, g, b, h, half, xq4, s):
        return types.void(qs, qh, g, b, h, half, xq4, s), _q6_codegen(isa)

    return k4(False), k4(True), q6_runs
