"""Matrix kernels for Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 weights in LLVM IR, for any CPU
with an int8 dot-product instruction: x86's `vpdpbusd` (vnni.py) or AVX2's
`vpmaddubsw` + `vpmaddwd` pair (avx2.py), and Arm's `sdot` (sdot.py).

Why: the portable kernels (dot_q.py) compute ggml's 8 integer lanes per block for 64
rows, store them, and FMA them into 8 float accumulators in a second loop; Numba cannot
keep those accumulators in registers across blocks (it cannot prove the scratch arrays
do not alias the weights), and the round trips cost more than the arithmetic. Here one
call computes W rows (W = the ISA's `width`) of one row group over all blocks, with the
8 accumulators in registers, and each ggml lane's four byte products are one lane of
one dot-product instruction.

What differs between instruction sets is an `Isa`: the instruction (`dot`), the rows per
call and whether Q8_0's signed codes must enter as unsigned bytes (vpdpbusd multiplies
u8 x s8: code + 128, and 128 x the lane's activation sum comes back off; sdot multiplies
s8 x s8 and takes the codes as they are). Q4_0/Q5_0 codes enter as q, not q - 8 / q - 16,
on both, and 8 (16) x the activation sum comes back off. Every integer lane is exact, so
the float steps, and the bits, are the same whatever the instruction:

- matvec (one token, `chunk_codegen`): dot_q.py's arithmetic step for step, per block b
  and ggml lane j: acc_j = fma(f32(f16(d_w) * d_x), float(lane_j), acc_j); Q4_1/Q5_1 add
  f32(f16(m_w) * s_x) to a separate sum; at the end hsum_float_8's tree
  ((a4+a0) + (a6+a2)) + ((a5+a1) + (a7+a3)) (+ the min sum). llama.cpp's x86 order: on
  Arm too, so one set of bits on every CPU (backends/kernel_map.py).
- GEMM (a long chunk, `gemm_codegen`): per block, a token's 8 lanes summed as integers,
  then acc_t = fma(f32(d_w * d_x), float(sum), acc_t) (+ m_w * s_x); the block's code
  vectors are built once for the ISA's `gemm_tokens` tokens. Not llama.cpp's order (its
  batched kernels have their own); used for chunks of BATCH_MIN_TOKENS tokens or more.
  For IQ4_NL it is llama.cpp's order at every batch size, one token included (its
  repacked iq4_nl_8x8 gemv and gemm): the codes are the nibbles' levels from the ISA's
  byte shuffle (`Isa.iq4_table`: level + 128 where q8_flip, 128 x the sum coming back off;
  as they are, signed, elsewhere).

Operands (C-contiguous; G row groups of R rows, NB blocks of 32 values, repack.py with
lanes = a multiple of the ISA's width):
  qs    u32[G, NB, 8, R]    block codes, 4 bytes per word, row g*R + r in lane r (4 words
                            for the 4-bit types: low nibbles values 0..15, high 16..31)
  qh    u32[G, NB, 1, R]    Q5_0/Q5_1: the 32 fifth bits per row; else size 0
  d     u16[G, NB, D, R]    f16 bits of the block scale d (and Q4_1/Q5_1's min m: D = 2)
  xq4   i32[(T,) NB, 8]     the token's q8 codes, 4 bytes per word (activations.py)
  xsum  i32[(T,) NB, 16]    per block: the code sum (0), lane sums of 4 codes (8..15)
  xd    f32[(T,) NB, 2]     per block: the activation scale (f16-rounded) and d * sum
What does not live here: the instructions and the parallel drivers (vnni.py, sdot.py),
the layout (repack.py), activation quantization (activations.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from gguf import GGMLQuantizationType as T
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from .irvec import FLOAT, INT16, INT32, arrays, fma16, halves_to_float, i64_args, load16, load_at, prefetch, splat, vec
from .quantize import IQ4_NL_LEVELS

# A decode step reads every weight from DRAM (the output matrix has swept the caches), in
# jobs of a few KiB, too short for the hardware prefetchers to ramp up: the matvec kernel
# asks for the weight codes this far ahead in its thread's stream (its next blocks, then
# its next groups). SmolLM2 on an AVX2 EPYC, 2 threads: 7.8-8.1 -> 7.2-7.4 ms per token.
PREFETCH_BYTES = 2048

TYPES = (T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1)  # the weight types of every kernel here
IQ4_LEVELS = [int(v) for v in IQ4_NL_LEVELS]


@dataclass(frozen=True)
class Isa:
    """An int8 dot-product instruction set, as the kernels need it.

    dot(builder, acc, codes, x4, signed=False) -> acc + per 32-bit lane of `codes` (<width x
    i32>, four code bytes each) the sum of its 4 byte products with the 4 bytes of the i32
    x4 (acc None: zero); codes are non-negative bytes unless `signed` (Q8_0's, where the
    ISA takes them as they are); q8_flip: Q8_0 codes enter as code ^ 0x80 (unsigned operand).
    For the signed-code types of gemm_low_ir.py (Q3_K, IQ4_XS):
    dot_scaled(builder, acc, codes, x4, scale) -> acc + scale (<width x i32>, each lane an
    int16) x the same sums for signed code bytes in -127..127 and any activation bytes
    (-128 included, though q8_K's stay in -127..127: the sign trick where the ISA multiplies
    unsigned bytes, with x's sign on the codes); dot_diff_scaled(builder, acc, low, high, x4, scale) -> the same for
    the codes low - high, low and high unsigned bytes in 0..7 (Q3_K's 2-bit codes and 4 x its
    inverted high bits: no sign trick); lookup(builder, idx, table) -> per byte table[idx]
    (idx bytes 0..15, table 16 Python ints in -128..127), the ISA's byte shuffle."""

    name: str
    width: int  # rows per call: one float32 lane each
    gemm_tokens: int  # tokens per GEMM call: their accumulators and the codes fit in registers
    rows_tokens: int  # separate tokens per exact (matvec) call: 9 accumulators each beside the codes (1: per token)
    q8_flip: bool
    dot: Callable
    dot_scaled: Callable
    dot_diff_scaled: Callable
    lookup: Callable

    def signed(self, kind) -> bool:
        """Whether the codes of weight type kind reach `dot` as signed bytes."""
        return kind in (T.Q8_0, T.IQ4_NL) and not self.q8_flip

    def offset(self, kind) -> int:
        """What the codes fed to `dot` exceed ggml's signed codes by, for weight type kind."""
        flip = 128 if self.q8_flip else 0
        return {T.Q8_0: flip, T.IQ4_NL: flip, T.Q4_0: 8, T.Q5_0: 16}.get(kind, 0)

    def iq4_table(self) -> list[int]:
        """IQ4_NL's 16 levels as `lookup` bytes: as they are, or flipped to level + 128 (as
        signed bytes) where the codes enter unsigned (q8_flip)."""
        return [(v + 128 + 128) % 256 - 128 if self.q8_flip else v for v in IQ4_LEVELS]


def block_codes(builder, isa, kind, qs, qh, gb, n_words, R, row0):
    """The 8 code vectors of block gb (= g * n_blocks + b) for `width` rows from row0:
    vector j holds, per row, the four codes of ggml lane j (Q8_0 flipped where the ISA
    wants it; Q4/Q5: q, 0..31)."""
    i64, vi = ir.IntType(64), vec(INT32, isa.width)

    def const(value):
        return ir.Constant(vi, [value] * isa.width)

    if kind in (T.Q5_0, T.Q5_1):  # the block's 32 fifth bits, one u32 per row
        bits = load16(builder, qh.data, builder.add(builder.mul(gb, R), row0), vi)
    codes = []
    for j in range(8):
        w = j if kind == T.Q8_0 else j % 4
        at = builder.add(builder.mul(builder.add(builder.mul(gb, n_words), ir.Constant(i64, w)), R), row0)
        words = load16(builder, qs.data, at, vi)
        if kind == T.Q8_0:
            code = builder.xor(words, const(0x80808080 - (1 << 32))) if isa.q8_flip else words
        elif j < 4:
            code = builder.and_(words, const(0x0F0F0F0F))
        else:
            code = builder.and_(builder.lshr(words, const(4)), const(0x0F0F0F0F))
        if kind in (T.Q5_0, T.Q5_1):
            code = builder.or_(code, _fifth_bits(builder, bits, 4 * j if j < 4 else 16 + 4 * (j - 4), const))
        if kind == T.IQ4_NL:  # the nibbles index the 16 levels (the ISA's byte shuffle)
            code = isa.lookup(builder, code, isa.iq4_table())
        codes.append(code)
    return codes


def _prefetch_codes(builder, qs, gb, n_words, R, row0, size):
    # ask for the code bytes PREFETCH_BYTES ahead of block gb's `size` bytes for these rows
    if not PREFETCH_BYTES:
        return
    i64 = ir.IntType(64)
    at = builder.add(builder.mul(builder.mul(gb, n_words), R), row0)
    for line in range(0, size, 64):
        prefetch(builder, builder.gep(qs.data, [builder.add(at, ir.Constant(i64, (PREFETCH_BYTES + line) // 4))]))


def _fifth_bits(builder, bits, first, const):
    # bits first..first+3 of each row's qh word -> bit 4 of bytes 0..3 (16 or 0 added to
    # each code): the 4 bits times 0x00204081 land at bits 0, 8, 16, 24 without carries
    four = builder.and_(builder.lshr(bits, const(first)), const(15))
    spread = builder.and_(builder.mul(four, const(0x00204081)), const(0x01010101))
    return builder.shl(spread, const(4))


def n_words_max(kind):
    # u32 words of codes per row and block
    return 8 if kind == T.Q8_0 else 4


def scales(builder, width, d_data, index, factor):
    # f32(f16 d_w[width rows] * factor): the f16 bits widened exactly, one rounded multiply
    halves = load16(builder, d_data, index, vec(INT16, width))
    return builder.fmul(halves_to_float(builder, halves), splat(builder, factor, vec(FLOAT, width)))


def _lane_total(builder, kind, a):
    # one token's 8 lane accumulators (+ the min sum a[8]) as hsum_float_8 adds them:
    # ((a4+a0) + (a6+a2)) + ((a5+a1) + (a7+a3)), then the min sum
    s0, s1 = builder.fadd(a[4], a[0]), builder.fadd(a[5], a[1])
    s2, s3 = builder.fadd(a[6], a[2]), builder.fadd(a[7], a[3])
    total = builder.fadd(builder.fadd(s0, s2), builder.fadd(s1, s3))
    return builder.fadd(total, a[8]) if kind in (T.Q4_1, T.Q5_1) else total


def _accumulate_block(builder, isa, kind, codes, w_d, w_m, acts, tb, acc):
    """One block of one token into its 8 lane accumulators (and the min sum in acc[8] for
    the kinds with a min): each lane's int8 dot with the token's activations, scaled by
    the weight's and the activations' block scales, fused into the lane."""
    x4, xs, xd = acts
    W = isa.width
    vf = vec(FLOAT, W)
    off_mul = isa.offset(kind)
    scale = builder.fmul(w_d, splat(builder, load_at(builder, xd.data, tb, 2, 0), vf))
    for j in range(8):
        seed = None  # the integer lane starts at -offset x the lane's activation sum
        if off_mul:
            xsum = load_at(builder, xs.data, tb, 16, 8 + j)
            seed = splat(builder, builder.mul(xsum, ir.Constant(INT32, -off_mul)), vec(INT32, W))
        lane = isa.dot(builder, seed, codes[j], load_at(builder, x4.data, tb, 8, j), isa.signed(kind))
        builder.store(fma16(builder, scale, builder.sitofp(lane, vf), builder.load(acc[j])), acc[j])
    if w_m is not None:
        mins = builder.fmul(w_m, splat(builder, load_at(builder, xd.data, tb, 2, 1), vf))
        builder.store(builder.fadd(builder.load(acc[8]), mins), acc[8])


def _store_token_row(builder, out, out_cols, total, t, n_tok, col):
    """Store one token's lane totals at out[t, col : col + width], unless t is past the
    last token (the kernel computed it on the last one and drops it)."""
    with builder.if_then(builder.icmp_signed("<", t, n_tok)):
        at = builder.add(builder.mul(t, out_cols), col)
        builder.store(total, builder.bitcast(builder.gep(out.data, [at]), total.type.as_pointer()), align=4)


def chunk_codegen(kind, isa, n_t=0):
    """IR body, one token (n_t = 0): (qs, qh, d, xq4, xsum, xd, g, c, out) -> out[g*R +
    width*c : +width]. Several separate tokens (n_t > 0): (qs, qh, d, xq4, xsum, xd, g, c,
    t0, out) -> out[t0 : t0 + n_t, the same columns], xq4, xsum, xd with a token axis, out
    f32[n_tok, >= G * R]; each token's arithmetic is the one-token kernel's, step for step
    (the same bits), and the block's codes are built once for all n_t (tokens past the end
    are computed on the last one and not stored)."""
    W = isa.width
    vf = vec(FLOAT, W)

    def codegen(context, builder, sig, args):
        i64 = ir.IntType(64)
        qs, qh, d, x4, xs, xd, out = arrays(context, builder, sig, args, 0, 1, 2, 3, 4, 5, 9 if n_t else 8)
        g, c = i64_args(builder, args[6:8])
        _, n_blocks, n_words, R = cgutils.unpack_tuple(builder, qs.shape, 4)
        n_dcols = cgutils.unpack_tuple(builder, d.shape, 4)[2]
        row0 = builder.mul(c, ir.Constant(i64, W))
        if n_t:
            t0 = i64_args(builder, args[8:9])[0]
            n_tok = cgutils.unpack_tuple(builder, x4.shape, 3)[0]
            out_cols = cgutils.unpack_tuple(builder, out.shape, 2)[1]
            last = builder.sub(n_tok, ir.Constant(i64, 1))
            toks = [builder.select(builder.icmp_signed("<", t, n_tok), t, last)
                    for t in (builder.add(t0, ir.Constant(i64, i)) for i in range(n_t))]
        else:
            toks = [None]
        # per token: 8 lanes + the min sum
        accs = [[cgutils.alloca_once_value(builder, ir.Constant(vf, None)) for _ in range(9)] for _ in toks]
        with cgutils.for_range(builder, n_blocks) as loop:
            b = loop.index
            gb = builder.add(builder.mul(g, n_blocks), b)
            d_base = builder.add(builder.mul(builder.mul(gb, n_dcols), R), row0)
            _prefetch_codes(builder, qs, gb, n_words, R, row0, 4 * W * n_words_max(kind))
            codes = block_codes(builder, isa, kind, qs, qh, gb, n_words, R, row0)
            w_d = halves_to_float(builder, load16(builder, d.data, d_base, vec(INT16, W)))
            w_m = None
            if kind in (T.Q4_1, T.Q5_1):
                w_m = halves_to_float(builder, load16(builder, d.data, builder.add(d_base, R), vec(INT16, W)))
            for t, acc in zip(toks, accs):
                tb = b if t is None else builder.add(builder.mul(t, n_blocks), b)
                _accumulate_block(builder, isa, kind, codes, w_d, w_m, (x4, xs, xd), tb, acc)
        col = builder.add(builder.mul(g, R), row0)
        for i, acc in enumerate(accs):
            total = _lane_total(builder, kind, [builder.load(p) for p in acc])
            if not n_t:
                builder.store(total, builder.bitcast(builder.gep(out.data, [col]), vf.as_pointer()), align=4)
                continue
            _store_token_row(builder, out, out_cols, total, builder.add(t0, ir.Constant(i64, i)), n_tok, col)
        return context.get_dummy_value()

    return codegen


def gemm_codegen(kind, isa, n_t=0):
    """IR body: (qs, qh, d, xq4, xsum, xd, g, c, t0, out) -> out[t0 : t0 + n_t (default:
    gemm_tokens), g*R + width*c : +width]; tokens past the end of xq4 are computed on the
    last token and not stored. xq4, xsum, xd have a token axis; out: f32[n_tok, >= G * R]."""
    W, n_t = isa.width, n_t or isa.gemm_tokens
    vf = vec(FLOAT, W)

    def codegen(context, builder, sig, args):
        qs, qh, d, x4, xs, xd, out = arrays(context, builder, sig, args, 0, 1, 2, 3, 4, 5, 9)
        i64 = ir.IntType(64)
        g, c, t0 = i64_args(builder, args[6:9])
        _, n_blocks, n_words, R = cgutils.unpack_tuple(builder, qs.shape, 4)
        n_dcols = cgutils.unpack_tuple(builder, d.shape, 4)[2]
        n_tok = cgutils.unpack_tuple(builder, x4.shape, 3)[0]
        out_cols = cgutils.unpack_tuple(builder, out.shape, 2)[1]
        row0 = builder.mul(c, ir.Constant(i64, W))
        last = builder.sub(n_tok, ir.Constant(i64, 1))
        toks = []
        for i in range(n_t):
            t = builder.add(t0, ir.Constant(i64, i))
            toks.append(builder.select(builder.icmp_signed("<", t, n_tok), t, last))
        accs = [cgutils.alloca_once_value(builder, ir.Constant(vf, None)) for _ in range(n_t)]
        off_mul = isa.offset(kind)
        with cgutils.for_range(builder, n_blocks) as loop:
            b = loop.index
            gb = builder.add(builder.mul(g, n_blocks), b)
            d_base = builder.add(builder.mul(builder.mul(gb, n_dcols), R), row0)
            if n_t == 1:  # a decode step: the weight streams from DRAM (see PREFETCH_BYTES)
                _prefetch_codes(builder, qs, gb, n_words, R, row0, 4 * W * n_words_max(kind))
            codes = block_codes(builder, isa, kind, qs, qh, gb, n_words, R, row0)
            for i, t in enumerate(toks):
                tb = builder.add(builder.mul(t, n_blocks), b)
                isum = None
                for j in range(8):
                    isum = isa.dot(builder, isum, codes[j], load_at(builder, x4.data, tb, 8, j), isa.signed(kind))
                if off_mul:
                    total = load_at(builder, xs.data, tb, 16, 0)
                    isum = builder.sub(isum, splat(builder, builder.mul(total, ir.Constant(INT32, off_mul)), isum.type))
                dx = load_at(builder, xd.data, tb, 2, 0)
                acc = fma16(builder, scales(builder, W, d.data, d_base, dx), builder.sitofp(isum, vf),
                            builder.load(accs[i]))
                if kind in (T.Q4_1, T.Q5_1):
                    sx = load_at(builder, xd.data, tb, 2, 1)
                    acc = builder.fadd(acc, scales(builder, W, d.data, builder.add(d_base, R), sx))
                builder.store(acc, accs[i])
        col = builder.add(builder.mul(g, R), row0)
        for i in range(n_t):
            t = builder.add(t0, ir.Constant(i64, i))
            _store_token_row(builder, out, out_cols, builder.load(accs[i]), t, n_tok, col)
        return context.get_dummy_value()

    return codegen


def chunk_intrinsics(isa) -> dict:
    """{weight type: Numba intrinsic (qs, qh, d, xq4, xsum, xd, g, c, out)} for one ISA."""

    def make(kind):
        @intrinsic
        def chunk(typingctx, qs, qh, d, xq4, xsum, xd, g, c, out):
            return types.void(qs, qh, d, xq4, xsum, xd, g, c, out), chunk_codegen(kind, isa)

        return chunk

    return {kind: make(kind) for kind in TYPES}


def rows_intrinsics(isa, n_t) -> dict:
    """{weight type: Numba intrinsic (qs, qh, d, xq4, xsum, xd, g, c, t0, out)}: the one-token
    kernel for n_t separate tokens from t0, each with its bits."""

    def make(kind):
        @intrinsic
        def rows(typingctx, qs, qh, d, xq4, xsum, xd, g, c, t0, out):
            return types.void(qs, qh, d, xq4, xsum, xd, g, c, t0, out), chunk_codegen(kind, isa, n_t)

        return rows

    return {kind: make(kind) for kind in TYPES}


def gemm_intrinsics(isa, kinds=TYPES, n_t=0) -> dict:
    """{weight type: Numba intrinsic (qs, qh, d, xq4, xsum, xd, g, c, t0, out)} for one ISA:
    gemm_codegen's tiles of n_t tokens (default gemm_tokens) for each of kinds."""

    def make(kind):
        @intrinsic
        def gemm(typingctx, qs, qh, d, xq4, xsum, xd, g, c, t0, out):
            return types.void(qs, qh, d, xq4, xsum, xd, g, c, t0, out), gemm_codegen(kind, isa, n_t)

        return gemm

    return {kind: make(kind) for kind in kinds}
