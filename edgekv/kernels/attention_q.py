"""Attention over a KV cache of any storage type (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0,
q5_1, iq4_nl, chosen separately for K and V).

Each visible slot's K row and V row are read as the kernel reaches them, so no
dequantized copy of the cache exists: Q8_0, Q4_0 and IQ4_NL rows block by block in place
(the block scale applied once per block; IQ4_NL's levels by a 16-byte table lookup,
pshufb on x86, tbl on Arm), other types dequantized into a head_dim-sized
scratch row. The arithmetic is float32 with ggml's softmax (same masks and exp as attention.py); unlike
the f16/f16 kernels in attention.py it makes no attempt to reproduce llama.cpp's
roundings bit for bit (llama.cpp itself quantizes Q and the softmax weights to the cache
types here, a different computation again). What does not live here: the f16/f16 exact
path (attention.py), the storage and its writes (kv/cache.py).
"""

from __future__ import annotations

import numba as nb
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic
from gguf import GGMLQuantizationType as T

from .attention import softmax_numerators, visible
from .config import JIT_FLAGS, PARALLEL_FLAGS
from .cpu_features import IS_AARCH64, host_has
from .dequant import dequant_row
from .irvec import FLOAT, V16F, V16I, arrays, fma16, lanes, splat
from .quantize import IQ4_NL_LEVELS

V16B = ir.VectorType(ir.IntType(8), 16)
# a 16-byte table lookup, one instruction: IQ4_NL's codes become their levels in place
_LOOKUP = ("llvm.aarch64.neon.tbl1.v16i8" if IS_AARCH64
           else "llvm.x86.ssse3.pshuf.b.128" if host_has("ssse3") else None)


def _levels(builder, nibbles):
    # <16 x i8> codes 0..15 -> their IQ4_NL levels as <16 x float>
    fn = builder.module.declare_intrinsic(_LOOKUP, fnty=ir.FunctionType(V16B, [V16B, V16B]))
    table = ir.Constant(V16B, [int(v) for v in IQ4_NL_LEVELS])
    return builder.sitofp(builder.call(fn, [table, nibbles]), V16F)


def _block_codes(builder, src, offset, ggml_type):
    """The 32 codes of a Q8_0 / Q4_0 / IQ4_NL block at byte offset (after its f16 scale) as
    two float vectors (values 0-15, 16-31): Q4_0's -8 applied, IQ4_NL's levels looked up."""
    i8 = ir.IntType(8)
    if ggml_type == T.Q8_0:
        raw = builder.load(builder.bitcast(builder.gep(src, [offset]), ir.VectorType(i8, 32).as_pointer()), align=1)
        wide = builder.sitofp(raw, ir.VectorType(FLOAT, 32))
        return lanes(builder, wide, 0, 16), lanes(builder, wide, 16, 16)
    raw = builder.load(builder.bitcast(builder.gep(src, [offset]), ir.VectorType(i8, 16).as_pointer()), align=1)
    if ggml_type == T.IQ4_NL:
        low = builder.and_(raw, ir.Constant(V16B, [15] * 16))
        return _levels(builder, low), _levels(builder, builder.lshr(raw, ir.Constant(V16B, [4] * 16)))
    wide = builder.zext(raw, V16I)
    eight = ir.Constant(V16I, [8] * 16)
    lo = builder.sub(builder.and_(wide, ir.Constant(V16I, [15] * 16)), eight)
    hi = builder.sub(builder.lshr(wide, ir.Constant(V16I, [4] * 16)), eight)
    return builder.sitofp(lo, V16F), builder.sitofp(hi, V16F)


def _block_scale(builder, src, offset):
    # the f16 scale at byte offset, as float32
    bits = builder.load(builder.bitcast(builder.gep(src, [offset]), ir.IntType(16).as_pointer()), align=1)
    return builder.fpext(builder.bitcast(bits, ir.HalfType()), FLOAT)


def _row_intrinsic(ggml_type, block_bytes):
    """(dot, add) for cache rows of ggml_type: dot(x f32[hd], src u8[hd / 32 * block_bytes])
    -> float32 x . row; add(acc f32[hd], w float32, src) does acc += w * row. src is one
    token's head in the cache (a C-contiguous slice of u8[n_kv, cap, row_bytes])."""

    @intrinsic
    def dot(typingctx, x, src):
        # x . (a Q8_0 / Q4_0 cache row read in place); float32, any summation order
        def codegen(context, builder, sig, args):
            xa, sa = arrays(context, builder, sig, args, 0, 1)
            i64 = ir.IntType(64)
            n_blocks = builder.udiv(cgutils.unpack_tuple(builder, xa.shape, 1)[0], ir.Constant(i64, 32))
            acc = cgutils.alloca_once_value(builder, ir.Constant(V16F, None))
            with cgutils.for_range(builder, n_blocks) as loop:
                o = builder.mul(loop.index, ir.Constant(i64, block_bytes))
                d = splat(builder, _block_scale(builder, sa.data, o))
                lo, hi = _block_codes(builder, sa.data, builder.add(o, ir.Constant(i64, 2)), ggml_type)
                at = builder.mul(loop.index, ir.Constant(i64, 32))
                for half, codes in ((0, lo), (16, hi)):
                    xp = builder.gep(xa.data, [builder.add(at, ir.Constant(i64, half))])
                    xv = builder.load(builder.bitcast(xp, V16F.as_pointer()), align=4)
                    builder.store(fma16(builder, builder.fmul(xv, d), codes, builder.load(acc)), acc)
            v, width = builder.load(acc), 16
            while width > 1:  # halving tree: log2(16) dependent adds, not 15
                width //= 2
                v = builder.fadd(lanes(builder, v, 0, width), lanes(builder, v, width, width))
            return builder.extract_element(v, ir.Constant(ir.IntType(32), 0))

        return types.float32(x, src), codegen

    @intrinsic
    def add(typingctx, acc, w, src):
        # acc += w * (the cache row, read in place)
        def codegen(context, builder, sig, args):
            aa, sa = arrays(context, builder, sig, args, 0, 2)
            i64 = ir.IntType(64)
            n_blocks = builder.udiv(cgutils.unpack_tuple(builder, aa.shape, 1)[0], ir.Constant(i64, 32))
            with cgutils.for_range(builder, n_blocks) as loop:
                o = builder.mul(loop.index, ir.Constant(i64, block_bytes))
                wd = splat(builder, builder.fmul(args[1], _block_scale(builder, sa.data, o)))
                lo, hi = _block_codes(builder, sa.data, builder.add(o, ir.Constant(i64, 2)), ggml_type)
                at = builder.mul(loop.index, ir.Constant(i64, 32))
                for half, codes in ((0, lo), (16, hi)):
                    ap = builder.bitcast(builder.gep(aa.data, [builder.add(at, ir.Constant(i64, half))]),
                                         V16F.as_pointer())
                    builder.store(fma16(builder, wd, codes, builder.load(ap, align=4)), ap, align=4)
            return context.get_dummy_value()

        return types.void(acc, types.float32, src), codegen

    return dot, add


_dot_q8_0, _add_q8_0 = _row_intrinsic(T.Q8_0, 34)  # block bytes: f16 scale + 32 codes
_dot_q4_0, _add_q4_0 = _row_intrinsic(T.Q4_0, 18)  # f16 scale + 16 bytes of nibbles
IQ4_NL_IN_PLACE = _LOOKUP is not None  # else IQ4_NL rows go through the scratch row
_dot_iq4_nl, _add_iq4_nl = _row_intrinsic(T.IQ4_NL, 18)  # Q4_0's layout, levels for codes


@nb.njit(**dict(JIT_FLAGS, inline="always"))  # inlined: per-slot calls cost more than the work
def dot_row(src, ggml_type, x, scratch):
    # x . (cache row src dequantized); Q8_0 and Q4_0 are read in place (LLVM IR above),
    # other types go through scratch: f32[len(x)]
    if ggml_type == T.Q8_0:
        return _dot_q8_0(x, src)
    if ggml_type == T.Q4_0:
        return _dot_q4_0(x, src)
    if IQ4_NL_IN_PLACE and ggml_type == T.IQ4_NL:
        return _dot_iq4_nl(x, src)
    dequant_row(src, ggml_type, scratch)
    total = np.float32(0.0)
    for i in range(x.shape[0]):
        total += x[i] * scratch[i]
    return total


@nb.njit(**dict(JIT_FLAGS, inline="always"))
def add_row(src, ggml_type, w, acc, scratch):
    # acc += w * (cache row src dequantized), Q8_0 and Q4_0 in place (see dot_row)
    if ggml_type == T.Q8_0:
        _add_q8_0(acc, np.float32(w), src)
    elif ggml_type == T.Q4_0:
        _add_q4_0(acc, np.float32(w), src)
    elif IQ4_NL_IN_PLACE and ggml_type == T.IQ4_NL:
        _add_iq4_nl(acc, np.float32(w), src)
    else:
        dequant_row(src, ggml_type, scratch)
        for i in range(acc.shape[0]):
            acc[i] += w * scratch[i]


@nb.njit(**dict(JIT_FLAGS, inline="always"))
def _dot_f32(x, y):
    total = np.float32(0.0)
    for i in range(x.shape[0]):
        total += x[i] * y[i]
    return total


@nb.njit(**PARALLEL_FLAGS)
def attention_rows(q, q_pos, k_cache, v_cache, type_k, type_v, slot_pos, n_slots, window, scale,
                   scores, rows, out, sink_k):
    # q: f32[n, n_heads, hd_k]; k_cache: u8[n_kv, cap, row_bytes_k]; v_cache: u8[n_kv, cap, row_bytes_v]
    # type_k/type_v: ggml type ids; scores: f32[>= n * n_heads, >= n_slots]
    # rows: f32[threads, 2, max(hd_k, hd_v)] scratch; out: f32[n, n_heads, hd_v]
    # sink_k: f32[n_kv, n_sinks, hd_k], the K of positions < n_sinks read instead of their rows
    # (a calibrated K type's sinks, cache.SINKS; n_sinks = 0 for the others)
    n, n_heads, hd_k = q.shape
    hd_v = out.shape[2]
    group = n_heads // k_cache.shape[0]
    for job in nb.prange(n * n_heads):
        t, h = job // n_heads, job % n_heads
        kvh, qp = h // group, q_pos[t]
        k_row, v_row = rows[nb.get_thread_id(), 0, :hd_k], rows[nb.get_thread_id(), 1, :hd_v]
        row = scores[job]
        m = -np.inf
        for s in range(n_slots):
            if not visible(slot_pos[s], qp, window):
                row[s] = -np.inf
                continue
            if slot_pos[s] < sink_k.shape[1]:
                row[s] = _dot_f32(q[t, h], sink_k[kvh, slot_pos[s]]) * scale
            else:
                row[s] = dot_row(k_cache[kvh, s], type_k, q[t, h], k_row) * scale
            m = max(m, row[s])
        denom = softmax_numerators(row, n_slots, m)
        inv = np.float32(1.0 / denom) if denom > 0 else np.float32(0.0)
        acc = out[t, h]
        acc[:] = 0.0
        for s in range(n_slots):
            if row[s] != 0.0:
                add_row(v_cache[kvh, s], type_v, row[s] * inv, acc, v_row)


@nb.njit(**PARALLEL_FLAGS)
def dequant_rows(src, ggml_type, dst):
    # src: u8[n_rows, row_bytes] cache rows -> dst: f32[n_rows, head_dim]
    for i in nb.prange(src.shape[0]):
        dequant_row(src[i], ggml_type, dst[i])
