"""Float weights (F32, F16, BF16) times several tokens in LLVM IR, each token with the bits
of the one-token kernel (matvec_drivers.dot_float), the weight read once for all of them.

Why: dot_float keeps its 64 lane sums in a scratch array (Numba cannot prove it does not
alias the weight), so every multiply-add is a load and a store, and a second token re-reads
the whole row group. A speculative verify pass or a batch of sessions' decode steps on an
F32 model then cost about a full decode step per extra token (SmolLM2's 1536 x 576 F32
weight: 250 us for one token, 2.4 ms for eight). Here a call computes `WIDTH` rows of one
row group for up to `TOKENS` tokens with every sum in a register, and each weight vector
is loaded once for all of them.

The arithmetic is dot_float's, lane for lane: the sum of row r starts at 0 and takes, for
each column in order, `sum + w[r, col] * x[col]` with the multiply and the add allowed to
fuse (`contract`, the one fast-math flag of Numba's kernels that can change a bit here):
where the CPU has an FMA both compile to one, elsewhere both to a multiply and an add, so
the two kernels agree on every CPU. F16 and BF16 weights widen to float32 exactly first;
x is the activation dot_float gets (rounded to the weight's type: activations.py).

Operands (C-contiguous; G row groups of R rows, repack.py's lane layout):
  F32:       w   f32[G, n, R]      row g*R + r, column col at w[g, col, r]
  F16, BF16: d   u16[G, n, 1, R]   the same, as the type's bits
  xf         f32[T, n]             the tokens' activations
  out        f32[T, >= G * R]      token t's row g*R + WIDTH*c + i at out[t, g*R + WIDTH*c + i]
What does not live here: the driver that runs the calls over groups and tokens
(matvec_drivers.matvec_float_rows), activation rounding (activations.py).
"""

from __future__ import annotations

from gguf import GGMLQuantizationType as T
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from .irvec import FLOAT, INT16, INT32, arrays, i64_args, load16, splat, vec

WIDTH = 16  # rows per call: 2 AVX2 or 4 NEON registers, 1 AVX-512 register
TOKENS = 6  # tokens per call at most: 6 x 2 sums, 2 weight vectors and x fit AVX2's 16 ymm registers
CONTRACT = ("contract",)  # Numba's fast-math flag that lets a multiply and an add fuse


def _weights(builder, kind, data, index):
    """WIDTH weights of type kind at element `index` of data, as float32 lanes (exact)."""
    if kind == T.F32:
        ptr = builder.gep(data, [index])
        return builder.load(builder.bitcast(ptr, vec(FLOAT, WIDTH).as_pointer()), align=4)
    bits = load16(builder, data, index, vec(INT16, WIDTH))
    if kind == T.F16:
        return builder.fpext(builder.bitcast(bits, vec(ir.HalfType(), WIDTH)), vec(FLOAT, WIDTH))
    wide = builder.shl(builder.zext(bits, vec(INT32, WIDTH)), ir.Constant(vec(INT32, WIDTH), [16] * WIDTH))
    return builder.bitcast(wide, vec(FLOAT, WIDTH))  # BF16: the top half of a float32


def _accumulate(builder, kind, src, xf, base, n_cols, R, toks):
    """The loop over columns for the tokens toks (i64 values): their WIDTH row sums."""
    vf = vec(FLOAT, WIDTH)
    sums = [cgutils.alloca_once_value(builder, ir.Constant(vf, [0.0] * WIDTH)) for _ in toks]
    with cgutils.for_range(builder, n_cols) as loop:
        col = loop.index
        w = _weights(builder, kind, src.data, builder.add(base, builder.mul(col, R)))
        for t, acc in zip(toks, sums):
            x = builder.load(builder.gep(xf.data, [builder.add(builder.mul(t, n_cols), col)]))
            product = builder.fmul(w, splat(builder, x, vf), flags=CONTRACT)
            builder.store(builder.fadd(builder.load(acc), product, flags=CONTRACT), acc)
    return [builder.load(acc) for acc in sums]


def rows_codegen(kind):
    """IR body: (src, xf, g, c, t0, n, out) -> out[t0 : t0 + n, g*R + WIDTH*c : +WIDTH], src
    the weight (w for F32, d for F16/BF16), 1 <= n <= TOKENS: one loop per n (a switch), so
    that each call does the work of its own tokens only."""

    def codegen(context, builder, sig, args):
        i64 = ir.IntType(64)
        src, xf, out = arrays(context, builder, sig, args, 0, 1, 6)
        g, c, t0, n = i64_args(builder, args[2:6])
        shape = cgutils.unpack_tuple(builder, src.shape, sig.args[0].ndim)
        n_cols, R = shape[1], shape[-1]
        out_cols = cgutils.unpack_tuple(builder, out.shape, 2)[1]
        first = builder.add(builder.mul(g, R), builder.mul(c, ir.Constant(i64, WIDTH)))
        base = builder.add(builder.mul(builder.mul(g, n_cols), R), builder.mul(c, ir.Constant(i64, WIDTH)))
        done = builder.append_basic_block("done")
        cases = [builder.append_basic_block(f"tokens{k}") for k in range(1, TOKENS + 1)]
        switch = builder.switch(n, cases[-1])
        for k, block in enumerate(cases, 1):
            switch.add_case(ir.Constant(i64, k), block)
            builder.position_at_end(block)
            toks = [builder.add(t0, ir.Constant(i64, i)) for i in range(k)]
            for t, total in zip(toks, _accumulate(builder, kind, src, xf, base, n_cols, R, toks)):
                at = builder.add(builder.mul(t, out_cols), first)
                builder.store(total, builder.bitcast(builder.gep(out.data, [at]), total.type.as_pointer()), align=4)
            builder.branch(done)
        builder.position_at_end(done)
        return context.get_dummy_value()

    return codegen


def _checked(src, xf, out) -> bool:
    # the pointer arithmetic above assumes C-contiguous operands of these shapes
    return (all(isinstance(a, types.Array) and a.layout == "C" for a in (src, xf, out))
            and xf.ndim == 2 and out.ndim == 2 and xf.dtype == out.dtype == types.float32)


def rows_intrinsic(kind):
    """A Numba intrinsic (src, xf, g, c, t0, n, out) for weight type kind (F32, F16 or BF16)."""
    want = (3, types.float32) if kind == T.F32 else (4, types.uint16)

    @intrinsic
    def rows(typingctx, src, xf, g, c, t0, n, out):
        if not (_checked(src, xf, out) and (src.ndim, src.dtype) == want):
            return None
        return types.void(src, xf, g, c, t0, n, out), rows_codegen(kind)

    return rows
