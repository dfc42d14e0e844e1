"""Building blocks for the kernels written in LLVM IR (dot_ir.py, vnni.py, sdot.py,
attention.py, attention_q.py): vector types and the few operations every one of them needs.
The 16-lane types fill one AVX-512 register; the helpers take vectors of any width
(an 8-lane vector is two NEON registers).

What lives here: plain functions of an llvmlite IRBuilder, used inside Numba
`@intrinsic` code generators. What does not: any kernel.
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils

INT32, FLOAT, INT16 = ir.IntType(32), ir.FloatType(), ir.IntType(16)
V16I, V16F = ir.VectorType(INT32, 16), ir.VectorType(FLOAT, 16)
V16S, V16H = ir.VectorType(INT16, 16), ir.VectorType(ir.HalfType(), 16)


def vec(element, width):
    """The vector type of `width` lanes of `element` (an llvmlite type)."""
    return ir.VectorType(element, width)


def splat(builder, value, vtype=V16F):
    """A vector of type vtype with every lane = value."""
    undef = ir.Constant(vtype, ir.Undefined)
    one = builder.insert_element(undef, value, ir.Constant(INT32, 0))
    return builder.shuffle_vector(one, undef, ir.Constant(ir.VectorType(INT32, vtype.count), [0] * vtype.count))


def sign_trick(builder, codes, x4):
    """(u, s) for an unsigned x signed byte dot product of signed codes (<W x i32>, bytes in
    -127..127) with the 4 bytes of the i32 x4 (any int8): u = |x| (0..128, unsigned; splat)
    and s = the codes with x's sign (-127..127), so that u * s = code * x byte by byte.
    (ggml's AVX2 trick puts the codes' sign on x instead, which needs x > -128: true of q8
    activations, but this way nothing about x is assumed.)"""
    n = codes.type.count
    vb = vec(ir.IntType(8), 4 * n)
    x = builder.bitcast(splat(builder, x4, vec(INT32, n)), vb)
    c = builder.bitcast(codes, vb)
    negative = builder.icmp_signed("<", x, ir.Constant(vb, [0] * vb.count))
    s = builder.select(negative, builder.sub(ir.Constant(vb, [0] * vb.count), c), c)
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vb, [vb, ir.IntType(1)]), f"llvm.abs.v{vb.count}i8")
    u = builder.call(fn, [x, ir.Constant(ir.IntType(1), 0)])
    return builder.bitcast(u, codes.type), builder.bitcast(s, codes.type)


def load16(builder, data, index, vtype):
    """The 16-lane vector of type vtype at element `index` of pointer data (unaligned)."""
    ptr = builder.gep(data, [index])
    return builder.load(builder.bitcast(ptr, vtype.as_pointer()), align=2)


def fma16(builder, a, b, c):
    """a * b + c per lane, rounded once (float32 vectors of any width; 16 on AVX-512)."""
    t = a.type
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(t, [t, t, t]), f"llvm.fma.v{t.count}f32")
    return builder.call(fn, [a, b, c])


def halves_to_float(builder, bits):
    """IEEE halves (as i16 lanes, any width) -> float32 lanes, exactly."""
    n = bits.type.count
    return builder.fpext(builder.bitcast(bits, vec(ir.HalfType(), n)), vec(FLOAT, n))


def concat(builder, parts):
    """The vectors `parts` (of one type) side by side, as one vector."""
    while len(parts) > 1:
        n = parts[0].type.count
        mask = ir.Constant(ir.VectorType(INT32, 2 * n), list(range(2 * n)))
        parts = [builder.shuffle_vector(parts[i], parts[i + 1], mask) for i in range(0, len(parts), 2)]
    return parts[0]


def lanes(builder, vec, first, n):
    """Lanes first .. first + n - 1 of vec, as an n-lane vector."""
    undef = ir.Constant(vec.type, ir.Undefined)
    return builder.shuffle_vector(vec, undef, ir.Constant(ir.VectorType(INT32, n), list(range(first, first + n))))


def reduce_add_ps(builder, v):
    """The 16 float32 lanes of v summed as _mm512_reduce_add_ps sums them (ggml's 16-lane
    sums): lanes i + i+8, then i + i+4, then (0 + 2) + (1 + 3); a float32 scalar."""
    v8 = builder.fadd(lanes(builder, v, 8, 8), lanes(builder, v, 0, 8))
    v4 = builder.fadd(lanes(builder, v8, 4, 4), lanes(builder, v8, 0, 4))
    e = [builder.extract_element(v4, ir.Constant(INT32, i)) for i in range(4)]
    return builder.fadd(builder.fadd(e[0], e[2]), builder.fadd(e[1], e[3]))


def load_at(builder, data, row, width, col):
    """data[row * width + col] for an element pointer `data` and i64 `row`; width: an int,
    col: an int or an i64 value."""
    i64 = ir.IntType(64)
    col = col if isinstance(col, ir.Value) else ir.Constant(i64, col)
    return builder.load(builder.gep(data, [builder.add(builder.mul(row, ir.Constant(i64, width)), col)]))


def i64_args(builder, args):
    """Integer arguments of an intrinsic's call, widened to i64 where Numba passed narrower ones."""
    i64 = ir.IntType(64)
    return [builder.sext(a, i64) if a.type != i64 else a for a in args]


def arrays(context, builder, sig, args, *which):
    """The array arguments at positions `which` of an intrinsic's call, as Numba's array
    structs (`.data`: element pointer, `.shape`: i64 tuple)."""
    return [context.make_array(sig.args[i])(context, builder, args[i]) for i in which]


def prefetch(builder, ptr, locality=3):
    """A hint to fetch the cache line at ptr (never faults, even past the end): into every
    cache level (locality 3), or not the nearest ones (2: L2 and out, 0: non-temporal)."""
    i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
                                        "llvm.prefetch.p0")
    builder.call(fn, [builder.bitcast(ptr, i8p), ir.Constant(i32, 0), ir.Constant(i32, locality), ir.Constant(i32, 1)])
