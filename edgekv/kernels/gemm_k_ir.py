"""Whole K-quant products (Q4_K, Q5_K, Q6_K) in LLVM IR, for tiles of tokens: the integer
sums on the CPU's int8 dot instruction (int8dot.py's ISA) and the float steps in vector
registers, in llama.cpp's x86 orders (dot_k.py states them), so the bits are the portable
kernels' and llama.cpp's.

Why: dot_k.py computes a token's product one super-block at a time, storing its integer
sums to scratch arrays and reading them back for the float steps, and reads the whole
weight once per token. Here one call computes `width` rows of a row group for a tile of
tokens over all super-blocks: a chunk's code vectors are unpacked once for every token of
the tile, and the sums never leave registers. A long chunk (the batch path) then costs
integer arithmetic on cached weights instead of dequantized tiles through BLAS, and gets
llama.cpp's rounding (q8_K activations) rather than float32 BLAS's.

- `k4_tile` (Q4_K; Q5_K with `fifth`): per 64-value chunk c, lo/hi = sums of the low
  (high) nibble codes times the activation codes, T = sc_2c lo + sc_2c+1 hi,
  M = mn_2c X_2c + mn_2c+1 X_2c+1 (X: sums of activation codes); `per_chunk` (llama.cpp's
  repacked gemm, whole groups of 4 tokens): acc = fma(T, f32(d_w d_x), acc) and
  accm = fma(M, f32(dmin_w d_x), accm) per chunk; else (its gemv) per super-block with T
  and M summed over the 4 chunks; the result acc - accm.
- `q6_tile` (Q6_K in a batch of 8 or more, ORDER_TILED): per super-block the whole
  integer sum T = sum_sub sc_sub (S_sub - 32 X_sub) over the 16 sub-blocks of 16 values,
  then acc = fma(f32(T * d_w), d_x, acc); `q6_gemv` (one token, or a batch under 8):
  the same integers in vec_dot_q6_K_q8_K's 8 lanes, each with its own float accumulator.

Operands (repack.py's lane layout, R rows per group, a multiple of the ISA's width):
  qs u32[G, NSB, 32, R]; qh u32[G, NSB, 8 (Q5_K) / 16 (Q6_K) / 0, R];
  sc u8[G, NSB, 16, R] (Q4_K/Q5_K: 8 scales, 8 mins; Q6_K: 16 int8 scales);
  d u16[G, NSB, 2 or 1, R]; xq4 i32[n_tok, NSB, 64] (q8_K codes, 4 per word);
  xsum i32[n_tok, NSB, 16]; xd f32[n_tok, NSB, 2] (d_x in column 0); out f32[n_tok, >= G*R].
A call (qs, qh, sc, d, xq4, xsum, xd, g, c, t0, out) writes out[t0 : t0 + tokens,
g*R + width*c : + width]; tokens past n_tok are computed on the last token and not stored.
What does not live here: the drivers (int8dot.py), the per-token kernels (dot_k.py, dot_k_ir.py).
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from .dot_ir import scales
from .irvec import FLOAT, INT16, INT32, arrays, fma16, halves_to_float, i64_args, load16, load_at, prefetch, splat, vec

I64, INT8 = ir.IntType(64), ir.IntType(8)
# One token's kernels stream each weight from DRAM once, faster than the hardware prefetchers
# ramp up on jobs of a few KiB in four arrays: each super-block asks for every line the next
# super-block of its stream will read (codes, fifth/high bits, scales, d), into L2 (prefetcht1:
# a nearer level evicts the lines in use). Measured on a Zen 4, 2 threads, Q4_K [8960 x 1536]
# and Q6_K [16384 x 1536] from DRAM: 27.0 -> 30.3 and 26.0 -> 29.4 GB/s against asking for the
# codes alone into L1 2 KiB ahead (1 thread: 17.8 -> 23.5, 15.5 -> 18.9); 2 or 4 super-blocks
# ahead, or into L1, was slower.
PREFETCH_SB = 1
PREFETCH_LOCALITY = 2


def const_vec(vtype, value):
    return ir.Constant(vtype, [value] * vtype.count)


def _at(builder, *index_dims):
    # flat element index of a C-contiguous array: ((i0 * n1 + i1) * n2 + i2) ...; pairs (i, n)
    flat = index_dims[0][0]
    for i, n in index_dims[1:]:
        flat = builder.add(builder.mul(flat, n), i)
    return flat


def byte_vector(builder, data, index, width, signed):
    # width bytes of a u8 array from element index, widened to i32 lanes (int8 bits if signed)
    raw = builder.load(builder.bitcast(builder.gep(data, [index]), vec(INT8, width).as_pointer()), align=1)
    return (builder.sext if signed else builder.zext)(raw, vec(INT32, width))


class TileFrame:
    """What every K-quant tile kernel unpacks from its arguments."""

    def __init__(self, context, builder, sig, args, width, n_t):
        self.qs, self.qh, self.sc, self.d, self.x4, self.xs, self.xd, self.out = arrays(
            context, builder, sig, args, 0, 1, 2, 3, 4, 5, 6, 10)
        self.g, c, t0 = i64_args(builder, args[7:10])
        _, self.n_sb, self.n_w, self.R = cgutils.unpack_tuple(builder, self.qs.shape, 4)
        self.n_qh = cgutils.unpack_tuple(builder, self.qh.shape, 4)[2]
        self.n_d = cgutils.unpack_tuple(builder, self.d.shape, 4)[2]
        self.n_tok = cgutils.unpack_tuple(builder, self.x4.shape, 3)[0]
        self.out_cols = cgutils.unpack_tuple(builder, self.out.shape, 2)[1]
        self.row0 = builder.mul(c, ir.Constant(I64, width))
        self.t0 = t0
        last = builder.sub(self.n_tok, ir.Constant(I64, 1))
        self.toks = []
        for i in range(n_t):
            t = builder.add(t0, ir.Constant(I64, i))
            self.toks.append(builder.select(builder.icmp_signed("<", t, self.n_tok), t, last))

    def word(self, builder, arr, n_words, b, w, vi):
        # the width-lane vector of word w of super-block b, rows row0.., of qs or qh
        w = w if isinstance(w, ir.Value) else ir.Constant(I64, w)
        return load16(builder, arr.data, _at(builder, (self.g, None), (b, self.n_sb), (w, n_words), (self.row0, self.R)), vi)

    def prefetch_ahead(self, builder, b, width, streams):
        # ask for what super-block b + PREFETCH_SB of this job will read (past its last, the
        # thread's next job's: prange hands each thread a run of groups); streams: (array,
        # its item bytes, its items per row and super-block) for each array the kernel reads
        for arr, item, per_row in streams:
            size = per_row * item * width  # bytes of one super-block of one job
            at = _at(builder, (self.g, None), (b, self.n_sb), (ir.Constant(I64, 0), ir.Constant(I64, per_row)),
                     (self.row0, self.R))
            for line in range(0, size, 64):  # one per cache line (a 32-byte d row: one)
                ahead = ir.Constant(I64, (PREFETCH_SB * size + line) // item)
                prefetch(builder, builder.gep(arr.data, [builder.add(at, ahead)]), PREFETCH_LOCALITY)

    def per_row(self, builder, arr, n_cols, b, k):
        # flat index of arr[g, b, k, row0] for a [G, NSB, n_cols, R] array
        return _at(builder, (self.g, None), (b, self.n_sb), (ir.Constant(I64, k), n_cols), (self.row0, self.R))

    def store(self, builder, accs, vf):
        col = builder.add(builder.mul(self.g, self.R), self.row0)
        for i, acc in enumerate(accs):
            t = builder.add(self.t0, ir.Constant(I64, i))
            with builder.if_then(builder.icmp_signed("<", t, self.n_tok)):
                at = builder.add(builder.mul(t, self.out_cols), col)
                builder.store(builder.load(acc), builder.bitcast(builder.gep(self.out.data, [at]), vf.as_pointer()), align=4)


# A lone token's 64-value chunk sums in two accumulators each (codes u even / odd): one chain
# of 8 dot instructions waits on their latency; two ran a cached Q4_K [256 x 1536] gemv at
# 64 GB/s against 57 on one thread of a Zen 4 (four: 62). Integer sums: the same bits.
K4_CHAINS = 2


def _total(builder, parts):
    # the sum of integer vectors (exact: any order gives the same bits)
    total = parts[0]
    for p in parts[1:]:
        total = builder.add(total, p)
    return total


def _k4_chunk_sums(builder, isa, f, b, c, tbs, fifth, vi):
    # (lo, hi) per token tb of tbs: the integer sums of chunk c of super-block b, the low
    # (high) nibble codes, with Q5_K's fifth bits, times the activation codes; a lone token's
    # in K4_CHAINS accumulators each, added at the end
    chains = K4_CHAINS if len(tbs) == 1 else 1
    lo, hi = [[None] * chains for _ in tbs], [[None] * chains for _ in tbs]
    for u in range(8):
        words = f.word(builder, f.qs, f.n_w, b, 8 * c + u, vi)
        lo_codes = builder.and_(words, const_vec(vi, 0x0F0F0F0F))
        hi_codes = builder.and_(builder.lshr(words, const_vec(vi, 4)), const_vec(vi, 0x0F0F0F0F))
        if fifth:  # bit 2c / 2c+1 of each qh byte: the codes' fifth bit
            e = f.word(builder, f.qh, f.n_qh, b, u, vi)
            lo_codes = builder.or_(lo_codes, builder.shl(builder.and_(
                builder.lshr(e, const_vec(vi, 2 * c)), const_vec(vi, 0x01010101)), const_vec(vi, 4)))
            hi_codes = builder.or_(hi_codes, builder.shl(builder.and_(
                builder.lshr(e, const_vec(vi, 2 * c + 1)), const_vec(vi, 0x01010101)), const_vec(vi, 4)))
        for i, tb in enumerate(tbs):
            j = u % chains
            lo[i][j] = isa.dot(builder, lo[i][j], lo_codes, load_at(builder, f.x4.data, tb, 64, 16 * c + u))
            hi[i][j] = isa.dot(builder, hi[i][j], hi_codes, load_at(builder, f.x4.data, tb, 64, 16 * c + 8 + u))
    return [_total(builder, parts) for parts in lo], [_total(builder, parts) for parts in hi]


def _k4_codegen(isa, fifth, n_t, per_chunk):
    """IR body of k4_tile (see the module docstring) for n_t tokens."""
    W = isa.width
    vi, vf = vec(INT32, W), vec(FLOAT, W)

    def codegen(context, builder, sig, args):
        f = TileFrame(context, builder, sig, args, W, n_t)
        accs = [cgutils.alloca_once_value(builder, ir.Constant(vf, None)) for _ in range(2 * n_t)]
        with cgutils.for_range(builder, f.n_sb) as loop:
            b = loop.index
            tbs = [builder.add(builder.mul(t, f.n_sb), b) for t in f.toks]
            if n_t == 1:  # codes, Q5_K's fifth bits, scales and mins, d and dmin
                f.prefetch_ahead(builder, b, W, ((f.qs, 4, 32), (f.qh, 4, 8 if fifth else 0), (f.sc, 1, 16), (f.d, 2, 2)))
            d_at = f.per_row(builder, f.d, f.n_d, b, 0)
            dxs = [load_at(builder, f.xd.data, tb, 2, 0) for tb in tbs]
            tot = mins = [None] * n_t
            for c in range(4):
                lo, hi = _k4_chunk_sums(builder, isa, f, b, c, tbs, fifth, vi)
                s0, s1, m0, m1 = (byte_vector(builder, f.sc.data, f.per_row(builder, f.sc, ir.Constant(I64, 16), b, k), W, False)
                                  for k in (2 * c, 2 * c + 1, 8 + 2 * c, 9 + 2 * c))
                tot_c, mins_c = [], []
                for i, tb in enumerate(tbs):
                    x0 = builder.add(load_at(builder, f.xs.data, tb, 16, 4 * c), load_at(builder, f.xs.data, tb, 16, 4 * c + 1))
                    x1 = builder.add(load_at(builder, f.xs.data, tb, 16, 4 * c + 2), load_at(builder, f.xs.data, tb, 16, 4 * c + 3))
                    tot_c.append(builder.add(builder.mul(s0, lo[i]), builder.mul(s1, hi[i])))
                    mins_c.append(builder.add(builder.mul(m0, splat(builder, x0, vi)), builder.mul(m1, splat(builder, x1, vi))))
                if per_chunk or c == 0:
                    tot = mins = None
                tot, mins = add_parts(builder, tot, tot_c), add_parts(builder, mins, mins_c)
                if per_chunk or c == 3:
                    min_fmas(builder, f, d_at, dxs, tot, mins, accs, W)
        store_differences(builder, f, accs, vf)
        return context.get_dummy_value()

    return codegen


def add_parts(builder, sums, parts):
    """Per token, the integer sums so far (None: none yet) plus this part's (exact in any order)."""
    return parts if sums is None else [builder.add(a, x) for a, x in zip(sums, parts)]


def min_fmas(builder, f, d_at, dxs, tot, mins, accs, width):
    """The repacked Q4_K/Q5_K/Q2_K kernels' float step, per token i of the tile:
    accs[2i] = fma(f32(tot[i]), f32(d_w d_x), accs[2i]) and accs[2i + 1] = fma(f32(mins[i]),
    f32(dmin_w d_x), accs[2i + 1]) (d_at: the flat index of d_w; dmin_w R further)."""
    vf = vec(FLOAT, width)
    for i, dx in enumerate(dxs):
        acc, accm = accs[2 * i], accs[2 * i + 1]
        builder.store(fma16(builder, builder.sitofp(tot[i], vf), scales(builder, width, f.d.data, d_at, dx),
                            builder.load(acc)), acc)
        dmin_at = builder.add(d_at, f.R)
        builder.store(fma16(builder, builder.sitofp(mins[i], vf), scales(builder, width, f.d.data, dmin_at, dx),
                            builder.load(accm)), accm)


def store_differences(builder, f, accs, vf):
    """Store each token's accs[2i] - accs[2i + 1] (min_fmas' two sums): the result."""
    results = [cgutils.alloca_once_value(builder, builder.fsub(builder.load(accs[2 * i]), builder.load(accs[2 * i + 1])))
               for i in range(len(accs) // 2)]
    f.store(builder, results, vf)


def _q6_codes(builder, f, b, h, half, jj, vi):
    # the code vectors of run jj of quarters k = 0..3 of quarter-pair (h, half) of a Q6_K
    # super-block b: 4 bits of ql word w (quarters 0/2: low/high nibbles) or w + 8 (1/3),
    # 2 bits (at 2k) of qh word 8h + 4 half + jj, for codes 0..63
    w = 16 * h + 4 * half + jj
    p = f.word(builder, f.qs, f.n_w, b, w, vi)
    q = f.word(builder, f.qs, f.n_w, b, w + 8, vi)
    e = f.word(builder, f.qh, f.n_qh, b, 8 * h + 4 * half + jj, vi)
    return [builder.or_(builder.and_(builder.lshr(low, const_vec(vi, shift)), const_vec(vi, 0x0F0F0F0F)),
                        builder.shl(builder.and_(builder.lshr(e, const_vec(vi, 2 * k)), const_vec(vi, 0x03030303)), const_vec(vi, 4)))
            for k, (low, shift) in enumerate(((p, 0), (q, 0), (p, 4), (q, 4)))]


def _q6_codegen(isa, n_t):
    """IR body of q6_tile (see the module docstring) for n_t tokens."""
    W = isa.width
    vi, vf = vec(INT32, W), vec(FLOAT, W)

    def codegen(context, builder, sig, args):
        f = TileFrame(context, builder, sig, args, W, n_t)
        accs = [cgutils.alloca_once_value(builder, ir.Constant(vf, None)) for _ in range(n_t)]
        with cgutils.for_range(builder, f.n_sb) as loop:
            b = loop.index
            tbs = [builder.add(builder.mul(t, f.n_sb), b) for t in f.toks]
            tot = [None] * n_t
            for h in range(2):
                for half in range(2):
                    sums = [[None] * 4 for _ in range(n_t)]  # sub-block 8h + 2k + half of token i
                    for jj in range(4):
                        for k, codes in enumerate(_q6_codes(builder, f, b, h, half, jj, vi)):
                            x_word = 32 * h + 4 * half + jj + 8 * k
                            for i, tb in enumerate(tbs):
                                sums[i][k] = isa.dot(builder, sums[i][k], codes, load_at(builder, f.x4.data, tb, 64, x_word))
                    for k in range(4):
                        sub = 8 * h + 2 * k + half
                        scale = byte_vector(builder, f.sc.data, f.per_row(builder, f.sc, ir.Constant(I64, 16), b, sub), W, True)
                        for i, tb in enumerate(tbs):
                            offset = builder.mul(load_at(builder, f.xs.data, tb, 16, sub), ir.Constant(INT32, 32))
                            term = builder.mul(scale, builder.sub(sums[i][k], splat(builder, offset, vi)))
                            tot[i] = term if tot[i] is None else builder.add(tot[i], term)
            tiled_fma(builder, f, b, tbs, tot, accs, W)
        f.store(builder, accs, vf)
        return context.get_dummy_value()

    return codegen


def _q6_gemv_codegen(isa):
    """IR body of q6_gemv: one token in llama.cpp's vec_dot_q6_K_q8_K order (dot_k.py): 8
    int32 lanes per super-block, lane 4 half + jj = sum over (h, k) of sc_sub x run jj,
    less 32 (X_2j sc_2j + X_2j+1 sc_2j+1); acc_j = fma(f32(d_x d_w), lane_j, acc_j);
    at the end hsum_float_8: ((a4 + a0) + (a6 + a2)) + ((a5 + a1) + (a7 + a3))."""
    W = isa.width
    vi, vf = vec(INT32, W), vec(FLOAT, W)

    def codegen(context, builder, sig, args):
        f = TileFrame(context, builder, sig, args, W, 1)
        accs = [cgutils.alloca_once_value(builder, ir.Constant(vf, None)) for _ in range(8)]
        with cgutils.for_range(builder, f.n_sb) as loop:
            b = loop.index
            tb = builder.add(builder.mul(f.toks[0], f.n_sb), b)
            f.prefetch_ahead(builder, b, W, ((f.qs, 4, 32), (f.qh, 4, 16), (f.sc, 1, 16), (f.d, 2, 1)))
            scs = [byte_vector(builder, f.sc.data, f.per_row(builder, f.sc, ir.Constant(I64, 16), b, sub), W, True)
                   for sub in range(16)]
            lanes = [None] * 8
            for h in range(2):
                for half in range(2):
                    for jj in range(4):
                        for k, codes in enumerate(_q6_codes(builder, f, b, h, half, jj, vi)):
                            run = isa.dot(builder, None, codes, load_at(builder, f.x4.data, tb, 64, 32 * h + 4 * half + jj + 8 * k))
                            term = builder.mul(scs[8 * h + 2 * k + half], run)
                            j = 4 * half + jj
                            lanes[j] = term if lanes[j] is None else builder.add(lanes[j], term)
            scale = scales(builder, W, f.d.data, f.per_row(builder, f.d, f.n_d, b, 0), load_at(builder, f.xd.data, tb, 2, 0))
            for j in range(8):
                x0, x1 = load_at(builder, f.xs.data, tb, 16, 2 * j), load_at(builder, f.xs.data, tb, 16, 2 * j + 1)
                offset = builder.add(builder.mul(scs[2 * j], splat(builder, x0, vi)), builder.mul(scs[2 * j + 1], splat(builder, x1, vi)))
                lane = builder.sub(lanes[j], builder.mul(offset, const_vec(vi, 32)))
                builder.store(fma16(builder, scale, builder.sitofp(lane, vf), builder.load(accs[j])), accs[j])
        f.store(builder, [hsum_float_8(builder, accs)], vf)
        return context.get_dummy_value()

    return codegen


def tiled_fma(builder, f, b, tbs, tot, accs, width):
    """The tiled matmul's float step of super-block b: per token i (q8_K block tbs[i]) of the
    tile, accs[i] = fma(f32(tot[i]) * d_w, d_x, accs[i]) (tot: its integer sums)."""
    vf = vec(FLOAT, width)
    dw = halves_to_float(builder, load16(builder, f.d.data, f.per_row(builder, f.d, f.n_d, b, 0), vec(INT16, width)))
    for i, tb in enumerate(tbs):
        dx = splat(builder, load_at(builder, f.xd.data, tb, 2, 0), vf)
        builder.store(fma16(builder, builder.fmul(builder.sitofp(tot[i], vf), dw), dx, builder.load(accs[i])), accs[i])


def hsum_float_8(builder, accs):
    """The 8 lane accumulators (allocas) summed as ggml's hsum_float_8 adds its lanes:
    ((a4 + a0) + (a6 + a2)) + ((a5 + a1) + (a7 + a3)); an alloca holding the result."""
    a = [builder.load(p) for p in accs]
    s0, s1 = builder.fadd(a[4], a[0]), builder.fadd(a[5], a[1])
    s2, s3 = builder.fadd(a[6], a[2]), builder.fadd(a[7], a[3])
    return cgutils.alloca_once_value(builder, builder.fadd(builder.fadd(s0, s2), builder.fadd(s1, s3)))


def tile_intrinsic(codegen):
    """A Numba intrinsic (qs, qh, sc, d, xq4, xsum, xd, g, c, t0, out) of a tile's IR body."""

    @intrinsic
    def tile(typingctx, qs, qh, sc, d, xq4, xsum, xd, g, c, t0, out):
        return types.void(qs, qh, sc, d, xq4, xsum, xd, g, c, t0, out), codegen

    return tile


def k_tile_intrinsics(isa, q6_tokens):
    """{name: tile_intrinsic} for one ISA: q4k_gemm / q5k_gemm (4 tokens, per-chunk FMAs),
    q4k_gemv / q5k_gemv (one token, per super-block FMAs), q6k_tiled (q6_tokens tokens),
    q6k_gemv (one token, 8 lanes)."""
    make = tile_intrinsic
    return {
        "q4k_gemm": make(_k4_codegen(isa, False, 4, True)),
        "q5k_gemm": make(_k4_codegen(isa, True, 4, True)),
        "q4k_gemv": make(_k4_codegen(isa, False, 1, False)),
        "q5k_gemv": make(_k4_codegen(isa, True, 1, False)),
        "q6k_tiled": make(_q6_codegen(isa, q6_tokens)),
        "q6k_gemv": make(_q6_gemv_codegen(isa)),
    }
