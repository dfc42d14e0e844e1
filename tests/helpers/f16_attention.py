"""The float64 reference for the CPU's attention kernels over an f16 cache (test_ops.py,
test_attention_decode.py), and how close an f16 kernel must come to it.

    reference_attention(q, q_pos, k, v, slot_pos, window, scale)
        q [n, heads, hd] at positions q_pos over the K/V rings [n_kv, cap, hd] whose slots hold
        positions slot_pos (-1: empty); grouped-query heads, causal, an optional sliding window
    F16_ATTENTION_ATOL
        the tolerance for outputs of size ~1 when q and the weights are rounded to f16
"""

from __future__ import annotations

import numpy as np

F16_ATTENTION_ATOL = 5e-3  # |out| ~ 1: f16 rounding of q (2^-11 relative) and of the weights


def reference_attention(q, q_pos, k, v, slot_pos, window, scale):
    n, heads, _ = q.shape
    group = heads // k.shape[0]
    out = np.zeros((n, heads, v.shape[2]))
    for t in range(n):
        vis = (slot_pos >= 0) & (slot_pos <= q_pos[t])
        if window:
            vis &= q_pos[t] - slot_pos < window
        for h in range(heads):
            s = k[h // group, vis].astype(np.float64) @ q[t, h] * scale
            p = np.exp(s - s.max())
            out[t, h] = p @ v[h // group, vis] / p.sum()
    return out
