"""Prefill matrix products for Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 weights on x86 CPUs with
AVX512-VNNI: integer GEMM in LLVM IR.

Why: a chunk of many tokens went through dequantized float32 weight tiles and BLAS,
16 multiply-adds per SIMD instruction plus the cost of dequantizing every tile; here
the activations of every token are quantized to q8 once (as for a matvec) and each
`vpdpbusd` does 64 byte products. One call computes 16 rows x 8 tokens: the weight
block's 8 code vectors are prepared once and used for all 8 tokens, whose float
accumulators stay in registers.

Arithmetic: per block, the 8 ggml lanes of a token are summed as integers (exact), then
acc_t = fma(f32(d_w * d_x), float(sum), acc_t) (+ m_w * s_x for Q4_1/Q5_1). That is
not llama.cpp's float order for a single token (vnni.py keeps that one): like the BLAS
path it replaces, it is used only for chunks of backends/kernel_map.py BATCH_MIN_TOKENS tokens or more,
which llama.cpp computes with its own, different, batched kernels.
What does not live here: the per-token exact kernels (vnni.py), the layout (repack.py).
"""

from __future__ import annotations

import numba as nb
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic
from gguf import GGMLQuantizationType as T

from . import activations as act
from .config import EXACT_FLAGS
from .irvec import INT32, V16F, V16I, arrays, fma16, load_at, splat
from .vnni import CHUNK, OFFSETS, block_codes, dpbusd, scale16

TOKENS = 8  # tokens per call: 8 float accumulators + 8 code vectors fit in the 32 zmm registers


def _gemm_codegen(kind):
    """(qs, qh, d, xq4, xsum, xd, g, c, t0, out) -> out[t0:t0+8, g*R + 16c : +16]; tokens
    past the end of xq4 are computed on the last token and not stored.

    Operands as vnni._chunk_codegen's (qs, qh, d: the repacked weight), with a token axis
    on the activations: xq4 i32[n_tok, NB, 8], xsum i32[n_tok, NB, 16], xd f32[n_tok, NB, 2];
    t0 int64 the first of the 8 tokens; out f32[n_tok, >= G * R] (C-contiguous rows)."""

    def codegen(context, builder, sig, args):
        qs, qh, d, x4, xs, xd, out = arrays(context, builder, sig, args, 0, 1, 2, 3, 4, 5, 9)
        i64 = ir.IntType(64)
        g, c, t0 = (builder.sext(a, i64) if a.type != i64 else a for a in args[6:9])
        _, n_blocks, n_words, R = cgutils.unpack_tuple(builder, qs.shape, 4)
        n_dcols = cgutils.unpack_tuple(builder, d.shape, 4)[2]
        n_tok = cgutils.unpack_tuple(builder, x4.shape, 3)[0]
        out_cols = cgutils.unpack_tuple(builder, out.shape, 2)[1]
        row0 = builder.mul(c, ir.Constant(i64, CHUNK))
        last = builder.sub(n_tok, ir.Constant(i64, 1))
        toks = []
        for i in range(TOKENS):
            t = builder.add(t0, ir.Constant(i64, i))
            toks.append(builder.select(builder.icmp_signed("<", t, n_tok), t, last))
        accs = [cgutils.alloca_once_value(builder, ir.Constant(V16F, None)) for _ in range(TOKENS)]
        off_mul = OFFSETS.get(kind, 0)
        with cgutils.for_range(builder, n_blocks) as loop:
            b = loop.index
            gb = builder.add(builder.mul(g, n_blocks), b)
            d_base = builder.add(builder.mul(builder.mul(gb, n_dcols), R), row0)
            codes = block_codes(builder, kind, qs, qh, gb, n_words, R, row0)
            for i, t in enumerate(toks):
                tb = builder.add(builder.mul(t, n_blocks), b)
                isum = None
                for j in range(8):
                    isum = dpbusd(builder, isum, codes[j], splat(builder, load_at(builder, x4.data, tb, 8, j), V16I))
                if off_mul:
                    total = load_at(builder, xs.data, tb, 16, 0)
                    isum = builder.sub(isum, splat(builder, builder.mul(total, ir.Constant(INT32, off_mul)), V16I))
                dx = load_at(builder, xd.data, tb, 2, 0)
                acc = fma16(builder, scale16(builder, d.data, d_base, dx), builder.sitofp(isum, V16F),
                            builder.load(accs[i]))
                if kind in (T.Q4_1, T.Q5_1):
                    sx = load_at(builder, xd.data, tb, 2, 1)
                    acc = builder.fadd(acc, scale16(builder, d.data, builder.add(d_base, R), sx))
                builder.store(acc, accs[i])
        col = builder.add(builder.mul(g, R), row0)
        for i in range(TOKENS):
            t = builder.add(t0, ir.Constant(i64, i))
            with builder.if_then(builder.icmp_signed("<", t, n_tok)):
                at = builder.add(builder.mul(t, out_cols), col)
                ptr = builder.bitcast(builder.gep(out.data, [at]), V16F.as_pointer())
                builder.store(builder.load(accs[i]), ptr, align=4)
        return context.get_dummy_value()

    return codegen


def _gemm_intrinsic(kind):
    @intrinsic
    def gemm(typingctx, qs, qh, d, xq4, xsum, xd, g, c, t0, out):
        return types.void(qs, qh, d, xq4, xsum, xd, g, c, t0, out), _gemm_codegen(kind)

    return gemm


_GEMM = {kind: _gemm_intrinsic(kind) for kind in (T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1)}
_q8_0, _q4_0, _q4_1, _q5_0, _q5_1 = (_GEMM[k] for k in (T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1))


@nb.njit(**dict(EXACT_FLAGS, parallel=True))
def quantize_acts(x, xq, xd, xsum):
    # every token's activations to q8 blocks: x f32[n, n_cols] -> xq i8[n, NB, 32], xd, xsum
    for t in nb.prange(x.shape[0]):
        act.quantize_act_q8(x[t], xq[t], xd[t], xsum[t])


@nb.njit(**dict(EXACT_FLAGS, parallel=True))  # no fast-math inside the IR
def gemm_chunks(kind, qs, qh, d, xq4, xsum, xd, out_pad):
    # out_pad f32[n_tok, G * R] = x @ W^T for all 16-row chunks; a group's token tiles on one thread
    per_group = qs.shape[3] // CHUNK
    n_tok = xq4.shape[0]
    for job in nb.prange(qs.shape[0] * per_group):
        g, c = job // per_group, job % per_group
        for t0 in range(0, n_tok, TOKENS):
            if kind == T.Q8_0:
                _q8_0(qs, qh, d, xq4, xsum, xd, g, c, t0, out_pad)
            elif kind == T.Q4_0:
                _q4_0(qs, qh, d, xq4, xsum, xd, g, c, t0, out_pad)
            elif kind == T.Q4_1:
                _q4_1(qs, qh, d, xq4, xsum, xd, g, c, t0, out_pad)
            elif kind == T.Q5_0:
                _q5_0(qs, qh, d, xq4, xsum, xd, g, c, t0, out_pad)
            else:
                _q5_1(qs, qh, d, xq4, xsum, xd, g, c, t0, out_pad)
