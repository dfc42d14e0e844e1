"""Whole Q2_K, Q3_K and IQ4_XS products in LLVM IR, for tiles of tokens, as gemm_k_ir.py computes
the K-quants': the integer sums on the CPU's int8 dot instruction (int8dot.py's ISA), the
float steps in vector registers, in llama.cpp's x86 orders, so the bits are the portable
kernels' (dot_k_low.py, dot_iq.py) and llama.cpp's.

Why: the portable kernels unpack and multiply one code at a time, per row, and store 8
integer lanes per 32 values to scratch (a 4096 x 4096 IQ4_XS matvec: ~3 ms; the repacked
Q4_K beside it on gemm_k_ir.py: ~0.6 ms). Here a code vector of `width` rows is four bytes
per row, one dot instruction per 4 values of every row.

Both types sum a super-block in vec_dot's 8 integer lanes: lane k holds, over the
super-block, sub-block scale x the 4 products of values 4k..4k+3 of each 32-value run
(Q3_K: scale_s - 32 over 16-value sub-blocks s, codes -4..3 from 2 bits of qs and one of
hmask, entering the ISA's `dot_diff_scaled` as crumb minus 4 x the inverted high bit; IQ4_XS: ls_ib - 32 over 32-value blocks ib, levels -127..113 that the ISA's byte
shuffle looks up from the nibbles: lanes 0-3 the low nibbles, 4-7 the high ones). Then:

- `gemv` (one token, or a batch under 8): acc_k = fma(f32(d_x d_w), f32(lane_k), acc_k)
  per super-block; at the end hsum_float_8: ((a4 + a0) + (a6 + a2)) + ((a5 + a1) + (a7 + a3))
- `tiled` (a batch of 8 or more, ORDER_TILED): T = the lanes' sum, acc = fma(f32(T) * d_w,
  d_x, acc) per super-block, for the ISA's tile of tokens at once.

Q2_K (repacked by llama.cpp: rows a multiple of 8, not a tied output; else the portable
kernels keep its file-layout orders) sums as its repacked kernels and Q4_K's here: per
128-value half, tot = sum_s scale_s S_s and mins = sum_s min_s X_s over its 8 sub-blocks of
16 (S_s: the 2-bit codes, unsigned, on the ISA's `dot`; X_s: q8_K's sums of 16 codes); the
two FMAs of gemm_k_ir.min_fmas per half (`q2k_gemm`, whole groups of 4 tokens) or per
super-block (`q2k_gemv`), the result acc - accm.

Q3_K's and IQ4_XS's codes are signed, so they enter the ISA's `dot_scaled` with their scale (dot_ir.Isa: |x| times the codes carrying x's sign where the
instruction multiplies unsigned bytes; on AVX2 the scale rides vpmaddwd, as in llama.cpp's
kernels). Integer sums are exact: any instruction, the same bits.

Operands (repack.py's lane layout, R rows per group, a multiple of the ISA's width):
  Q3_K:   qs u32[G, NSB, 16, R] (word 8n + k: the 2-bit codes of values 128n + 32j + 4k..+3
          at bits 2j of its bytes), qh u32[G, NSB, 8, R] (hmask: word k, bit 4n + j of each
          byte), sc u8[G, NSB, 16, R] (6-bit scales), d u16[G, NSB, 1, R]
  IQ4_XS: qs u32[G, NSB, 32, R] (block ib: words 4ib..4ib+3), qh u32[G, NSB, 0, R],
          sc u8[G, NSB, 8, R] (6-bit ls), d u16[G, NSB, 1, R]
  Q2_K:   qs as Q3_K's, qh u32[G, NSB, 0, R], sc u8[G, NSB, 16, R] (scale | min << 4),
          d u16[G, NSB, 2, R] (d, dmin)
and xq4, xsum (unused), xd, g, c, t0, out as gemm_k_ir.py's tiles take them.
What does not live here: the drivers (int8dot.py), the frame and helpers (gemm_k_ir.py).
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils

from .dot_ir import scales
from .gemm_k_ir import (I64, TileFrame, add_parts, byte_vector, const_vec, hsum_float_8, min_fmas, store_differences,
                        tile_intrinsic, tiled_fma)
from .irvec import FLOAT, INT32, fma16, load_at, splat, vec
from .quantize import IQ4_NL_LEVELS

LEVELS = [int(v) for v in IQ4_NL_LEVELS]


def _scale(builder, f, n_cols, b, k, vi):
    # the 6-bit scale k of super-block b, minus 32, per row (i32 lanes)
    raw = byte_vector(builder, f.sc.data, f.per_row(builder, f.sc, ir.Constant(I64, n_cols), b, k), vi.count, False)
    return builder.sub(raw, const_vec(vi, 32))


def _q3_terms(builder, isa, f, b, tbs, vi):
    # (lane k, [sub-block scale x the lane's 4 products, per token]) over a Q3_K super-block,
    # a lane's 8 terms one after another (its sum is done early: fewer live registers);
    # code = crumb - 4 (1 - high bit), entering the ISA as the two unsigned parts
    for k in range(8):
        half = k // 4  # lanes 0-3 under sub-block 8n + 2j, 4-7 under the next
        inverted = builder.xor(f.word(builder, f.qh, f.n_qh, b, k, vi), const_vec(vi, -1))
        for n in range(2):
            words = f.word(builder, f.qs, f.n_w, b, 8 * n + k, vi)
            for j in range(4):
                scale = _scale(builder, f, 16, b, 8 * n + 2 * j + half, vi)
                t = 4 * n + j  # the high bit's place in each hmask byte
                crumbs = builder.and_(builder.lshr(words, const_vec(vi, 2 * j)), const_vec(vi, 0x03030303))
                moved = builder.lshr(inverted, const_vec(vi, t - 2)) if t >= 2 else builder.shl(inverted, const_vec(vi, 2 - t))
                fours = builder.and_(moved, const_vec(vi, 0x04040404))  # 4 where the high bit is clear
                x_word = 32 * n + 8 * j + k
                yield k, [isa.dot_diff_scaled(builder, None, crumbs, fours, load_at(builder, f.x4.data, tb, 64, x_word), scale)
                          for tb in tbs]


def _iq4_terms(builder, isa, f, b, tbs, vi):
    # (lane, [block scale x the lane's 4 products, per token]) over an IQ4_XS super-block
    for ib in range(8):
        ls = _scale(builder, f, 8, b, ib, vi)
        for w in range(4):
            words = f.word(builder, f.qs, f.n_w, b, 4 * ib + w, vi)
            for half in range(2):
                nibbles = builder.and_(builder.lshr(words, const_vec(vi, 4 * half)), const_vec(vi, 0x0F0F0F0F))
                levels = isa.lookup(builder, nibbles, LEVELS)
                x_word = 8 * ib + 4 * half + w
                yield 4 * half + w, [isa.dot_scaled(builder, None, levels, load_at(builder, f.x4.data, tb, 64, x_word), ls)
                                     for tb in tbs]


def _q2_half(builder, isa, f, b, n, tbs, vi):
    # (tot, mins) per token over half n (values 128n..128n+127) of a Q2_K super-block:
    # tot = sum_s scale_s S_s, mins = sum_s min_s X_s over its sub-blocks s = 8n..8n+7
    # (S_s: the 2-bit codes (unsigned) times the activation codes, on the ISA's dot)
    tot, mins = [None] * len(tbs), [None] * len(tbs)
    for j in range(4):  # 32 values 128n + 32j..: sub-blocks 8n + 2j (lanes 0-3), 8n + 2j + 1 (4-7)
        sums = [[None, None] for _ in tbs]
        for k in range(8):
            words = f.word(builder, f.qs, f.n_w, b, 8 * n + k, vi)
            crumbs = builder.and_(builder.lshr(words, const_vec(vi, 2 * j)), const_vec(vi, 0x03030303))
            for i, tb in enumerate(tbs):
                sums[i][k // 4] = isa.dot(builder, sums[i][k // 4], crumbs, load_at(builder, f.x4.data, tb, 64, 32 * n + 8 * j + k))
        for half in range(2):
            s = 8 * n + 2 * j + half
            raw = byte_vector(builder, f.sc.data, f.per_row(builder, f.sc, ir.Constant(I64, 16), b, s), vi.count, False)
            scale, low = builder.and_(raw, const_vec(vi, 15)), builder.lshr(raw, const_vec(vi, 4))
            for i, tb in enumerate(tbs):
                term = builder.mul(scale, sums[i][half])
                tot[i] = term if tot[i] is None else builder.add(tot[i], term)
                part = builder.mul(low, splat(builder, load_at(builder, f.xs.data, tb, 16, s), vi))
                mins[i] = part if mins[i] is None else builder.add(mins[i], part)
    return tot, mins


def _q2_codegen(isa, n_t, per_half):
    """IR body of a Q2_K tile (llama.cpp's repacked Q2_K, see the module docstring): per half
    (its gemm, whole groups of 4 tokens) or per super-block (its gemv), the two FMAs of
    gemm_k_ir.min_fmas; the result acc - accm."""
    W = isa.width
    vi, vf = vec(INT32, W), vec(FLOAT, W)

    def codegen(context, builder, sig, args):
        f = TileFrame(context, builder, sig, args, W, n_t)
        accs = [cgutils.alloca_once_value(builder, ir.Constant(vf, None)) for _ in range(2 * n_t)]
        with cgutils.for_range(builder, f.n_sb) as loop:
            b = loop.index
            tbs = [builder.add(builder.mul(t, f.n_sb), b) for t in f.toks]
            if n_t == 1:
                f.prefetch_ahead(builder, b, W, ((f.qs, 4, 16), (f.sc, 1, 16), (f.d, 2, 2)))
            d_at = f.per_row(builder, f.d, f.n_d, b, 0)
            dxs = [load_at(builder, f.xd.data, tb, 2, 0) for tb in tbs]
            for n in range(2):
                tot_n, mins_n = _q2_half(builder, isa, f, b, n, tbs, vi)
                if per_half or n == 0:
                    tot = mins = None
                tot, mins = add_parts(builder, tot, tot_n), add_parts(builder, mins, mins_n)
                if per_half or n == 1:
                    min_fmas(builder, f, d_at, dxs, tot, mins, accs, W)
        store_differences(builder, f, accs, vf)
        return context.get_dummy_value()

    return codegen


def _streams(f, q3):
    # what a super-block of one job reads, for TileFrame.prefetch_ahead: (array, item bytes, items per row)
    if q3:
        return (f.qs, 4, 16), (f.qh, 4, 8), (f.sc, 1, 16), (f.d, 2, 1)
    return (f.qs, 4, 32), (f.sc, 1, 8), (f.d, 2, 1)


def _gemv_codegen(isa, q3):
    """IR body of a one-token tile (vec_dot's 8 lanes; see the module docstring)."""
    W = isa.width
    vi, vf = vec(INT32, W), vec(FLOAT, W)
    terms = _q3_terms if q3 else _iq4_terms

    def codegen(context, builder, sig, args):
        f = TileFrame(context, builder, sig, args, W, 1)
        accs = [cgutils.alloca_once_value(builder, ir.Constant(vf, None)) for _ in range(8)]
        with cgutils.for_range(builder, f.n_sb) as loop:
            b = loop.index
            tb = builder.add(builder.mul(f.toks[0], f.n_sb), b)
            f.prefetch_ahead(builder, b, W, _streams(f, q3))
            scale = scales(builder, W, f.d.data, f.per_row(builder, f.d, f.n_d, b, 0), load_at(builder, f.xd.data, tb, 2, 0))
            lanes, counts = [None] * 8, [0] * 8
            for k, (term,) in terms(builder, isa, f, b, [tb], vi):
                lanes[k] = term if lanes[k] is None else builder.add(lanes[k], term)
                counts[k] += 1
                if counts[k] == 8:  # the lane's last term (8 each): into its float accumulator now
                    builder.store(fma16(builder, scale, builder.sitofp(lanes[k], vf), builder.load(accs[k])), accs[k])
        f.store(builder, [hsum_float_8(builder, accs)], vf)
        return context.get_dummy_value()

    return codegen


def _tiled_codegen(isa, q3, n_t):
    """IR body of an n_t-token tile in the tiled matmul's order (see the module docstring)."""
    W = isa.width
    vi, vf = vec(INT32, W), vec(FLOAT, W)
    terms = _q3_terms if q3 else _iq4_terms

    def codegen(context, builder, sig, args):
        f = TileFrame(context, builder, sig, args, W, n_t)
        accs = [cgutils.alloca_once_value(builder, ir.Constant(vf, None)) for _ in range(n_t)]
        with cgutils.for_range(builder, f.n_sb) as loop:
            b = loop.index
            tbs = [builder.add(builder.mul(t, f.n_sb), b) for t in f.toks]
            tot = [None] * n_t
            for _, parts in terms(builder, isa, f, b, tbs, vi):
                tot = [p if t is None else builder.add(t, p) for t, p in zip(tot, parts)]
            tiled_fma(builder, f, b, tbs, tot, accs, W)
        f.store(builder, accs, vf)
        return context.get_dummy_value()

    return codegen


def low_tile_intrinsics(isa, tokens):
    """{name: gemm_k_ir.tile_intrinsic} for one ISA: q3k_gemv / iq4xs_gemv (one token),
    q3k_tiled / iq4xs_tiled (`tokens` tokens), q2k_gemv (one token, llama.cpp's repacked
    gemv), q2k_gemm (4 tokens, its gemm)."""
    return {
        "q2k_gemv": tile_intrinsic(_q2_codegen(isa, 1, False)),
        "q2k_gemm": tile_intrinsic(_q2_codegen(isa, 4, True)),
        "q3k_gemv": tile_intrinsic(_gemv_codegen(isa, True)),
        "iq4xs_gemv": tile_intrinsic(_gemv_codegen(isa, False)),
        "q3k_tiled": tile_intrinsic(_tiled_codegen(isa, True, tokens)),
        "iq4xs_tiled": tile_intrinsic(_tiled_codegen(isa, False, tokens)),
    }
