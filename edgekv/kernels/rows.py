"""What a K or V row goes through on its way into a quantized cache, and back: pure row math.

- The Walsh-Hadamard rotation (`hadamard`, `rotation_for`, `rotate`): llama.cpp's, which
  spreads outlier channels over a block before 4-bit rounding.
- A calibrated K type's map applied to rows (`map_keys`, `map_queries`; kv/key_map.py holds
  the map, kv/calibration.py measures it) and its sink rows (`keep_sinks`; kv/cache.py's SINKS
  says why).
What does not live here: the block formats (kernels/quantize.py, dequant.py), where rows go
(kv/cache.py), attention (the backend).
"""

from __future__ import annotations

import numpy as np


def hadamard(n: int) -> np.ndarray:
    """The orthonormal n x n Walsh-Hadamard matrix (Sylvester order; symmetric, H @ H = I)."""
    h = np.full((1, 1), 1.0 / np.sqrt(n), np.float32)
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h


def rotation_for(quantized: bool, head_dim: int, largest: bool) -> np.ndarray | None:
    """llama.cpp rotates K (and V) with a Walsh-Hadamard matrix before storing them in a
    quantized cache: outliers spread over the block, so 4-bit blocks lose far less
    (q4_0 perplexity of SmolLM2: 22.5 unrotated, 19.5 rotated). Scores are unchanged
    (orthonormal Q and K rotation) and V's rotation is undone on the attention output.
    K uses the largest power of two >= 64 dividing head_dim, V blocks of 64."""
    if not quantized or head_dim % 64:
        return None
    n = 64
    while largest and head_dim % (2 * n) == 0:
        n *= 2
    return hadamard(n)


def rotate(x: np.ndarray, h: np.ndarray | None) -> None:
    """Multiply every run of h.shape[0] values of x by h, in place (no-op when h is None)."""
    if h is not None:
        n = h.shape[0]
        x[...] = (x.reshape(-1, n) @ h).reshape(x.shape)


def map_keys(k: np.ndarray, mean: np.ndarray, scale: np.ndarray) -> None:
    """k: f32[m, n_kv_heads, head_dim] -> (k - mean) * scale, in place (one layer's KeyMap)."""
    k -= mean
    k *= scale


def map_queries(q: np.ndarray, scale: np.ndarray) -> None:
    """q: f32[n, n_heads, head_dim] -> q / scale, in place; GQA: a KV head's scale
    (scale: f32[n_kv_heads, head_dim]) serves its group of query heads."""
    q.reshape(q.shape[0], scale.shape[0], -1, q.shape[2])[...] /= scale[None, :, None, :]


def keep_sinks(sink_k: np.ndarray, positions: np.ndarray, k: np.ndarray) -> None:
    """Copy the stored K rows (k: f32[m, n_kv, hd]) of positions below SINKS into sink_k:
    f32[n_kv, SINKS, hd], one layer's sink rows by position."""
    for t in np.flatnonzero(positions < sink_k.shape[1]):
        sink_k[:, positions[t]] = k[t]
