"""Decode kernels for Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 weights on x86 CPUs with
AVX512-VNNI, written in LLVM IR.

Why: the portable kernels (dot_q.py) compute ggml's 8 integer lanes per block for 64
rows, store them, and FMA them into 8 float accumulators in a second loop; Numba cannot
keep those accumulators in registers across blocks (it cannot prove the scratch arrays
do not alias the weights), and the round trips cost more than the arithmetic. Here one
call computes 16 rows of one row group over all blocks with the 8 accumulators in 8
zmm registers, and each lane's four products are one `vpdpbusd` (u8 x s8 -> i32).

Same float arithmetic as dot_q.py, step for step, so the same bits: per block b and
ggml lane j, acc_j = fma(f32(f16(d_w) * d_x), float(lane_j), acc_j); Q4_1 adds
f32(f16(m_w) * s_x) to a separate sum (Q5_1 too); at the end hsum_float_8's tree
((a4+a0) + (a6+a2)) + ((a5+a1) + (a7+a3)), plus the min sum for Q4_1. The integer lanes
are exact whatever the instruction: signed Q8_0 codes enter vpdpbusd as code + 128
(u8), Q4_0/Q5_0 codes as q (not q - 8, q - 16), and the offsets come back as 128 (8, 16) times the sum
of the lane's four activation codes (activations.py keeps them in xsum[b, 8 + j]).

What lives here: `HAS_VNNI`, the IR kernels and `matvec_vnni`, the parallel driver
matvec.py calls instead of matvec_lanes when the CPU has the instructions.
What does not: the layout (repack.py), activation quantization (activations.py).
"""

from __future__ import annotations

import numba as nb
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic
from gguf import GGMLQuantizationType as T

from .config import EXACT_FLAGS
from .intrinsics import host_has
from .irvec import INT32, V16F, V16I, V16S, arrays, fma16, halves_to_float, load16, load_at, splat

HAS_VNNI = host_has("avx512vnni") and host_has("avx512f") and host_has("f16c")
VNNI_TYPES = (T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1)
CHUNK = 16  # rows per call: one zmm register of float32
OFFSETS = {T.Q8_0: 128, T.Q4_0: 8, T.Q5_0: 16}  # what the codes fed to vpdpbusd exceed ggml's signed codes by


def dpbusd(builder, acc, words_u8, x4):
    # acc + per 32-bit lane the sum of 4 products (unsigned bytes of words_u8) x (signed bytes of x4)
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(V16I, [V16I, V16I, V16I]),
                                        "llvm.x86.avx512.vpdpbusd.512")
    return builder.call(fn, [acc if acc is not None else ir.Constant(V16I, None), words_u8, x4])


def block_codes(builder, kind, qs, qh, gb, n_words, R, row0):
    """The 8 code vectors of block gb (= g * n_blocks + b) for 16 rows from row0: vector j
    holds, per row, the four u8 codes of ggml lane j (Q8_0: code + 128; Q4/Q5: code)."""
    i64 = ir.IntType(64)
    if kind in (T.Q5_0, T.Q5_1):  # the block's 32 fifth bits, one u32 per row
        bits = load16(builder, qh.data, builder.add(builder.mul(gb, R), row0), V16I)
    codes = []
    for j in range(8):
        w = j if kind == T.Q8_0 else j % 4
        at = builder.add(builder.mul(builder.add(builder.mul(gb, n_words), ir.Constant(i64, w)), R), row0)
        words = load16(builder, qs.data, at, V16I)
        if kind == T.Q8_0:
            code = builder.xor(words, ir.Constant(V16I, [0x80808080 - (1 << 32)] * 16))
        elif j < 4:
            code = builder.and_(words, ir.Constant(V16I, [0x0F0F0F0F] * 16))
        else:
            code = builder.and_(builder.lshr(words, ir.Constant(V16I, [4] * 16)),
                                ir.Constant(V16I, [0x0F0F0F0F] * 16))
        if kind in (T.Q5_0, T.Q5_1):
            code = builder.or_(code, _fifth_bits(builder, bits, 4 * j if j < 4 else 16 + 4 * (j - 4)))
        codes.append(code)
    return codes


def _fifth_bits(builder, bits, first):
    # bits first..first+3 of each row's qh word -> bit 4 of bytes 0..3 (16 or 0 added to
    # each code): the 4 bits times 0x00204081 land at bits 0, 8, 16, 24 without carries
    four = builder.and_(builder.lshr(bits, ir.Constant(V16I, [first] * 16)), ir.Constant(V16I, [15] * 16))
    spread = builder.and_(builder.mul(four, ir.Constant(V16I, [0x00204081] * 16)),
                          ir.Constant(V16I, [0x01010101] * 16))
    return builder.shl(spread, ir.Constant(V16I, [4] * 16))


def scale16(builder, d_data, index, factor):
    # f32(f16 d_w[16 rows] * factor): the f16 bits widened exactly, one rounded multiply
    return builder.fmul(halves_to_float(builder, load16(builder, d_data, index, V16S)), splat(builder, factor, V16F))


def _chunk_codegen(kind):
    """IR body for ggml type `kind`: (qs, qh, d, xq4, xsum, xd, g, c, out) -> out[g*R + 16c : +16].

    Operands (C-contiguous; G row groups of R rows, NB blocks of 32 values, repack.py):
      qs    u32[G, NB, 8, R]    block codes, 4 bytes per word, row g*R + r in lane r
      qh    u32[G, NB, 1, R]    Q5_0/Q5_1: the 32 fifth bits per row; else size 0
      d     u16[G, NB, D, R]    f16 bits of the block scale d (and Q4_1/Q5_1's min m: D = 2)
      xq4   i32[NB, 8]          the token's q8 codes, 4 bytes per word (activations.py)
      xsum  i32[NB, 16]         per block: lane sums of 4 codes (8..15), used for the offsets
      xd    f32[NB, 2]          per block: the activation scale (f16-rounded) and d * sum
      g, c  int64               the row group and its 16-row chunk
      out   f32[G * R]          written at g*R + 16c .. +16"""

    def codegen(context, builder, sig, args):
        qs, qh, d, x4, xs, xd, out = arrays(context, builder, sig, args, 0, 1, 2, 3, 4, 5, 8)
        i64 = ir.IntType(64)
        g, c = (builder.sext(a, i64) if a.type != i64 else a for a in args[6:8])
        _, n_blocks, n_words, R = cgutils.unpack_tuple(builder, qs.shape, 4)
        n_dcols = cgutils.unpack_tuple(builder, d.shape, 4)[2]
        row0 = builder.mul(c, ir.Constant(i64, CHUNK))
        accs = [cgutils.alloca_once_value(builder, ir.Constant(V16F, None))
                for _ in range(9)]  # 8 lanes + Q4_1/Q5_1's min sum
        off_mul = OFFSETS.get(kind, 0)
        with cgutils.for_range(builder, n_blocks) as loop:
            b = loop.index
            gb = builder.add(builder.mul(g, n_blocks), b)
            d_base = builder.add(builder.mul(builder.mul(gb, n_dcols), R), row0)
            scale = scale16(builder, d.data, d_base, load_at(builder, xd.data, b, 2, 0))
            codes = block_codes(builder, kind, qs, qh, gb, n_words, R, row0)
            for j in range(8):
                lane = dpbusd(builder, None, codes[j], splat(builder, load_at(builder, x4.data, b, 8, j), V16I))
                if off_mul:
                    xsum = load_at(builder, xs.data, b, 16, 8 + j)
                    lane = builder.sub(lane, splat(builder, builder.mul(xsum, ir.Constant(INT32, off_mul)), V16I))
                acc = builder.load(accs[j])
                builder.store(fma16(builder, scale, builder.sitofp(lane, V16F), acc), accs[j])
            if kind in (T.Q4_1, T.Q5_1):
                mins = scale16(builder, d.data, builder.add(d_base, R), load_at(builder, xd.data, b, 2, 1))
                builder.store(builder.fadd(builder.load(accs[8]), mins), accs[8])
        a = [builder.load(p) for p in accs]
        s0, s1 = builder.fadd(a[4], a[0]), builder.fadd(a[5], a[1])
        s2, s3 = builder.fadd(a[6], a[2]), builder.fadd(a[7], a[3])
        total = builder.fadd(builder.fadd(s0, s2), builder.fadd(s1, s3))
        if kind in (T.Q4_1, T.Q5_1):
            total = builder.fadd(total, a[8])
        out_index = builder.add(builder.mul(g, R), row0)
        ptr = builder.bitcast(builder.gep(out.data, [out_index]), V16F.as_pointer())
        builder.store(total, ptr, align=4)
        return context.get_dummy_value()

    return codegen


def _chunk_intrinsic(kind):
    @intrinsic
    def chunk(typingctx, qs, qh, d, xq4, xsum, xd, g, c, out):
        return types.void(qs, qh, d, xq4, xsum, xd, g, c, out), _chunk_codegen(kind)

    return chunk


_q8_0_chunk = _chunk_intrinsic(T.Q8_0)
_q4_0_chunk = _chunk_intrinsic(T.Q4_0)
_q4_1_chunk = _chunk_intrinsic(T.Q4_1)
_q5_0_chunk = _chunk_intrinsic(T.Q5_0)
_q5_1_chunk = _chunk_intrinsic(T.Q5_1)


@nb.njit(**dict(EXACT_FLAGS, parallel=True))  # no fast-math: it would reorder the IR's float steps
def vnni_chunks(kind, qs, qh, d, xq4, xsum, xd, out_pad):
    # every 16-row chunk of every group: out_pad f32[G * R] (R a multiple of 16)
    per_group = qs.shape[3] // CHUNK
    for g in nb.prange(qs.shape[0]):  # a group's chunks on one thread: its memory is one stream
        for c in range(per_group):
            if kind == T.Q8_0:
                _q8_0_chunk(qs, qh, d, xq4, xsum, xd, g, c, out_pad)
            elif kind == T.Q4_0:
                _q4_0_chunk(qs, qh, d, xq4, xsum, xd, g, c, out_pad)
            elif kind == T.Q4_1:
                _q4_1_chunk(qs, qh, d, xq4, xsum, xd, g, c, out_pad)
            elif kind == T.Q5_0:
                _q5_0_chunk(qs, qh, d, xq4, xsum, xd, g, c, out_pad)
            else:
                _q5_1_chunk(qs, qh, d, xq4, xsum, xd, g, c, out_pad)
