"""Attention over the KV cache: GQA, causal and sliding-window masks, online softmax.

K and V are stored as IEEE half bit patterns (uint16) because Numba has no float16
type; a 65,536-entry table turns them back into float32. Scores and the weighted sum
accumulate in float32 with a running max (online softmax), so no score matrix is
materialised. Slots are visited in storage order: positions are already baked into K by
RoPE, so only the masks read `slot_pos`.
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

from .config import PARALLEL_FLAGS

F16_TO_F32 = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)


@nb.njit(**PARALLEL_FLAGS)
def attention_f16(q, q_pos, k_cache, v_cache, slot_pos, n_slots, window, scale, lut, out):
    # q: f32[n, n_heads, hd_k]; q_pos: i32[n]
    # k_cache: u16[n_kv, cap, hd_k]; v_cache: u16[n_kv, cap, hd_v]; slot_pos: i32[cap] (-1 = empty)
    # out: f32[n, n_heads, hd_v]; a slot is visible to query t if 0 <= pos <= q_pos[t]
    # and (window == 0 or q_pos[t] - pos < window)
    n, n_heads, hd_k = q.shape
    hd_v = v_cache.shape[2]
    group = n_heads // k_cache.shape[0]
    for job in nb.prange(n * n_heads):
        t = job // n_heads
        h = job % n_heads
        kvh = h // group
        qp = q_pos[t]
        m = -np.inf
        denom = np.float32(0.0)
        acc = out[t, h]  # accumulate in place: no allocation per query
        acc[:] = 0.0
        for s in range(n_slots):
            p = slot_pos[s]
            if p < 0 or p > qp or (window > 0 and qp - p >= window):
                continue
            dot = np.float32(0.0)
            for i in range(hd_k):
                dot += q[t, h, i] * lut[k_cache[kvh, s, i]]
            dot *= scale
            if dot > m:
                corr = math.exp(m - dot) if m != -np.inf else np.float32(0.0)
                denom *= corr
                for i in range(hd_v):
                    acc[i] *= corr
                m = dot
            w = math.exp(dot - m)
            denom += w
            for i in range(hd_v):
                acc[i] += w * lut[v_cache[kvh, s, i]]
        inv = np.float32(1.0) / denom if denom > 0 else np.float32(0.0)
        for i in range(hd_v):
            acc[i] *= inv


def attention_chunk_blas(q, q_pos, k_cache, v_cache, slot_pos, n_slots, window, scale, out):
    """Prefill attention for a chunk of queries through BLAS matrix products.

    Same contract as `attention_f16`. For many queries the score matrix per KV head
    ([n * group, n_slots] floats) is small enough to materialise, and two GEMMs beat a
    per-query loop by an order of magnitude.
    """
    n, n_heads, hd_k = q.shape
    n_kv = k_cache.shape[0]
    group = n_heads // n_kv
    pos = slot_pos[:n_slots]
    visible = (pos[None, :] >= 0) & (pos[None, :] <= q_pos[:, None])  # [n, n_slots]
    if window > 0:
        visible &= (q_pos[:, None] - pos[None, :]) < window
    bias = np.where(visible, np.float32(0.0), np.float32(-np.inf))[:, None, :]  # [n, 1, n_slots]
    for g in range(n_kv):
        kf = F16_TO_F32[k_cache[g, :n_slots]]  # [n_slots, hd_k]
        vf = F16_TO_F32[v_cache[g, :n_slots]]  # [n_slots, hd_v]
        qg = q[:, g * group : (g + 1) * group, :].reshape(n * group, hd_k)
        scores = (qg @ kf.T).reshape(n, group, n_slots) * np.float32(scale) + bias
        scores -= scores.max(axis=2, keepdims=True)
        np.exp(scores, out=scores)
        scores /= scores.sum(axis=2, keepdims=True)
        out[:, g * group : (g + 1) * group, :] = (scores.reshape(n * group, n_slots) @ vf).reshape(n, group, -1)
