"""Attention over the KV cache: GQA, causal and sliding-window masks.

K and V are stored as IEEE half bit patterns (uint16) because Numba has no float16
type; a 65,536-entry table turns them back into float32. `attention_f16` reproduces
llama.cpp's CPU attention (no flash attention) bit for bit, because these small models
are sensitive enough that its roundings decide greedy tokens: Q is rounded to f16
before the Q·K dot (ggml converts it to K's type), each dot product sums in the lane
order of the code llama.cpp runs (ggml_vec_dot_f16 for one token, llamafile's tinyBLAS
for a chunk), the softmax uses ggml's vector exp and its 16-lane sums, and the
normalised probabilities are rounded to f16 before they weight V. Long prefill chunks
use `attention_chunk_blas` instead: the same roundings, BLAS summation order (last-bit
differences), ten times faster. Slots are visited in storage order: positions are baked
into K by RoPE, so only the masks read `slot_pos`.
"""

from __future__ import annotations


import numba as nb
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from .config import EXACT_FLAGS, PARALLEL_FLAGS
from .fp16 import all_halves, f16_to_f32, round_f16
from .intrinsics import fma
from .irvec import V16F, V16S, arrays, fma16, halves_to_float, reduce_add_ps
from .ggml_math import v_expf

F16_TO_F32 = all_halves()


@nb.njit(**EXACT_FLAGS)
def softmax_numerators(row, n, m):
    # row[:n] <- exp(row - m) (0 where -inf); returns their sum as ggml_vec_soft_max_f32
    # does on AVX-512: groups of 16 lanes, each reduced in float32 by a halving tree
    # (lanes i + i+8, then i + i+4, then (0+2)+(1+3)), the group sums added in float64
    total = 0.0
    lanes = np.empty(16, np.float32)
    for base in range(0, n, 16):
        for i in range(16):
            s = base + i
            if s < n and row[s] != -np.inf:
                row[s] = v_expf(row[s] - m)
                lanes[i] = row[s]
            else:
                if s < n:
                    row[s] = 0.0
                lanes[i] = 0.0
        for i in range(8):
            lanes[i] = lanes[i] + lanes[i + 8]
        for i in range(4):
            lanes[i] = lanes[i] + lanes[i + 4]
        total += np.float64(np.float32(lanes[0] + lanes[2]) + np.float32(lanes[1] + lanes[3]))
    return total


@nb.njit(**EXACT_FLAGS)
def visible(p, qp, window):
    # a slot holding position p is visible to a query at position qp: live, not in the
    # future, and inside the sliding window when there is one
    return p >= 0 and p <= qp and (window == 0 or qp - p < window)


@nb.njit(**EXACT_FLAGS)
def _reduce16(v):
    # _mm512_reduce_add_ps of v[0:16]: lanes i + i+8, then i + i+4, then (0+2) + (1+3)
    a0, a1 = np.float32(v[8] + v[0]), np.float32(v[9] + v[1])
    a2, a3 = np.float32(v[10] + v[2]), np.float32(v[11] + v[3])
    a4, a5 = np.float32(v[12] + v[4]), np.float32(v[13] + v[5])
    a6, a7 = np.float32(v[14] + v[6]), np.float32(v[15] + v[7])
    a0, a1, a2, a3 = np.float32(a4 + a0), np.float32(a5 + a1), np.float32(a6 + a2), np.float32(a7 + a3)
    return np.float32(np.float32(a0 + a2) + np.float32(a1 + a3))


@nb.njit(**EXACT_FLAGS)
def _fold_lanes(lanes, m, n_regs=4):
    # GGML_F32x16_REDUCE of 4 accumulators lanes[4, 16, >= m] -> lanes[0, :, :m] summed over
    # registers as (0+2) + (1+3); the caller reduces the 16 lanes with _reduce16 or
    # _reduce16_rows. n_regs < 4: registers n_regs.. were never written (left +0, never
    # read): the same sums without adding their zeros, which changes no bit (an
    # FMA-accumulated sum starting at +0 is never -0, and x + +0 == x for every other x, inf
    # and NaN included). lanes C-contiguous: whole rows, so the loops over e vectorize.
    for l in range(16):
        r0, r1, r2, r3 = lanes[0, l], lanes[1, l], lanes[2, l], lanes[3, l]
        if n_regs == 4:
            for e in range(m):
                r0[e] = np.float32(np.float32(r0[e] + r2[e]) + np.float32(r1[e] + r3[e]))
        elif n_regs == 3:
            for e in range(m):
                r0[e] = np.float32(np.float32(r0[e] + r2[e]) + r1[e])
        elif n_regs == 2:
            for e in range(m):
                r0[e] = np.float32(r0[e] + r1[e])


@nb.njit(**EXACT_FLAGS)
def _reduce16_rows(rows, out):
    # out[e] = _reduce16(rows[:, e]) for e < out.size, the same adds with e innermost
    # (rows: f32[16, >= out.size] C-contiguous, overwritten)
    m = out.shape[0]
    for i in range(8):
        a, b = rows[i], rows[i + 8]
        for e in range(m):
            a[e] = np.float32(b[e] + a[e])
    for i in range(4):
        a, b = rows[i], rows[i + 4]
        for e in range(m):
            a[e] = np.float32(b[e] + a[e])
    r0, r1, r2, r3 = rows[0], rows[1], rows[2], rows[3]
    for e in range(m):
        out[e] = np.float32(np.float32(r0[e] + r2[e]) + np.float32(r1[e] + r3[e]))


@nb.njit(**EXACT_FLAGS)
def _register(i, one_register):
    # which 16-lane register element i of a dot product accumulates in: ggml_vec_dot_f16
    # (one query: llama.cpp's decode) cycles through 4 registers every 64 elements;
    # llamafile's tinyBLAS (a chunk of 2 or more queries) keeps a single register
    return 0 if one_register else (i % 64) // 16


@nb.njit(**EXACT_FLAGS)
def dot_f16(q, k_row, acc, one_register):
    # q: f32[hd] (f16 values), k_row: u16[hd]; acc: f32[64] scratch. Two orders:
    # - one_register (a query of a chunk, llamafile's tinyBLAS; hd a multiple of 16):
    #   element i FMA-accumulates in lane i % 16 of one register, then the lanes are reduced.
    # - else ggml_vec_dot_f16 (a lone decode step): the first hd - hd % 64 elements in four
    #   registers (element 64c + 16j + l in lane l of register j), folded (0+2) + (1+3) and
    #   reduced to a float32, then the leftover elements' products (exact in float32: both
    #   are f16) added one at a time in float64 (Phi-3's head of 96: 64 + 32).
    # Whole runs of 16 (64) elements go through a contiguous loop, which LLVM vectorizes.
    acc[:] = 0.0
    hd = q.shape[0]
    if one_register:  # constant trip counts: LLVM unrolls them into whole SIMD registers
        for c in range(0, hd, 16):
            for i in range(16):
                acc[i] = fma(q[c + i], f16_to_f32(k_row[c + i]), acc[i])
        return _reduce16(acc)
    full = hd - hd % 64
    for c in range(0, full, 64):
        for i in range(64):
            acc[i] = fma(q[c + i], f16_to_f32(k_row[c + i]), acc[i])
    for l in range(16):
        acc[l] = np.float32(np.float32(acc[l] + acc[32 + l]) + np.float32(acc[16 + l] + acc[48 + l]))
    total = np.float64(_reduce16(acc))
    for i in range(full, hd):
        total += np.float64(np.float32(q[i] * f16_to_f32(k_row[i])))
    return np.float32(total)


@intrinsic
def _dot_f16_4reg(typingctx, q, k_row):
    # ggml_vec_dot_f16 as one query's decode runs it, for hd a multiple of 64, written in
    # LLVM IR so the four 16-lane accumulators stay in registers. Operands: q f32[hd] (values
    # already rounded to f16), k_row u16[hd] (one cached key's f16 bits), both contiguous
    # (a row of attention_f16's q[t, h] and k_cache[kvh, s]). Element 64c + 16j + l
    # FMA-accumulates in lane l of register j; then (r0 + r2) + (r1 + r3) and
    # _mm512_reduce_add_ps's tree (lanes i + i+8, i + i+4, then (0+2) + (1+3)).
    def codegen(context, builder, sig, args):
        qa, ka = arrays(context, builder, sig, args, 0, 1)
        i64 = ir.IntType(64)
        n_chunks = builder.udiv(cgutils.unpack_tuple(builder, qa.shape, 1)[0], ir.Constant(i64, 64))
        accs = [cgutils.alloca_once_value(builder, ir.Constant(V16F, None)) for _ in range(4)]
        with cgutils.for_range(builder, n_chunks) as loop:
            for j in range(4):
                at = builder.add(builder.mul(loop.index, ir.Constant(i64, 64)), ir.Constant(i64, 16 * j))
                qv = builder.load(builder.bitcast(builder.gep(qa.data, [at]), V16F.as_pointer()), align=4)
                kh = builder.load(builder.bitcast(builder.gep(ka.data, [at]), V16S.as_pointer()), align=2)
                builder.store(fma16(builder, qv, halves_to_float(builder, kh), builder.load(accs[j])), accs[j])
        r = [builder.load(a) for a in accs]
        v = builder.fadd(builder.fadd(r[0], r[2]), builder.fadd(r[1], r[3]))
        return reduce_add_ps(builder, v)

    return types.float32(q, k_row), codegen


@nb.njit(**EXACT_FLAGS)  # its own function: a fast-math caller must not reorder the sums
def dot_f16_4reg(q, k_row):
    return _dot_f16_4reg(q, k_row)


@nb.njit(**PARALLEL_FLAGS)
def attention_f16(q, q_pos, k_cache, v_cache, slot_pos, n_slots, window, scale, scores, pv, out, one_token=False):
    # q: f32[n, n_heads, hd_k] (rounded to f16 in place); q_pos: i32[n]
    # k_cache: u16[n_kv, cap, hd_k]; v_cache: u16[n_kv, cap, hd_v]; slot_pos: i32[cap] (-1 = empty)
    # scores: f32[>= n * n_heads, >= n_slots]; pv: f32[threads, 4, 16, >= max(hd_v, 64)] scratch
    # out: f32[n, n_heads, hd_v]. Slot s is visible to query t if 0 <= pos <= q_pos[t]
    # and (window == 0 or q_pos[t] - pos < window). Arithmetic as llama.cpp's (module doc);
    # one_token: every query in a lone decode step's order (drafted tokens verified in one pass)
    n, n_heads, hd_k = q.shape
    chunk_order = n > 1 and not one_token
    group = n_heads // k_cache.shape[0]
    for job in nb.prange(n * n_heads):
        t, h = job // n_heads, job % n_heads
        attend_head(q[t, h], q_pos[t], k_cache[h // group], v_cache[h // group], slot_pos, n_slots, window, scale,
                    scores[job], pv[nb.get_thread_id()], out[t, h], chunk_order)


@nb.njit(**EXACT_FLAGS)
def attend_head(q, qp, k_rows, v_rows, slot_pos, n_slots, window, scale, row, lanes, out, one_register):
    # one query head at position qp over one KV head's ring (k_rows u16[cap, hd_k], v_rows
    # u16[cap, hd_v]) -> out f32[hd_v]; q f32[hd_k] is rounded to f16 in place; row: its
    # score row, lanes: f32[4, 16, >= max(hd_v, 64)] scratch. one_register: the query is one
    # of a chunk's (llamafile's tinyBLAS order), else a lone decode step (ggml_vec_dot_f16's):
    # slot s of the weighted sum of V goes to lane s % 16 of register _register(s).
    hd_k, hd_v = q.shape[0], v_rows.shape[1]
    fast_dot = not one_register and hd_k % 64 == 0
    tiny_blas = one_register and hd_k % 16 == 0  # tinyBLAS refuses other sizes: ggml_vec_dot_f16 then
    dot_acc = lanes[0, 0, 0:64]  # free until the V sum starts
    for i in range(hd_k):
        q[i] = round_f16(q[i])
    m = -np.inf
    for s in range(n_slots):
        if not visible(slot_pos[s], qp, window):
            row[s] = -np.inf
            continue
        if fast_dot:
            row[s] = dot_f16_4reg(q, k_rows[s]) * scale
        else:
            row[s] = dot_f16(q, k_rows[s], dot_acc, tiny_blas) * scale
        m = max(m, row[s])
    denom = softmax_numerators(row, n_slots, m)
    inv = np.float32(1.0 / denom) if denom > 0 else np.float32(0.0)
    n_regs = 1 if one_register else min(4, (n_slots + 15) // 16)  # the registers slots reach
    for j in range(n_regs):
        for l in range(16):
            lanes[j, l, :hd_v] = 0.0
    for s in range(n_slots):
        if row[s] != 0.0:
            w = round_f16(row[s] * inv)
            j, l = _register(s, one_register), s % 16
            acc, v_row = lanes[j, l], v_rows[s]
            for e in range(hd_v):
                acc[e] = fma(w, f16_to_f32(v_row[e]), acc[e])
    _fold_lanes(lanes, hd_v, n_regs)
    _reduce16_rows(lanes[0], out)


@nb.njit(**PARALLEL_FLAGS)
def round_f16_inplace(x):
    # x: f32[n, m] <- nearest f16 values (ggml converts Q to K's type before the dot)
    for i in nb.prange(x.shape[0]):
        for j in range(x.shape[1]):
            x[i, j] = round_f16(x[i, j])


@nb.njit(**PARALLEL_FLAGS)
def masked_softmax(scores, group, q_pos, slot_pos, window, scale, round_probs):
    # scores: f32[n * group, n_slots] raw Q.K (row r is query r // group) -> softmax
    # probabilities with the same masks and arithmetic as attention_f16; round_probs:
    # round them to f16, as llama.cpp does before they weight an f16 V
    n_rows, n_slots = scores.shape
    for r in nb.prange(n_rows):
        qp = q_pos[r // group]
        row = scores[r]
        m = -np.inf
        for s in range(n_slots):
            if not visible(slot_pos[s], qp, window):
                row[s] = -np.inf
            else:
                row[s] = row[s] * scale
                m = max(m, row[s])
        denom = softmax_numerators(row, n_slots, m)
        inv = np.float32(1.0 / denom) if denom > 0 else np.float32(0.0)
        for s in range(n_slots):
            row[s] = round_f16(row[s] * inv) if round_probs else row[s] * inv


def attention_chunk_blas(q, q_pos, kf, vf, slot_pos, n_slots, window, scale, out, f16_cache, mass=None):
    """Prefill attention for a chunk of queries: the two products through BLAS.

    kf: f32[n_kv, n_slots, hd_k] and vf: f32[n_kv, n_slots, hd_v], the visible range of
    the cache as float32 (made per layer and chunk by the caller). With f16_cache the
    roundings of `attention_f16` apply (q is rounded to f16 in place). For many queries
    the score matrix per KV head ([n * group, n_slots] floats) is small enough to
    materialise, and two GEMMs beat a per-query loop by an order of magnitude. mass:
    f32[n_kv, >= n_slots] or None, where each slot's softmax weights are added up per KV head.
    """
    n, n_heads, hd_k = q.shape
    n_kv = kf.shape[0]
    group = n_heads // n_kv
    if f16_cache:
        round_f16_inplace(q.reshape(n, n_heads * hd_k))
    for g in range(n_kv):
        qg = q[:, g * group : (g + 1) * group, :].reshape(n * group, hd_k)
        scores = qg @ kf[g].T  # [n * group, n_slots]
        masked_softmax(scores, group, q_pos, slot_pos, window, np.float32(scale), f16_cache)
        if mass is not None:
            mass[g, :n_slots] += scores.sum(axis=0)
        out[:, g * group : (g + 1) * group, :] = (scores @ vf[g]).reshape(n, group, -1)
