"""The parallel drivers of the int8 dot-product kernels (dot_ir.py), for the instruction
set this CPU has: AVX512-VNNI (vnni.py), else AVX2 (avx2.py), or Arm's sdot (sdot.py).

What lives here: `ISA` (None on a CPU with neither; the portable kernels serve it),
`HAS_INT8DOT`, `TYPES`, and the drivers matvec_drivers.py calls: `matvec_chunks` (one token,
llama.cpp's bits), `matvec_chunks_rows` (several tokens, each with those bits) and
`gemm_chunks` (a long chunk); for the K-quants, `k_gemm_chunks`, `k_gemv_many` (one token
through several weights at once), `k4_sums` and
`q6_runs`, the integer sums dot_k.py takes from dot_k_ir.py (K_TYPES). Only this CPU's ISA is ever compiled:
the other's instructions do not exist for its LLVM target.
What does not: the IR (dot_ir.py), activation quantization (activations.py).
"""

from __future__ import annotations

import numba as nb
from gguf import GGMLQuantizationType as T

from .config import EXACT_FLAGS
from .dot_ir import TYPES as IR_TYPES, chunk_intrinsics, gemm_intrinsics, rows_intrinsics
from .dot_k_ir import k_intrinsics
from .gemm_k_ir import k_tile_intrinsics
from .gemm_low_ir import low_tile_intrinsics
from .avx2 import AVX2, HAS_AVX2
from .sdot import HAS_SDOT, SDOT
from .vnni import HAS_VNNI, VNNI

ISA = VNNI if HAS_VNNI else AVX2 if HAS_AVX2 else SDOT if HAS_SDOT else None
HAS_INT8DOT = ISA is not None
CHUNK = (ISA or VNNI).width  # rows per call; repacked groups are a multiple of it
TOKENS = (ISA or VNNI).gemm_tokens  # tokens per GEMM call
ROWS_TOKENS = (ISA or VNNI).rows_tokens  # separate tokens per exact multi-token call (1: per token)

# the 32-value block types these kernels serve: IR_TYPES on every kernel of dot_ir.py, and
# IQ4_NL repacked (rows a multiple of 8; in file layout llama.cpp sums it in vec_dot's and
# tinyBLAS's orders, dot_iq.py's) on its GEMM tiles alone: llama.cpp's iq4_nl_8x8 gemv and
# gemm share one order, acc = fma(f32(S_b), f32(d_w d_x), acc) block after block
TYPES = IR_TYPES + (T.IQ4_NL,)
_C = chunk_intrinsics(ISA or VNNI)
_c_q8_0, _c_q4_0, _c_q4_1, _c_q5_0, _c_q5_1 = (_C[k] for k in IR_TYPES)
_R = rows_intrinsics(ISA or VNNI, max(2, ROWS_TOKENS))
_r_q8_0, _r_q4_0, _r_q4_1, _r_q5_0, _r_q5_1 = (_R[k] for k in IR_TYPES)
_P = rows_intrinsics(ISA or VNNI, 2)
_p_q8_0, _p_q4_0, _p_q4_1, _p_q5_0, _p_q5_1 = (_P[k] for k in IR_TYPES)
_G = gemm_intrinsics(ISA or VNNI)
_g_q8_0, _g_q4_0, _g_q4_1, _g_q5_0, _g_q5_1 = (_G[k] for k in IR_TYPES)
_nl_tile = gemm_intrinsics(ISA or VNNI, (T.IQ4_NL,))[T.IQ4_NL]  # TOKENS tokens
_nl_one = gemm_intrinsics(ISA or VNNI, (T.IQ4_NL,), 1)[T.IQ4_NL]  # one token


_k4, _k5, _q6 = k_intrinsics(ISA or VNNI)
# the types on the whole-tile kernels (gemm_k_ir.py, gemm_low_ir.py: q8_K activations)
# (Q2_K repacked only: in file layout llama.cpp sums it in other orders, dot_k_low.py's)
K_TYPES = (T.Q4_K, T.Q5_K, T.Q6_K, T.Q3_K, T.IQ4_XS, T.Q2_K)
Q6_TOKENS = 4 if CHUNK == 16 else 2  # tokens per Q6_K tile: 16 sums + 4 codes fill the registers
_KT = k_tile_intrinsics(ISA or VNNI, Q6_TOKENS)
_q4k_gemm, _q5k_gemm, _q4k_gemv, _q5k_gemv, _q6k_tiled, _q6k_gemv = (
    _KT[k] for k in ("q4k_gemm", "q5k_gemm", "q4k_gemv", "q5k_gemv", "q6k_tiled", "q6k_gemv"))
# tokens per Q3_K / IQ4_XS tile (and per call of _tiled): one integer sum each beside the
# codes, so 4 on every ISA (on AVX2, 2 -> 4 tokens: a [8960 x 1536] Q3_K x 512 tokens 1.2-1.3x
# faster, measured paired on a Zen 3)
LOW_TOKENS = 4
_LT = low_tile_intrinsics(ISA or VNNI, LOW_TOKENS)
_q3k_gemv, _q3k_tiled, _iq4xs_gemv, _iq4xs_tiled, _q2k_gemv, _q2k_gemm = (
    _LT[k] for k in ("q3k_gemv", "q3k_tiled", "iq4xs_gemv", "iq4xs_tiled", "q2k_gemv", "q2k_gemm"))


@nb.njit(**EXACT_FLAGS)
def k4_sums(qs, qh, g, b, c, xq4, lo, hi):
    # dot_k.k4_chunk_sums on the ISA (xq4: the q8_K codes as i32[NSB, 64])
    if qh.shape[2] > 0:
        _k5(qs, qh, g, b, c, xq4, lo, hi)
    else:
        _k4(qs, qh, g, b, c, xq4, lo, hi)


@nb.njit(**EXACT_FLAGS)
def q6_runs(qs, qh, g, b, h, half, xq4, s):
    # dot_k.q6_quarter_sums on the ISA
    _q6(qs, qh, g, b, h, half, xq4, s)


@nb.njit(**dict(EXACT_FLAGS, parallel=True))  # no fast-math inside the IR
def nl_chunks(qs, qh, d, xq4, xsum, xd, out_pad):
    # out_pad f32[n_tok, G * R] = x @ W^T for a repacked IQ4_NL weight, every token in
    # llama.cpp's one order (see TYPES): TOKENS-token tiles, the rest one by one
    per_group = qs.shape[3] // CHUNK
    n_tok = xq4.shape[0]
    for job in nb.prange(qs.shape[0] * per_group):
        g, c = job // per_group, job % per_group
        t = 0
        while t + TOKENS <= n_tok:
            _nl_tile(qs, qh, d, xq4, xsum, xd, g, c, t, out_pad)
            t += TOKENS
        for t in range(t, n_tok):
            _nl_one(qs, qh, d, xq4, xsum, xd, g, c, t, out_pad)


@nb.njit(**dict(EXACT_FLAGS, parallel=True))  # no fast-math: it would reorder the IR's float steps
def matvec_chunks(kind, qs, qh, d, xq4, xsum, xd, out_pad):
    # every CHUNK-row chunk of every group, one token: out_pad f32[G * R] (R a multiple of CHUNK)
    if kind == T.IQ4_NL:
        nb_ = xq4.shape[0]
        nl_chunks(qs, qh, d, xq4.reshape(1, nb_, 8), xsum.reshape(1, nb_, 16), xd.reshape(1, nb_, 2),
                  out_pad.reshape(1, out_pad.size))
        return
    per_group = qs.shape[3] // CHUNK
    for g in nb.prange(qs.shape[0]):  # a group's chunks on one thread: its memory is one stream
        for c in range(per_group):
            if kind == T.Q8_0:
                _c_q8_0(qs, qh, d, xq4, xsum, xd, g, c, out_pad)
            elif kind == T.Q4_0:
                _c_q4_0(qs, qh, d, xq4, xsum, xd, g, c, out_pad)
            elif kind == T.Q4_1:
                _c_q4_1(qs, qh, d, xq4, xsum, xd, g, c, out_pad)
            elif kind == T.Q5_0:
                _c_q5_0(qs, qh, d, xq4, xsum, xd, g, c, out_pad)
            else:
                _c_q5_1(qs, qh, d, xq4, xsum, xd, g, c, out_pad)


@nb.njit(**dict(EXACT_FLAGS, parallel=True))  # no fast-math: it would reorder the IR's float steps
def matvec_chunks_rows(kind, qs, qh, d, xq4, xsum, xd, out_pad):
    # matvec_chunks for each of several tokens (xq4 i32[T, NB, 8], xsum, xd with the token
    # axis too; out_pad f32[T, G * R]), each token's products exactly matvec_chunks': a
    # chunk's weights come from memory once for all tokens, and where the ISA's registers
    # allow (ROWS_TOKENS > 1) its codes are built once per ROWS_TOKENS tokens, then per 2
    if kind == T.IQ4_NL:
        nl_chunks(qs, qh, d, xq4, xsum, xd, out_pad)
        return
    per_group = qs.shape[3] // CHUNK
    n_tok = xq4.shape[0]
    wide = ROWS_TOKENS if ROWS_TOKENS > 1 else n_tok + 1
    pair = 2 if ROWS_TOKENS > 1 else n_tok + 1
    for g in nb.prange(qs.shape[0]):
        for c in range(per_group):
            t = 0
            while t + wide <= n_tok:
                _rows_wide(kind, qs, qh, d, xq4, xsum, xd, g, c, t, out_pad)
                t += wide
            while t + pair <= n_tok:
                _rows_pair(kind, qs, qh, d, xq4, xsum, xd, g, c, t, out_pad)
                t += pair
            for t in range(t, n_tok):
                _row_one(kind, qs, qh, d, xq4[t], xsum[t], xd[t], g, c, out_pad[t])


@nb.njit(**EXACT_FLAGS)
def _rows_wide(kind, qs, qh, d, xq4, xsum, xd, g, c, t0, out_pad):
    if kind == T.Q8_0:
        _r_q8_0(qs, qh, d, xq4, xsum, xd, g, c, t0, out_pad)
    elif kind == T.Q4_0:
        _r_q4_0(qs, qh, d, xq4, xsum, xd, g, c, t0, out_pad)
    elif kind == T.Q4_1:
        _r_q4_1(qs, qh, d, xq4, xsum, xd, g, c, t0, out_pad)
    elif kind == T.Q5_0:
        _r_q5_0(qs, qh, d, xq4, xsum, xd, g, c, t0, out_pad)
    else:
        _r_q5_1(qs, qh, d, xq4, xsum, xd, g, c, t0, out_pad)


@nb.njit(**EXACT_FLAGS)
def _rows_pair(kind, qs, qh, d, xq4, xsum, xd, g, c, t0, out_pad):
    if kind == T.Q8_0:
        _p_q8_0(qs, qh, d, xq4, xsum, xd, g, c, t0, out_pad)
    elif kind == T.Q4_0:
        _p_q4_0(qs, qh, d, xq4, xsum, xd, g, c, t0, out_pad)
    elif kind == T.Q4_1:
        _p_q4_1(qs, qh, d, xq4, xsum, xd, g, c, t0, out_pad)
    elif kind == T.Q5_0:
        _p_q5_0(qs, qh, d, xq4, xsum, xd, g, c, t0, out_pad)
    else:
        _p_q5_1(qs, qh, d, xq4, xsum, xd, g, c, t0, out_pad)


@nb.njit(**EXACT_FLAGS)
def _row_one(kind, qs, qh, d, xq4, xsum, xd, g, c, out_pad):
    if kind == T.Q8_0:
        _c_q8_0(qs, qh, d, xq4, xsum, xd, g, c, out_pad)
    elif kind == T.Q4_0:
        _c_q4_0(qs, qh, d, xq4, xsum, xd, g, c, out_pad)
    elif kind == T.Q4_1:
        _c_q4_1(qs, qh, d, xq4, xsum, xd, g, c, out_pad)
    elif kind == T.Q5_0:
        _c_q5_0(qs, qh, d, xq4, xsum, xd, g, c, out_pad)
    else:
        _c_q5_1(qs, qh, d, xq4, xsum, xd, g, c, out_pad)


@nb.njit(**dict(EXACT_FLAGS, parallel=True))  # no fast-math inside the IR
def gemm_chunks(kind, qs, qh, d, xq4, xsum, xd, out_pad):
    # out_pad f32[n_tok, G * R] = x @ W^T for all CHUNK-row chunks; a chunk's token tiles on one thread
    if kind == T.IQ4_NL:  # llama.cpp's own order (exact)
        nl_chunks(qs, qh, d, xq4, xsum, xd, out_pad)
        return
    per_group = qs.shape[3] // CHUNK
    n_tok = xq4.shape[0]
    for job in nb.prange(qs.shape[0] * per_group):
        g, c = job // per_group, job % per_group
        for t0 in range(0, n_tok, TOKENS):
            if kind == T.Q8_0:
                _g_q8_0(qs, qh, d, xq4, xsum, xd, g, c, t0, out_pad)
            elif kind == T.Q4_0:
                _g_q4_0(qs, qh, d, xq4, xsum, xd, g, c, t0, out_pad)
            elif kind == T.Q4_1:
                _g_q4_1(qs, qh, d, xq4, xsum, xd, g, c, t0, out_pad)
            elif kind == T.Q5_0:
                _g_q5_0(qs, qh, d, xq4, xsum, xd, g, c, t0, out_pad)
            else:
                _g_q5_1(qs, qh, d, xq4, xsum, xd, g, c, t0, out_pad)


@nb.njit(**dict(EXACT_FLAGS, parallel=True))  # no fast-math inside the IR
def k_gemm_chunks(kind, qs, qh, sc, d, xq4, xsum, xd, batch, out_pad):
    # out_pad f32[n_tok, G * R] = x @ W^T for a K_TYPES weight (gemm_k_ir.py, gemm_low_ir.py).
    # batch: the tokens are one chunk, in the orders llama.cpp uses for it: Q4_K/Q5_K/Q2_K
    # whole groups of 4 tokens per-chunk (Q2_K: per-half) FMAs (its repacked gemm), the rest
    # per super-block (gemv);
    # Q6_K, Q3_K and IQ4_XS from 8 tokens tiled, else vec_dot's lanes. Not batch: every token
    # as a lone decode step (gemv).
    per_group = qs.shape[3] // CHUNK
    n_tok = xq4.shape[0]
    n_gemm = n_tok - n_tok % 4 if batch else 0
    for job in nb.prange(qs.shape[0] * per_group):
        g, c = job // per_group, job % per_group
        if kind == T.Q4_K or kind == T.Q5_K or kind == T.Q2_K:  # llama.cpp's repacked kernels
            for t0 in range(0, n_gemm, 4):
                _gemm4(kind, qs, qh, sc, d, xq4, xsum, xd, g, c, t0, out_pad)
            for t in range(n_gemm, n_tok):
                _gemv(kind, qs, qh, sc, d, xq4, xsum, xd, g, c, t, out_pad)
        elif batch and n_tok >= 8:
            for t0 in range(0, n_tok, LOW_TOKENS):
                _tiled(kind, qs, qh, sc, d, xq4, xsum, xd, g, c, t0, out_pad)
        else:
            for t in range(n_tok):
                _gemv(kind, qs, qh, sc, d, xq4, xsum, xd, g, c, t, out_pad)


@nb.njit(**EXACT_FLAGS)
def _gemm4(kind, qs, qh, sc, d, xq4, xsum, xd, g, c, t0, out_pad):
    # tokens t0..t0+3 through a chunk of a Q4_K, Q5_K or Q2_K weight: the repacked gemm's order
    if kind == T.Q4_K:
        _q4k_gemm(qs, qh, sc, d, xq4, xsum, xd, g, c, t0, out_pad)
    elif kind == T.Q5_K:
        _q5k_gemm(qs, qh, sc, d, xq4, xsum, xd, g, c, t0, out_pad)
    else:
        _q2k_gemm(qs, qh, sc, d, xq4, xsum, xd, g, c, t0, out_pad)


@nb.njit(**EXACT_FLAGS)
def _tiled(kind, qs, qh, sc, d, xq4, xsum, xd, g, c, t0, out_pad):
    # a tile of LOW_TOKENS tokens of a Q6_K, Q3_K or IQ4_XS weight, tiled order (Q6_K's in
    # tiles of Q6_TOKENS; tokens past the last are computed on it and not stored)
    if kind == T.Q6_K:
        for t in range(t0, t0 + LOW_TOKENS, Q6_TOKENS):
            _q6k_tiled(qs, qh, sc, d, xq4, xsum, xd, g, c, t, out_pad)
    elif kind == T.Q3_K:
        _q3k_tiled(qs, qh, sc, d, xq4, xsum, xd, g, c, t0, out_pad)
    else:
        _iq4xs_tiled(qs, qh, sc, d, xq4, xsum, xd, g, c, t0, out_pad)


@nb.njit(**EXACT_FLAGS)
def _gemv(kind, qs, qh, sc, d, xq4, xsum, xd, g, c, t, out_pad):
    # token t through a chunk of any K_TYPES weight, as a lone decode step
    if kind == T.Q4_K:
        _q4k_gemv(qs, qh, sc, d, xq4, xsum, xd, g, c, t, out_pad)
    elif kind == T.Q5_K:
        _q5k_gemv(qs, qh, sc, d, xq4, xsum, xd, g, c, t, out_pad)
    elif kind == T.Q6_K:
        _q6k_gemv(qs, qh, sc, d, xq4, xsum, xd, g, c, t, out_pad)
    elif kind == T.Q3_K:
        _q3k_gemv(qs, qh, sc, d, xq4, xsum, xd, g, c, t, out_pad)
    elif kind == T.Q2_K:
        _q2k_gemv(qs, qh, sc, d, xq4, xsum, xd, g, c, t, out_pad)
    else:
        _iq4xs_gemv(qs, qh, sc, d, xq4, xsum, xd, g, c, t, out_pad)


@nb.njit(**dict(EXACT_FLAGS, parallel=True))
def k_gemv_many(kinds, starts, qss, qhs, scs, ds, xq4, xsum, xd, outs):
    # one token through several K_TYPES weights of one row length (row_stack.KStack): member m
    # (type kinds[m], arrays qss[m].., row groups starts[m]..starts[m+1]-1 of the jobs) into
    # outs[m] f32[1, G_m * R], each row as k_gemm_chunks(batch=False) computes it; one
    # parallel region for all of them
    for job in nb.prange(starts[-1]):
        m = 0
        while job >= starts[m + 1]:
            m += 1
        _gemv(kinds[m], qss[m], qhs[m], scs[m], ds[m], xq4, xsum, xd, job - starts[m], 0, 0, outs[m])
