"""A calibrated K type's key map (`KeyMap`) and the re-coding of a cache's K rows when the map
changes (`recode_keys`: a calibrated cache that grew into a larger context).

kv/calibration.py measures the map; kernels/rows.py applies it to rows (`map_keys`,
`map_queries`); the backend's attend applies it on the way into the ring.
What does not live here: the Hadamard rotation (kernels/rows.py), where rows go (kv/cache.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..kernels.rows import map_keys, rotate


@dataclass(frozen=True)
class KeyMap:
    """What a calibrated K type stores instead of K: (k - mean) * scale per channel, the
    query divided by the same scale, so q . k changes by q . mean, one constant per query
    and KV head, which softmax ignores. mean, scale: f32[n_layers, n_kv_heads, head_dim]."""

    mean: np.ndarray
    scale: np.ndarray

    @classmethod
    def identity(cls, n_layers: int, n_kv_heads: int, head_dim: int) -> "KeyMap":
        """The map that changes nothing (mean 0, scale 1)."""
        shape = (n_layers, n_kv_heads, head_dim)
        return cls(np.zeros(shape, np.float32), np.ones(shape, np.float32))

    def keys(self, layer: int, k: np.ndarray) -> None:
        map_keys(k, self.mean[layer], self.scale[layer])

    def unkeys(self, layer: int, k: np.ndarray) -> None:
        """The stored values (f32[m, n_kv_heads, head_dim]) -> K, in place."""
        k /= self.scale[layer]
        k += self.mean[layer]

    def same(self, other: "KeyMap | None") -> bool:
        return other is not None and np.array_equal(self.mean, other.mean) and np.array_equal(self.scale, other.scale)


def recode_keys(cache, old: KeyMap) -> None:
    """A KVCache's K rows and sink rows stored through the map `old` -> through its own map (a
    calibrated K type's cache that grew into a larger context, whose map differs)."""
    def remap(layer: int, k: np.ndarray) -> None:  # in place
        rotate(k, cache.rot_k[layer])
        old.unkeys(layer, k)
        cache.key_map.keys(layer, k)
        rotate(k, cache.rot_k[layer])

    for layer, pos in enumerate(cache.pos):
        if not cache.kinds_k[layer].calibrated:
            continue
        slots = np.flatnonzero(pos >= 0)
        if slots.size:
            k = cache.load_k(layer, slots)
            remap(layer, k)
            cache.write_k(layer, slots, k)
        sinks = np.ascontiguousarray(cache.sink_k[layer].transpose(1, 0, 2))  # [SINKS, n_kv, hd]
        remap(layer, sinks)
        cache.sink_k[layer] = sinks.transpose(1, 0, 2)
