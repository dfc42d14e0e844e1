"""One query's attention over a deep f16 cache: attention_f16's bits, in a faster order.

`attention_f16` (attention.py) reproduces llama.cpp's non-flash decode bit for bit, but
walks the cache the way the arithmetic is written: one slot at a time, a horizontal
16-lane reduction per K dot, and a read-modify-write of a 64-float accumulator row per
V row. At depth that is latency- and load-bound, not arithmetic-bound. This kernel
computes the same numbers with the same operations on the same operands, only
scheduled differently, so every result is identical:

- K dots, 16 slots at a time (attention_deep_ir.py `_scores16`): each slot's four 16-lane
  FMA registers are formed exactly as in ggml_vec_dot_f16, folded (r0 + r2) + (r1 + r3),
  and then the 16 slots' lane trees (lanes i + i+8, i + i+4, then (0+2) + (1+3)) run side
  by side as four rounds of shuffles and vector adds instead of sixteen scalar
  reductions. Float addition is commutative: the same two operands give the same bits.
  A head size that is not a multiple of 64 (Phi-3's 96) adds the rest of each dot's
  products one at a time in float64 after the reduction, as ggml_vec_dot_f16 does, the
  block's 16 slots side by side (`_add_leftovers`).
- V accumulation, one accumulator row at a time (`_v_rows`): slot s adds into lane
  s % 16 of register (s % 64) // 16, i.e. into accumulator row s % 64, in increasing s.
  Each of the 64 rows is independent, so a row's slots r, r + 64, r + 128, ... are
  summed with the row held in registers and written once, in the same order as before.
- The softmax is attention_f16's, its exps 16 lanes at a time (`softmax_numerators_16`:
  ggml's v_expf on whole vectors, the same steps per lane), and a slot whose numerator
  is 0 (masked, or exp underflowed) is skipped in the V sum exactly as there.
- Work is shared out by KV head and slot chunk (K), by head (softmax) and by KV head and
  accumulator row (V); a GQA group's query heads use each K and V row, converted from
  f16 once, while it is in registers. At depth the rows are asked for ahead of use (the
  prefetch constants in attention_deep_ir.py), V's during the K phase: in a real decode
  step each layer's cache comes from DRAM.

The one exception to "same bits" would be a CPU without FMA, where the scalar exp's
fallback rounds twice: there the scalar softmax runs. The price of the new order is three
parallel regions instead of one, so `DEPTH_MIN_SLOTS` decides where it takes over.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from .attention import _fold_lanes, _reduce16_rows, dot_f16, dot_f16_4reg, softmax_numerators, visible
from .attention_deep_ir import (MAX_HEADS, V_AHEAD_SLOTS, _block_max, _scores_block, _v_block, prefetch_rows,
                                softmax_numerators_16)
from .config import EXACT_FLAGS
from .fp16 import f16_to_f32, round_f16
from .intrinsics import HAS_FMA

# Below this many cache slots the single-region attention_f16 is as fast; both give the
# same bits, so the switch is invisible except in time.
DEPTH_MIN_SLOTS = 512
SLOT_CHUNK = 512  # slots per K job: enough work to amortise a job, enough jobs to balance
# No fast-math here either (see attention_deep_ir.py)
EXACT_PARALLEL = dict(EXACT_FLAGS, parallel=True)


def fits(n_queries: int, n_slots: int, window: int, hd_k: int, hd_v: int) -> bool:
    """Whether attention_f16_deep takes this call: one query that sees at least
    DEPTH_MIN_SLOTS slots (a sliding window caps what it sees), head sizes in whole 16-element
    vectors (the layouts its IR is written for; Phi-3's 96 = 64 + 32 sums the last 32 of each
    K dot in float64, as ggml_vec_dot_f16 does).

    A sliding-window layer whose ring holds more than its window (gemma3's local layers:
    512 of ~1088 slots) takes it too: 16-slot blocks the query cannot see are not dotted,
    and V rows no head weighs are not read. Per local layer at depth, gemma3's geometry on
    an AVX-512 Zen 4, 40 layers' rings from memory: 78-81 us against attention_f16's 96-98
    (before the skipping, on an AVX2 EPYC: 290 against 169)."""
    seen = n_slots if window == 0 else min(n_slots, window)
    return n_queries == 1 and seen >= DEPTH_MIN_SLOTS and hd_k % 16 == 0 and hd_v % 16 == 0


@nb.njit(**EXACT_FLAGS)
def _any_visible(slot_pos, s0, qp, window):
    # whether any of the 16 slots from s0 is visible to the query
    for s in range(s0, s0 + 16):
        if visible(slot_pos[s], qp, window):
            return True
    return False


@nb.njit(**EXACT_FLAGS)
def _add_leftovers(qh, k_head, s0, full, scale, row, total):
    # ggml_vec_dot_f16's tail for slots s0 .. s0 + 15: row[s] holds the reduced sum of the
    # first `full` elements; the products of the rest (exact in float32: both factors are
    # f16 values) are added one at a time in float64, then the dot is scaled. Each slot's
    # sum keeps that order; the 16 slots' sums run side by side (vectorizable across slots)
    for j in range(16):
        total[j] = np.float64(row[s0 + j])
    for i in range(full, qh.shape[0]):
        qi = qh[i]
        for j in range(16):
            total[j] += np.float64(np.float32(qi * f16_to_f32(k_head[s0 + j, i])))
    for j in range(16):
        row[s0 + j] = np.float32(total[j]) * scale


@nb.njit(**EXACT_PARALLEL)
def _k_scores(q, qp, k_cache, v_cache, slot_pos, n_slots, window, scale, scores, maxima):
    # scores[h, s] = q[h] . k[s] * scale for visible slots (-inf for the rest) in whole
    # 16-slot blocks; maxima[h, c]: the largest score of chunk c (-inf if none). On the
    # way, the V rows V_AHEAD_SLOTS ahead are asked for (the V phase reads them out of order)
    n_heads, n_kv, hd = q.shape[0], k_cache.shape[0], q.shape[1]
    end, full = n_slots - n_slots % 16, hd - hd % 64
    group, n_chunks = n_heads // n_kv, (end + SLOT_CHUNK - 1) // SLOT_CHUNK
    for job in nb.prange(n_kv * n_chunks):
        g, c = job // n_chunks, job % n_chunks
        total = np.empty(16, np.float64)  # _add_leftovers' sums
        lo, hi = c * SLOT_CHUNK, min(end, (c + 1) * SLOT_CHUNK)
        for s0 in range(lo, hi, 16):
            if not _any_visible(slot_pos, s0, qp, window):  # masked whole below
                continue
            prefetch_rows(v_cache[g], s0 + V_AHEAD_SLOTS, 16)
            for h0 in range(g * group, (g + 1) * group, MAX_HEADS):
                n = min(MAX_HEADS, (g + 1) * group - h0)
                if full == hd:
                    _scores_block(q, h0, n, k_cache[g], s0, scale, scores)
                else:  # the 64-element chunks' sums unscaled (x * 1 is exact), then the rest
                    _scores_block(q, h0, n, k_cache[g], s0, np.float32(1.0), scores)
                    for h in range(h0, h0 + n):
                        _add_leftovers(q[h], k_cache[g], s0, full, scale, scores[h], total)
        for s in range(lo, hi):
            if not visible(slot_pos[s], qp, window):
                for h in range(g * group, (g + 1) * group):
                    scores[h, s] = -np.inf
        for h in range(g * group, (g + 1) * group):
            maxima[h, c] = _block_max(scores[h], lo, hi)


@nb.njit(**EXACT_PARALLEL)
def _softmax(scores, probs, n_heads, n_slots, maxima):
    # per head: numerators in place (attention_f16's softmax), probs = them normalised and
    # rounded to f16 (the weights of V)
    for h in nb.prange(n_heads):
        row, m = scores[h], -np.inf
        for c in range(maxima.shape[1]):
            m = max(m, maxima[h, c])
        denom = softmax_numerators_16(row, n_slots, m) if HAS_FMA else softmax_numerators(row, n_slots, m)
        inv = np.float32(1.0 / denom) if denom > 0 else np.float32(0.0)
        for s in range(n_slots):
            probs[h, s] = round_f16(row[s] * inv)


@nb.njit(**EXACT_PARALLEL)
def _v_sums(scores, probs, v_cache, n_heads, n_slots, lanes):
    # lanes[h, j, l] <- accumulator row 16 j + l of head h (see _v_rows)
    group = n_heads // v_cache.shape[0]
    for job in nb.prange(v_cache.shape[0] * 64):
        g, r = job // 64, job % 64
        for h0 in range(g * group, (g + 1) * group, MAX_HEADS):
            _v_block(scores, probs, h0, min(MAX_HEADS, (g + 1) * group - h0), v_cache[g], r, n_slots, lanes)


@nb.njit(**EXACT_FLAGS)  # calls the three parallel phases
def attention_f16_deep(q, q_pos, k_cache, v_cache, slot_pos, n_slots, window, scale, scores, probs, lanes, out):
    # attention_f16 for one query (q: f32[1, n_heads, hd_k], rounded to f16 in place) with
    # fits() true; same bits. scores, probs: f32[>= n_heads, >= n_slots] (scores is left
    # holding the softmax numerators, as attention_f16 leaves it); lanes: f32[>= n_heads,
    # 4, 16, hd_v] scratch; out: f32[1, n_heads, hd_v].
    n_heads, hd_k = q.shape[1], q.shape[2]
    group, qp = n_heads // k_cache.shape[0], q_pos[0]
    qh = q[0]
    for h in range(n_heads):
        for i in range(hd_k):
            qh[h, i] = round_f16(qh[h, i])
    end = n_slots - n_slots % 16
    n_chunks = (end + SLOT_CHUNK - 1) // SLOT_CHUNK
    maxima = np.full((n_heads, n_chunks + 1), -np.inf, np.float32)
    acc = np.empty(64, np.float32)  # dot_f16's scratch
    _k_scores(qh, qp, k_cache, v_cache, slot_pos, n_slots, window, scale, scores, maxima)
    for h in range(n_heads):  # the last partial block, one slot at a time
        m = -np.inf
        for s in range(end, n_slots):
            if visible(slot_pos[s], qp, window):
                if hd_k % 64:
                    scores[h, s] = dot_f16(qh[h], k_cache[h // group, s], acc, False) * scale
                else:
                    scores[h, s] = dot_f16_4reg(qh[h], k_cache[h // group, s]) * scale
                m = max(m, scores[h, s])
            else:
                scores[h, s] = -np.inf
        maxima[h, n_chunks] = m
    _softmax(scores, probs, n_heads, n_slots, maxima)
    _v_sums(scores, probs, v_cache, n_heads, n_slots, lanes)
    for h in range(n_heads):
        _fold_lanes(lanes[h], lanes.shape[3])
        _reduce16_rows(lanes[h, 0], out[0, h])
