"""Each native/ kernel as NumPy arithmetic, for the emulated driver (tests/cuda_emulator.py),
which calls KERNELS[name](launch, *args) for a launch of ek_<name>. Each twin checks, through
launch.need, the grid and block its kernel's indexing needs (the comment atop each .cu file),
reads and writes device memory by address (mem) and computes in float64. Its arithmetic is
gguf.quants', float64 NumPy and, for the IQ4_NL cache rows gguf.quants cannot write,
tests/numpy_reference.py's: independent of the code under test.
"""

from __future__ import annotations

import ctypes

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants as gq

from numpy_reference import quantize_iq4_nl

Q8_1 = np.dtype([("d", "<f2"), ("s", "<f2"), ("qs", "i1", 32)])
KV_BLOCK_TYPES = (T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.IQ4_NL)


def mem(ptr: int, count: int, dtype=np.float32) -> np.ndarray:
    dtype = np.dtype(dtype)
    return np.ctypeslib.as_array((ctypes.c_uint8 * (count * dtype.itemsize)).from_address(ptr)).view(dtype)


def dequantize(raw: np.ndarray, ggml_type: int, n: int) -> np.ndarray:
    return gq.dequantize(raw, T(ggml_type)).reshape(-1, n).astype(np.float64)


# -- the kernels, as NumPy ----------------------------------------------------------------------

def get_rows(L, w, ggml_type, row_bytes, ids, out, n_cols):
    n_tok = L.grid[1]
    L.need(L.grid[0] * L.block[0] >= n_cols and L.block[0] == 32, "one block of 32 per 32 columns")
    rows = [mem(w + int(i) * row_bytes, row_bytes, np.uint8) for i in mem(ids, n_tok, np.int32)]
    mem(out, n_tok * n_cols)[:] = dequantize(np.concatenate(rows), ggml_type, n_cols).reshape(-1)


def quantize_q8_1(L, x, y, n_blocks):
    L.need(L.grid[0] * L.block[0] // 32 >= n_blocks, "a warp per block of 32")
    v = mem(x, n_blocks * 32).reshape(-1, 32).astype(np.float32)
    d = np.abs(v).max(axis=1) / np.float32(127)
    q = np.where(d[:, None] > 0, np.rint(v / np.where(d > 0, d, 1)[:, None]), 0)
    blocks = mem(y, n_blocks, Q8_1)
    blocks["qs"] = q.astype(np.int8)
    blocks["d"] = d.astype(np.float16)
    blocks["s"] = (d * q.sum(axis=1)).astype(np.float16)


def matvec(L, w, x, out, n_rows, n_cols, row_bytes, n_tok=None):
    """ek_matvec_* (grid.y: a token each) and ek_matmul_* (n_tok: 8 tokens a warp)."""
    ggml_type = T[L.name[len("ek_matvec_"):].upper()]
    if n_tok is None:
        n_tok = L.grid[1]
    else:
        L.need(L.grid[1] == -(-n_tok // 8) and n_tok > 1, "8 tokens a warp (a single token is a matvec)")
    L.need(L.block[:2] == (32, 4) and L.grid[0] * 4 >= n_rows, "a warp per row, 4 rows per block")
    weights = dequantize(mem(w, n_rows * row_bytes, np.uint8), ggml_type, n_cols)
    if ggml_type in (T.F32, T.F16, T.BF16):
        acts = mem(x, n_tok * n_cols).reshape(n_tok, n_cols).astype(np.float64)
    else:
        blocks = mem(x, n_tok * n_cols // 32, Q8_1)
        acts = (blocks["d"].astype(np.float64)[:, None] * blocks["qs"]).reshape(n_tok, n_cols)
    mem(out, n_tok * n_rows)[:] = (acts @ weights.T).reshape(-1)


def _norm(v, w, eps):
    return v / np.sqrt((v * v).mean(axis=1, keepdims=True) + eps) * w


def _rows_block(L, dim):
    L.need(L.block[0] % 32 == 0 and L.block[0] <= 1024, "a whole number of warps per row")


def rms_norm(L, x, w, out, dim, eps):
    _rows_block(L, dim)
    n = L.grid[0]
    mem(out, n * dim)[:] = _norm(mem(x, n * dim).reshape(n, dim).astype(np.float64), mem(w, dim), eps).reshape(-1)


def add_rms_norm(L, x, y, w, out, dim, eps):
    _rows_block(L, dim)
    n = L.grid[0]
    xs = mem(x, n * dim)
    xs += mem(y, n * dim)
    mem(out, n * dim)[:] = _norm(xs.reshape(n, dim).astype(np.float64), mem(w, dim), eps).reshape(-1)


def rms_norm_heads(L, x, w, head_dim, eps):
    _rows_block(L, head_dim)
    n = L.grid[0]
    xs = mem(x, n * head_dim)
    xs[:] = _norm(xs.reshape(n, head_dim).astype(np.float64), mem(w, head_dim), eps).reshape(-1)


def rope(L, x, cos, sin, n_heads, head_dim, half, mode):
    n_tok = L.grid[2]
    L.need(L.grid[0] * L.block[0] >= half and L.grid[1] == n_heads, "a thread per pair, grid.y the heads")
    v = mem(x, n_tok * n_heads * head_dim).reshape(n_tok, n_heads, head_dim)
    c = mem(cos, n_tok * half).reshape(n_tok, 1, half)
    s = mem(sin, n_tok * half).reshape(n_tok, 1, half)
    i = np.arange(half)
    a, b = (i, i + half) if mode == 2 else (2 * i, 2 * i + 1)
    x0, x1 = v[:, :, a].copy(), v[:, :, b].copy()
    v[:, :, a] = x0 * c - x1 * s
    v[:, :, b] = x0 * s + x1 * c


def _elementwise(L, n):
    L.need(L.grid[0] >= 1 and L.block[0] % 32 == 0, "grid-stride threads")


def silu_mul(L, gate, up, n):
    _elementwise(L, n)
    g = mem(gate, n)
    g[:] = g / (1 + np.exp(-g.astype(np.float64))) * mem(up, n)


def gelu_mul(L, gate, up, n):
    _elementwise(L, n)
    g = mem(gate, n).astype(np.float64)
    mem(gate, n)[:] = 0.5 * g * (1 + np.tanh(0.7978845608028654 * g * (1 + 0.044715 * g * g))) * mem(up, n)


def add(L, x, y, n):
    _elementwise(L, n)
    mem(x, n)[:] += mem(y, n)


def scale(L, x, s, n):
    _elementwise(L, n)
    mem(x, n)[:] *= np.float32(s)


def softcap(L, x, cap, n):
    _elementwise(L, n)
    v = mem(x, n)
    v[:] = cap * np.tanh(v.astype(np.float64) / cap)


def softmax_rows(L, x, n):
    _rows_block(L, n)
    v = mem(x, L.grid[0] * n).reshape(-1, n)
    e = np.exp(v.astype(np.float64) - v.max(axis=1, keepdims=True))
    v[:] = e / e.sum(axis=1, keepdims=True)


def add_bias(L, x, b, d, n):
    _elementwise(L, n)
    mem(x, n).reshape(-1, d)[:] += mem(b, d)


def rotate(L, x, h, r):
    L.need(L.block[0] == r, "a block of r threads per run")
    runs = L.grid[0]
    v = mem(x, runs * r).reshape(runs, r)
    v[:] = v.astype(np.float64) @ mem(h, r * r).reshape(r, r)


def kv_rows(x: np.ndarray, ggml_type: int) -> np.ndarray:
    """Cache rows [..., hd] in ggml_type, as bytes."""
    if ggml_type == T.IQ4_NL:
        return quantize_iq4_nl(x.reshape(-1, x.shape[-1]).astype(np.float32))
    return gq.quantize(x, T(ggml_type)).view(np.uint8)


def kv_write(L, src, slots, ring, ggml_type, limit, n_tok, n_kv, hd, cap, row_bytes):
    per_row = hd // 32 if ggml_type in KV_BLOCK_TYPES else hd
    L.need(L.grid[0] * L.block[0] >= n_tok * n_kv * per_row, "a thread per block (or value)")
    x = np.clip(mem(src, n_tok * n_kv * hd).reshape(n_tok, n_kv, hd), -limit, limit)
    rows = mem(ring, n_kv * cap * row_bytes, np.uint8).reshape(n_kv, cap, row_bytes)
    for t, slot in enumerate(mem(slots, n_tok, np.int32)):
        rows[:, slot] = kv_rows(x[t], ggml_type).reshape(n_kv, row_bytes)


def _scores(L, q, q_pos, k, v, slot_pos, n_slots, window, scale_, type_k, type_v, n_heads, n_kv, hd_k, hd_v,
            cap, row_bytes_k, row_bytes_v, sink, n_sinks, n_tok=None):
    """Per query token: which of the *n_slots written slots it sees, and each head's scores
    and values over them, in float64 (the ring read as the kernels read it). n_tok: the
    grid's second dimension unless given (a kernel whose grid is by slot)."""
    if n_tok is None:
        n_tok = L.grid[1]
        L.need(L.grid[0] == n_heads and L.block[0] == 32, "a warp per (head, token)")
    queries = mem(q, n_tok * n_heads * hd_k).reshape(n_tok, n_heads, hd_k).astype(np.float64)
    n_slots = int(mem(n_slots, 1, np.int32)[0])
    pos = mem(slot_pos, cap, np.int32)[:n_slots]
    keys = dequantize(mem(k, n_kv * cap * row_bytes_k, np.uint8).reshape(n_kv, cap, -1)[:, :n_slots].reshape(-1),
                      type_k, hd_k).reshape(n_kv, n_slots, hd_k)
    values = dequantize(mem(v, n_kv * cap * row_bytes_v, np.uint8).reshape(n_kv, cap, -1)[:, :n_slots].reshape(-1),
                        type_v, hd_v).reshape(n_kv, n_slots, hd_v)
    if n_sinks:  # a calibrated K type: the slots of positions < n_sinks read their f32 rows
        sinks = mem(sink, n_kv * n_sinks * hd_k).reshape(n_kv, n_sinks, hd_k)
        at = np.flatnonzero((pos >= 0) & (pos < n_sinks))
        keys[:, at] = sinks[:, pos[at]]
    group = n_heads // n_kv
    for t, qp in enumerate(mem(q_pos, n_tok, np.int32)):
        visible = (pos >= 0) & (pos <= qp) & ((window == 0) | (qp - pos < window))
        yield t, visible, [(keys[h // group] @ queries[t, h] * scale_, values[h // group]) for h in range(n_heads)]


def attention(L, *args):
    out, n_heads, hd_v = args[-1], args[10], args[13]
    result = mem(out, L.grid[1] * n_heads * hd_v).reshape(L.grid[1], n_heads, hd_v)
    for t, visible, heads in _scores(L, *args[:-1]):
        for h, (scores, values) in enumerate(heads):
            masked = np.where(visible, scores, -np.inf)
            p = np.exp(masked - masked.max())
            result[t, h] = p @ values / p.sum()


NO_SCORE = np.float32(-3.402823466e38)  # EK_NO_SCORE: a range that saw no slot has l = 0


def attention_split(L, *args):
    chunk, parts, n_heads, hd_v, cap = args[-2], args[-1], args[10], args[13], args[14]
    n_tok, n_splits = L.grid[1], L.grid[2]
    L.need(n_splits * chunk >= cap, "the ranges cover the ring")
    records = mem(parts, n_tok * n_heads * n_splits * (2 + hd_v)).reshape(n_tok, n_heads, n_splits, 2 + hd_v)
    for t, visible, heads in _scores(L, *args[:-2]):
        for h, (scores, values) in enumerate(heads):
            for z in range(n_splits):
                seen = np.zeros_like(visible)
                seen[z * chunk:(z + 1) * chunk] = visible[z * chunk:(z + 1) * chunk]
                if not seen.any():
                    records[t, h, z] = [NO_SCORE, 0] + [0] * hd_v
                    continue
                m = scores[seen].max()
                p = np.exp(np.where(seen, scores, -np.inf) - m)
                records[t, h, z, 0], records[t, h, z, 1], records[t, h, z, 2:] = m, p.sum(), p @ values


def key_map(L, x, mean, scale_, n, n_kv, group, hd, queries):
    L.need(L.grid[0] * L.block[0] >= min(n, 1), "threads over the values (grid-stride)")
    values = mem(x, n).reshape(-1, n_kv, group, hd)
    m, s = mem(mean, n_kv * hd).reshape(n_kv, 1, hd), mem(scale_, n_kv * hd).reshape(n_kv, 1, hd)
    values[...] = values / s if queries else (values - m) * s


def keep_sinks(L, k, positions, sink, n, n_kv, hd, n_sinks):
    n_tok = n // (n_kv * hd)
    keys, sinks = mem(k, n).reshape(n_tok, n_kv, hd), mem(sink, n_kv * n_sinks * hd).reshape(n_kv, n_sinks, hd)
    for t, p in enumerate(mem(positions, n_tok, np.int32)):
        if 0 <= p < n_sinks:
            sinks[:, p] = keys[t]


def attention_stats(L, *args):
    stats, n_heads = args[-1], args[10]
    result = mem(stats, L.grid[1] * n_heads * 2).reshape(L.grid[1], n_heads, 2)
    for t, visible, heads in _scores(L, *args[:-1]):
        for h, (scores, _) in enumerate(heads):
            if not visible.any():
                result[t, h] = [NO_SCORE, 0]
                continue
            m = scores[visible].max()
            result[t, h] = [m, np.exp(scores[visible] - m).sum()]


def attention_tally(L, *args):
    *ring, stats, mass, n_tok = args
    n_heads, n_kv, cap = ring[10], ring[11], ring[14]
    L.need(L.grid[1] == n_kv and L.block[0] % 32 == 0 and L.grid[0] * (L.block[0] // 32) >= cap,
           "a warp per (slot, KV head)")
    ml = mem(stats, n_tok * n_heads * 2).reshape(n_tok, n_heads, 2).astype(np.float64)
    tallies = mem(mass, n_kv * cap).reshape(n_kv, cap)
    group = n_heads // n_kv
    for t, visible, heads in _scores(L, *ring, n_tok=n_tok):
        for h, (scores, _) in enumerate(heads):
            if ml[t, h, 1] > 0:
                n = visible.size
                tallies[h // group, :n] += np.where(visible, np.exp(scores - ml[t, h, 0]) / ml[t, h, 1], 0)


def attention_merge(L, parts, n_splits, n_heads, hd_v, out):
    n_tok = L.grid[1]
    L.need(L.grid[0] == n_heads and L.block[0] == 32, "a warp per (head, token)")
    records = mem(parts, n_tok * n_heads * n_splits * (2 + hd_v)).reshape(n_tok, n_heads, n_splits, 2 + hd_v)
    m, l, acc = records[..., 0].astype(np.float64), records[..., 1:2], records[..., 2:]
    weight = np.where(l[..., 0] > 0, np.exp(m - np.where(l[..., 0] > 0, m, -np.inf).max(axis=2, keepdims=True)), 0)
    result = mem(out, n_tok * n_heads * hd_v).reshape(n_tok, n_heads, hd_v)
    result[...] = np.einsum("thz,thzd->thd", weight, acc) / np.einsum("thz,thz->th", weight, l[..., 0])[..., None]


def kv_shift(L, ring, slots, cos, sin, h, r, ggml_type, limit, m, n_kv, hd, cap, row_bytes, half, mode):
    L.need(L.grid[0] * L.block[0] >= m * n_kv, "a thread per (slot, KV head)")
    rows = mem(ring, n_kv * cap * row_bytes, np.uint8).reshape(n_kv, cap, row_bytes)
    c, s = mem(cos, m * half).reshape(m, half), mem(sin, m * half).reshape(m, half)
    rot = mem(h, r * r).reshape(r, r).astype(np.float64) if r else None
    i = np.arange(half)
    a, b = (i, i + half) if mode == 2 else (2 * i, 2 * i + 1)
    for j, slot in enumerate(mem(slots, m, np.int32)):
        x = dequantize(rows[:, slot].reshape(-1), ggml_type, hd)  # [n_kv, hd]
        if rot is not None:
            x = (x.reshape(-1, r) @ rot).reshape(n_kv, hd)
        x0, x1 = x[:, a].copy(), x[:, b].copy()
        x[:, a], x[:, b] = x0 * c[j] - x1 * s[j], x0 * s[j] + x1 * c[j]
        if rot is not None:
            x = (x.reshape(-1, r) @ rot).reshape(n_kv, hd)
        x = np.clip(x, -limit, limit).astype(np.float32)
        rows[:, slot] = kv_rows(x, ggml_type).reshape(n_kv, row_bytes)


KERNELS = {f.__name__: f for f in (get_rows, quantize_q8_1, rms_norm, add_rms_norm, rms_norm_heads, rope, silu_mul,
                                   gelu_mul, add, scale, softcap, softmax_rows, add_bias, rotate, kv_write, attention,
                                   attention_split, attention_merge, attention_stats, attention_tally, kv_shift,
                                   key_map, keep_sinks)}
