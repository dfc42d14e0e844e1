"""Attention over a KV cache of any storage type (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0,
q5_1, chosen separately for K and V).

Each visible slot's K row and V row are read as the kernel reaches them, so no
dequantized copy of the cache exists: Q8_0 and Q4_0 rows block by block in place (the
block scale applied once per block), other types dequantized into a head_dim-sized
scratch row. The
arithmetic is float32 with ggml's softmax (same masks and exp as attention.py); unlike
the f16/f16 kernels in attention.py it makes no attempt to reproduce llama.cpp's
roundings bit for bit (llama.cpp itself quantizes Q and the softmax weights to the cache
types here, a different computation again). What does not live here: the f16/f16 exact
path (attention.py), the storage and its writes (cache.py).
"""

from __future__ import annotations

import numba as nb
import numpy as np

from .attention import softmax_numerators, visible
from .config import JIT_FLAGS, PARALLEL_FLAGS
from .dequant import dequant_row, half_at

F32 = np.float32
I32 = np.int32


@nb.njit(**JIT_FLAGS)
def dot_row(src, ggml_type, x, scratch):
    # x . (cache row src dequantized); Q8_0 and Q4_0 are read in place, block by block,
    # other types go through scratch: f32[len(x)]
    n = x.shape[0]
    total = np.float32(0.0)
    if ggml_type == 8 or ggml_type == 2:
        bs = 34 if ggml_type == 8 else 18
        for b in range(n // 32):
            o, part = bs * b, np.float32(0.0)
            if ggml_type == 8:
                for j in range(32):
                    part += x[32 * b + j] * F32(np.int8(src[o + 2 + j]))
            else:
                for j in range(16):
                    c = I32(src[o + 2 + j])
                    part += x[32 * b + j] * F32(I32(c & 15) - 8) + x[32 * b + 16 + j] * F32(I32(c >> 4) - 8)
            total += part * half_at(src, o)
        return total
    dequant_row(src, ggml_type, scratch)
    for i in range(n):
        total += x[i] * scratch[i]
    return total


@nb.njit(**JIT_FLAGS)
def add_row(src, ggml_type, w, acc, scratch):
    # acc += w * (cache row src dequantized), Q8_0 and Q4_0 in place (see dot_row)
    n = acc.shape[0]
    if ggml_type == 8 or ggml_type == 2:
        bs = 34 if ggml_type == 8 else 18
        for b in range(n // 32):
            o = bs * b
            wd = w * half_at(src, o)
            if ggml_type == 8:
                for j in range(32):
                    acc[32 * b + j] += wd * F32(np.int8(src[o + 2 + j]))
            else:
                for j in range(16):
                    c = I32(src[o + 2 + j])
                    acc[32 * b + j] += wd * F32(I32(c & 15) - 8)
                    acc[32 * b + 16 + j] += wd * F32(I32(c >> 4) - 8)
        return
    dequant_row(src, ggml_type, scratch)
    for i in range(n):
        acc[i] += w * scratch[i]


@nb.njit(**PARALLEL_FLAGS)
def attention_rows(q, q_pos, k_cache, v_cache, type_k, type_v, slot_pos, n_slots, window, scale,
                   scores, rows, out):
    # q: f32[n, n_heads, hd_k]; k_cache: u8[n_kv, cap, row_bytes_k]; v_cache: u8[n_kv, cap, row_bytes_v]
    # type_k/type_v: ggml type ids; scores: f32[>= n * n_heads, >= n_slots]
    # rows: f32[threads, 2, max(hd_k, hd_v)] scratch; out: f32[n, n_heads, hd_v]
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
