"""The LLVM IR pieces of the deep f16 attention kernel (attention_decode.py).

What lives here: the intrinsics that do its arithmetic in whole vectors, and the small
exact-flag functions that choose among their variants:

- `_scores16(n_heads, chunks)`: K dots of a GQA group's query heads with 16 slots, each
  K row converted from f16 once; the 16 slots' lane trees as four rounds of shuffles;
- `_v_rows(n_heads)`: the V sum of one accumulator row (slots r, r + 64, ...) for a
  group's heads, 64 columns of each held in registers;
- `prefetch_rows`: ask for a run of cache rows ahead of use;
- `_block_max`, `_exp_block` / `softmax_numerators_16`: the scores' maximum and the
  softmax numerators 16 lanes at a time (ggml's exp as v_expf_ir).

Every one keeps attention_f16's operations and operands (attention.py), so its bits.
No fast-math here: Numba puts its fast-math flags on every float instruction of a
function, an inlined intrinsic's IR included, and `reassoc` would let LLVM regroup the
very sums these exist to keep in llama.cpp's order. What does not live here: the
parallel phases and their scheduling (attention_decode.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numba as nb
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from .config import EXACT_FLAGS
from .ggml_math import v_expf_ir
from .irvec import (FLOAT, INT32, V16F, V16S, arrays, fma16, prefetch, halves_to_float, i64_args, lanes, reduce_add_ps, splat,
                    vec)


def _pairwise(builder, a, b, lo, hi):
    # a and b side by side (32 lanes), lanes lo[i] + hi[i] for each i: one round of
    # 16-lane trees of several slots at once
    mask = lambda idx: ir.Constant(ir.VectorType(INT32, 16), idx)  # noqa: E731
    return builder.fadd(builder.shuffle_vector(a, b, mask(hi)), builder.shuffle_vector(a, b, mask(lo)))


# The rounds of _mm512_reduce_add_ps for 16 slots' vectors at once. Round 1 pairs two
# slots: lanes i + i+8 of each -> 8 lanes per slot. Round 2 pairs two of those: within each
# slot's 8, lanes i + i+4 -> 4 per slot. Round 3: lanes 0+2 and 1+3 -> 2 per slot. Round 4:
# the two -> 1 per slot, slot k in lane k.
_ROUNDS = (
    ([*range(0, 8), *range(16, 24)], [*range(8, 16), *range(24, 32)]),
    ([i + 8 * g for g in range(4) for i in range(4)], [i + 4 + 8 * g for g in range(4) for i in range(4)]),
    ([i + 4 * g for g in range(8) for i in range(2)], [i + 2 + 4 * g for g in range(8) for i in range(2)]),
    (list(range(0, 32, 2)), list(range(1, 32, 2))),
)


# At depth a layer's K and V come from DRAM (the next token finds them evicted by the other
# layers), and the hardware prefetchers fall behind. K is read in order, faster than DRAM
# answers: rows K_PREFETCH_SLOTS ahead are asked for explicitly (K dots over 4096 slots
# from DRAM, SmolLM2: 198 -> 69 us per layer). An accumulator row's V rows lie 64 rows
# apart (8 KiB for head size 64), a stride the prefetchers do not follow across pages; a
# thread's next job is the next accumulator row, so each V row read asks for the one
# V_PREFETCH_ROWS after it (V sums from DRAM: ~110 -> ~85 us per layer). Even so, V's
# scattered first reads waited on DRAM on an AVX-512 Zen 4, so the K phase, which reads the
# cache in order, also asks for the V rows of the slots V_AHEAD_SLOTS ahead (`prefetch_rows`):
# the V phase then finds them in L2/L3 (SmolLM2 d4096, whole kernel from DRAM, paired runs:
# 12-20% less time per layer; gemma3's one KV head: no change).
K_PREFETCH_SLOTS = 64
V_PREFETCH_ROWS = 1
V_AHEAD_SLOTS = 64
MAX_HEADS = 4  # query heads of a GQA group that one call serves (registers: 4 x 4 accumulators)


def _load_vec(builder, data, at, vtype):
    return builder.load(builder.bitcast(builder.gep(data, [at]), vtype.as_pointer()), align=2)


def _slot_folds(builder, qa, ka, heads, base, hd, chunks):
    """For one K row (u16 elements from `base`), each head's four FMA registers folded
    (r0 + r2) + (r1 + r3): the vector whose lane tree is the dot. The row is converted
    from f16 once for every head. chunks: the number of 64-element chunks when known at
    compile time (straight-line code), else None (a loop over hd / 64)."""
    i64 = ir.IntType(64)
    accs = [[ir.Constant(V16F, None)] * 4 for _ in heads]

    def chunk(c0):
        ahead = builder.add(builder.add(base, builder.mul(hd, ir.Constant(i64, K_PREFETCH_SLOTS))), c0)
        for half in (0, 32):  # 64 halves: two cache lines
            prefetch(builder, builder.gep(ka.data, [builder.add(ahead, ir.Constant(i64, half))]))
        for j in range(4):
            at = builder.add(c0, ir.Constant(i64, 16 * j))
            k = halves_to_float(builder, _load_vec(builder, ka.data, builder.add(base, at), V16S))
            for g, h in enumerate(heads):
                qv = _load_vec(builder, qa.data, builder.add(builder.mul(h, hd), at), V16F)
                accs[g][j] = fma16(builder, qv, k, accs[g][j])

    if chunks is not None:
        for c in range(chunks):
            chunk(ir.Constant(i64, 64 * c))
    else:
        slots = [[cgutils.alloca_once_value(builder, v) for v in row] for row in accs]
        with cgutils.for_range(builder, builder.udiv(hd, ir.Constant(i64, 64))) as loop:
            accs = [[builder.load(a) for a in row] for row in slots]
            chunk(builder.mul(loop.index, ir.Constant(i64, 64)))
            for row, values in zip(slots, accs):
                for a, v in zip(row, values):
                    builder.store(v, a)
        accs = [[builder.load(a) for a in row] for row in slots]
    return [builder.fadd(builder.fadd(r[0], r[2]), builder.fadd(r[1], r[3])) for r in accs]


def _scores16(n_heads, chunks):
    """K dots of `n_heads` query heads (fixed here, 1..MAX_HEADS) with 16 slots, each K row
    converted from f16 once for all of them; chunks: hd / 64 if fixed here, else None."""

    @intrinsic
    def scores16(typingctx, q, h0, k_head, s0, scale, out):
        # out[h, s0 + i] = (q[h] . k_head[s0 + i]) * scale for h in h0 .. h0 + n_heads - 1
        # and i < 16, each dot as dot_f16_4reg forms it. q: f32[heads, hd] (f16 values);
        # k_head: u16[cap, hd] one KV head's cache; out: f32[rows, >= s0 + 16]; all
        # C-contiguous; hd a multiple of 64 (= 64 * chunks if chunks), s0 + 16 <= cap.
        def codegen(context, builder, sig, args):
            qa, ka, oa = arrays(context, builder, sig, args, 0, 2, 5)
            i64 = ir.IntType(64)
            head, first = i64_args(builder, [args[1], args[3]])
            hd = cgutils.unpack_tuple(builder, qa.shape, 2)[1]
            width = cgutils.unpack_tuple(builder, oa.shape, 2)[1]
            heads = [builder.add(head, ir.Constant(i64, g)) for g in range(n_heads)]
            # per head, a stack of (round, vector): two entries of one round combine at
            # once, so at most five vectors per head are live, not sixteen
            stacks = [[] for _ in range(n_heads)]
            for i in range(16):
                base = builder.mul(builder.add(first, ir.Constant(i64, i)), hd)
                for stack, folded in zip(stacks, _slot_folds(builder, qa, ka, heads, base, hd, chunks)):
                    stack.append((0, folded))
                    while len(stack) > 1 and stack[-1][0] == stack[-2][0]:
                        (level, b), (_, a) = stack.pop(), stack.pop()
                        lo, hi = _ROUNDS[level]
                        stack.append((level + 1, _pairwise(builder, a, b, lo, hi)))
            for (((_, sums),), h) in zip(stacks, heads):
                dst = builder.gep(oa.data, [builder.add(builder.mul(h, width), first)])
                builder.store(builder.fmul(sums, splat(builder, args[4])), builder.bitcast(dst, V16F.as_pointer()),
                              align=4)
            return context.get_dummy_value()

        return types.void(q, h0, k_head, s0, types.float32, out), codegen

    return scores16


@dataclass
class _VRow:
    """What the code of one V accumulator row works with: the arrays (numba array structs),
    the query heads' indices, the row, its slot count and the row widths (LLVM values)."""

    na: object
    pa: object
    va: object
    la: object
    heads: list
    row: object
    count: object
    hd: object
    n_width: object
    p_width: object


def _v_columns(builder, vr: _VRow, c0, n_vec: int) -> None:
    # columns c0 .. c0 + 16 n_vec - 1 of every head's accumulator row, held in registers over
    # the row's slots, then stored into lanes
    i64 = ir.IntType(64)
    accs = [[cgutils.alloca_once_value(builder, ir.Constant(V16F, None)) for _ in range(n_vec)]
            for _ in vr.heads]
    with cgutils.for_range(builder, vr.count) as loop:
        s = builder.add(vr.row, builder.mul(loop.index, ir.Constant(i64, 64)))
        _v_slot(builder, vr, s, c0, n_vec, accs)
    for g, h in enumerate(vr.heads):
        out = builder.add(builder.mul(builder.add(builder.mul(h, ir.Constant(i64, 64)), vr.row), vr.hd), c0)
        for j in range(n_vec):
            dst = builder.gep(vr.la.data, [builder.add(out, ir.Constant(i64, 16 * j))])
            builder.store(builder.load(accs[g][j]), builder.bitcast(dst, V16F.as_pointer()), align=4)


def _v_slot(builder, vr: _VRow, s, c0, n_vec: int, accs) -> None:
    # slot s's V columns, converted from f16 once, into each head's sums that keeps the slot
    i64 = ir.IntType(64)
    zero = ir.Constant(FLOAT, 0.0)
    keeps = [builder.fcmp_unordered("!=", builder.load(builder.gep(
        vr.na.data, [builder.add(builder.mul(h, vr.n_width), s)])), zero) for h in vr.heads]
    any_keep = keeps[0]
    for keep in keeps[1:]:
        any_keep = builder.or_(any_keep, keep)
    # a slot no head keeps (outside a sliding window, or underflowed) is not read: adding
    # nothing leaves the sums as they are
    with builder.if_then(any_keep, likely=True):
        base = builder.add(builder.mul(s, vr.hd), c0)
        ahead = builder.add(base, builder.mul(vr.hd, ir.Constant(i64, V_PREFETCH_ROWS)))
        for half in range(0, 16 * n_vec, 32):  # a cache line per 32 halves
            prefetch(builder, builder.gep(vr.va.data, [builder.add(ahead, ir.Constant(i64, half))]))
        v = [halves_to_float(builder, _load_vec(builder, vr.va.data, builder.add(base, ir.Constant(i64, 16 * j)),
                                                V16S))
             for j in range(n_vec)]
        for g, (h, keep) in enumerate(zip(vr.heads, keeps)):
            w = splat(builder, builder.load(builder.gep(vr.pa.data, [builder.add(builder.mul(h, vr.p_width), s)])))
            for j in range(n_vec):
                old = builder.load(accs[g][j])
                builder.store(builder.select(keep, fma16(builder, w, v[j], old), old), accs[g][j])


def _v_rows(n_heads):
    """V sums of `n_heads` query heads (fixed here, 1..MAX_HEADS) over one accumulator row,
    each V row converted from f16 once for all of them."""

    @intrinsic
    def v_rows(typingctx, numerators, probs, h0, v_head, r, n_slots, lanes):
        # for h in h0 .. h0 + n_heads - 1: lanes[h, r // 16, r % 16, :] = the sum over slots
        # s = r, r + 64, ... < n_slots with numerators[h, s] != 0, in that order, of
        # probs[h, s] * v_head[s] (one FMA per element, from 0): accumulator row r of
        # attention_f16's V sum. numerators, probs: f32[rows, width] (probs f16 values);
        # v_head: u16[cap, hd_v]; lanes: f32[heads, 4, 16, hd_v]; all C-contiguous, hd_v a
        # multiple of 16. 64 columns of every head's row at a time stay in registers, then
        # the last hd_v % 64 columns 16 at a time.
        def codegen(context, builder, sig, args):
            na, pa, va, la = arrays(context, builder, sig, args, 0, 1, 3, 6)
            i64 = ir.IntType(64)
            head, row, n = i64_args(builder, [args[2], args[4], args[5]])
            count = builder.udiv(builder.add(builder.sub(n, row), ir.Constant(i64, 63)), ir.Constant(i64, 64))
            vr = _VRow(na, pa, va, la, [builder.add(head, ir.Constant(i64, g)) for g in range(n_heads)], row,
                       builder.select(builder.icmp_signed(">", n, row), count, ir.Constant(i64, 0)),
                       cgutils.unpack_tuple(builder, va.shape, 2)[1], cgutils.unpack_tuple(builder, na.shape, 2)[1],
                       cgutils.unpack_tuple(builder, pa.shape, 2)[1])
            whole = builder.udiv(vr.hd, ir.Constant(i64, 64))
            with cgutils.for_range(builder, whole) as cols:  # 64 columns at a time
                _v_columns(builder, vr, builder.mul(cols.index, ir.Constant(i64, 64)), 4)
            tail = builder.udiv(builder.urem(vr.hd, ir.Constant(i64, 64)), ir.Constant(i64, 16))
            with cgutils.for_range(builder, tail) as cols:  # then 16 (Phi-3's 96: 64 + 2 x 16)
                _v_columns(builder, vr, builder.add(builder.mul(whole, ir.Constant(i64, 64)),
                                                    builder.mul(cols.index, ir.Constant(i64, 16))), 1)
            return context.get_dummy_value()

        return types.void(numerators, probs, h0, v_head, r, n_slots, lanes), codegen

    return v_rows


@intrinsic
def prefetch_rows(typingctx, head, s0, n):
    # ask for rows s0 .. s0 + n - 1 of head (u16[cap, hd], C-contiguous), every cache line
    # of them; rows past the end are harmless (a prefetch never faults)
    def codegen(context, builder, sig, args):
        (ha,) = arrays(context, builder, sig, args, 0)
        i64 = ir.IntType(64)
        first, count = i64_args(builder, [args[1], args[2]])
        hd = cgutils.unpack_tuple(builder, ha.shape, 2)[1]
        start = builder.mul(first, hd)
        n_halves = builder.mul(count, hd)
        line = ir.Constant(i64, 32)  # halves per 64-byte cache line
        n_lines = builder.udiv(builder.add(n_halves, ir.Constant(i64, 31)), line)
        with cgutils.for_range(builder, n_lines) as loop:
            prefetch(builder, builder.gep(ha.data, [builder.add(start, builder.mul(loop.index, line))]))
        return context.get_dummy_value()

    return types.void(head, s0, n), codegen


@intrinsic
def _block_max(typingctx, row, lo, hi):
    # the largest of row[lo:hi] (hi - lo a multiple of 16; -inf if empty), 16 lanes at a
    # time with llvm.maxnum: max is exact, so any order gives attention_f16's value
    def codegen(context, builder, sig, args):
        (ra,) = arrays(context, builder, sig, args, 0)
        i64 = ir.IntType(64)
        first, last = i64_args(builder, [args[1], args[2]])
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(V16F, [V16F, V16F]), "llvm.maxnum.v16f32")
        best = cgutils.alloca_once_value(builder, splat(builder, ir.Constant(FLOAT, float("-inf"))))
        count = builder.sdiv(builder.sub(last, first), ir.Constant(i64, 16))
        count = builder.select(builder.icmp_signed(">", count, ir.Constant(i64, 0)), count, ir.Constant(i64, 0))
        with cgutils.for_range(builder, count) as loop:
            at = builder.add(first, builder.mul(loop.index, ir.Constant(i64, 16)))
            builder.store(builder.call(fn, [builder.load(best), _load_vec(builder, ra.data, at, V16F)]), best)
        v = builder.load(best)
        for width in (8, 4, 2, 1):  # halves of v, maxed pairwise
            vt = vec(FLOAT, width)
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vt, [vt, vt]), f"llvm.maxnum.v{width}f32")
            v = builder.call(fn, [lanes(builder, v, 0, width), lanes(builder, v, width, width)])
        return builder.extract_element(v, ir.Constant(INT32, 0))

    return types.float32(row, lo, hi), codegen


@intrinsic
def _exp_block(typingctx, row, s0, m):
    # row[s0:s0 + 16] <- v_expf(row - m), 0 where row is -inf (masked); returns the 16
    # lanes' sum as softmax_numerators forms it: i + i+8, i + i+4, then (0+2) + (1+3)
    def codegen(context, builder, sig, args):
        (ra,) = arrays(context, builder, sig, args, 0)
        (first,) = i64_args(builder, [args[1]])
        m = args[2] if sig.args[2] == types.float32 else builder.fptrunc(args[2], FLOAT)
        ptr = builder.bitcast(builder.gep(ra.data, [first]), V16F.as_pointer())
        x = builder.load(ptr, align=4)
        live = builder.fcmp_unordered("!=", x, splat(builder, ir.Constant(FLOAT, float("-inf"))))
        e = v_expf_ir(builder, builder.fsub(x, splat(builder, m)))
        e = builder.select(live, e, ir.Constant(V16F, None))
        builder.store(e, ptr, align=4)
        return reduce_add_ps(builder, e)

    return types.float32(row, s0, m), codegen


@nb.njit(**EXACT_FLAGS)
def softmax_numerators_16(row, n, m):
    # softmax_numerators (attention.py) with its exps 16 lanes at a time: the same bits
    # where the CPU has FMA (v_expf_ir); a last partial block goes through a padded copy
    total = 0.0
    end = n - n % 16
    for base in range(0, end, 16):
        total += np.float64(_exp_block(row, base, m))
    if end < n:
        pad = np.full(16, -np.inf, np.float32)
        pad[: n - end] = row[end:n]
        total += np.float64(_exp_block(pad, 0, m))
        row[end:n] = pad[: n - end]
    return total


# head size 64 (straight-line code) and any other multiple of 64 (a loop over chunks)
_s64_1, _s64_2, _s64_3, _s64_4 = (_scores16(n, 1) for n in range(1, MAX_HEADS + 1))
_scores16_1, _scores16_2, _scores16_3, _scores16_4 = (_scores16(n, None) for n in range(1, MAX_HEADS + 1))
_v_rows_1, _v_rows_2, _v_rows_3, _v_rows_4 = (_v_rows(n) for n in range(1, MAX_HEADS + 1))


@nb.njit(**EXACT_FLAGS)
def _scores_block(q, h0, n, k_head, s0, scale, out):
    # K dots of query heads h0 .. h0 + n - 1 (n <= MAX_HEADS) with slots s0 .. s0 + 15
    if q.shape[1] == 64:
        if n == 4:
            _s64_4(q, h0, k_head, s0, scale, out)
        elif n == 3:
            _s64_3(q, h0, k_head, s0, scale, out)
        elif n == 2:
            _s64_2(q, h0, k_head, s0, scale, out)
        else:
            _s64_1(q, h0, k_head, s0, scale, out)
    elif n == 4:
        _scores16_4(q, h0, k_head, s0, scale, out)
    elif n == 3:
        _scores16_3(q, h0, k_head, s0, scale, out)
    elif n == 2:
        _scores16_2(q, h0, k_head, s0, scale, out)
    else:
        _scores16_1(q, h0, k_head, s0, scale, out)


@nb.njit(**EXACT_FLAGS)
def _v_block(numerators, probs, h0, n, v_head, r, n_slots, lanes):
    # accumulator row r of query heads h0 .. h0 + n - 1 (n <= MAX_HEADS)
    if n == 4:
        _v_rows_4(numerators, probs, h0, v_head, r, n_slots, lanes)
    elif n == 3:
        _v_rows_3(numerators, probs, h0, v_head, r, n_slots, lanes)
    elif n == 2:
        _v_rows_2(numerators, probs, h0, v_head, r, n_slots, lanes)
    else:
        _v_rows_1(numerators, probs, h0, v_head, r, n_slots, lanes)
