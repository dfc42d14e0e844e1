"""Drafted tokens in the cache: a verify pass whose rejected rows are forgotten exactly.

Speculative decoding (edgekv/speculative/) evaluates a token and k drafted ones in one pass,
then keeps the first n of them. What the pass changed must come out as if only those n had
ever been evaluated, one decode step each:

- the pass wrote its rows into the slots `reserve` gave: free slots of the full-context layers
  (which may still hold rows of dropped or truncated positions), the oldest slots of a
  windowed ring (positions no query can still see, which a cache that never saw the drafts
  still holds). Their rows and positions, saved by `reserve_draft` before the pass writes, are
  put back in a rejected token's slots; the scan length `used` goes back to what the kept
  slots need, and a ring's write pointer `cur` follows them;
- the `keep` policy's tallies: during the pass each query's attention weights go to a staging
  array of their own (`staging`, f32[n, n_layers, n_kv_heads, cap]; backends/cpu.py
  add_tallies), and `settle` adds the kept queries' in order, as n decode steps add them, and
  counts n queries (AttentionTallies.count), not the pass's n + k.

The arithmetic of the pass itself is the backend's business: under
`Backend.independent_rows` each row comes out as a one-token pass computes it, so the kept
rows' K, V and logits are a decode step's bits (tests/test_speculative_rollback.py).
What does not live here: the reservation (KVCache.reserve), the session's token list
(session.py `verify` / `settle`), choosing drafts (speculative/).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .cache import KVCache, Reservation


@dataclass
class DraftMark:
    """What a verify pass may change, saved before it writes (`reserve_draft`)."""

    res: Reservation
    used: np.ndarray  # i64[n_layers], the scan lengths before the reservation
    rows: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]  # layer -> the reserved slots' k, v rows and positions
    n_slots: np.ndarray  # i64[n_layers], each layer's scan length during the pass


def reserve_draft(cache: KVCache, n: int) -> DraftMark:
    """Reserve n slots as KVCache.reserve does, saving what `settle` needs to forget any of
    them, and point the tallies (if any) at a fresh staging array for the pass."""
    used = cache.used.copy()
    old_pos = {layer: cache.pos[layer].copy() for layer in cache._ring_layers}
    res = cache.reserve(n)
    cache.backend.rings_to_host(cache)
    rows = {}
    for layer in range(len(cache.pos)):
        slots = res.slots[layer]
        pos = old_pos[layer][slots] if layer in old_pos else np.full(slots.size, -1, np.int32)
        rows[layer] = (cache.k[layer][:, slots].copy(), cache.v[layer][:, slots].copy(), pos)
    if cache.tallies is not None:
        cap = cache.tallies.mass.shape[-1]
        if cache.staging is None or cache.staging.shape[0] < n:
            cache.staging = np.zeros((n, *cache.tallies.mass.shape[:2], cap), np.float32)
        cache.drafting = True
    return DraftMark(res, used, rows, cache.used.copy())


def settle(cache: KVCache, mark: DraftMark, n_kept: int) -> None:
    """Keep the first n_kept tokens of the pass (0: none), forget the others exactly."""
    res = mark.res
    cache.drafting = False
    rejected = n_kept < res.positions.size  # else no row to put back (and, on a GPU, nothing to copy)
    if rejected:
        cache.backend.rings_to_host(cache)
    for layer, pos in enumerate(cache.pos):
        slots, (k, v, old) = res.slots[layer], mark.rows[layer]
        gone = slots[n_kept:]
        cache.k[layer][:, gone], cache.v[layer][:, gone], pos[gone] = k[:, n_kept:], v[:, n_kept:], old[n_kept:]
        if cache.ring(layer):
            cache.cur[layer] = (int(slots[n_kept - 1]) + 1) % cache.caps[layer] if n_kept else res.cur[layer]
        cache.used[layer] = max(int(mark.used[layer]), int(slots[:n_kept].max()) + 1 if n_kept else 0)
    if rejected:
        cache.backend.rings_from_host(cache)
    kept = Reservation(res.positions[:n_kept], [s[:n_kept] for s in res.slots], res.cur)
    if cache.tallies is not None and cache.tally_layer is not None:
        mass, n_slots = cache.tallies.mass, int(mark.n_slots[cache.tally_layer])
        for t in range(n_kept):
            mass[:, :, :n_slots] += cache.staging[t, :, :, :n_slots]
    cache.commit(kept)
